"""The CLI contract: JSON envelopes and codes, commands that never open the database, job and run
commands end to end, status/doctor, no traceback for any input, and a light cold start.

In-process through the ``cli`` fixture (both stores) where behaviour is the point; real
subprocesses where the claim is about the process: never touching the database file,
never printing a traceback, which modules get imported.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import scheduler_cmd

from scheduler.base.run_ids import new_run_id, short_run_id
from scheduler.base.timeutil import parse_iso
from scheduler.plugins.stores import open_store

CODE_RE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
MANUAL = {"schedule_kind": "manual", "payload_message": "echo hi"}
#: Plugin groups switched off where a test needs a healthy plugin inventory whatever else is installed.
ONLY_STORES = "executors:*,channels:*,evidence_providers:*,credential_providers:*,authorization_providers:*,hooks:*"


def job(name: str, **fields: Any) -> str:
    return json.dumps({"name": name, **MANUAL, **fields})


def run_cli(*args: str) -> tuple[int, str, str]:
    """In-process CLI without a database argument (for commands that must not need one)."""
    from scheduler.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def sub(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real ``scheduler`` in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("SCHEDULER_DEBUG", None)
    return subprocess.run([*scheduler_cmd(), *args], input=stdin if stdin is not None else b"", capture_output=True,
                          env=full_env, timeout=timeout)


def json_error(res: Any, code: str) -> dict[str, Any]:
    """Assert the result is the JSON error envelope with ``code``; return it."""
    assert res.code != 0, res
    doc = res.json
    assert doc["ok"] is False and doc["code"] == code and doc["error"], doc
    assert set(doc) <= {"ok", "error", "code", "details"}
    return doc


def ok(res: Any) -> dict[str, Any]:
    assert res.code == 0, res
    doc = res.json
    assert doc["ok"] is True, doc
    assert len([ln for ln in res.out.splitlines() if ln.strip()]) == 1  # one JSON object
    return doc


def near(iso: str, ms: int, slack_ms: int = 5000) -> bool:
    return abs(parse_iso(iso) - ms) <= slack_ms


# --- the JSON contract ----------------------------------------------------------------------------


def test_success_is_one_json_object_with_ok_true(cli: Any) -> None:
    doc = ok(cli("--json", "jobs", "add", job("a")))
    assert doc["job"]["name"] == "a" and doc["job"]["id"]
    assert ok(cli("jobs", "list", "--json"))["jobs"][0]["id"] == doc["job"]["id"]  # --json after the command works too


def test_error_is_a_json_object_on_stdout_with_nonzero_exit(cli: Any) -> None:
    res = cli("--json", "jobs", "get", "nope")
    doc = json_error(res, "NOT_FOUND")
    assert "nope" in doc["error"]
    assert res.err == ""


def test_human_mode_error_goes_to_stderr_only(cli: Any) -> None:
    res = cli("jobs", "get", "nope")
    assert res.code == 1 and res.out == ""
    assert "NOT_FOUND" in res.err and "nope" in res.err
    res = cli("jobs", "add", json.dumps({"name": "", "schedule_kind": "cron", "payload_message": "x"}))
    assert res.code == 1 and res.out == ""
    assert "name:" in res.err and "schedule_cron:" in res.err  # each field's error listed


def test_invalid_json(cli: Any) -> None:
    doc = json_error(cli("--json", "jobs", "add", "{not json"), "INVALID_JSON")
    assert "line 1" in doc["error"]


def test_deeply_nested_json_is_invalid_json_not_a_crash(cli: Any) -> None:
    """Regression: 100k nested arrays raised RecursionError (INTERNAL_ERROR)."""
    json_error(cli("--json", "jobs", "validate", "[" * 100_000), "INVALID_JSON")


def test_lone_surrogates_in_json_are_refused(cli: Any) -> None:
    """Regression: an unknown key "\\ud800" crashed the JSON error output with a traceback."""
    json_error(cli("--json", "jobs", "validate", '{"\\ud800": 1}'), "INVALID_JSON")
    json_error(cli("--json", "jobs", "add", '{"name": "x\\udc00", "schedule_kind": "manual", "payload_message": "x"}'),
               "INVALID_JSON")


def test_invalid_argument(cli: Any) -> None:
    json_error(cli("--json", "jobs", "list", "--limit", "zero"), "INVALID_ARGUMENT")
    json_error(cli("--json", "jobs", "frobnicate"), "INVALID_ARGUMENT")
    json_error(cli("--json", "jobs", "add", job("a"), "--stdin", stdin=job("b")), "INVALID_ARGUMENT")
    json_error(cli("--json", "jobs", "add", "--at", "2030-01-01T00:00:00Z", "--in", "5m", job("a")), "INVALID_ARGUMENT")


def test_validation_failed_lists_every_field(cli: Any) -> None:
    doc = json_error(cli("--json", "jobs", "add", json.dumps({"name": "a", "schedule_kind": "every", "schedule_every": "often",
                                                              "payload_message": "x", "max_retries": -1, "colour": "red"})),
                     "VALIDATION_FAILED")
    assert {d["field"]: d["code"] for d in doc["details"]} == {
        "schedule_every": "INVALID_DURATION", "max_retries": "OUT_OF_RANGE", "colour": "UNKNOWN_FIELD"}


def test_update_with_a_non_object_lists_details(cli: Any) -> None:
    ok(cli("--json", "jobs", "add", job("a")))
    doc = json_error(cli("--json", "jobs", "update", "a", "[1, 2]"), "VALIDATION_FAILED")
    assert doc["details"] and doc["details"][0]["code"] == "INVALID_TYPE"


def test_not_found_everywhere(cli: Any) -> None:
    for args in (["jobs", "get", "x"], ["jobs", "update", "x", "{}"], ["jobs", "enable", "x"], ["jobs", "disable", "x"],
                 ["jobs", "delete", "x"], ["jobs", "tree", "x"], ["jobs", "next", "x"], ["runs", "list", "x"],
                 ["runs", "get", "x"], ["runs", "output", "x"]):
        json_error(cli("--json", *args), "NOT_FOUND")


def test_db_init_failed_names_phase_and_path(tmp_path: Path, cli: Any) -> None:
    bad = tmp_path / "random.db"
    bad.write_bytes(os.urandom(2048))
    doc = json_error(cli("--json", "jobs", "list", db=str(bad)), "DB_INIT_FAILED")
    assert doc["details"] == {"phase": "open", "path": str(bad)}
    res = cli("jobs", "list", db=str(bad))
    assert res.code == 1 and res.out == "" and "DB_INIT_FAILED" in res.err and str(bad) in res.err


def test_payload_read_failed(cli: Any, tmp_path: Path) -> None:
    json_error(cli("--json", "jobs", "add", "--file", str(tmp_path / "missing.json")), "PAYLOAD_READ_FAILED")
    binary = tmp_path / "spec.bin"
    binary.write_bytes(b"\xff\xfe\x00{")
    json_error(cli("--json", "jobs", "validate", "--file", str(binary)), "PAYLOAD_READ_FAILED")


def test_payload_too_large(cli: Any, tmp_path: Path) -> None:
    from scheduler.cli.input import MAX_INPUT_BYTES

    huge = json.dumps({"name": "a", **MANUAL, "description": "x" * MAX_INPUT_BYTES})
    json_error(cli("--json", "jobs", "add", "--stdin", stdin=huge), "PAYLOAD_TOO_LARGE")
    big = tmp_path / "big.json"
    big.write_text(huge)
    json_error(cli("--json", "jobs", "validate", "--file", str(big)), "PAYLOAD_TOO_LARGE")
    assert ok(cli("--json", "jobs", "list"))["jobs"] == []


def test_help_with_json_is_a_json_object() -> None:
    code, out, _ = run_cli("--json", "help", "jobs", "add")
    assert code == 0
    doc = json.loads(out)
    assert doc["ok"] is True and "--dry-run" in doc["help"]
    code, out, _ = run_cli("help")
    assert code == 0 and "Commands:" in out and "jobs" in out


def test_version_and_capabilities() -> None:
    from scheduler import PLUGIN_API_VERSION, __version__

    code, out, _ = run_cli("--json", "version")
    assert code == 0 and json.loads(out) == {"ok": True, "version": __version__, "plugin_api": PLUGIN_API_VERSION}
    code, out, _ = run_cli("--json", "capabilities")
    caps = json.loads(out)["capabilities"]
    assert caps["cron_fields"] == [5, 6] and "every" in caps["schedule_kinds"] and caps["plugin_api"] == PLUGIN_API_VERSION


# --- commands that never open the database ---------------------------------------------------------------


NO_DB_COMMANDS = [
    ["help"],
    ["help", "jobs", "add"],
    ["version"],
    ["schema"],
    ["schema", "jobs"],
    ["schema", "sql"],
    ["capabilities"],
    ["jobs", "validate", job("v", schedule_kind="cron", schedule_cron="*/5 * * * *", payload_message="x")],
    ["jobs", "add", "--dry-run", job("d")],
    ["jobs", "add", "--dry-run", "--in", "90s", job("d")],
    ["schedule", "preview", "0 9 * * *", "--tz", "Europe/Berlin", "-n", "3"],
]


def test_stateless_commands_never_open_or_create_the_database(tmp_path: Path) -> None:
    """Each command runs as a real process against a database it must not touch.

    Two targets, alternated over the commands and the output modes: a file of random bytes
    (opening it would fail DB_INIT_FAILED and could write to it) and a path in a directory
    that does not exist (opening it would create the directory).
    """
    rand_dir = tmp_path / "r"
    rand_dir.mkdir()
    rand = rand_dir / "random.db"
    content = os.urandom(4096)
    rand.write_bytes(content)
    missing = tmp_path / "no" / "such" / "dir" / "scheduler.db"
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(job("f"))
    commands = NO_DB_COMMANDS + [
        ["jobs", "validate", "--file", str(spec_file)],
        ["jobs", "add", "--dry-run", "--file", str(spec_file)],
    ]
    for i, args in enumerate(commands):
        for target, as_json in ((rand, i % 2 == 0), (missing, i % 2 == 1)) if args[0] in ("version", "jobs") else \
                ([(rand, True)] if i % 2 == 0 else [(missing, False)]):
            res = sub("--db", str(target), *(["--json"] if as_json else []), *args)
            assert res.returncode == 0, (args, target.name, res.stdout[-500:], res.stderr[-500:])
            if as_json:
                assert json.loads(res.stdout)["ok"] is True, args
    res = sub("--db", str(missing), "jobs", "validate", "--stdin", stdin=job("s").encode())
    assert res.returncode == 0, res.stderr
    res = sub("jobs", "add", "--dry-run", job("e"), env={"SCHEDULER_DB": str(missing)})
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "no").exists()
    assert rand.read_bytes() == content and [p.name for p in rand_dir.iterdir()] == ["random.db"]
    # ... while a command that needs the database does open it, and says so.
    res = sub("--db", str(rand), "--json", "jobs", "list")
    assert json.loads(res.stdout)["code"] == "DB_INIT_FAILED"


def test_dry_run_shows_the_computed_next_run(cli: Any) -> None:
    doc = ok(cli("--json", "jobs", "add", "--dry-run", job("d", schedule_kind="every", schedule_every="10m")))
    assert doc["dry_run"] is True and near(doc["job"]["next_run_at"], int(time.time() * 1000) + 600_000)
    assert ok(cli("--json", "jobs", "list"))["jobs"] == []


# --- jobs add: inline, --file, --stdin, arrays ------------------------------------------------------------


def test_jobs_add_three_ways(cli: Any, tmp_path: Path) -> None:
    assert ok(cli("--json", "jobs", "add", job("inline")))["job"]["name"] == "inline"
    f = tmp_path / "spec.json"
    f.write_text(job("from-file"))
    assert ok(cli("--json", "jobs", "add", "--file", str(f)))["job"]["name"] == "from-file"
    assert ok(cli("--json", "jobs", "add", "--stdin", stdin=job("from-stdin")))["job"]["name"] == "from-stdin"
    names = [j["name"] for j in ok(cli("--json", "jobs", "list"))["jobs"]]
    assert names == ["from-file", "from-stdin", "inline"]


def test_jobs_add_array_all_or_nothing(cli: Any) -> None:
    batch = [json.loads(job("one")), json.loads(job("two")), {"name": "three", "schedule_kind": "cron",
                                                               "schedule_cron": "nope", "payload_message": "x"}]
    doc = json_error(cli("--json", "jobs", "add", json.dumps(batch)), "VALIDATION_FAILED")
    assert [(d["index"], d["field"]) for d in doc["details"]] == [(2, "schedule_cron")]
    assert ok(cli("--json", "jobs", "list"))["jobs"] == []

    batch[2] = json.loads(job("three"))
    doc = ok(cli("--json", "jobs", "add", json.dumps(batch)))
    assert [j["name"] for j in doc["jobs"]] == ["one", "two", "three"] and all(j["id"] for j in doc["jobs"])


def test_array_failing_in_the_database_stores_nothing(cli: Any) -> None:
    ok(cli("--json", "jobs", "add", job("taken")))
    doc = json_error(cli("--json", "jobs", "add", json.dumps([json.loads(job("fresh")), json.loads(job("taken"))])), "NAME_CONFLICT")
    assert "taken" in doc["error"]
    json_error(cli("--json", "jobs", "add", json.dumps([json.loads(job("dup")), json.loads(job("dup"))])), "NAME_CONFLICT")
    assert [j["name"] for j in ok(cli("--json", "jobs", "list"))["jobs"]] == ["taken"]


def test_name_conflict(cli: Any) -> None:
    ok(cli("--json", "jobs", "add", job("a")))
    json_error(cli("--json", "jobs", "add", job("a")), "NAME_CONFLICT")
    ok(cli("--json", "jobs", "add", job("b")))
    json_error(cli("--json", "jobs", "update", "b", '{"name": "a"}'), "NAME_CONFLICT")


def test_chain_parent_named_earlier_in_the_batch(cli: Any) -> None:
    batch = [json.loads(job("parent")), {"name": "child", "schedule_kind": "chain", "parent_id": "parent",
                                         "payload_message": "x", "trigger_on": "failure"}]
    doc = ok(cli("--json", "jobs", "add", json.dumps(batch)))
    parent, child = doc["jobs"]
    assert child["parent_id"] == parent["id"] and child["trigger_on"] == "failure" and child["next_run_at"] is None


# --- list / get / update / enable / disable / delete / tree / next -----------------------------------------


def test_list_and_get(cli: Any) -> None:
    added = ok(cli("--json", "jobs", "add", job("a", schedule_kind="cron", schedule_cron="0 9 * * *")))["job"]
    ok(cli("--json", "jobs", "add", job("b")))
    cli("--json", "jobs", "disable", "b")
    listed = ok(cli("--json", "jobs", "list"))["jobs"]
    assert [(j["name"], j["state"]) for j in listed] == [("a", "enabled"), ("b", "disabled")]
    assert [j["name"] for j in ok(cli("--json", "jobs", "list", "--enabled"))["jobs"]] == ["a"]
    assert [j["name"] for j in ok(cli("--json", "jobs", "list", "--disabled"))["jobs"]] == ["b"]
    assert len(ok(cli("--json", "jobs", "list", "--limit", "1"))["jobs"]) == 1
    by_id = ok(cli("--json", "jobs", "get", added["id"]))["job"]
    by_name = ok(cli("--json", "jobs", "get", "a"))["job"]
    assert by_id == by_name and by_id["next_run_at"].endswith("T09:00:00.000Z")
    for key in ("created_at", "updated_at", "next_run_at"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", by_id[key]), key


def test_human_list_is_an_aligned_table_with_local_times(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        ok(cli("--json", "jobs", "add", job("winter", schedule_kind="at", schedule_at="2099-01-15T09:00:00Z")))
        ok(cli("--json", "jobs", "add", job("a-much-longer-name", schedule_kind="every", schedule_every="5m")))
        res = cli("jobs", "list")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert res.code == 0
    lines = res.out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "ID", "STATE"] and "NEXT RUN" in lines[0]
    col = lines[0].index("STATE")
    assert all(ln[col:].startswith("enabled") for ln in lines[1:])  # aligned
    winter = next(ln for ln in lines if ln.startswith("winter"))
    assert "2099-01-15 10:00:00 CET" in winter  # local time with its zone


def test_update_resets_with_null_and_recomputes_next_run(cli: Any) -> None:
    first = ok(cli("--json", "jobs", "add", job("a", schedule_kind="cron", schedule_cron="0 9 * * *", max_retries=4)))["job"]
    assert first["max_retries"] == 4 and first["next_run_at"].endswith("T09:00:00.000Z")
    same = ok(cli("--json", "jobs", "update", "a", '{"description": "docs"}'))["job"]
    assert same["next_run_at"] == first["next_run_at"] and same["description"] == "docs"
    moved = ok(cli("--json", "jobs", "update", "a", '{"schedule_cron": "30 10 * * *", "max_retries": null}'))["job"]
    assert moved["next_run_at"].endswith("T10:30:00.000Z") and moved["max_retries"] == 0
    assert ok(cli("--json", "jobs", "update", "a", '{"description": null}'))["job"]["description"] is None
    every = ok(cli("--json", "jobs", "update", "a", '{"schedule_kind": "every", "schedule_cron": null, "schedule_every": "2h"}'))["job"]
    assert every["schedule_cron"] is None and near(every["next_run_at"], int(time.time() * 1000) + 7_200_000)
    json_error(cli("--json", "jobs", "update", "a", '{"name": null}'), "VALIDATION_FAILED")
    json_error(cli("--json", "jobs", "update", "a", '{"bogus": 1}'), "VALIDATION_FAILED")


def test_enable_disable(cli: Any) -> None:
    ok(cli("--json", "jobs", "add", job("a", schedule_kind="every", schedule_every="1h")))
    off = ok(cli("--json", "jobs", "disable", "a"))["job"]
    assert off["enabled"] is False and off["state"] == "disabled"
    on = ok(cli("--json", "jobs", "enable", "a"))["job"]
    assert on["enabled"] is True and on["state"] == "enabled" and near(on["next_run_at"], int(time.time() * 1000) + 3_600_000)


def test_delete_and_tree(cli: Any) -> None:
    batch = [json.loads(job("root")),
             {"name": "kid", "schedule_kind": "chain", "parent_id": "root", "payload_message": "x", "trigger_condition": "contains:OK"},
             {"name": "grandkid", "schedule_kind": "chain", "parent_id": "kid", "payload_message": "x", "trigger_on": "complete"}]
    ok(cli("--json", "jobs", "add", json.dumps(batch)))
    ok(cli("--json", "jobs", "add", job("alone")))
    tree = ok(cli("--json", "jobs", "tree"))["tree"]
    assert [t["name"] for t in tree] == ["alone", "root"]
    root = tree[1]
    assert root["children"][0]["name"] == "kid" and root["children"][0]["trigger_condition"] == "contains:OK"
    assert root["children"][0]["children"][0]["name"] == "grandkid"
    assert ok(cli("--json", "jobs", "tree", "kid"))["tree"][0]["children"][0]["trigger_on"] == "complete"
    human = cli("jobs", "tree", "root").out.splitlines()
    assert human[0] == "root" and "kid [success contains:OK]" in human[1] and "grandkid [complete]" in human[2]

    json_error(cli("--json", "jobs", "delete", "root"), "JOB_HAS_CHILDREN")
    deleted = ok(cli("--json", "jobs", "delete", "root", "--cascade"))["deleted"]
    assert deleted["name"] == "root"
    assert [j["name"] for j in ok(cli("--json", "jobs", "list"))["jobs"]] == ["alone"]
    ok(cli("--json", "jobs", "delete", "alone"))
    json_error(cli("--json", "jobs", "get", "alone"), "NOT_FOUND")


def test_jobs_next_shows_offsets(cli: Any) -> None:
    ok(cli("--json", "jobs", "add", job("berlin", schedule_kind="cron", schedule_cron="0 9 * * *", schedule_tz="Europe/Berlin")))
    fires = ok(cli("--json", "jobs", "next", "berlin", "-n", "4"))["fires"]
    assert len(fires) == 4
    for f in fires:
        assert f["local"][11:19] == "09:00:00" and f["offset"] in ("+01:00", "+02:00") and f["tz"] == "Europe/Berlin"
        assert f["local"].endswith(f["offset"])
        local_hour = 9 - int(f["offset"][1:3])
        assert f["utc"][11:13] == f"{local_hour:02d}"
    assert fires == sorted(fires, key=lambda f: f["utc"]) and len({f["utc"] for f in fires}) == 4

    ok(cli("--json", "jobs", "add", job("every", schedule_kind="every", schedule_every="90m")))
    fires = ok(cli("--json", "jobs", "next", "every", "-n", "3"))["fires"]
    gaps = {parse_iso(b["utc"]) - parse_iso(a["utc"]) for a, b in itertools.pairwise(fires)}
    assert gaps == {90 * 60_000}
    ok(cli("--json", "jobs", "add", job("manual")))
    assert ok(cli("--json", "jobs", "next", "manual"))["fires"] == []
    res = cli("jobs", "next", "berlin", "-n", "2")
    assert res.out.splitlines()[0].split() == ["LOCAL", "OFFSET", "UTC"]


def test_at_and_in_shortcuts(cli: Any) -> None:
    before = int(time.time() * 1000)
    soon = ok(cli("--json", "jobs", "add", "--in", "90s", job("soon")))["job"]
    assert soon["schedule_kind"] == "at" and near(soon["schedule_at"], before + 90_000) and soon["next_run_at"] == soon["schedule_at"]
    at = ok(cli("--json", "jobs", "add", "--at", "2099-03-01T10:00:00+01:00", job("later")))["job"]
    assert at["schedule_at"] == "2099-03-01T09:00:00.000Z" == at["next_run_at"]
    doc = json_error(cli("--json", "jobs", "add", "--at", "2020-01-01T00:00:00Z", job("past")), "VALIDATION_FAILED")
    assert doc["details"][0]["code"] == "AT_IN_PAST"
    assert ok(cli("--json", "jobs", "add", "--at", "2020-01-01T00:00:00Z", "--allow-past", job("past")))["job"]["allow_past_at"] is True
    doc = json_error(cli("--json", "jobs", "add", "--at", "2099-01-01T00:00:00", job("naive")), "VALIDATION_FAILED")
    assert doc["details"][0]["code"] == "INVALID_TIME"
    json_error(cli("--json", "jobs", "add", "--in", "soonish", job("x")), "INVALID_DURATION")


def test_schedule_preview_shows_offsets_without_a_database(tmp_path: Path) -> None:
    code, out, err = run_cli("--db", str(tmp_path / "absent" / "x.db"), "--json", "schedule", "preview", "0 9 * * *",
                             "--tz", "Europe/Berlin", "-n", "3", "--from", "2025-03-28T12:00:00Z")
    assert code == 0, err
    fires = json.loads(out)["fires"]
    assert [(f["local"], f["offset"], f["utc"]) for f in fires] == [
        ("2025-03-29T09:00:00+01:00", "+01:00", "2025-03-29T08:00:00.000Z"),
        ("2025-03-30T09:00:00+02:00", "+02:00", "2025-03-30T07:00:00.000Z"),  # spring forward that night
        ("2025-03-31T09:00:00+02:00", "+02:00", "2025-03-31T07:00:00.000Z"),
    ]
    code, out, _ = run_cli("schedule", "preview", "0 9 * * *", "--tz", "Europe/Berlin", "-n", "3")
    assert code == 0 and out.splitlines()[0].split() == ["LOCAL", "OFFSET", "UTC"] and len(out.splitlines()) == 4
    assert not (tmp_path / "absent").exists()


def test_schedule_preview_near_the_end_of_time_is_a_coded_error() -> None:
    """Regression: --from 9999-12-31 overflowed inside croniter (INTERNAL_ERROR)."""
    code, out, _ = run_cli("--json", "schedule", "preview", "* * * * *", "--from", "9999-12-31T23:58:00Z", "-n", "5")
    doc = json.loads(out)
    assert code != 0 and doc["ok"] is False and doc["code"] != "INTERNAL_ERROR" and CODE_RE.match(doc["code"])


# --- runs ------------------------------------------------------------------------------------------------


RUN_KEYS = {"id", "job_id", "status", "scheduled_for", "started_at", "finished_at", "dispatcher_owner"}


def insert_run(store: Any, job_id: str, run_id: str, status: str, t0: int, **extra: Any) -> None:
    row = {"id": run_id, "job_id": job_id, "status": status, "created_at": t0, "scheduled_for": t0, "started_at": t0 + 10,
           "finished_at": t0 + 1010 if status not in ("running", "pending") else None, "duration_ms": 1000,
           "dispatcher_owner": "host-a:1234", "dispatcher_token": 3, "dispatch_kind": "schedule", **extra}
    cols = list(row)
    with store.transaction() as tx:
        tx.execute(f"INSERT INTO runs({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})", [row[c] for c in cols])


@pytest.fixture
def with_runs(cli: Any, store_url: str) -> dict[str, Any]:
    from scheduler.plugins.stores import open_store

    job_id = ok(cli("--json", "jobs", "add", job("worker")))["job"]["id"]
    other = ok(cli("--json", "jobs", "add", job("other")))["job"]["id"]
    t0 = parse_iso("2025-05-01T10:00:00Z")
    store = open_store(store_url)
    insert_run(store, job_id, "11111111-aaaa-4aaa-8aaa-000000000001", "ok", t0,
               stdout_excerpt="line one\nline two ✓\n", stdout_bytes=22, stderr_excerpt="warn: x\n", stderr_bytes=8, exit_code=0,
               stdout_sha256=hashlib.sha256("line one\nline two ✓\n".encode()).hexdigest(),
               stderr_sha256=hashlib.sha256(b"warn: x\n").hexdigest())
    insert_run(store, job_id, "22222222-bbbb-4bbb-8bbb-000000000002", "error", t0 + 60_000, error_code="EXIT_NONZERO", exit_code=3)
    insert_run(store, other, "33333333-cccc-4ccc-8ccc-000000000003", "running", t0 + 120_000)
    store.close()
    return {"job_id": job_id, "other": other, "t0": t0}


def test_runs_list_shape(cli: Any, with_runs: dict[str, Any]) -> None:
    runs = ok(cli("--json", "runs", "list"))["runs"]
    assert [r["status"] for r in runs] == ["running", "error", "ok"]  # newest first
    for r in runs:
        assert set(r) >= RUN_KEYS
    first = runs[2]
    assert first["id"] == "11111111-aaaa-4aaa-8aaa-000000000001" and first["job_id"] == with_runs["job_id"]
    assert (first["scheduled_for"], first["started_at"], first["finished_at"]) == (
        "2025-05-01T10:00:00.000Z", "2025-05-01T10:00:00.010Z", "2025-05-01T10:00:01.010Z")
    assert first["dispatcher_owner"] == "host-a:1234" and runs[0]["finished_at"] is None
    assert [r["status"] for r in ok(cli("--json", "runs", "list", "worker"))["runs"]] == ["error", "ok"]
    assert [r["status"] for r in ok(cli("--json", "runs", "list", "--status", "ok"))["runs"]] == ["ok"]
    assert len(ok(cli("--json", "runs", "list", "--limit", "1"))["runs"]) == 1
    json_error(cli("--json", "runs", "list", "--status", "finished"), "INVALID_ARGUMENT")
    human = cli("runs", "list").out.splitlines()
    assert human[0].split()[:3] == ["RUN", "JOB", "STATUS"] and "worker" in human[2]


def test_runs_get_and_output(cli: Any, with_runs: dict[str, Any]) -> None:
    run = ok(cli("--json", "runs", "get", "11111111-aaaa-4aaa-8aaa-000000000001"))["run"]
    assert run["status"] == "ok" and run["exit_code"] == 0 and run["stdout_excerpt"] == "line one\nline two ✓\n"
    assert ok(cli("--json", "runs", "get", "22222222"))["run"]["error_code"] == "EXIT_NONZERO"  # unique prefix
    out = ok(cli("--json", "runs", "output", "11111111-aaaa-4aaa-8aaa-000000000001"))
    assert out["content"] == "line one\nline two ✓\n" and out["stream"] == "stdout" and out["offloaded"] is False
    assert ok(cli("--json", "runs", "output", "11111111", "stderr"))["content"] == "warn: x\n"


def test_a_run_is_listed_by_its_last_8_characters_and_found_by_either_end(cli: Any, with_runs: dict[str, Any],
                                                                         store_url: str) -> None:
    human = cli("runs", "list").out.splitlines()
    assert [line.split()[0] for line in human[1:4]] == ["00000003", "00000002", "00000001"]  # the ids' random end
    assert ok(cli("--json", "runs", "get", "00000002"))["run"]["error_code"] == "EXIT_NONZERO"  # as listed: a suffix
    assert ok(cli("--json", "runs", "events", "c-000000000003"))["events"] is not None  # a longer end, dashes and all
    assert ok(cli("--json", "runs", "get", "222222"))["run"]["id"].startswith("222222")  # a prefix, as before
    json_error(cli("--json", "runs", "get", "00000009"), "NOT_FOUND")
    json_error(cli("--json", "runs", "get", "00001"), "NOT_FOUND")  # shorter than 6: never a piece
    store = open_store(store_url)
    # two runs that end alike: their shared end is refused, not taken as the first of them
    insert_run(store, with_runs["job_id"], "44444444-dddd-4ddd-8ddd-00000000aa0f", "ok", with_runs["t0"] + 150_000)
    insert_run(store, with_runs["job_id"], "55555555-eeee-4eee-8eee-10000000aa0f", "ok", with_runs["t0"] + 160_000)
    # time-ordered ids made within a minute share their start: their prefix is ambiguous, their end is not
    made = [new_run_id() for _ in range(2)]
    for i, run_id in enumerate(made):
        insert_run(store, with_runs["job_id"], run_id, "ok", with_runs["t0"] + 200_000 + i)
    store.close()
    err = json_error(cli("--json", "runs", "get", "00aa0f"), "INVALID_ARGUMENT")
    assert "ambiguous" in err["error"] and "last 8 characters" in err["error"]
    assert ok(cli("--json", "runs", "get", "10000000aa0f"))["run"]["id"].startswith("55555555")
    json_error(cli("--json", "runs", "get", made[0][:8]), "INVALID_ARGUMENT")
    assert ok(cli("--json", "runs", "get", short_run_id(made[1])))["run"]["id"] == made[1]


def test_runs_output_human_writes_the_raw_stream(with_runs: dict[str, Any], store_url: str, tmp_path: Path) -> None:
    if "://" in store_url:
        pytest.skip("subprocess check runs on the SQLite file")
    res = sub("--db", store_url, "runs", "output", "11111111-aaaa-4aaa-8aaa-000000000001")
    assert res.returncode == 0 and res.stdout == "line one\nline two ✓\n".encode()


# --- status and doctor ---------------------------------------------------------------------------------------


def test_status_json(cli: Any, with_runs: dict[str, Any]) -> None:
    cli("--json", "jobs", "add", job("cron", schedule_kind="cron", schedule_cron="0 0 1 1 *"))
    status = ok(cli("--json", "status"))["status"]
    from scheduler.core.store.migrations import SCHEMA_VERSION

    assert status["schema_version"] == SCHEMA_VERSION
    assert status["jobs"] == {"enabled": 3}
    assert status["runs"] == {"ok": 1, "error": 1, "running": 1}
    assert status["queue"]["expired_claims"] == 0 and status["recovery_blocked"] == []
    assert status["next_run_at"].endswith("-01-01T00:00:00.000Z")
    human = cli("status")
    assert human.code == 0 and "dispatcher: not running" in human.out


def test_doctor_healthy_on_a_fresh_database(cli: Any, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the built-in SQLite store declared no plugin_api, so doctor was never healthy."""
    monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", ONLY_STORES)
    doc = ok(cli("--json", "doctor"))
    assert doc["healthy"] is True
    checks = {c["check"]: c for c in doc["checks"]}
    assert {"open", "plugins", "expired_claims", "recovery_blocked"} <= set(checks)
    if "://" not in store_url:  # the SQLite store's own checks
        assert {"integrity", "foreign_keys", "tables", "writable"} <= set(checks)
    assert all(c["ok"] for c in doc["checks"])
    assert "sqlite" in checks["plugins"]["detail"] or "loaded" in checks["plugins"]["detail"]


def test_doctor_exits_1_on_foreign_key_violations_and_reopen_restores_dropped_tables(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", ONLY_STORES)
    open_store(db_path).close()  # only commands adding jobs create a missing database (issue 30)
    assert run_cli("--db", str(db_path), "--json", "jobs", "list")[0] == 0
    conn = sqlite3.connect(db_path)  # foreign_keys is off on a plain connection
    conn.execute("DROP TABLE messages")
    conn.execute("INSERT INTO runs(id, job_id, status, created_at) VALUES ('orphan', 'no-such-job', 'ok', 1)")
    conn.commit()
    conn.close()
    code, out, _ = run_cli("--db", str(db_path), "--json", "doctor")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["code"] == "UNHEALTHY"
    checks = {c["check"]: c for c in doc["details"]}
    assert checks["foreign_keys"]["ok"] is False and checks["foreign_keys"]["detail"].startswith("1 ")
    assert checks["tables"]["ok"] is True  # opening re-applied the schema: the dropped table is back
    code, out, err = run_cli("--db", str(db_path), "doctor")
    assert code == 1 and "FAIL  foreign_keys" in out and "UNHEALTHY" in err


def broken_plugin_dir(tmp_path: Path) -> Path:
    """A directory to put on PYTHONPATH: a distribution whose executor cannot be imported."""
    site = tmp_path / "site"
    dist = site / "scheduler_executor_kaputt-0.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: scheduler-executor-kaputt\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text("[scheduler.executors]\nkaputt = scheduler_executor_kaputt:Executor\n")
    (site / "scheduler_executor_kaputt.py").write_text("import no_such_dependency_xyz\n")
    return site


def test_doctor_exits_1_when_a_plugin_fails_to_import(tmp_path: Path) -> None:
    site = broken_plugin_dir(tmp_path)
    env = {"PYTHONPATH": str(site), "SCHEDULER_DISABLE_PLUGINS": ""}
    db = str(tmp_path / "s.db")
    open_store(db).close()  # only commands adding jobs create a missing database (issue 30)
    res = sub("--db", db, "--json", "doctor", env=env)
    assert res.returncode == 1, res.stdout
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["code"] == "UNHEALTHY"
    plugins = next(c for c in doc["details"] if c["check"] == "plugins")
    assert plugins["ok"] is False
    assert "kaputt" in plugins["detail"] and "scheduler-executor-kaputt" in plugins["detail"]
    assert "no_such_dependency_xyz" in plugins["detail"]
    human = sub("--db", db, "doctor", env=env)
    assert human.returncode == 1 and b"FAIL" in human.stdout and b"UNHEALTHY" in human.stderr and b"Traceback" not in human.stderr
    # An unrelated command is not affected by the broken plugin.
    assert json.loads(sub("--db", db, "--json", "jobs", "list", env=env).stdout) == {"ok": True, "jobs": []}


# --- no input ever produces a traceback ---------------------------------------------------------------------------


HUGE = b'{"name": "' + b"x" * (5 * 1024 * 1024) + b'"}'
FUZZ: list[tuple[list[str], bytes | None]] = [
    (["jobs", "add", "{bad json"], None),
    (["jobs", "add", '{"name": 1, "schedule_kind": [], "payload_message": {}}'], None),
    (["jobs", "add", '[1, "x", null]'], None),
    (["jobs", "add", "{}"], None),
    (["jobs", "add", "[]"], None),
    (["jobs", "validate", "null"], None),
    (["jobs", "validate", "NaN"], None),
    (["jobs", "validate", "[" * 50_000], None),
    (["jobs", "add", "--stdin"], b"\xff\xfe\x00\x01binary"),
    (["jobs", "add", "--stdin"], HUGE),
    (["jobs", "validate", "--stdin"], b""),
    (["jobs", "add", "--file", "/nonexistent/spec.json"], None),
    (["jobs", "add", "--file", "/"], None),
    (["jobs", "add"], None),
    (["frobnicate"], None),
    (["jobs", "frobnicate"], None),
    (["--no-such-option", "version"], None),
    (["jobs", "list", "--limit", "-1"], None),
    (["jobs", "list", "--limit", "many"], None),
    (["jobs", "get"], None),
    (["jobs", "get", ""], None),
    (["jobs", "update", "nope", "{}"], None),
    (["jobs", "update", "nope", "not json"], None),
    (["jobs", "next", "nope", "-n", "0"], None),
    (["jobs", "delete", "nope"], None),
    (["jobs", "run", "nope"], None),
    (["runs", "get", "5f0c9a2e-0000-4000-8000-000000000000"], None),
    (["runs", "output", "5f0c9a2e"], None),
    (["runs", "output", "x", "stdall"], None),
    (["runs", "list", "--status", "weird"], None),
    (["runs", "list", "--limit", "0"], None),
    (["runs", "cancel", "nope"], None),
    (["schedule", "preview", "not a cron"], None),
    (["schedule", "preview", "* * * * *", "--tz", "Nowhere/Land"], None),
    (["schedule", "preview", "* * * * *", "-n", "100000"], None),
    (["schedule", "preview", "* * * * *", "--from", "9999-12-31T23:59:00Z"], None),
    (["schedule", "preview", "* * * * *", "--from", "yesterday"], None),
    (["schedule", "preview", "every 0s"], None),
    (["jobs", "add", "--in", "99999999999999999999d", '{"name": "x", "payload_message": "x"}'], None),
    (["jobs", "add", "--at", "not-a-time", '{"name": "x", "payload_message": "x"}'], None),
    (["jobs", "add", '{"\\ud800": 1}'], None),
    (["jobs", "add", '{"name": "\\udfff", "schedule_kind": "manual", "payload_message": "x"}'], None),
    (["jobs", "add", '{"name": "x", "schedule_kind": "at", "schedule_at": 100000000000000000000000, "payload_message": "x"}'], None),
    (["jobs", "add", '{"name": "x", "schedule_kind": "every", "schedule_every": "' + "9" * 5000 + 's", "payload_message": "x"}'], None),
    (["jobs", "add", '{"name": "x", "schedule_kind": "manual", "payload_message": "a\\u0000b"}'], None),
    (["jobs", "add", '{"name": "x", "schedule_kind": "manual", "payload_message": "x", "max_retries": ' + "9" * 5000 + "}"], None),
    (["jobs", "update", "nope", '{"max_retries": -' + "9" * 5000 + "}"], None),
    (["jobs", "validate", '[{"name": "x", "schedule_kind": "manual", "payload_message": "x", "max_retries": 1e999}]'], None),
    (["jobs", "add", "--in", "", '{"name": "x", "schedule_kind": "manual", "payload_message": "x"}'], None),
    (["jobs", "add", '{"name": "x\\u202e", "schedule_kind": "manual", "payload_message": "x"}'], None),
    (["jobs", "add", '{"name": "x", "schedule_kind": "manual", "payload_message": "x", "executor": "nosuch"}'], None),
    (["runs", "list", "--status", ""], None),
    (["runs", "list", "--limit", "\u0661"], None),
    (["help", "nonsense"], None),
    (["schema", "nonsense"], None),
    (["plugins", "list", "--bogus"], None),
    (["run", "--lease-ttl", "forever"], None),
]


def _fuzz_id(case: tuple[list[str], bytes | None]) -> str:
    args, stdin = case
    text = " ".join(args)[:40]
    return text + (f" <stdin {len(stdin)}B>" if stdin is not None else "")


@pytest.mark.parametrize("case", FUZZ, ids=[_fuzz_id(c) for c in FUZZ])
def test_malformed_invocations_never_produce_a_traceback(case: tuple[list[str], bytes | None], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    args, stdin = case
    db = str(tmp_path / "fuzz.db")
    res = sub("--db", db, "--json", *args, stdin=stdin)
    assert res.returncode != 0
    assert b"Traceback" not in res.stdout and b"Traceback" not in res.stderr, res.stderr[-2000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stdout[-500:]
    doc = json.loads(lines[0])
    assert doc["ok"] is False and isinstance(doc["error"], str) and doc["error"]
    assert CODE_RE.match(doc["code"]) and doc["code"] != "INTERNAL_ERROR", doc
    # Human mode (in-process, same code path): the message on stderr, nothing on stdout.
    code, out, err = run_cli_stdin(["--db", db, *args], stdin, monkeypatch)
    assert code == res.returncode and out == "" and f"error [{doc['code']}]" in err and "Traceback" not in err


def run_cli_stdin(argv: list[str], stdin: bytes | None, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    from scheduler.cli.main import main

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin or b"")))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_bad_database_targets_never_produce_a_traceback(tmp_path: Path) -> None:
    rand = tmp_path / "rand.db"
    rand.write_bytes(os.urandom(1000))
    (tmp_path / "file").write_text("x")
    for db, code in ((str(tmp_path), "DB_INIT_FAILED"), (str(rand), "DB_INIT_FAILED"), (str(tmp_path / "file" / "x.db"), "DB_NOT_FOUND"),
                     ("weird://host/db", "PLUGIN_NOT_FOUND")):
        res = sub("--db", db, "--json", "jobs", "list")
        assert res.returncode == 1 and b"Traceback" not in res.stderr
        assert json.loads(res.stdout)["code"] == code


# --- cold start ------------------------------------------------------------------------------------------------------


FORBIDDEN_AT_START = ("croniter", "sqlite3", "_sqlite3", "scheduler.core.store", "stevedore", "pluggy", "scheduler.plugins",
                      "scheduler.core.spec", "scheduler.core.schedules", "re2", "jsonschema")


def imported_modules(*args: str) -> set[str]:
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "scheduler", *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    names = set()
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert "scheduler.cli.main" in names  # the parse really saw the imports
    return names


def test_version_cold_start_imports_no_plugin_croniter_or_database() -> None:
    names = imported_modules("version")
    bad = sorted(n for n in names if n.split(".")[0] in ("croniter", "sqlite3", "_sqlite3", "stevedore", "pluggy", "re2", "jsonschema")
                 or n.startswith(("scheduler.core.store", "scheduler.plugins", "scheduler.core.spec", "scheduler.core.schedules", "scheduler_")))
    assert bad == []


def test_help_stays_light_too() -> None:
    for args in (["help"],):
        names = imported_modules(*args)
        assert not {n for n in names if n.split(".")[0] in ("croniter", "sqlite3", "_sqlite3", "stevedore", "pluggy")}, args
