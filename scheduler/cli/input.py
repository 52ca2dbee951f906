"""Reading JSON input for specs and patches: inline, ``--file PATH`` or ``--stdin``."""

from __future__ import annotations

import json
import sys
from typing import Any

from scheduler.errors import SchedulerError

#: Largest spec document accepted (an array of many jobs fits easily).
MAX_INPUT_BYTES = 4 * 1024 * 1024


def read_json_input(inline: str | None, file: str | None, stdin: bool, *, what: str = "job spec") -> Any:
    """Exactly one source; parse it as JSON (``INVALID_JSON``, ``PAYLOAD_READ_FAILED``, ``PAYLOAD_TOO_LARGE``)."""
    sources = [s for s in (inline is not None, file is not None, stdin) if s]
    if len(sources) != 1:
        raise SchedulerError("INVALID_ARGUMENT", f"give the {what} exactly one way: inline JSON, --file PATH or --stdin")
    if inline is not None:
        text = inline
    elif file is not None:
        try:
            with open(file, "rb") as fh:
                raw = fh.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            raise SchedulerError("PAYLOAD_READ_FAILED", f"cannot read {file}: {exc.strerror or exc}") from None
        text = _decode(raw, file)
    else:
        try:
            raw = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            raise SchedulerError("PAYLOAD_READ_FAILED", f"cannot read standard input: {exc}") from None
        text = _decode(raw, "standard input")
    if len(text.encode("utf-8", errors="replace")) > MAX_INPUT_BYTES:
        raise SchedulerError("PAYLOAD_TOO_LARGE", f"{what} is larger than {MAX_INPUT_BYTES} bytes")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON: nested too deeply") from None
    try:
        # JSON may spell lone UTF-16 surrogates ("\ud800"); they are not text, cannot be stored or printed.
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON text: it contains a lone UTF-16 surrogate escape") from None
    except (RecursionError, ValueError):
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON: nested too deeply") from None
    return doc


def _decode(raw: bytes, where: str) -> str:
    if len(raw) > MAX_INPUT_BYTES:
        raise SchedulerError("PAYLOAD_TOO_LARGE", f"{where} is larger than {MAX_INPUT_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SchedulerError("PAYLOAD_READ_FAILED", f"{where} is not UTF-8 text") from None
