"""Helpers every evidence provider of this project needs: json-sort-v1, payload and envelope checks, bounded subprocesses.

This file is identical in ``scheduler-provider-checksum``, ``scheduler-provider-ssh``
and ``scheduler-provider-external`` (each distribution installs on its own, so none
depends on another). It exists because ``scheduler.api`` does not export the kernel's
canonical-JSON helpers yet; once it exports ``canonical_bytes`` / ``hash_bytes`` /
``is_digest``, the json-sort-v1 part below should be replaced by those.

json-sort-v1 is the canonical form artifacts and evidence are hashed in: byte-identical
to ``JSON.stringify`` of the value after sorting every object's keys (UTF-16 code-unit
order, array-index keys first as a JavaScript object lists them), no white space,
JavaScript number formatting, only ``"``, ``\\`` and U+0000-U+001F escaped (lone
surrogates as ``\\udxxx``). Values JavaScript could not carry exactly (integers beyond
2^53 - 1, NaN, infinities, non-string keys, ``"__proto__"``) are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import attrs

from scheduler.api import EvidenceEnvelope, EvidenceVerification, SchedulerError, build_options

CANONICALIZATION = "json-sort-v1"
PAYLOAD_FORMAT = "canonical-json"
MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 512
_MAX_ARRAY_INDEX = 2**32 - 2

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_ARRAY_INDEX = re.compile("0|[1-9][0-9]{0,9}")
_ESCAPE = re.compile('[\x00-\x1f"\\\\\ud800-\udfff]')
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class EvidenceFailure(Exception):
    """A coded failure inside a provider; ``attest`` raises it as ``SchedulerError``, ``verify`` returns it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def error(self) -> SchedulerError:
        return SchedulerError(self.code, self.message)

    def verification(self, provider: str) -> EvidenceVerification:
        return EvidenceVerification(verified=False, provider=provider, code=self.code, reason=self.message)


# -- json-sort-v1 ---------------------------------------------------------------------------------


class CanonicalError(ValueError):
    """A value with no json-sort-v1 form."""


def _js_string(text: str) -> str:
    """``text`` as JavaScript sees it: a surrogate pair written as two code points is one character."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")


def _quote(text: str) -> str:
    text = _js_string(text)
    return '"' + _ESCAPE.sub(lambda m: _SHORT.get(m.group(0)) or f"\\u{ord(m.group(0)):04x}", text) + '"'


def js_number(value: int | float) -> str:
    """A number as JavaScript's ``Number.prototype.toString`` writes it."""
    if isinstance(value, bool):
        raise CanonicalError("a boolean is not a number")
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise CanonicalError(f"integer {value} is outside JavaScript's safe range")
        return int.__repr__(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise CanonicalError(f"{value!r} has no JSON form")
    if value == 0:
        return "0"
    sign, digit_tuple, exponent = Decimal(float.__repr__(value)).as_tuple()
    digits = "".join(map(str, digit_tuple))
    stripped = digits.rstrip("0")
    exponent = int(exponent) + len(digits) - len(stripped)
    digits = stripped.lstrip("0") or "0"
    k = len(digits)
    n = k + exponent  # value = 0.DIGITS * 10^n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        text = (digits if k == 1 else digits[0] + "." + digits[1:]) + ("e+" if e >= 0 else "e-") + str(abs(e))
    return "-" + text if sign else text


def _key_rank(key: str) -> tuple[int, int, bytes]:
    if _ARRAY_INDEX.fullmatch(key) and int(key) <= _MAX_ARRAY_INDEX:
        return (0, int(key), b"")
    return (1, 0, key.encode("utf-16-be", "surrogatepass"))


def _emit(value: Any, out: list[str], depth: int) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, (int, float)):
        out.append(js_number(value))
    elif isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            raise CanonicalError(f"nesting deeper than {MAX_DEPTH} levels")
        keys: dict[str, Any] = {}
        for key in value:
            if not isinstance(key, str):
                raise CanonicalError(f"object keys must be strings, not {type(key).__name__}")
            js_key = _js_string(key)
            if js_key == "__proto__" or js_key in keys:
                raise CanonicalError(f"object key {key!a} has no json-sort-v1 form")
            keys[js_key] = key
        out.append("{")
        for i, js_key in enumerate(sorted(keys, key=_key_rank)):
            if i:
                out.append(",")
            out.append(_quote(js_key))
            out.append(":")
            _emit(value[keys[js_key]], out, depth + 1)
        out.append("}")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        if depth >= MAX_DEPTH:
            raise CanonicalError(f"nesting deeper than {MAX_DEPTH} levels")
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _emit(item, out, depth + 1)
        out.append("]")
    else:
        raise CanonicalError(f"{type(value).__name__} values have no json-sort-v1 form")


def canonical_json(value: Any) -> str:
    """``value`` in json-sort-v1 (``CanonicalError`` when it has no such form)."""
    out: list[str] = []
    _emit(value, out, 0)
    return "".join(out)


def canonical_bytes(value: Any) -> bytes:
    """The UTF-8 bytes of ``canonical_json(value)`` (lone surrogates are escaped, so the text always encodes)."""
    return canonical_json(value).encode("utf-8")


def sha256_digest(data: bytes) -> str:
    """``sha256:<64 lowercase hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: Any) -> bool:
    return isinstance(value, str) and DIGEST_RE.fullmatch(value) is not None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise CanonicalError(f"duplicate key {key!a}")
        out[key] = value
    return out


def _refuse_constant(name: str) -> Any:
    raise CanonicalError(f"{name} is not JSON")


def strict_json(data: bytes | str) -> Any:
    """Parse JSON refusing duplicate keys and NaN/Infinity (``CanonicalError``; ``ValueError`` for bad syntax)."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)


# -- payloads -------------------------------------------------------------------------------------


@attrs.frozen
class Payload:
    """A checked evidence payload: its canonical bytes, their digest and the parsed document."""

    canonical: bytes
    digest: str
    document: Mapping[str, Any]

    @property
    def text(self) -> str:
        return self.canonical.decode("utf-8")


def parse_canonical(canonical: bytes, what: str = "the payload") -> dict[str, Any]:
    """The JSON object ``canonical`` holds, refused unless it is exactly its own json-sort-v1 form."""
    try:
        text = bytes(canonical).decode("utf-8")
    except UnicodeDecodeError:
        raise EvidenceFailure("EVIDENCE_JSON_INVALID", f"{what} is not UTF-8") from None
    try:
        document = strict_json(text)
    except CanonicalError as exc:
        raise EvidenceFailure("EVIDENCE_JSON_INVALID", f"{what} is not acceptable JSON: {exc}") from None
    except ValueError as exc:
        raise EvidenceFailure("EVIDENCE_JSON_INVALID", f"{what} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise EvidenceFailure("EVIDENCE_PAYLOAD_INVALID", f"{what} must be a JSON object, not {type(document).__name__}")
    try:
        again = canonical_bytes(document)
    except CanonicalError as exc:
        raise EvidenceFailure("EVIDENCE_PAYLOAD_NONCANONICAL", f"{what} has no json-sort-v1 form: {exc}") from None
    if again != bytes(canonical):
        raise EvidenceFailure("EVIDENCE_PAYLOAD_NONCANONICAL", f"{what} is not in json-sort-v1 canonical form")
    return document


def normalise_payload(payload: Any) -> Payload:
    """Check what the kernel handed over: an ``EvidencePayload`` (document, canonical bytes, digest) or bare bytes.

    The canonical bytes must be a JSON object in exactly json-sort-v1 form, the document
    (when given) must canonicalise to those bytes, and the digest (when given) must be
    their SHA-256. Anything else is refused with an ``EVIDENCE_*`` code.
    """
    if isinstance(payload, (bytes, bytearray, memoryview)):
        canonical, document, digest = bytes(payload), None, None
    elif hasattr(payload, "canonical"):
        canonical = payload.canonical
        document = getattr(payload, "document", None)
        digest = getattr(payload, "digest", None)
        if not isinstance(canonical, (bytes, bytearray, memoryview)):
            raise EvidenceFailure("EVIDENCE_PAYLOAD_INVALID", "the payload's canonical form must be bytes")
        canonical = bytes(canonical)
    else:
        raise EvidenceFailure("EVIDENCE_PAYLOAD_INVALID", f"an evidence payload must be bytes or an EvidencePayload, not {type(payload).__name__}")
    parsed = parse_canonical(canonical)
    if document is not None:
        try:
            from_document = canonical_bytes(document)
        except CanonicalError as exc:
            raise EvidenceFailure("EVIDENCE_PAYLOAD_INVALID", f"the payload document has no json-sort-v1 form: {exc}") from None
        if from_document != canonical:
            raise EvidenceFailure("EVIDENCE_PAYLOAD_NONCANONICAL", "the payload document does not canonicalise to the payload bytes")
    actual = sha256_digest(canonical)
    if digest is not None:
        if not is_digest(digest):
            raise EvidenceFailure("EVIDENCE_DIGEST_INVALID", "the payload digest is not sha256: and 64 lowercase hex digits")
        if digest != actual:
            raise EvidenceFailure("EVIDENCE_DIGEST_MISMATCH", "the payload digest is not the SHA-256 of the payload bytes")
    return Payload(canonical=canonical, digest=actual, document=parsed)


# -- declarations and envelopes -------------------------------------------------------------------


def declared_options(declaration: Any, cls: type | None, provider: str) -> Any:
    """The declaration's validated ``provider_config`` (an instance of ``cls``); ``EVIDENCE_OPTIONS_INVALID`` otherwise."""
    raw = getattr(declaration, "options", None)
    if raw is None:
        raw = getattr(declaration, "provider_config", None)
    if cls is None:
        if raw:
            raise EvidenceFailure("EVIDENCE_OPTIONS_INVALID", f"the {provider} evidence provider takes no provider_config")
        return None
    if isinstance(raw, cls):
        return raw
    try:
        return build_options(cls, dict(raw) if isinstance(raw, Mapping) else raw, "evidence.provider_config")
    except SchedulerError as exc:
        raise EvidenceFailure("EVIDENCE_OPTIONS_INVALID", exc.message) from None


def requested_methods(declaration: Any) -> tuple[str, ...]:
    """The methods the declaration asks for (empty when it names none)."""
    methods = getattr(declaration, "methods", None)
    if not methods:
        return ()
    if isinstance(methods, str):
        return (methods,)
    return tuple(str(m) for m in methods)


def check_requested_methods(declaration: Any, supported: frozenset[str], provider: str) -> None:
    """Refuse a declaration asking for a method this provider does not perform (never a silent downgrade)."""
    unsupported = [m for m in requested_methods(declaration) if m not in supported]
    if unsupported:
        raise EvidenceFailure(
            "EVIDENCE_METHOD_UNSUPPORTED",
            f"the {provider} evidence provider does not perform {', '.join(map(repr, unsupported))}"
            f" (it performs {', '.join(sorted(supported))})",
        )


def envelope_parts(envelope: Any, provider: str) -> tuple[str, Mapping[str, Any]]:
    """``(payload_digest, data)`` of an envelope (``EvidenceEnvelope`` or its stored JSON), checked for its provider and format."""
    if isinstance(envelope, EvidenceEnvelope):
        name, fmt, digest, data = envelope.provider, envelope.format, envelope.payload_digest, envelope.data
    elif isinstance(envelope, Mapping):
        name, fmt, digest, data = (envelope.get(k) for k in ("provider", "format", "payload_digest", "data"))
    else:
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"an envelope must be an EvidenceEnvelope, not {type(envelope).__name__}")
    if name != provider:
        raise EvidenceFailure("EVIDENCE_PROVIDER_MISMATCH", f"the envelope was made by provider {name!r}, not {provider!r}")
    if not isinstance(data, Mapping):
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's data must be an object")
    if not is_digest(digest):
        raise EvidenceFailure("EVIDENCE_DIGEST_INVALID", "the envelope's payload_digest is not sha256: and 64 lowercase hex digits")
    if data.get("payload_digest") != digest:
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's payload_digest disagrees with its data")
    if fmt != data.get("schema"):
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's format disagrees with its data's schema")
    return digest, data


def check_keys(data: Mapping[str, Any], expected: Sequence[str], what: str = "the envelope") -> None:
    """Exactly these keys, no more, no fewer."""
    keys = set(data)
    missing, extra = sorted(set(expected) - keys), sorted(keys - set(expected))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unexpected {', '.join(extra)}"] if extra else [])
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"{what} has the wrong fields ({'; '.join(parts)})")


def check_bound_payload(envelope_digest: str, payload: Payload) -> None:
    """The envelope must be for this payload: an envelope moved from another payload is refused."""
    if envelope_digest != payload.digest:
        raise EvidenceFailure("EVIDENCE_PAYLOAD_MISMATCH", "the envelope was made for a different payload (its payload_digest differs)")


# -- bounded subprocesses -------------------------------------------------------------------------


@attrs.frozen
class Completed:
    """How a bounded subprocess ended."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    oversized: bool = False


def minimal_env(extra: Mapping[str, str] | None = None, pass_through: Sequence[str] = ()) -> dict[str, str]:
    """A small, predictable environment: PATH, HOME, a C locale, plus what the caller adds."""
    env = {"PATH": os.environ.get("PATH") or os.defpath, "LC_ALL": "C", "LANG": "C"}
    if os.environ.get("HOME"):
        env["HOME"] = os.environ["HOME"]
    for name in pass_through:
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(extra or {})
    return env


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bounded(argv: Sequence[str], data: bytes, *, timeout_s: float, max_stdout: int, env: Mapping[str, str],
                max_stderr: int = 64 * 1024) -> Completed:
    """Run ``argv`` (no shell) in its own process group with ``data`` on stdin, within ``timeout_s`` and output caps.

    Past the deadline, or once stdout exceeds ``max_stdout`` bytes, the whole group is
    killed. ``FileNotFoundError`` / ``PermissionError`` propagate when ``argv[0]`` cannot
    be started.
    """
    deadline = time.monotonic() + timeout_s
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(env), start_new_session=True, close_fds=True)
    over = threading.Event()
    out, err = bytearray(), bytearray()

    def read(stream: Any, buf: bytearray, cap: int, flag: bool) -> None:
        try:
            while True:
                chunk = stream.read1(65536)
                if not chunk:
                    return
                room = cap + 1 - len(buf)
                buf.extend(chunk[:room])
                if len(buf) > cap:
                    if flag:
                        over.set()
                    return
        except (OSError, ValueError):
            return

    def write() -> None:
        try:
            proc.stdin.write(data)  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            try:
                proc.stdin.close()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass

    threads = [threading.Thread(target=write, daemon=True),
               threading.Thread(target=read, args=(proc.stdout, out, max_stdout, True), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, err, max_stderr, False), daemon=True)]
    for t in threads:
        t.start()
    timed_out = False
    while True:
        remaining = deadline - time.monotonic()
        if over.is_set():
            break
        if remaining <= 0:
            timed_out = True
            break
        try:
            proc.wait(timeout=min(0.02, remaining))
            break
        except subprocess.TimeoutExpired:
            continue
    if proc.returncode is None:  # late or oversized: the group goes, whatever it was doing
        _kill_group(proc.pid)
        proc.wait()
    else:
        # The leader exited; children it left may still hold the pipes open. Wait for the
        # readers until the deadline, then kill the group (it exists while those members do).
        for t in threads[1:]:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads[1:]):
            timed_out = True
            _kill_group(proc.pid)
    for t, stream in zip(threads[1:], (proc.stdout, proc.stderr)):
        t.join(0.5)
        if not t.is_alive():  # a reader still blocked holds the stream's lock: leave it to the daemon thread
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
    return Completed(returncode=proc.returncode, stdout=bytes(out[:max_stdout]), stderr=bytes(err[:max_stderr]),
                     timed_out=timed_out, oversized=over.is_set() or len(out) > max_stdout)


def snippet(data: bytes, limit: int = 200) -> str:
    """A short, single-line, printable excerpt of a process's output for an error message."""
    text = data.decode("utf-8", "replace").strip()
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", text)
    return text[:limit] + ("..." if len(text) > limit else "")
