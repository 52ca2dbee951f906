"""Structured output: turn a run's captured stdout into the structured-output record.

A job declares ``output_format`` (``text``, ``json`` or ``ndjson``). After the
command ends, every executor hands the *complete* stdout bytes to
``parse_structured`` and stores the record it returns in
``ExecutionResult.structured``::

    {"format": "json", "valid": True, "warning": None, "bytes": 123,
     "sha256": "...", "parsed": {...}, "artifact": None}

Rules (the "Structured Output" contract):

* ``json``: the whole text is one JSON value (surrounding whitespace allowed).
* ``ndjson``: every nonblank line is one JSON value on its own; ``parsed`` is the list.
* ``text``: the normalised text (CRLF -> LF, trailing whitespace at the end removed);
  always valid.
* Malformed output is *not* fatal: ``valid`` is False and ``warning`` names the line
  and column. The run's status is never changed by this module.
* Only strict JSON is accepted: ``NaN``/``Infinity`` and numbers that overflow a float
  make the output invalid, so the stored value can always be serialised again.
* A parsed value whose compact JSON serialisation is larger than ``max_parsed_bytes``
  is not stored inline: ``parsed`` is None and ``artifact`` points at the stream's
  offloaded artifact (the raw bytes), with a warning. Either the parsed value or the
  artifact reference is recorded, never both.

Partial captures: ``data`` must be the whole stream. When a recorder offloaded the
stream, the excerpt in memory is not enough; the caller reads the full bytes from
the artifact (``read_artifact`` verifies them) and passes those.
``structured_from_capture`` does exactly that for a ``StreamCapture``. If the caller
really only has a prefix (``total_bytes > len(data)``), nothing is parsed: the record
says so in ``warning`` and refers to ``artifact`` when there is one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.core.outputs import StreamCapture, read_artifact  # the kernel's capture and artifact reader

#: Formats ``JobSpec.output_format`` may take.
OUTPUT_FORMATS = ("text", "json", "ndjson")
#: Largest parsed value (compact JSON serialisation, bytes) stored inline in the run row.
DEFAULT_MAX_PARSED_BYTES = 256 * 1024


class _NonStandardJSON(ValueError):
    """Raised from the decoder hooks for NaN, Infinity or a number that overflows a float."""


def _reject_constant(name: str) -> Any:
    """``parse_constant`` hook: NaN / Infinity / -Infinity are not JSON."""
    raise _NonStandardJSON(f"{name} is not a valid JSON value")


def _strict_float(text: str) -> float:
    """``parse_float`` hook: refuse numbers that only fit as +/-inf."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NonStandardJSON(f"number {text[:40]} is out of range")
    return value


#: Longest integer literal accepted in structured output (Python refuses > 4300 digits with a ValueError).
MAX_INT_DIGITS = 100


def _strict_int(text: str) -> int:
    """``parse_int`` hook: refuse integer literals too long to be a real count or id (never a crash)."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _NonStandardJSON(f"integer literal of {len(text.lstrip('-'))} digits is out of range")
    return int(text)


def _loads(text: str) -> Any:
    """Strict ``json.loads``: one value, no NaN/Infinity, no overflowing numbers, no huge integer literals."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_strict_float, parse_int=_strict_int)


def _record(
    fmt: str, *, valid: bool, warning: str | None, total_bytes: int, sha256: str, parsed: Any, artifact: str | None
) -> dict[str, Any]:
    """The record in its fixed key order."""
    return {
        "format": fmt,
        "valid": valid,
        "warning": warning,
        "bytes": total_bytes,
        "sha256": sha256,
        "parsed": parsed,
        "artifact": artifact,
    }


def unparsed_record(
    fmt: str, *, total_bytes: int, sha256: str, artifact: str | None, warning: str, valid: bool = False
) -> dict[str, Any]:
    """A record for output that was deliberately not parsed (limit exceeded, artifact unreadable...).

    Executors use it so that every run with captured stdout still reports format,
    size and digest, with the reason in ``warning``.
    """
    _check_format(fmt)
    return _record(fmt, valid=valid, warning=warning, total_bytes=total_bytes, sha256=sha256, parsed=None, artifact=artifact)


def _check_format(fmt: str) -> None:
    """Refuse an unknown format (the spec validator normally prevents it)."""
    if fmt not in OUTPUT_FORMATS:
        expected = ", ".join(OUTPUT_FORMATS)
        raise SchedulerError("OUTPUT_FORMAT_UNKNOWN", f"unknown output_format {fmt!r} (expected one of {expected})")


def _serialised_size(value: Any) -> int:
    """Bytes of the compact JSON serialisation of ``value`` (how it would be stored)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8"))


def _exceeds(value: Any, limit: int) -> tuple[bool, int | None]:
    """Whether the serialised value is over ``limit``; cheap lower bound first for big strings."""
    if isinstance(value, str) and len(value) > limit:
        return True, None  # a JSON string is at least as long as its characters
    size = _serialised_size(value)
    return size > limit, size


def _utf8_problem(data: bytes, exc: UnicodeDecodeError) -> str:
    """Describe where the first invalid UTF-8 byte is."""
    line = data.count(b"\n", 0, exc.start) + 1
    return f"stream is not valid UTF-8 at byte {exc.start} (line {line})"


def _parse_json(text: str) -> tuple[Any, str | None]:
    """Parse one JSON document; (value, None) or (None, warning naming the position)."""
    try:
        return _loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON at line {exc.lineno}, column {exc.colno} (char {exc.pos}): {exc.msg}"
    except _NonStandardJSON as exc:
        return None, f"invalid JSON: {exc}"
    except RecursionError:
        return None, "invalid JSON: nesting too deep to parse"


def _parse_ndjson(text: str) -> tuple[Any, str | None]:
    """Parse every nonblank line on its own; (list, None) or (None, warning naming the first bad line)."""
    values: list[Any] = []
    first_error: str | None = None
    bad = nonblank = 0
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        nonblank += 1
        try:
            values.append(_loads(line))
            continue
        except json.JSONDecodeError as exc:
            problem = f"line {lineno}, column {exc.colno}: {exc.msg}"
        except _NonStandardJSON as exc:
            problem = f"line {lineno}: {exc}"
        except RecursionError:
            problem = f"line {lineno}: nesting too deep to parse"
        bad += 1
        if first_error is None:
            first_error = problem
    if first_error is not None:
        return None, f"invalid NDJSON at {first_error} ({bad} of {nonblank} nonblank lines invalid)"
    return values, None


def normalise_text(text: str) -> str:
    """The text form of output: CRLF -> LF and no trailing whitespace at the end."""
    return text.replace("\r\n", "\n").rstrip()


def parse_structured(
    fmt: str,
    data: bytes,
    *,
    total_bytes: int,
    sha256: str,
    artifact: str | None,
    max_parsed_bytes: int = DEFAULT_MAX_PARSED_BYTES,
) -> dict[str, Any]:
    """Build the structured-output record of one stream (see the module docstring).

    ``data`` must hold the complete stream: when it was offloaded, read it back from
    the artifact first (``structured_from_capture`` does). ``total_bytes`` and
    ``sha256`` describe the whole stream as the recorder saw it; ``artifact`` is the
    stream's offloaded artifact reference, used when the parsed value is too large to
    store inline or when only a prefix is available. Never raises for malformed
    output; raises ``OUTPUT_FORMAT_UNKNOWN`` / ``STRUCTURED_INPUT_INVALID`` for
    programming errors.
    """
    _check_format(fmt)
    if total_bytes < len(data):
        raise SchedulerError(
            "STRUCTURED_INPUT_INVALID", f"total_bytes ({total_bytes}) is smaller than the data given ({len(data)} bytes)"
        )
    if max_parsed_bytes < 0:
        raise SchedulerError("STRUCTURED_INPUT_INVALID", "max_parsed_bytes must not be negative")
    if total_bytes > len(data):
        where = "see the artifact" if artifact else "the rest was not captured"
        return _record(
            fmt,
            valid=fmt == "text",
            warning=f"only {len(data)} of {total_bytes} bytes of the stream were available, so it was not parsed; {where}",
            parsed=None,
            artifact=artifact,
            total_bytes=total_bytes,
            sha256=sha256,
        )

    warning: str | None = None
    if fmt == "text":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = data.decode("utf-8", errors="replace")
            warning = _utf8_problem(data, exc) + "; undecodable bytes were replaced with U+FFFD"
        parsed: Any = normalise_text(text)
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            return _record(fmt, valid=False, warning=_utf8_problem(data, exc), parsed=None, artifact=None, total_bytes=total_bytes, sha256=sha256)
        parsed, problem = _parse_json(text) if fmt == "json" else _parse_ndjson(text)
        if problem is not None:
            return _record(fmt, valid=False, warning=problem, parsed=None, artifact=None, total_bytes=total_bytes, sha256=sha256)

    too_big, size = _exceeds(parsed, max_parsed_bytes)
    if too_big:
        shown = f"{size} bytes" if size is not None else f"more than {max_parsed_bytes} bytes"
        where = f"see the artifact {artifact}" if artifact else "the stream was not offloaded, so only its digest is kept"
        note = f"parsed value is {shown} when serialised, over the {max_parsed_bytes}-byte inline limit; {where}"
        warning = f"{warning}; {note}" if warning else note
        return _record(fmt, valid=True, warning=warning, parsed=None, artifact=artifact, total_bytes=total_bytes, sha256=sha256)
    return _record(fmt, valid=True, warning=warning, parsed=parsed, artifact=None, total_bytes=total_bytes, sha256=sha256)


def structured_from_capture(
    fmt: str,
    capture: StreamCapture,
    *,
    root: Path,
    head: bytes,
    max_parsed_bytes: int = DEFAULT_MAX_PARSED_BYTES,
) -> dict[str, Any]:
    """``parse_structured`` for a ``StreamCapture``, loading the full stream from its artifact when needed.

    ``head`` is the raw bytes the executor still holds in memory (the whole stream
    when it was small). If that is less than the whole stream and the stream was
    offloaded, the artifact is read through ``read_artifact`` (digest-checked); a
    missing or tampered artifact yields an invalid record whose warning carries the
    error code instead of an exception, because structured output is never fatal.
    """
    data = head[: capture.bytes]
    if len(data) < capture.bytes and capture.artifact:
        try:
            data = read_artifact(root, capture.artifact, capture.sha256, capture.bytes)
        except SchedulerError as exc:
            return unparsed_record(
                fmt,
                total_bytes=capture.bytes,
                sha256=capture.sha256,
                artifact=capture.artifact,
                warning=f"{exc.code}: {exc.message}",
            )
    return parse_structured(
        fmt,
        data,
        total_bytes=capture.bytes,
        sha256=capture.sha256,
        artifact=capture.artifact,
        max_parsed_bytes=max_parsed_bytes,
    )


__all__ = ["normalise_text", "parse_structured", "structured_from_capture", "unparsed_record"]
