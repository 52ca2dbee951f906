"""``json-sort-v1``: canonical JSON byte-identical to sorted-key ``JSON.stringify``, and ``sha256:`` digests.

Execution artifacts, approvals, evidence and credential presentations bind to digests
of canonical JSON, and other tools (the Node ecosystem's handoff compilers and
verifiers) recompute those digests. So the bytes must be exactly what JavaScript
produces for the same value after sorting object keys:

* object keys in the order the reference's rebuilt objects enumerate them: it assigns the
  keys, sorted by UTF-16 code units (``Array.prototype.sort``), to a fresh ``{}``, and a
  JavaScript object lists array-index keys (``"0"`` .. ``"4294967294"``, no leading zeros)
  first, in numeric order, then the rest as inserted. So ``{"10", "9", "", "a"}`` is written
  ``"9","10","","a"``. Recursively; arrays keep their order;
* no white space; strings escape only ``"``, ``\\`` and U+0000-U+001F (``\\b \\f \\n \\r \\t``
  short forms, others ``\\u00xx``), lone surrogates as ``\\udxxx``; everything else raw
  (U+2028/U+2029 included);
* numbers as ``Number.prototype.toString`` writes them: ``1.0`` is ``1``, ``-0`` is ``0``,
  ``1e21`` is ``1e+21``, ``1e-7`` is ``1e-7``;
* ``UNDEFINED`` (JavaScript's ``undefined``) becomes ``null`` wherever it appears.

Values JavaScript could not carry exactly are refused with a coded error rather than
silently changed: integers beyond +/-(2^53 - 1) (``CANONICAL_INTEGER_UNSAFE``), NaN and
infinities (``CANONICAL_NUMBER_INVALID``), non-string keys and other Python types
(``CANONICAL_TYPE_UNSUPPORTED``), keys no JavaScript object holds as given
(``CANONICAL_KEY_UNSUPPORTED``: ``"__proto__"``, which the reference's assignment hands to the
prototype setter and so drops, and two keys that are one JavaScript string, a surrogate pair
written as two code points beside the astral character itself), nesting deeper than
``MAX_DEPTH`` (``CANONICAL_TOO_DEEP``). A property-based test holds this module to ``node``
(tests/test_canonical.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any, TypeGuard

from scheduler.base.errors import SchedulerError

#: The canonicalization's name and version as artifacts and evidence record them.
CANONICALIZATION = "json-sort-v1"
CANONICALIZATION_VERSION = 1
#: Largest integer JavaScript represents exactly (``Number.MAX_SAFE_INTEGER``).
MAX_SAFE_INTEGER = 2**53 - 1
#: Deepest nesting accepted (arrays and objects); artifacts are a handful of levels deep.
MAX_DEPTH = 512
#: Largest array index (2^32 - 2): keys ``"0"`` .. this one come first in a JavaScript object.
MAX_ARRAY_INDEX = 2**32 - 2

_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_ARRAY_INDEX = re.compile("0|[1-9][0-9]{0,9}")
_NEEDS_ESCAPE = re.compile('[\x00-\x1f"\\\\\ud800-\udfff]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class _Undefined:
    """JavaScript's ``undefined``: canonicalised as ``null`` (json-sort-v1 rule)."""

    _instance: _Undefined | None = None

    def __new__(cls) -> _Undefined:  # noqa: PYI034 - a singleton: every call returns the one instance
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNDEFINED"

    def __bool__(self) -> bool:
        return False


UNDEFINED = _Undefined()


def canonical_json(value: Any) -> str:
    """``value`` as json-sort-v1 text (what ``JSON.stringify`` gives after sorting keys).

    The run pipeline checks every run's job against its artifact digest, so this is on the
    dispatcher's hot path: a value made only of what ``json.dumps`` writes exactly as the
    reference does (``_plain``) is written by the standard library's C encoder; anything
    else (floats, keys that sort differently in JavaScript, lone surrogates, other types,
    unsafe integers, deep nesting) by ``_write``, which also raises the coded refusals.
    """
    if _plain(value, 0):
        text = _dumps(value)
        if _SURROGATE.search(text) is None:  # a lone surrogate in a string: the reference escapes it
            return text
    return _written(value)


def _written(value: Any) -> str:
    """``value`` as json-sort-v1 text, written by this module (every case, every refusal)."""
    parts: list[str] = []
    _write(value, parts, 0)
    return "".join(parts)


#: The standard library's encoder set to json-sort-v1's layout (C speed). Exact for ``_plain`` values: their strings
#: are escaped by the same ``encode_basestring`` as ``_string`` uses, their keys sort by code point as UTF-16 does
#: for ASCII, and their numbers are safe integers (``int.__repr__``).
_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")).encode


def _plain(value: Any, depth: int) -> bool:
    """Whether ``json.dumps`` (``_dumps``) writes ``value`` byte for byte as ``_write`` would.

    Exact types only (a subclass may write itself otherwise): dicts with ASCII keys that are
    not array indices (JavaScript lists those first) and not ``__proto__``, lists and tuples,
    strings, None, booleans and safe integers, nested at most ``MAX_DEPTH`` deep. Floats are
    not plain (``repr`` is not ``Number.prototype.toString``). Lone surrogates in strings
    are caught after writing (``canonical_json``).
    """
    t = type(value)
    if t is dict:
        for key in value:
            if type(key) is not str or not key.isascii() or key.isdigit() or key == "__proto__":
                return False
        items: Any = value.values()
    elif t is list or t is tuple:
        items = value
    else:
        return t is str or value is None or t is bool or (t is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    if depth >= MAX_DEPTH:
        return False
    for item in items:
        it = type(item)
        if it is str or item is None or it is bool:
            continue
        if it is int:
            if -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                continue
            return False
        if not _plain(item, depth + 1):
            return False
    return True


def member_template(value: dict[str, Any], key: str) -> tuple[str, str] | None:
    """The canonical text of ``value`` with one more string member ``key``, split around that member's value.

    ``(before, after)`` such that ``before + canonical_json(s) + after == canonical_json({**value, key: s})`` for
    every string ``s`` (``member_digest`` composes it): many objects that differ only in that one string (the
    native artifacts of one job shape, which differ only in their job id) are canonicalised once, not once each.
    Written by ``_write`` itself, member by member at the depth the whole object puts them, so the text is the
    whole object's by construction, and a value it refuses is refused here with the same code. None when ``key``
    is already in ``value``, or when any key's place is not a plain sort's (not ASCII, an array index,
    ``__proto__``, not a string): then the caller canonicalises each whole object.
    """
    keys = [*value, key]
    if key in value or not all(_plain_key(k) for k in keys):
        return None
    members: list[str | None] = []
    for k in sorted(keys):
        if k == key:
            members.append(None)
            continue
        out = [_string(k), ":"]
        _write(value[k], out, 1)
        members.append("".join(out))
    at = members.index(None)
    before = "{" + "".join(f"{m}," for m in members[:at]) + _string(key) + ":"
    after = "".join(f",{m}" for m in members[at + 1:]) + "}"
    return before, after


def member_digest(template: tuple[str, str], text: str) -> str:
    """``canonical_digest`` of the object ``template`` (``member_template``) describes, with ``text`` as its member."""
    if not isinstance(text, str):
        raise _unsupported(text)
    before, after = template
    return "sha256:" + hashlib.sha256((before + _string(text) + after).encode("utf-8")).hexdigest()


def canonical_bytes(value: Any) -> bytes:
    """The UTF-8 bytes of ``canonical_json(value)``: what digests and signatures cover."""
    return canonical_json(value).encode("utf-8")


def canonical_digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


def hash_text(text: str) -> str:
    """``sha256:<hex>`` of a string's UTF-8 bytes (the string itself, not its JSON form).

    As the reference's ``hash.update(string, "utf8")``: a surrogate pair written as two code
    points is its one character, and a lone surrogate is U+FFFD.
    """
    return "sha256:" + hashlib.sha256(_utf8(text)).hexdigest()


def hash_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of raw bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a digest in the one stored form: ``sha256:`` and 64 lowercase hex digits."""
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None


def format_number(value: float) -> str:
    """A number as JavaScript's ``Number.prototype.toString`` writes it (refusing what JS cannot hold)."""
    if isinstance(value, bool):
        raise _unsupported(value)
    if isinstance(value, int):
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return int.__repr__(value)  # not str(): an int-mixin Enum's str() is its name
        raise SchedulerError(
            "CANONICAL_INTEGER_UNSAFE",
            f"integer {value} is outside JavaScript's safe range (+/-{MAX_SAFE_INTEGER}); write it as a string",
        )
    if value != value or value in (float("inf"), float("-inf")):
        raise SchedulerError("CANONICAL_NUMBER_INVALID", f"{value!r} has no JSON form")
    if value == 0:
        return "0"
    sign, digit_tuple, exponent = Decimal(float.__repr__(value)).as_tuple()  # a subclass's repr may be anything
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    exponent += len(digit_tuple) - len(digits)  # type: ignore[operator]
    digits = digits.lstrip("0") or "0"
    k = len(digits)
    n = k + int(exponent)  # value = 0.DIGITS x 10^n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return "-" + text if sign else text


def _utf16_normalised(text: str) -> str:
    """Join surrogate code points that form a valid pair into one character (JavaScript sees them as one)."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")


def _utf8(text: str) -> bytes:
    """UTF-8 as JavaScript encodes a string: pairs joined, lone surrogates as U+FFFD."""
    return _SURROGATE.sub("\ufffd", _utf16_normalised(text)).encode("utf-8")


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group(0)
    return _SHORT_ESCAPES.get(ch) or f"\\u{ord(ch):04x}"


def _string(text: str) -> str:
    if _SURROGATE.search(text) is None:
        return encode_basestring(text)  # C speed; escapes exactly what JSON.stringify escapes here
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, _utf16_normalised(text)) + '"'


def _key_order(key: str) -> tuple[int, int, bytes]:
    """Where the reference writes ``key`` (already UTF-16-normalised): array indices first, by value."""
    if _ARRAY_INDEX.fullmatch(key) is not None and int(key) <= MAX_ARRAY_INDEX:
        return (0, int(key), b"")
    return (1, 0, key.encode("utf-16-be", "surrogatepass"))


def _plain_key(key: Any) -> bool:
    """A key whose place needs no work: ASCII (code point order is UTF-16 order), not an array index, not ``__proto__``."""
    return type(key) is str and key.isascii() and not (key[:1].isdigit() and key.isdigit()) and key != "__proto__"


def _sorted_keys(value: dict[Any, Any]) -> list[tuple[str, str]]:
    """``(key as written, key in value)`` in the reference's order, refusing keys JavaScript cannot hold."""
    if all(_plain_key(key) for key in value):  # the common case (artifacts, evidence): a plain sort, same order
        return [(key, key) for key in sorted(value)]
    keys: dict[str, str] = {}
    for key in value:
        if not isinstance(key, str):
            raise SchedulerError("CANONICAL_TYPE_UNSUPPORTED", f"object keys must be strings, not {type(key).__name__}")
        js_key = _utf16_normalised(key)
        if js_key == "__proto__":
            raise SchedulerError(
                "CANONICAL_KEY_UNSUPPORTED", 'the object key "__proto__" has no json-sort-v1 form (JavaScript drops it)'
            )
        if js_key in keys:
            raise SchedulerError(
                "CANONICAL_KEY_UNSUPPORTED",
                f"object keys {keys[js_key]!a} and {key!a} are the same JavaScript string (a surrogate pair)",
            )
        keys[js_key] = key
    return sorted(keys.items(), key=lambda item: _key_order(item[0]))


def _unsupported(value: Any) -> SchedulerError:
    return SchedulerError("CANONICAL_TYPE_UNSUPPORTED", f"{type(value).__name__} values have no json-sort-v1 form")


def _write(value: Any, out: list[str], depth: int) -> None:
    if value is None or value is UNDEFINED:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, (int, float)):
        out.append(format_number(value))
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise SchedulerError("CANONICAL_TOO_DEEP", f"nesting deeper than {MAX_DEPTH} levels")
        out.append("{")
        for i, (js_key, key) in enumerate(_sorted_keys(value)):
            if i:
                out.append(",")
            out.append(_string(js_key))
            out.append(":")
            _write(value[key], out, depth + 1)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise SchedulerError("CANONICAL_TOO_DEEP", f"nesting deeper than {MAX_DEPTH} levels")
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out, depth + 1)
        out.append("]")
    else:
        raise _unsupported(value)
