"""Reading JSON input for specs and patches: inline, ``--file PATH`` or ``--stdin``.

Every user document goes through ``read_json_input``, which turns each way JSON can
fail into a coded error (never ``INTERNAL_ERROR``): not JSON or not standard JSON
(``NaN``, ``Infinity``) is ``INVALID_JSON``; a number no field can hold (an integer
literal of thousands of digits, which Python refuses to convert, or a float that
overflows to infinity) is ``VALIDATION_FAILED`` with an ``OUT_OF_RANGE`` detail
naming where it is (the parsing itself is ``scheduler.base.json_document``). It also holds the strict click parameter types the CLI uses for
numbers typed on the command line.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.base.files import read_capped
from scheduler.base.json_document import MAX_INPUT_BYTES, parse_json_document

__all__ = ["MAX_INPUT_BYTES", "AsciiIntRange", "parse_json_document", "read_json_input"]


def read_json_input(inline: str | None, file: str | None, stdin: bool, *, what: str = "job spec") -> Any:
    """Exactly one source; parse it as JSON (``INVALID_JSON``, ``PAYLOAD_READ_FAILED``, ``PAYLOAD_TOO_LARGE``).

    A number out of any field's range is ``VALIDATION_FAILED`` (``OUT_OF_RANGE`` per place).
    """
    sources = [s for s in (inline is not None, file is not None, stdin) if s]
    if len(sources) != 1:
        raise SchedulerError("INVALID_ARGUMENT", f"give the {what} exactly one way: inline JSON, --file PATH or --stdin")
    if inline is not None:
        text = inline
    elif file is not None:
        raw = read_capped(file, MAX_INPUT_BYTES, what=f"{what} file", unreadable="PAYLOAD_READ_FAILED",
                          too_large="PAYLOAD_TOO_LARGE")
        text = _decode(raw, file)
    else:
        try:
            raw = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            raise SchedulerError("PAYLOAD_READ_FAILED", f"cannot read standard input: {exc}") from None
        text = _decode(raw, "standard input")
    if len(text.encode("utf-8", errors="replace")) > MAX_INPUT_BYTES:
        raise SchedulerError("PAYLOAD_TOO_LARGE", f"{what} is larger than {MAX_INPUT_BYTES} bytes")
    return parse_json_document(text, what=what)


def _decode(raw: bytes, where: str) -> str:
    if len(raw) > MAX_INPUT_BYTES:
        raise SchedulerError("PAYLOAD_TOO_LARGE", f"{where} is larger than {MAX_INPUT_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SchedulerError("PAYLOAD_READ_FAILED", f"{where} is not UTF-8 text") from None


class AsciiIntRange(click.ParamType):
    """An integer option written in ASCII digits only, within ``[minimum, maximum]``.

    ``click.IntRange`` converts with ``int()``, which also reads other scripts' digits
    (``١`` is 1) and underscores (``1_0``); a count typed on a command line should mean
    exactly what it shows.
    """  # noqa: RUF002 - the Arabic-Indic digit is the example

    name = "integer"

    def __init__(self, minimum: int, maximum: int) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Parse ``value`` (a string from the command line, or an int default) or fail the option."""
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            body = text[1:] if text[:1] in "+-" else text
            if not body or len(body) > 19 or not (body.isascii() and body.isdigit()):
                self.fail(f"{value!r} is not an integer written in ASCII digits", param, ctx)
            number = int(text)
        if not self.minimum <= number <= self.maximum:
            self.fail(f"{number} is not in the range {self.minimum}<=x<={self.maximum}", param, ctx)
        return number

    def __repr__(self) -> str:
        return f"AsciiIntRange({self.minimum}, {self.maximum})"
