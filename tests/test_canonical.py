"""json-sort-v1 (``scheduler.base.canonical``) held byte for byte to the Node reference.

The reference is ``JSON.stringify(sortKeysDeep(value))``: every object rebuilt by assigning
its keys in ``Array.prototype.sort()`` order to a fresh ``{}``, ``undefined`` as ``null``.
``tests/support/canonical_node.js`` is that reference; one ``node`` process per test module
(per xdist worker) answers every value of the module, one line each way, so the property
test can compare well over 10,000 generated values in a few seconds.

Values travel to node as ``json.dumps(value, ensure_ascii=True)``: ASCII only, so lone
surrogates survive as ``\\udxxx`` escapes, a high and a low surrogate code point written
next to each other become the one JavaScript character they are there, and floats travel
as their shortest round-trip ``repr`` (``-0.0`` parses to ``-0``).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import itertools
import json
import math
import operator
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.base.canonical import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    UNDEFINED,
    canonical_bytes,
    canonical_digest,
    canonical_json,
    format_number,
    hash_bytes,
    hash_text,
    is_digest,
    member_digest,
    member_template,
)
from scheduler.base.errors import SchedulerError

HELPER = Path(__file__).resolve().parent / "support" / "canonical_node.js"
#: A batch is written whole before its answers are read, so it (and its answers, at most 4/3 of
#: it) must fit a pipe's 64 KiB buffer; a longer line travels alone.
BATCH_BYTES = 32 * 1024
#: The property test's size: examples x values per example, and the floor the count is held to.
EXAMPLES = 500
VALUES_PER_EXAMPLE = (21, 25)
MIN_COMPARED = 10_000


# -- the node side ---------------------------------------------------------------------------


class NodeReference:
    """One long-lived ``node tests/support/canonical_node.js``: values in, reference bytes out."""

    def __init__(self, node: str) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the child's stderr, open for its life
        self._proc = subprocess.Popen(
            [node, str(HELPER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )

    def canonical(self, values: list[Any]) -> list[bytes]:
        """The reference's UTF-8 bytes for each value (an AssertionError naming the value if node threw)."""
        answers = self._ask([wire(value) for value in values])
        out = []
        for value, answer in zip(values, answers, strict=True):
            assert not answer.startswith("!"), f"node refused {ascii(value)[:300]}: {answer[1:]}"
            out.append(base64.b64decode(answer, validate=True))
        return out

    def hash_string(self, texts: list[str]) -> list[str]:
        """The reference's ``hashString`` (``sha256:`` + hex of the string's UTF-8) of each text."""
        answers = self._ask(["H" + json.dumps(text, ensure_ascii=True) for text in texts])
        assert not any(a.startswith("!") for a in answers), answers
        return ["sha256:" + a for a in answers]

    def _ask(self, lines: list[str]) -> list[str]:
        answers: list[str] = []
        batch: list[bytes] = []
        size = 0
        for line in lines:
            data = line.encode("ascii") + b"\n"
            if batch and size + len(data) > BATCH_BYTES:
                answers += self._exchange(batch)
                batch, size = [], 0
            batch.append(data)
            size += len(data)
        if batch:
            answers += self._exchange(batch)
        return answers

    def _exchange(self, batch: list[bytes]) -> list[str]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(b"".join(batch))
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise AssertionError(f"node exited ({self._proc.poll()}): {self.stderr()}") from None
        answers = []
        for _ in batch:
            line = self._proc.stdout.readline()
            if not line:
                raise AssertionError(f"node exited ({self._proc.wait(5)}): {self.stderr()}")
            answers.append(line.decode("ascii").rstrip("\n"))
        return answers

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-2000:]

    def close(self) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()
        finally:
            self._proc.stdout.close()
            self._stderr.close()


@pytest.fixture(scope="module")
def node() -> Iterator[NodeReference]:
    path = shutil.which("node")
    if path is None:
        pytest.skip("node is not on PATH: json-sort-v1 is held to Node's JSON.stringify, which needs Node.js (apt nodejs)")
    reference = NodeReference(path)
    try:
        yield reference
    finally:
        reference.close()


def _undefined_as_null(obj: Any) -> None:
    if obj is UNDEFINED:
        return None
    raise TypeError(f"{type(obj).__name__} has no JSON form")


def wire(value: Any) -> str:
    """``value`` as the one ASCII line node reads (UNDEFINED as null: the reference maps it so)."""
    return json.dumps(value, ensure_ascii=True, default=_undefined_as_null)


def js_units(text: str) -> tuple[int, ...]:
    """The UTF-16 code units JavaScript holds for a Python string (a surrogate code point is one unit)."""
    units: list[int] = []
    for ch in text:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    return tuple(units)


PROTO = js_units("__proto__")


def key_refused(value: Any) -> bool:
    """Whether some object in ``value`` has keys no JavaScript object can hold as given.

    A ``__proto__`` key (the reference's ``sorted[key] = ...`` calls the prototype setter
    and drops it) or two Python keys that are one JavaScript string (a surrogate pair
    written as two code points next to the astral character itself).
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            units = [js_units(key) for key in item]
            if PROTO in units or len(set(units)) != len(units):
                return True
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def compare_with_node(node: NodeReference, values: list[Any], tally: Counter[str] | None = None) -> int:
    """Assert ``canonical_bytes`` equals the reference for every value; return how many were compared."""
    sent = []
    for value in values:
        if key_refused(value):
            with pytest.raises(SchedulerError) as info:
                canonical_bytes(value)
            assert info.value.code == "CANONICAL_KEY_UNSUPPORTED", ascii(value)[:300]
            if tally is not None:
                tally["refused"] += 1
        else:
            sent.append(value)
    expected = [canonical_bytes(value) for value in sent]
    for value, ours, theirs in zip(sent, expected, node.canonical(sent), strict=True):
        assert ours == theirs, f"value {ascii(value)[:500]}\npython {ours[:500]!r}\nnode   {theirs[:500]!r}"
    if tally is not None:
        for value in sent:
            tally.update(features(value))
    return len(sent)


def _is_index(key: str) -> bool:
    return key.isascii() and key.isdigit() and (key == "0" or key[0] != "0") and int(key) <= 2**32 - 2


def features(value: Any) -> set[str]:
    """Which hard cases one value exercises (the property test asserts each one occurred)."""
    found: set[str] = set()
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= 100:
            found.add("nested 100+")
        if isinstance(item, str):
            units = js_units(item)
            for i, unit in enumerate(units):
                high = 0xD800 <= unit <= 0xDBFF
                low = 0xDC00 <= unit <= 0xDFFF
                if high and not (i + 1 < len(units) and 0xDC00 <= units[i + 1] <= 0xDFFF):
                    found.add("lone surrogate")
                if low and not (i > 0 and 0xD800 <= units[i - 1] <= 0xDBFF):
                    found.add("lone surrogate")
            if any(0xD800 <= ord(a) <= 0xDBFF and 0xDC00 <= ord(b) <= 0xDFFF for a, b in itertools.pairwise(item)):
                found.add("pair as two code points")
            if any(ord(ch) > 0xFFFF for ch in item):
                found.add("astral")
            if any(ord(ch) < 0x20 for ch in item):
                found.add("control")
            if "\u2028" in item or "\u2029" in item:
                found.add("U+2028/9")
        elif isinstance(item, float):
            if item != 0 and abs(item) < 2.2250738585072014e-308:
                found.add("subnormal")
            if abs(item) >= 1e21 or 0 < abs(item) < 1e-6:
                found.add("exponent form")
            if item.is_integer() and 0 < abs(item) < 1e21:
                found.add("integral float")
            if item == 0 and math.copysign(1, item) < 0:
                found.add("-0.0")
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) == MAX_SAFE_INTEGER:
            found.add("safe boundary")
        elif isinstance(item, dict):
            keys = list(item)
            if any(k[:1] and 0xE000 <= ord(k[0]) <= 0xFFFF for k in keys) and any(k[:1] > "\uffff" for k in keys):
                found.add("astral vs high BMP keys")
            index = sorted((k for k in keys if _is_index(k)), key=int)
            rest = sorted((k for k in keys if not _is_index(k)), key=js_units)
            if index and index + rest != sorted(keys, key=js_units):
                found.add("array-index keys out of string order")
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
    return found


# -- strategies ------------------------------------------------------------------------------

ALL_CHARS = st.characters(exclude_categories=())  # the full range, surrogate code points included
SPECIAL_CHARS = st.sampled_from(
    [chr(i) for i in range(0x20)]
    + ['"', "\\", "/", "\x7f", "\x80", "\u2028", "\u2029", "\ufeff", "\ufffd", "\ue000", "\uffff"]
    + ["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d", "\ude00"]
    + ["\U00010000", "\U0001f600", "\U0010ffff", "a", "0"]
)
HIGH_BMP = st.characters(min_codepoint=0xD800, max_codepoint=0xFFFF, exclude_categories=())
ASTRAL = st.characters(min_codepoint=0x10000, exclude_categories=())
HIGH_SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDBFF, exclude_categories=())
LOW_SURROGATE = st.characters(min_codepoint=0xDC00, max_codepoint=0xDFFF, exclude_categories=())
#: A high and a low surrogate code point next to each other: one astral character to JavaScript.
SURROGATE_PAIR = st.builds(operator.add, HIGH_SURROGATE, LOW_SURROGATE)
TEXT = st.lists(st.one_of(ALL_CHARS, SPECIAL_CHARS, HIGH_BMP, ASTRAL, SURROGATE_PAIR), max_size=10).map("".join)

#: Keys JavaScript objects enumerate before all others, in numeric order, and their near misses.
INDEX_KEYS = st.one_of(
    st.integers(0, 2**32 + 10).map(str),
    st.sampled_from(["0", "1", "2", "9", "10", "11", "99", "100", "4294967294", "4294967295", "4294967296"]),
    st.sampled_from(["", "!", "-1", "-0", "00", "01", "1.0", "1e3", " 1", "1 ", "\uff11", "\U0001d7ce"]),
)
KEYS = st.one_of(
    TEXT,
    INDEX_KEYS,
    st.builds(operator.add, st.sampled_from(["", "a", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0001f600"]), TEXT),
)

SAFE_INTEGERS = st.one_of(
    st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    st.sampled_from([0, 1, -1, MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER - 1, 2**31, 2**32, -(2**31)]),
)
SPECIAL_FLOATS = [
    0.0, -0.0, 1.0, -1.0, 100.0, 0.1, 0.2 + 0.1, 1e20, 1e21, -1e21, 1e22, 123456789012345680000.0, 1e-6, 1e-7,
    1.5e-7, 123e-20, 5e-324, -5e-324, 2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308,
    9007199254740992.0, 9007199254740993.0, 4.35, 0.000001234, 1.2345678901234567e-5,
]


def _decimal_float(digits: int, exponent: int, negative: bool) -> float:
    value = float(f"{'-' if negative else ''}{digits}e{exponent}")
    return value if math.isfinite(value) else 1.7976931348623157e308


FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-300, max_value=1e-300),  # tiny and subnormal
    st.builds(_decimal_float, st.integers(1, 10**17 - 1), st.integers(-40, 30), st.booleans()),  # around 1e-7 and 1e21
    st.builds(_decimal_float, st.integers(1, 10**17 - 1), st.integers(-345, 310), st.booleans()),
    st.integers(-(2**80), 2**80).map(float),  # integral floats, past 2**53 and 1e21 too
    st.sampled_from(SPECIAL_FLOATS),
)
SCALARS = st.one_of(st.none(), st.just(UNDEFINED), st.booleans(), SAFE_INTEGERS, FLOATS, TEXT)
CONTAINERS = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(KEYS, children, max_size=6),
    ),
    max_leaves=12,
)


def nest(inner: Any, depth: int, key: str, shape: list[bool]) -> Any:
    """``inner`` wrapped in ``depth`` arrays and objects (``shape`` says which, cycling)."""
    for level in range(depth):
        inner = {key: inner} if shape[level % len(shape)] else [inner]
    return inner


DEEP = st.builds(nest, SCALARS, st.integers(90, MAX_DEPTH), KEYS, st.lists(st.booleans(), min_size=1, max_size=4))
VALUES = st.one_of(SCALARS, CONTAINERS, CONTAINERS, CONTAINERS, DEEP)


# -- against node ----------------------------------------------------------------------------


def test_generated_values_match_node(node: NodeReference) -> None:
    compared = 0
    tally: Counter[str] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(st.lists(VALUES, min_size=VALUES_PER_EXAMPLE[0], max_size=VALUES_PER_EXAMPLE[1]))
    # The rarest shapes, always compared once (random generation alone missed one of them in about 1 CI run of 20).
    @example([{"\ue000x": 0, "\U0001f600": 1, "10": 2, "9": 3, "a\u2028": -0.0}, "\ud800", "\ud83d\ude00"])
    def check(values: list[Any]) -> None:
        nonlocal compared
        compared += compare_with_node(node, values, tally)

    check()
    print(f"compared {compared} values with node; tally {dict(tally)}")
    assert compared >= MIN_COMPARED, f"only {compared} values compared with node"
    wanted = {
        "lone surrogate", "pair as two code points", "astral", "control", "U+2028/9", "subnormal", "exponent form",
        "integral float", "-0.0", "safe boundary", "astral vs high BMP keys", "array-index keys out of string order",
        "nested 100+",
    }
    assert wanted <= set(tally), f"never generated: {sorted(wanted - set(tally))} (tally {dict(tally)})"


@pytest.mark.parametrize("depth", [100, 500, MAX_DEPTH])
def test_deep_nesting_matches_node(node: NodeReference, depth: int) -> None:
    values = [
        nest("leaf", depth, "k", [False]),
        nest(1.5, depth, "k", [True]),
        nest({"b": UNDEFINED, "a": [1e21, "\ud83d\ude00", "\udc00"]}, depth - 2, "\U0001f600", [True, False]),
    ]
    assert compare_with_node(node, values) == 3


def test_known_hard_cases_match_node(node: NodeReference) -> None:
    values: list[Any] = [
        {"b": 1, "a": 2, "\uffff": 3, "\U0001f600": 4, "\ue000": 5, "\ud7ff": 6},
        {"10": 1, "9": 2, "a": 3, "": 4, "!": 5, "4294967295": 6, "4294967294": 7, "01": 8, "0": 9, "-1": 10},
        {"\ud83d\ude00x": 1, "\U0001f600": 2, "\ud83d": 3, "\ude00": 4, "\ud83d\ud83d\ude00": 5},  # noqa: F601 - distinct lone surrogates
        ["\ud83d\ude00", "\ude00\ud83d", "\ud800\ud800\udc00", "a\udbff", "\u2028\u2029", "".join(map(chr, range(0x20)))],
        [1.0, -0.0, 1e21, 1e20, 1e-7, 1e-6, 123e-20, 0.1, 5e-324, 1.7976931348623157e308, 100.0, -1e-7],
        [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0, UNDEFINED, None, True, False, (), {}, [[]], {"": {}}],
        {"toJSON": "x", "constructor": 1, "hasOwnProperty": 2, "length": 3},
    ]
    assert compare_with_node(node, values) == len(values)


def test_node_drops_proto_keys_so_they_are_refused(node: NodeReference) -> None:
    # The reference assigns keys to a fresh {}: "__proto__" hits the prototype setter and is lost.
    assert node.canonical([{"__proto__": 1, "a": 2}, {"__proto__": {"x": 1}}]) == [b'{"a":2}', b"{}"]
    for value in ({"__proto__": 1, "a": 2}, [{"__proto__": None}]):
        with pytest.raises(SchedulerError) as info:
            canonical_json(value)
        assert info.value.code == "CANONICAL_KEY_UNSUPPORTED"


def test_hash_text_matches_node_hash_string(node: NodeReference) -> None:
    checked = 0

    @settings(max_examples=60, deadline=None, database=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(TEXT, min_size=20, max_size=25))
    def check(texts: list[str]) -> None:
        nonlocal checked
        texts = texts + ["", "\ud800", "a\udfffb", "\ud83d\ude00", "\ude00\ud83d", '"quoted"\n']
        assert [hash_text(text) for text in texts] == node.hash_string(texts)
        checked += len(texts)

    check()
    assert checked >= 60 * 26


# -- plain unit tests ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (-0.0, "0"),
        (0.0, "0"),
        (1e21, "1e+21"),
        (-1e21, "-1e+21"),
        (1e20, "100000000000000000000"),
        (123456789012345680000.0, "123456789012345680000"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (1e-6, "0.000001"),
        (123e-20, "1.23e-18"),
        (0.1, "0.1"),
        (0.1 + 0.2, "0.30000000000000004"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (100.0, "100"),
        (9007199254740992.0, "9007199254740992"),
        (1.5, "1.5"),
        (-2.5e-5, "-0.000025"),
        (MAX_SAFE_INTEGER, "9007199254740991"),
        (-MAX_SAFE_INTEGER, "-9007199254740991"),
        (0, "0"),
    ],
)
def test_number_vectors(value: float, text: str) -> None:
    assert canonical_json(value) == text
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("\b\f\n\r\t", '"\\b\\f\\n\\r\\t"'),
        ("\x00\x01\x1f", '"\\u0000\\u0001\\u001f"'),
        ('"\\/', '"\\"\\\\/"'),
        ("\x7f\x80\u2028\u2029\ufeff", '"\x7f\x80\u2028\u2029\ufeff"'),
        ("é😀", '"é😀"'),
        ("\ud800", '"\\ud800"'),
        ("a\udfffb\x01", '"a\\udfffb\\u0001"'),
        ("\ud83d\ude00", '"😀"'),  # a pair written as two code points is one character
        ("\ude00\ud83d", '"\\ude00\\ud83d"'),  # the wrong way round is two lone surrogates
        ("\ud800\ud800\udc00", '"\\ud800\U00010000"'),
    ],
)
def test_string_vectors(value: str, text: str) -> None:
    assert canonical_json(value) == text
    assert canonical_bytes(value) == text.encode("utf-8")


def test_keys_sort_by_utf16_code_units() -> None:
    value = {"b": 1, "a": 2, "\uffff": 3, "\U0001f600": 4}
    # U+1F600 is D83D DE00 in UTF-16, before U+FFFF (code point order would put it last).
    assert canonical_json(value) == '{"a":2,"b":1,"\U0001f600":4,"\uffff":3}'
    nested = {"z": {"b": [{"d": 1, "c": 2}], "a": None}, "y": 0}
    assert canonical_json(nested) == '{"y":0,"z":{"a":null,"b":[{"c":2,"d":1}]}}'


def test_array_index_keys_come_first_in_numeric_order() -> None:
    # The reference rebuilds each object, and JavaScript objects enumerate array-index keys
    # ("0" .. "4294967294", no leading zeros) first, in numeric order, then the rest as inserted.
    value = {"10": 1, "9": 2, "a": 3, "": 4, "4294967295": 5, "4294967294": 6, "01": 7, "0": 8, "-1": 9}
    assert canonical_json(value) == (
        '{"0":8,"9":2,"10":1,"4294967294":6,"":4,"-1":9,"01":7,"4294967295":5,"a":3}'
    )


def test_undefined_is_null() -> None:
    assert canonical_json(UNDEFINED) == "null"
    assert canonical_json({"b": UNDEFINED, "a": [UNDEFINED, 1]}) == '{"a":[null,1],"b":null}'
    assert canonical_json([UNDEFINED]) == "[null]"


def test_number_subclasses_are_written_as_numbers() -> None:
    class Level(int, enum.Enum):
        LOW = 1

    class Priority(enum.IntEnum):
        HIGH = 2

    class Ratio(float, enum.Enum):
        HALF = 0.5

    class Loud(float):
        def __repr__(self) -> str:
            return "loud"

    assert canonical_json([Level.LOW, Priority.HIGH, Ratio.HALF, Loud(1e21)]) == "[1,2,0.5,1e+21]"


def _code(value: Any) -> str:
    with pytest.raises(SchedulerError) as info:
        canonical_json(value)
    with pytest.raises(SchedulerError):
        canonical_digest(value)
    return info.value.code


def test_unsafe_integers_are_refused() -> None:
    for value in (2**53, -(2**53), 2**64, [1, {"a": 2**53}]):
        assert _code(value) == "CANONICAL_INTEGER_UNSAFE"
    assert canonical_json([2**53 - 1, -(2**53 - 1)]) == "[9007199254740991,-9007199254740991]"


def test_nan_and_infinities_are_refused() -> None:
    for value in (math.nan, math.inf, -math.inf, {"a": [math.inf]}):
        assert _code(value) == "CANONICAL_NUMBER_INVALID"


def test_unsupported_types_and_keys_are_refused() -> None:
    for value in (b"x", {1, 2}, frozenset(), object(), Decimal("1.5"), 1j, {1: "a"}, {None: 1}, {("a",): 1}, [{b"k": 1}]):
        assert _code(value) == "CANONICAL_TYPE_UNSUPPORTED", value
    with pytest.raises(SchedulerError) as info:
        format_number(True)
    assert info.value.code == "CANONICAL_TYPE_UNSUPPORTED"


def test_keys_javascript_cannot_hold_are_refused() -> None:
    assert _code({"__proto__": 1}) == "CANONICAL_KEY_UNSUPPORTED"
    assert _code({"a": [{"__proto__": {}}]}) == "CANONICAL_KEY_UNSUPPORTED"
    # Two Python keys that are one JavaScript string: the pair as two code points and the character.
    assert _code({"\ud83d\ude00": 1, "\U0001f600": 2}) == "CANONICAL_KEY_UNSUPPORTED"
    assert canonical_json({"__proto": 1, "__proto__x": 2, "\ud83d": 3, "\ude00": 4}) == (  # noqa: F601 - distinct lone surrogates
        '{"__proto":1,"__proto__x":2,"\\ud83d":3,"\\ude00":4}'
    )


def test_nesting_deeper_than_max_depth_is_refused() -> None:
    assert canonical_json(nest(0, MAX_DEPTH, "k", [False])) == "[" * MAX_DEPTH + "0" + "]" * MAX_DEPTH
    assert canonical_json(nest(0, MAX_DEPTH, "k", [True])).count("{") == MAX_DEPTH
    for shape in ([False], [True], [True, False]):
        assert _code(nest(0, MAX_DEPTH + 1, "k", shape)) == "CANONICAL_TOO_DEEP"
    cycle: list[Any] = []
    cycle.append(cycle)
    assert _code(cycle) == "CANONICAL_TOO_DEEP"


def test_canonical_digest_is_sha256_of_the_canonical_bytes() -> None:
    value = {"b": [1.0, "é", "\ud800"], "a": UNDEFINED}
    data = canonical_bytes(value)
    assert data == '{"a":null,"b":[1,"é","\\ud800"]}'.encode()
    digest = canonical_digest(value)
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert digest == hash_bytes(data) and is_digest(digest)
    assert canonical_digest({"a": 1, "b": 2}) == canonical_digest({"b": 2, "a": 1})


def test_hash_text_hashes_the_raw_string() -> None:
    text = '{"a": 1} é😀'
    assert hash_text(text) == "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert hash_text(text) != canonical_digest(text)  # not its JSON form
    assert hash_text("") == "sha256:" + hashlib.sha256(b"").hexdigest()
    assert hash_text("\ud83d\ude00") == hash_text("\U0001f600")
    # Lone surrogates are U+FFFD in UTF-8, as Node's hash.update(string, "utf8") writes them.
    assert hash_text("a\ud800b") == "sha256:" + hashlib.sha256("a\ufffdb".encode()).hexdigest()


def test_is_digest_accepts_only_the_stored_form() -> None:
    good = "sha256:" + "0123456789abcdef" * 4
    assert is_digest(good)
    assert is_digest(canonical_digest([]))
    for bad in (
        good.upper(), "SHA256:" + good[7:], good[:-1], good + "0", good + "\n", " " + good, "sha256:" + "A" * 64,
        "sha256:" + "g" * 64, "sha512:" + good[7:], good[7:], "sha256:" + "\uff10" * 64, good.encode(), None, 1,
    ):
        assert not is_digest(bad), bad


# -- the standard library fast path ------------------------------------------------------------


def _text_or_code(write: Any, value: Any) -> str:
    """What ``write`` makes of ``value``: its text, or the code of its refusal."""
    try:
        return write(value)
    except SchedulerError as exc:
        return f"refused: {exc.code}"


def test_fast_path_writes_what_the_writer_writes() -> None:
    """``canonical_json`` hands plain values to ``json.dumps``: on every generated value both give the same text (or the
    same refusal), and the fast path is really taken for most of them (else this compares the writer with itself)."""
    from scheduler.base import canonical

    taken = 0

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(st.lists(VALUES, min_size=5, max_size=10))
    def check(values: list[Any]) -> None:
        nonlocal taken
        for value in values:
            assert _text_or_code(canonical_json, value) == _text_or_code(canonical._written, value), value
            taken += canonical._plain(value, 0)

    check()
    assert taken >= 300, f"the fast path was taken for only {taken} generated values"


@pytest.mark.parametrize("value", [
    {"a": 1.0}, [0.5], {"10": 1, "9": 2}, {"\u00e9": 1, "e": 2}, {"__proto__": 1}, {"a": 2**53}, [-(2**53)],
    {"a": "\ud800"}, ["x\udfff"], {1: "a"}, {"a": Decimal(1)}, {"a": UNDEFINED}, {"a": True, "b": False, "c": None},
    {"": {"x": [1, "\u2028", {"y": ()}]}}, "\x00\x1f\"\\", [("a", 1)],
])
def test_fast_path_hands_back_what_it_cannot_write_exactly(value: Any) -> None:
    """Floats, array-index and non-ASCII keys, __proto__, unsafe integers, lone surrogates, other types: the writer decides."""
    from scheduler.base import canonical

    assert _text_or_code(canonical_json, value) == _text_or_code(canonical._written, value)


def test_fast_path_stops_at_max_depth() -> None:
    """Nesting past MAX_DEPTH is the writer's refusal, whichever path starts."""
    with pytest.raises(SchedulerError) as err:
        canonical_json(nest("leaf", MAX_DEPTH + 1, "k", [True, False]))
    assert err.value.code == "CANONICAL_TOO_DEEP"
    assert canonical_json(nest(1, MAX_DEPTH, "k", [True])).startswith('{"k":')


def _digest_or_code(value: dict[str, Any]) -> str:
    """``canonical_digest`` of ``value``, or the code of its refusal."""
    try:
        return canonical_digest(value)
    except SchedulerError as exc:
        return f"refused: {exc.code}"


def _composed_or_code(value: dict[str, Any], key: str, text: str) -> str | None:
    """``member_digest`` of ``value`` with member ``key`` = ``text`` (None: no template), or the code of its refusal."""
    try:
        template = member_template(value, key)
        return None if template is None else member_digest(template, text)
    except SchedulerError as exc:
        return f"refused: {exc.code}"


def test_a_member_template_composes_the_whole_objects_digest() -> None:
    """``member_template`` + ``member_digest`` give exactly ``canonical_digest`` of the whole object (or its refusal) for
    generated objects and strings (non-ASCII, surrogates, controls); they decline (None) exactly when a key's place is
    not a plain sort's or the member is already there, and compose for most generated objects (else this tests little)."""
    composed = 0

    @settings(max_examples=400, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(st.dictionaries(st.one_of(KEYS, st.sampled_from(["job_id", "a", "z", "schema", "version"])), CONTAINERS, max_size=8),
           st.sampled_from(["job_id", "a", "m", "~"]), TEXT)
    @example({"target": {"\u00e9": 1}, "b": [1.5, "\ud800"]}, "job_id", "j\u00f6b-\U0001f600\udc00")
    @example({"10": 1, "b": 2}, "job_id", "x")
    @example({"\u00e9": 1}, "job_id", "x")
    @example({"__proto__": 1}, "job_id", "x")
    @example({"job_id": 1}, "job_id", "x")
    @example({"a": float("nan")}, "job_id", "x")
    def check(value: dict[str, Any], key: str, text: str) -> None:
        nonlocal composed
        got = _composed_or_code(value, key, text)
        plain = key not in value and all(k.isascii() and not k.isdigit() and k != "__proto__" for k in value)
        if got is None:
            assert not plain, value
            return
        assert plain or got.startswith("refused"), value
        assert got == _digest_or_code({**value, key: text}), (value, key, text)
        composed += not got.startswith("refused")

    check()
    # Of the 400 generated objects, 85-122 composed over 15 random runs (about 100 on average): a floor of 100 failed
    # about half of them (one CI run refused). 50 still says the test exercises composition, and is over 4 standard
    # deviations below what the generator gives.
    assert composed >= 50, f"only {composed} generated objects were composed"
    for depth in (MAX_DEPTH - 1, MAX_DEPTH):  # a member is written at the depth the whole object puts it
        deep = {"a": nest(1, depth, "k", [True])}
        assert _composed_or_code(deep, "job_id", "x") == _digest_or_code({**deep, "job_id": "x"})
