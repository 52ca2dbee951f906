"""Output redaction: presented credential values never reach a run's recorded output.

The kernel's ``StreamRecorder`` passes every chunk through a ``RedactionStream`` before it
hashes, counts, buffers or offloads anything, so the stored excerpt, the artifact file, the
SHA-256, the byte count, the structured-output parse and every delivery see only the
redacted bytes. Each occurrence of a presented value is replaced by ``[REDACTED:<name>]``
(``name`` is the binding's name), whichever ``write`` calls it was split across: the
stream holds back the last ``longest pattern - 1`` bytes until the next chunk (or
``flush``) decides them.

Forms that are redacted (``forms_of``), for the value and, when it has surrounding
whitespace (a file credential ending in a newline), for the value stripped too:

* the raw UTF-8 bytes, at any length (fail closed: even a very short value is redacted);
* as escaped inside a JSON string (``\\"``, ``\\\\``, ``\\n``, ``\\uXXXX``) and percent-encoded
  (``quote(value, safe="")``), when those differ from the raw form;
* for values of at least ``MIN_ENCODED_BYTES`` bytes (shorter encodings are too common in
  ordinary text to remove): lower- and upper-case hex; standard and URL-safe base64, padded
  and unpadded; and the base64 characters determined by the value alone at each of the three
  byte alignments, so the value is caught inside a longer base64 text too (``user:token``
  in an HTTP Basic header, ``echo $TOKEN | base64`` with its trailing newline). In that
  embedded case up to one character on each side, which mixes in neighbouring bytes,
  stays (at most 4 bits of the value each).

Overlapping occurrences (one value's tail is another's head, or a value repeated with
overlap) are merged into one span, replaced by the markers of every binding involved.
This is a defence against accidental disclosure (a command echoing its token, a verbose
HTTP client printing a header), not against a payload that deliberately transforms the
value (reversed, split across lines, encrypted): the command is trusted with the value.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING
from urllib.parse import quote

import attrs

if TYPE_CHECKING:
    from scheduler.core.execution import ExecutionResult
    from scheduler.core.outcomes import RunOutcomes

#: Shortest value (bytes) whose hex and base64 forms are redacted as well as its raw bytes.
MIN_ENCODED_BYTES = 6
#: A merged span still growing at the end of a chunk is held back (not emitted) while it is at most this
#: many bytes beyond the usual tail; past that (a pathological stream repeating a value) it is emitted.
_MAX_CARRY_EXTRA = 64 * 1024


def marker(name: str) -> bytes:
    """The bytes that replace an occurrence of binding ``name``'s value: ``[REDACTED:<name>]``."""
    return f"[REDACTED:{name}]".encode()


def _base64_forms(value: bytes) -> set[bytes]:
    """Standard and URL-safe base64 of ``value``: standalone (padded and unpadded) and the cores that appear
    whatever bytes surround it in a longer encoded text (one per alignment ``value`` can start at)."""
    forms: set[bytes] = set()
    padded = base64.b64encode(value)
    forms.update({padded, padded.rstrip(b"=")})
    n = len(value)
    for shift in (0, 1, 2):
        encoded = base64.b64encode(b"\x00" * shift + value + b"\x00\x00")
        # Character i covers bits [6i, 6i+6); the value's bits are [8*shift, 8*(shift+n)).
        first = -(-8 * shift // 6)
        last = (8 * (shift + n)) // 6  # exclusive
        if last - first >= 4:
            forms.add(encoded[first:last])
    urlsafe = {f.replace(b"+", b"-").replace(b"/", b"_") for f in forms}
    return forms | urlsafe


def forms_of(value: str | bytes) -> set[bytes]:
    """Every byte sequence redacted for one credential value (see the module docstring), empty for ``""``.

    A ``bytes`` value (a binary file credential) that is not UTF-8 gets its raw, hex and base64 forms.
    """
    forms: set[bytes] = set()
    if isinstance(value, bytes):
        raw = value
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            forms.add(raw)
            if len(raw) >= MIN_ENCODED_BYTES:
                forms.update({raw.hex().encode("ascii"), raw.hex().upper().encode("ascii")})
                forms.update(_base64_forms(raw))
            return forms
    texts = {value}
    if value.strip() and value.strip() != value:
        texts.add(value.strip())
    for text in texts:
        raw = text.encode("utf-8")
        if not raw:
            continue
        forms.add(raw)
        forms.add(json.dumps(text)[1:-1].encode("ascii"))
        forms.add(json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8"))
        forms.add(quote(text, safe="").encode("ascii"))
        if len(raw) >= MIN_ENCODED_BYTES:
            forms.update({raw.hex().encode("ascii"), raw.hex().upper().encode("ascii")})
            forms.update(_base64_forms(raw))
    forms.discard(b"")
    return forms


@attrs.frozen(repr=False)
class Redactions:
    """The compiled patterns of one run's presented values: build with ``redactions_for``; start a stream with
    ``stream()``. Holds derived forms of secret values, so it lives only as long as the run's request."""

    pattern: re.Pattern[bytes]
    #: Pattern bytes -> binding name (the first binding wins when two values share a form).
    names: dict[bytes, str]
    #: Length of the longest pattern: a stream holds back one byte less than this.
    longest: int
    #: The patterns, longest first (at one position the longest wins).
    ordered: tuple[bytes, ...] = ()

    def __repr__(self) -> str:
        return f"Redactions(bindings={sorted(set(self.names.values()))!r}, patterns={len(self.names)})"

    def stream(self) -> RedactionStream:
        """A fresh streaming redactor for one output stream."""
        return RedactionStream(self)

    def redact(self, data: bytes) -> tuple[bytes, dict[str, int]]:
        """Redact a whole byte string at once; returns the redacted bytes and the count per binding name."""
        stream = self.stream()
        out = stream.feed(data) + stream.flush()
        return out, dict(stream.counts)


def redactions_for(credentials: Iterable[object]) -> Redactions | None:
    """The redactions for a run's ``CredentialPresentation`` s (anything with ``name`` and ``value``), or None
    when none carries a value (then a recorder takes its plain path: no scanning at all)."""
    names: dict[bytes, str] = {}
    for credential in credentials:
        value = getattr(credential, "value", None)
        if not value:
            continue
        name = str(getattr(credential, "name", "") or "credential")
        for form in forms_of(value):
            names.setdefault(form, name)
    if not names:
        return None
    ordered = sorted(names, key=lambda b: (-len(b), b))  # longest first: the longest form wins at a position
    pattern = re.compile(b"|".join(re.escape(p) for p in ordered))
    return Redactions(pattern=pattern, names=names, longest=len(ordered[0]), ordered=tuple(ordered))


class RedactionStream:
    """Redacts one stream fed in chunks: ``feed`` returns the bytes that are decided, ``flush`` the rest.

    ``counts`` maps binding names to the number of spans replaced so far.
    """

    def __init__(self, redactions: Redactions) -> None:
        self._r = redactions
        self._pending = b""
        self.counts: dict[str, int] = {}

    def _spans(self, buf: bytes, limit: int) -> Iterator[tuple[int, int, list[str]]]:
        """Merged spans ``(start, end, names)`` of occurrences starting before ``limit``, left to right."""
        pattern, names, ordered = self._r.pattern, self._r.names, self._r.ordered
        # Finding each pattern with bytes.find (C speed) beats one regex alternation scanned position by position
        # several times over; a chunk holding none of them costs one find per pattern.
        following = {p: buf.find(p) for p in ordered}
        pos = 0
        while True:
            start, hit = -1, b""
            for p in ordered:
                i = following[p]
                if 0 <= i < pos:
                    i = following[p] = buf.find(p, pos)
                if i >= 0 and (start < 0 or i < start):  # longest first: at a tie the longer pattern stays
                    start, hit = i, p
            if start < 0 or start >= limit:
                return
            end = start + len(hit)
            found = [names[hit]]
            at = start + 1
            while at < end:  # an occurrence starting inside this one and reaching further extends the span
                m2 = pattern.match(buf, at)
                if m2 is not None and m2.end() > end:
                    end = m2.end()
                    name = names[m2.group()]
                    if name not in found:
                        found.append(name)
                at += 1
            yield start, end, found
            pos = end

    def _emit(self, buf: bytes, final: bool) -> bytes:
        keep = 0 if final else self._r.longest - 1
        safe_end = len(buf) - keep  # an occurrence starting before this is wholly inside buf
        out: list[bytes] = []
        pos = 0
        carry = max(safe_end, 0)
        for start, end, found in self._spans(buf, safe_end):
            if not final and end > safe_end and len(buf) - start <= keep + _MAX_CARRY_EXTRA:
                carry = start  # an occurrence not yet complete might still extend this span: decide it later
                break
            out.append(buf[pos:start])
            for name in found:
                out.append(marker(name))
                self.counts[name] = self.counts.get(name, 0) + 1
            pos = end
        else:
            carry = max(carry, pos)
        self._pending = buf[carry:]
        if not out:
            return buf[:carry] if carry < len(buf) else buf
        out.append(buf[pos:carry])
        return b"".join(out)

    def feed(self, chunk: bytes) -> bytes:
        """Take a chunk; return the redacted bytes that no later chunk can change (possibly empty)."""
        if not chunk:
            return b""
        return self._emit(self._pending + chunk, final=False)

    def flush(self) -> bytes:
        """End of stream: the redacted remainder."""
        buf, self._pending = self._pending, b""
        return self._emit(buf, final=True) if buf else b""


def record_redactions(result: ExecutionResult, outcomes: RunOutcomes) -> ExecutionResult:
    """Record on the run what output redaction replaced (the dispatcher, for runs that were presented credentials).

    Adds ``details["redactions"]`` (``{"stdout": {name: n}, "stderr": {...}, "total": {name: n}}``) to the
    ``ExecutionResult`` and queues an ``output.redacted`` event with the same counts; returns the result
    unchanged when nothing was replaced. The run's credentials summary (``runs.credentials_json``, written by
    the credential step's cleanup, which has run by now) gets the counts too, so ``runs get`` shows them in
    one place: ``redacted`` per presented binding and ``redactions`` (the summary above) at the top. Names and
    counts only, never a value or a form of one.
    """
    streams = {name: dict(capture.redactions) for name, capture in (("stdout", result.stdout), ("stderr", result.stderr))
               if capture is not None and capture.redactions}
    total: dict[str, int] = {}
    for counts in streams.values():
        for name, n in counts.items():
            total[name] = total.get(name, 0) + n
    summary: dict[str, dict[str, int]] = {**streams, "total": dict(sorted(total.items()))}
    _merge_into_credentials(outcomes, summary)
    if not streams:
        return result
    outcomes.record("output.redacted", summary)
    return attrs.evolve(result, details={**(result.details or {}), "redactions": summary})


def _merge_into_credentials(outcomes: RunOutcomes, summary: dict[str, dict[str, int]]) -> None:
    """Put the redaction counts into ``outcomes.columns["credentials_json"]`` (when the run has one): each presented
    binding gets ``redacted`` (its total, 0 when nothing was replaced), the summary gets ``redactions``."""
    text = outcomes.columns.get("credentials_json")
    if not text or not isinstance(text, (str, bytes)):
        return
    try:
        record = json.loads(text)
    except ValueError:
        return
    if not isinstance(record, dict):
        return
    total = summary.get("total") or {}
    for binding in record.get("bindings") or ():
        if isinstance(binding, dict) and binding.get("status") == "presented":
            name = binding.get("name")
            binding["redacted"] = int(total.get(name, 0)) if isinstance(name, str) else 0
    record["redactions"] = summary
    outcomes.columns["credentials_json"] = json.dumps(record, sort_keys=True, separators=(",", ":"))
