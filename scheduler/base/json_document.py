"""Strict parsing of one user-supplied JSON document: every way JSON can fail becomes a coded error.

Not JSON or not standard JSON (``NaN``, ``Infinity``) is ``INVALID_JSON``; an object
naming one key twice is ``DUPLICATE_KEY`` (``json`` would keep the last one silently); a number no
field can hold (an integer literal of thousands of digits, which Python refuses to
convert, or a float that overflows to infinity) is ``VALIDATION_FAILED`` with an
``OUT_OF_RANGE`` detail naming where it is. The CLI reads its documents with it
(``scheduler.cli.input``), and so does ``apply`` (``scheduler.ops.declarative``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from scheduler.base.errors import SchedulerError

#: Largest spec document accepted (an array of many jobs fits easily).
MAX_INPUT_BYTES = 4 * 1024 * 1024

#: Most digits an integer literal in a document may have. Every integer a spec holds is far
#: shorter (epoch milliseconds have 13 digits, a 64-bit column 19); Python itself refuses to
#: convert more than ``sys.get_int_max_str_digits()`` digits (4300 by default, never below 640),
#: so this bound keeps the conversion safe whatever that setting is.
MAX_INT_DIGITS = 100


class _OutOfRange:
    """Stands in for a number literal no field can hold, so its place can be reported after parsing.

    A plain slotted class rather than attrs: this module is on every CLI start-up path that
    takes a count or a spec, and attrs costs ~20 ms to import.
    """

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal

    def describe(self) -> str:
        """What is wrong with the literal, short enough for a message."""
        digits = sum(ch.isdigit() for ch in self.literal)
        if any(ch in self.literal for ch in ".eE"):
            return f"number {self.literal[:24]}{'...' if len(self.literal) > 24 else ''} is out of range (it overflows a float)"
        return f"integer literal of {digits} digits is out of range (at most {MAX_INT_DIGITS} digits)"


def parse_json_document(text: str, *, what: str = "job spec") -> Any:
    """Parse one user-supplied JSON document strictly; every failure is a coded ``SchedulerError``.

    Standard JSON only (no ``NaN``/``Infinity``), no lone surrogate escapes, and no number
    literal beyond what any field can hold: Python's own int-from-string limit would
    otherwise surface as an unexpected ``ValueError``.
    """
    out_of_range: list[_OutOfRange] = []

    def parse_int(literal: str) -> int | _OutOfRange:
        if len(literal) - literal.startswith("-") > MAX_INT_DIGITS:
            out_of_range.append(_OutOfRange(literal))
            return out_of_range[-1]
        return int(literal)

    def parse_float(literal: str) -> float | _OutOfRange:
        value = float(literal)
        if not math.isfinite(value):
            out_of_range.append(_OutOfRange(literal))
            return out_of_range[-1]
        return value

    def parse_constant(name: str) -> Any:
        raise _NonStandardConstant(name)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            seen: set[str] = set()
            key = next(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise _DuplicateKey(key)
        return obj

    try:
        doc = json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant,
                         object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except _NonStandardConstant as exc:
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON: {exc.args[0]} is not a JSON value") from None
    except _DuplicateKey as exc:
        raise SchedulerError("DUPLICATE_KEY", f"{what} gives the key {exc.args[0][:64]!r} twice in one object (JSON parsers"
                             " disagree on which one wins): keep one") from None
    except RecursionError:
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON: nested too deeply") from None
    if out_of_range:
        details = _out_of_range_details(doc)
        fields = ", ".join(sorted({d["field"] or "(document)" for d in details}))
        raise SchedulerError("VALIDATION_FAILED", f"{what} has numbers out of range: {fields}", details=details)
    try:
        # JSON may spell lone UTF-16 surrogates ("\ud800"); they are not text, cannot be stored or printed.
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON text: it contains a lone UTF-16 surrogate escape") from None
    except (RecursionError, ValueError):
        raise SchedulerError("INVALID_JSON", f"{what} is not valid JSON: nested too deeply") from None
    return doc


class _NonStandardConstant(ValueError):
    """Raised by the decoder for ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON)."""


class _DuplicateKey(ValueError):
    """Raised by the decoder for an object naming one key twice (``json`` would keep the last silently)."""


def _out_of_range_details(doc: Any) -> list[dict[str, Any]]:
    """One ``OUT_OF_RANGE`` detail per out-of-range literal, with its path (``index`` for a top-level array).

    Iterative, so a document nested as deeply as the parser allows cannot overflow the stack.
    """
    details: list[dict[str, Any]] = []
    top_array = isinstance(doc, list)
    stack: list[tuple[Any, str, int | None]] = [(doc, "", None)]
    while stack:
        value, path, index = stack.pop()
        if isinstance(value, _OutOfRange):
            item: dict[str, Any] = {"field": path, "code": "OUT_OF_RANGE", "error": value.describe()}
            if index is not None:
                item["index"] = index
            details.append(item)
        elif isinstance(value, dict):
            for key, child in reversed(list(value.items())):
                stack.append((child, f"{path}.{key}" if path else str(key), index))
        elif isinstance(value, list):
            for i, child in reversed(list(enumerate(value))):
                if top_array and value is doc:
                    stack.append((child, "", i))
                else:
                    stack.append((child, f"{path}[{i}]", index))
    return details


__all__ = ["MAX_INPUT_BYTES", "MAX_INT_DIGITS", "parse_json_document"]
