"""Issue 9, defects 5 and 11: hostile CLI input that crashed parsing or slipped through unchecked.

Defect 5: an integer literal of 5,000 digits in a spec hit Python's int-from-string digit
limit and surfaced as ``INTERNAL_ERROR`` (exit 70). Defect 11: empty ``--at``/``--in`` were
ignored (the job silently became manual), names with invisible or reordering characters were
accepted, ``runs list --status ''`` and ``--limit ١`` were accepted, and ``jobs validate``
accepted an array with duplicate names that ``jobs add`` then refused.

Real ``scheduler`` processes where the defect was seen at process level (an exit status),
in-process CLI calls otherwise.
"""  # noqa: RUF002 - the Arabic-Indic digit is the defect

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import scheduler_cmd

from scheduler.plugins.stores import open_store

HUGE = "9" * 5000
MANUAL = {"schedule_kind": "manual", "payload_message": "echo hi"}


def sub(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real ``scheduler`` in a subprocess."""
    full = {**os.environ, **(env or {})}
    full.pop("SCHEDULER_DEBUG", None)
    return subprocess.run([*scheduler_cmd(), *args], input=stdin, capture_output=True, env=full, timeout=60)


def run_cli(*args: str) -> tuple[int, dict[str, Any]]:
    """In-process ``scheduler --json ARGS``; returns the exit status and the one JSON object printed."""
    from scheduler.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["--json", *args])
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    assert len(lines) == 1, (out.getvalue(), err.getvalue())
    return code, json.loads(lines[0])


def spec(name: str = "job", **fields: Any) -> str:
    return json.dumps({"name": name, **MANUAL, **fields})


def refused(res: subprocess.CompletedProcess, code: str, exit_status: int = 1) -> dict[str, Any]:
    """Assert a real process failed with one JSON error object of ``code`` and no traceback."""
    assert b"Traceback" not in res.stderr, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert (res.returncode, doc["ok"], doc["code"]) == (exit_status, False, code), (res.returncode, doc)
    return doc


# --- defect 5: huge number literals ----------------------------------------------------------------------------------


def _huge_spec() -> str:
    return '{"name": "huge", "schedule_kind": "manual", "payload_message": "echo hi", "run_timeout_ms": ' + HUGE + "}"


@pytest.mark.parametrize("how", ["inline", "file", "stdin", "array", "validate", "dry-run"])
def test_a_5000_digit_integer_is_a_coded_validation_error_and_stores_nothing(how: str, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    text = _huge_spec()
    args: list[str] = ["jobs", "add", text]
    stdin = b""
    if how == "file":
        (tmp_path / "spec.json").write_text(text)
        args = ["jobs", "add", "--file", str(tmp_path / "spec.json")]
    elif how == "stdin":
        args, stdin = ["jobs", "add", "--stdin"], text.encode()
    elif how == "array":
        args = ["jobs", "add", f"[{spec('fine')}, {text}]"]
    elif how == "validate":
        args = ["jobs", "validate", text]
    elif how == "dry-run":
        args = ["jobs", "add", "--dry-run", text]
    doc = refused(sub("--db", str(db), "--json", *args, stdin=stdin), "VALIDATION_FAILED")
    detail = {"field": "run_timeout_ms", "code": "OUT_OF_RANGE", **({"index": 1} if how == "array" else {})}
    assert [{k: d[k] for k in detail} for d in doc["details"]] == [detail]
    assert "5000 digits" in doc["details"][0]["error"]
    assert not db.exists()  # refused while parsing, before the database is even opened: nothing stored
    human = sub("--db", str(db), *args, stdin=stdin)
    assert human.returncode == 1 and b"error [VALIDATION_FAILED]" in human.stderr and b"Traceback" not in human.stderr


def test_a_huge_integer_in_an_update_patch_changes_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    assert sub("--db", db, "--json", "jobs", "add", spec("keep")).returncode == 0
    before = json.loads(sub("--db", db, "--json", "jobs", "get", "keep").stdout)["job"]
    doc = refused(sub("--db", db, "--json", "jobs", "update", "keep", '{"max_retries": -' + HUGE + "}"), "VALIDATION_FAILED")
    assert [(d["field"], d["code"]) for d in doc["details"]] == [("max_retries", "OUT_OF_RANGE")]
    assert json.loads(sub("--db", db, "--json", "jobs", "get", "keep").stdout)["job"] == before


def test_out_of_range_numbers_are_located_wherever_they_are() -> None:
    nested = '{"name": "n", "schedule_kind": "manual", "payload_message": "x", "executor_options": {"a": [1, ' + HUGE + "]}}"
    code, doc = run_cli("jobs", "validate", nested)
    assert code == 1 and doc["code"] == "VALIDATION_FAILED"
    assert [(d["field"], d["code"]) for d in doc["details"]] == [("executor_options.a[1]", "OUT_OF_RANGE")]
    code, doc = run_cli("jobs", "validate", "[" + spec("a") + ', {"name": "b", "max_retries": 1e999}]')
    assert code == 1 and [(d["index"], d["field"], d["code"]) for d in doc["details"]] == [(1, "max_retries", "OUT_OF_RANGE")]
    code, doc = run_cli("jobs", "validate", HUGE)
    assert code == 1 and doc["details"][0]["field"] == ""
    # the largest integer a field could ever hold still parses, and the validator judges it
    code, doc = run_cli("jobs", "validate", spec(run_timeout_ms=int("9" * 100)))
    assert code == 1 and [(d["field"], d["code"]) for d in doc["details"]] == [("run_timeout_ms", "OUT_OF_RANGE")]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_standard_json_constants_are_invalid_json(literal: str) -> None:
    code, doc = run_cli("jobs", "validate", '{"name": "x", "schedule_kind": "manual", "payload_message": "x", "max_retries": ' + literal + "}")
    assert code == 1 and doc["code"] == "INVALID_JSON" and literal in doc["error"]


def test_parsing_is_safe_whatever_the_interpreter_digit_limit() -> None:
    """Python refuses int() of more than sys.get_int_max_str_digits() digits (640 at the lowest setting)."""
    res = subprocess.run([sys.executable, "-X", "int_max_str_digits=640", "-m", "scheduler", "--json", "jobs", "validate",
                          '{"name": "x", "schedule_kind": "manual", "payload_message": "x", "max_retries": ' + "9" * 700 + "}"],
                         capture_output=True, timeout=60)
    assert res.returncode == 1 and json.loads(res.stdout)["code"] == "VALIDATION_FAILED"


# --- defect 11: empty --at / --in -----------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--at", "--in"])
@pytest.mark.parametrize("value", ["", "   "])
@pytest.mark.parametrize("dry_run", [False, True])
def test_an_empty_at_or_in_is_refused_not_ignored(option: str, value: str, dry_run: bool, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    args = ["jobs", "add", *(["--dry-run"] if dry_run else []), option, value, spec("once")]
    doc = refused(sub("--db", str(db), "--json", *args), "INVALID_ARGUMENT")
    assert option in doc["error"]
    assert not db.exists()


def test_at_and_in_still_make_a_one_shot(tmp_path: Path) -> None:
    code, doc = run_cli("jobs", "add", "--dry-run", "--in", "5m", spec("soon"))
    assert code == 0 and doc["job"]["schedule_kind"] == "at"
    code, doc = run_cli("jobs", "add", "--dry-run", "--at", "2099-01-01T00:00:00Z", spec("later"))
    assert code == 0 and doc["job"]["schedule_at"] == "2099-01-01T00:00:00.000Z"
    code, doc = run_cli("jobs", "add", "--dry-run", "--at", "", "--in", "5m", spec("both"))
    assert code == 1 and doc["code"] == "INVALID_ARGUMENT" and "not both" in doc["error"]


# --- defect 11: job names -------------------------------------------------------------------------------------------


BAD_NAMES = {
    "next line U+0085": "a\u0085b",
    "line separator U+2028": "a\u2028b",
    "paragraph separator U+2029": "a\u2029b",
    "right-to-left override U+202E": "invoice\u202etxt.exe",
    "right-to-left mark U+200F": "a\u200fb",
    "first strong isolate U+2068": "a\u2068b",
    "arabic letter mark U+061C": "a\u061cb",
    "C1 control U+009B": "a\u009bb",
    "tab": "a\tb",
    "only spaces": "   ",
    "only a no-break space": "\u00a0",
    "leading space": " backup",
    "trailing space": "backup ",
    "trailing ideographic space": "backup\u3000",
    "empty": "",
}


@pytest.mark.parametrize("name", list(BAD_NAMES.values()), ids=list(BAD_NAMES))
def test_names_with_invisible_reordering_or_blank_characters_are_refused(name: str, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    doc = refused(sub("--db", str(db), "--json", "jobs", "add", spec(name)), "VALIDATION_FAILED")
    assert [(d["field"], d["code"]) for d in doc["details"]] == [("name", "INVALID_VALUE")], doc
    assert not db.exists()
    code, doc = run_cli("jobs", "validate", spec(name))
    assert code == 1 and doc["details"][0]["field"] == "name"


def test_a_refused_name_says_which_character_is_wrong() -> None:
    _, doc = run_cli("jobs", "validate", spec("invoice\u202etxt.exe"))
    assert "U+202E" in doc["details"][0]["error"]
    _, doc = run_cli("jobs", "validate", spec("   "))
    assert "blank" in doc["details"][0]["error"]
    _, doc = run_cli("jobs", "validate", spec("backup "))
    assert "white space" in doc["details"][0]["error"]


@pytest.mark.parametrize("name", ["backup", "nightly backup (db)", "日本語のジョブ", "family 👨\u200d👩\u200d👧", "x" * 128, "a\u00a0b"])
def test_ordinary_names_stay_valid(name: str) -> None:
    code, doc = run_cli("jobs", "validate", spec(name))
    assert code == 0 and doc["job"]["name"] == name


def test_renaming_to_a_bad_name_is_refused_too(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    assert sub("--db", db, "--json", "jobs", "add", spec("plain")).returncode == 0
    doc = refused(sub("--db", db, "--json", "jobs", "update", "plain", json.dumps({"name": "pl\u202eain"})), "VALIDATION_FAILED")
    assert doc["details"][0]["field"] == "name"
    assert json.loads(sub("--db", db, "--json", "jobs", "get", "plain").stdout)["job"]["name"] == "plain"


# --- defect 11: runs list / counts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["runs", "list", "--status", ""],
    ["runs", "list", "--status", "   "],
    ["runs", "list", "--limit", "\u0661"],          # ARABIC-INDIC DIGIT ONE
    ["runs", "list", "--limit", "\uff15"],          # FULLWIDTH DIGIT FIVE
    ["runs", "list", "--limit", "1_0"],
    ["jobs", "list", "--limit", "\u0661"],
    ["jobs", "next", "whatever", "-n", "\u0663"],
], ids=["status-empty", "status-blank", "limit-arabic-indic", "limit-fullwidth", "limit-underscore", "jobs-list-limit", "jobs-next-n"])
def test_empty_status_and_non_ascii_counts_are_refused(args: list[str], tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    res = sub("--db", str(db), "--json", *args)
    doc = json.loads(res.stdout)
    assert res.returncode in (1, 2) and doc["code"] == "INVALID_ARGUMENT", doc
    assert not db.exists()  # refused before the database is opened


def test_ascii_counts_and_known_statuses_still_work(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    open_store(db).close()  # read commands never create a database (issue 30): it exists first
    for args in (["runs", "list", "--limit", "5"], ["runs", "list", "--status", "ok"], ["jobs", "list", "--limit", " 7 "]):
        res = sub("--db", db, "--json", *args)
        assert res.returncode == 0, res.stdout


# --- defect 11: duplicate names in an array -------------------------------------------------------------------------


def test_validate_refuses_an_array_with_duplicate_names_as_add_does(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    array = f"[{spec('twin')}, {spec('other')}, {spec('twin', payload_message='echo again')}]"
    results = [
        sub("--json", "jobs", "validate", array),
        sub("--json", "jobs", "add", "--dry-run", array),
        sub("--db", str(db), "--json", "jobs", "add", array),
    ]
    docs = [refused(res, "NAME_CONFLICT") for res in results]
    assert all(d["details"] == docs[0]["details"] for d in docs)
    assert [(d["index"], d["field"], d["code"]) for d in docs[0]["details"]] == [(2, "name", "NAME_CONFLICT")]
    assert "twin" in docs[0]["error"]
    assert not db.exists()  # all or nothing: the refused add left no database (nor a job in it)
