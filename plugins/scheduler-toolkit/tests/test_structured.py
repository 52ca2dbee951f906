"""Tests for scheduler_toolkit.structured: json / ndjson / text records, non-fatal errors, inline limit, artifacts.

Real files and real StreamRecorders for the artifact cases; expected values are
written out by hand.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from scheduler_toolkit.structured import (
    DEFAULT_MAX_PARSED_BYTES,
    normalise_text,
    parse_structured,
    structured_from_capture,
    unparsed_record,
)

from scheduler.base.errors import SchedulerError
from scheduler.core.outputs import StreamRecorder, run_dir

KEYS = ["format", "valid", "warning", "bytes", "sha256", "parsed", "artifact"]


def parse(fmt: str, data: bytes, **kw: object) -> dict:
    """parse_structured on a complete in-memory stream."""
    kw.setdefault("artifact", None)
    return parse_structured(fmt, data, total_bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), **kw)  # type: ignore[arg-type]


def test_json_valid_record_shape() -> None:
    data = b'  {"a": [1, 2.5, "x"], "b": null}\n'
    rec = parse("json", data)
    assert list(rec) == KEYS
    assert rec == {
        "format": "json",
        "valid": True,
        "warning": None,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "parsed": {"a": [1, 2.5, "x"], "b": None},
        "artifact": None,
    }


def test_json_scalar_and_bom() -> None:
    assert parse("json", b"42")["parsed"] == 42
    assert parse("json", b"\xef\xbb\xbf[true]")["parsed"] == [True]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b'{"a": 1,\n "b": }', "line 2, column 7"),
        (b"", "line 1, column 1"),
        (b'{"a": 1} {"b": 2}', "Extra data"),
        (b"[1, 2", "line 1"),
    ],
)
def test_json_malformed_is_nonfatal(data: bytes, fragment: str) -> None:
    rec = parse("json", data)
    assert rec["valid"] is False
    assert rec["parsed"] is None and rec["artifact"] is None
    assert rec["warning"].startswith("invalid JSON")
    assert fragment in rec["warning"]
    assert rec["bytes"] == len(data)


@pytest.mark.parametrize("data", [b"NaN", b"[1, Infinity]", b'{"x": -Infinity}', b"1e400"])
def test_json_rejects_non_standard_numbers(data: bytes) -> None:
    rec = parse("json", data)
    assert rec["valid"] is False and rec["parsed"] is None
    assert "invalid JSON" in rec["warning"]


def test_json_too_deep_is_invalid_not_a_crash() -> None:
    rec = parse("json", b"[" * 200_000 + b"]" * 200_000)
    assert rec["valid"] is False
    assert "nesting" in rec["warning"]


def test_json_invalid_utf8_names_byte_and_line() -> None:
    rec = parse("json", b'"ok"\n"\xff"')
    assert rec["valid"] is False
    assert "byte 6" in rec["warning"] and "line 2" in rec["warning"]


def test_ndjson_valid_skips_blank_lines_and_crlf() -> None:
    data = b'{"n": 1}\r\n\n   \n[2]\n"three"\n'
    rec = parse("ndjson", data)
    assert rec["valid"] is True and rec["warning"] is None
    assert rec["parsed"] == [{"n": 1}, [2], "three"]


def test_ndjson_empty_is_valid_empty_list() -> None:
    assert parse("ndjson", b"\n\n")["parsed"] == []


def test_ndjson_invalid_line_is_named() -> None:
    data = b'{"ok": 1}\n\n{"bad": }\n{"ok": 2}\nnope\n'
    rec = parse("ndjson", data)
    assert rec["valid"] is False
    assert rec["parsed"] is None
    assert rec["warning"].startswith("invalid NDJSON at line 3, column 9")
    assert "2 of 4 nonblank lines invalid" in rec["warning"]


def test_ndjson_two_values_on_one_line_is_invalid() -> None:
    rec = parse("ndjson", b'{"a":1} {"b":2}\n')
    assert rec["valid"] is False and "line 1" in rec["warning"]


def test_text_normalised_and_always_valid() -> None:
    rec = parse("text", b"line one\r\nline two  \r\n\n \t\n")
    assert rec["valid"] is True and rec["warning"] is None
    assert rec["parsed"] == "line one\nline two"
    assert normalise_text("a\r\nb \n") == "a\nb"


def test_text_invalid_utf8_is_replaced_with_warning() -> None:
    rec = parse("text", b"caf\xe9\n")
    assert rec["valid"] is True
    assert rec["parsed"] == "caf\ufffd"
    assert "not valid UTF-8 at byte 3" in rec["warning"]


def test_parsed_over_limit_refers_to_artifact() -> None:
    data = json.dumps({"k": "v" * 1000}).encode()
    rec = parse("json", data, artifact="runs/r1/stdout", max_parsed_bytes=100)
    assert rec["valid"] is True
    assert rec["parsed"] is None
    assert rec["artifact"] == "runs/r1/stdout"
    assert "100-byte inline limit" in rec["warning"] and "runs/r1/stdout" in rec["warning"]


def test_parsed_under_limit_is_inline_and_no_artifact_ref() -> None:
    data = b'{"k": "v"}'
    rec = parse("json", data, artifact="runs/r1/stdout", max_parsed_bytes=100)
    assert rec["parsed"] == {"k": "v"} and rec["artifact"] is None


def test_large_text_over_limit_without_artifact() -> None:
    data = b"x" * (DEFAULT_MAX_PARSED_BYTES + 1)
    rec = parse("text", data)
    assert rec["valid"] is True and rec["parsed"] is None and rec["artifact"] is None
    assert "not offloaded" in rec["warning"]


def test_partial_data_is_not_parsed() -> None:
    rec = parse_structured("json", b'{"a"', total_bytes=1000, sha256="0" * 64, artifact="runs/r/stdout")
    assert rec["valid"] is False and rec["parsed"] is None
    assert rec["artifact"] == "runs/r/stdout"
    assert "only 4 of 1000 bytes" in rec["warning"]
    text = parse_structured("text", b"abc", total_bytes=10, sha256="0" * 64, artifact=None)
    assert text["valid"] is True and text["parsed"] is None and "not captured" in text["warning"]


def test_programming_errors_raise() -> None:
    with pytest.raises(SchedulerError) as exc:
        parse("yaml", b"a: 1")
    assert exc.value.code == "OUTPUT_FORMAT_UNKNOWN"
    with pytest.raises(SchedulerError) as exc:
        parse_structured("text", b"abcdef", total_bytes=3, sha256="0" * 64, artifact=None)
    assert exc.value.code == "STRUCTURED_INPUT_INVALID"


def test_unparsed_record() -> None:
    rec = unparsed_record("ndjson", total_bytes=5, sha256="ab" * 32, artifact=None, warning="output limit exceeded")
    assert list(rec) == KEYS
    assert rec["valid"] is False and rec["parsed"] is None and rec["warning"] == "output limit exceeded"


def _record_stream(tmp_path: Path, data: bytes) -> tuple[Path, object, bytes]:
    """Feed ``data`` through a real StreamRecorder; return (root, capture, head kept in memory)."""
    root = tmp_path / "artifacts"
    directory = run_dir(root, "run-1")
    rec = StreamRecorder(root=root, directory=directory, name="stdout", excerpt_bytes=16, offload_bytes=32)
    for i in range(0, len(data), 7):
        rec.write(data[i : i + 7])
    return root, rec.finish(), data[:16]


def test_from_capture_reads_offloaded_artifact(tmp_path: Path) -> None:
    lines = [{"i": i, "pad": "x" * 10} for i in range(20)]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    root, capture, head = _record_stream(tmp_path, data)
    assert capture.artifact == "runs/run-1/stdout"
    rec = structured_from_capture("ndjson", capture, root=root, head=head)
    assert rec["valid"] is True
    assert rec["parsed"] == lines
    assert rec["bytes"] == len(data) and rec["sha256"] == hashlib.sha256(data).hexdigest()


def test_from_capture_small_stream_uses_head(tmp_path: Path) -> None:
    root, capture, _ = _record_stream(tmp_path, b'{"small": true}')
    assert capture.artifact is None
    rec = structured_from_capture("json", capture, root=root, head=b'{"small": true}')
    assert rec["parsed"] == {"small": True}


def test_from_capture_tampered_artifact_is_nonfatal(tmp_path: Path) -> None:
    data = json.dumps({"v": list(range(50))}).encode()
    root, capture, head = _record_stream(tmp_path, data)
    (root / capture.artifact).write_bytes(data.replace(b"1", b"2"))
    rec = structured_from_capture("json", capture, root=root, head=head)
    assert rec["valid"] is False and rec["parsed"] is None
    assert rec["warning"].startswith("ARTIFACT_TAMPERED")
    assert rec["artifact"] == capture.artifact


@pytest.mark.parametrize("fmt, data", [("json", b'{"n": ' + b"9" * 5000 + b"}"), ("ndjson", b'{"a": 1}\n[-' + b"1" * 5000 + b"]\n")])
def test_a_huge_integer_literal_is_invalid_output_not_a_crash(fmt: str, data: bytes) -> None:
    """Regression: a 5,000-digit integer made Python's int() raise and the run end EXECUTOR_CRASHED."""
    rec = parse(fmt, data)
    assert rec["valid"] is False and rec["parsed"] is None
    assert "5000 digits is out of range" in rec["warning"]
    assert parse("json", b"1" + b"0" * 99)["parsed"] == 10**99  # long but plausible ids still parse
