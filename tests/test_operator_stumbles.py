"""Issue 32, section 2: stumbles a new user met in the CLI, each through the real CLI (SQLite and PostgreSQL).

1. ``apply`` refuses a new one-shot in the past without ``allow_past_at`` (``AT_IN_PAST``, as ``jobs add``),
   and a finished one-shot exported and applied on a new host is marked ``done`` and never runs again.
3. ``--json`` job objects carry their JSON columns (``executor_options``, ``constraints``, ...) as objects.
11. ``schedule_kind`` is inferred from the one schedule field given; two of them are ``SCHEDULE_KIND_AMBIGUOUS``.
12. Human-mode ``apply`` errors name the job and the file.
14. ``jobs delete`` asks for confirmation on a terminal (``--yes`` skips it; no terminal, no question).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from kernel_testing import TERMINAL, run_rows, wait_for

from scheduler.core.spec import SPEC_FIELD_NAMES

PAST = "2020-01-01T00:00:00Z"
FUTURE = "2031-05-01T10:00:00.000Z"  # as the CLI prints instants
ONCE = {"name": "once", "schedule_kind": "at", "schedule_at": PAST, "payload_message": "true"}


def write_toml(path: Path, jobs: list[dict[str, Any]]) -> Path:
    path.write_text(tomli_w.dumps({"jobs": jobs}))
    return path


def job_names(store: Any) -> list[str]:
    with store.read() as tx:
        return [r["name"] for r in tx.all("SELECT name FROM jobs ORDER BY name")]


# --------------------------------------------------------------------------- 1. apply and past one-shots


def test_apply_refuses_a_new_past_one_shot_without_allow_past_at(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [{"name": "tick", "schedule_kind": "every", "schedule_every": "5m",
                                              "payload_message": "date"}, ONCE])
    for args in (("--dry-run",), ()):
        out = cli("--json", "apply", str(f), *args)
        assert out.code != 0 and out.json["code"] == "VALIDATION_FAILED", out
        (detail,) = out.json["details"]
        assert detail["code"] == "AT_IN_PAST" and detail["field"] == "schedule_at", detail
        assert detail["job"] == "once" and Path(detail["file"]).name == "jobs.toml" and detail["index"] == 1
        assert job_names(store) == []  # all or nothing: the valid job is not created either
    # jobs add gives the same code for the same spec.
    added = cli("--json", "jobs", "add", json.dumps(ONCE))
    assert added.code != 0 and [d["code"] for d in added.json["details"]] == ["AT_IN_PAST"], added
    write_toml(f, [{**ONCE, "allow_past_at": True}])
    assert cli("--json", "apply", str(f)).code == 0
    assert job_names(store) == ["once"]


def test_a_stored_one_shot_keeps_its_passed_instant(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [{**ONCE, "schedule_at": FUTURE}])
    assert cli("--json", "apply", str(f)).code == 0
    with store.transaction() as tx:  # time passes: the stored instant is now behind us
        tx.execute("UPDATE jobs SET schedule_at = ?, next_run_at = ?", (1577836800000, 1577836800000))
    write_toml(f, [ONCE])
    again = cli("--json", "apply", str(f))
    assert again.code == 0 and again.json["summary"]["unchanged"] == 1, again


def test_a_finished_one_shot_is_exported_done_and_never_runs_on_a_new_host(cli: Any, store: Any, dispatcher: Any,
                                                                            tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [{**ONCE, "allow_past_at": True},
                                            {**ONCE, "name": "later", "schedule_at": FUTURE}])
    assert cli("--json", "apply", str(f)).code == 0
    job_id = cli("--json", "jobs", "get", "once").json["job"]["id"]
    d = dispatcher()
    try:
        wait_for(lambda: [r for r in run_rows(store, job_id) if r["status"] in TERMINAL], timeout=30, what="the one-shot's run")
    finally:
        d.stop()
    exported = cli("--json", "export", "--format", "json", "--output", str(tmp_path / "export.json"))
    assert exported.code == 0, exported
    doc = json.loads((tmp_path / "export.json").read_text())
    by_name = {j["name"]: j for j in doc["jobs"]}
    assert by_name["once"].get("done") is True and "done" not in by_name["later"]  # only the one that ran
    # The origin host: applying its own export changes nothing.
    same = cli("--json", "apply", str(tmp_path / "export.json"))
    assert same.json["summary"] == {"create": 0, "update": 0, "unchanged": 2, "prune": 0}, same
    # A new host: the finished one-shot is created done (no next run, nothing queued); re-enabling keeps it done.
    other = str(tmp_path / "other.db")
    created = cli("--json", "apply", str(tmp_path / "export.json"), db=other)
    assert created.code == 0 and created.json["summary"]["create"] == 2, created
    assert cli("--json", "jobs", "get", "once", db=other).json["job"]["next_run_at"] is None
    assert cli("--json", "jobs", "get", "later", db=other).json["job"]["next_run_at"] == FUTURE
    assert cli("--json", "jobs", "disable", "once", db=other).code == 0
    assert cli("--json", "jobs", "enable", "once", db=other).json["job"]["next_run_at"] is None
    from scheduler.plugins.stores import open_store

    new_host = open_store(other)
    try:
        with new_host.read() as tx:
            assert tx.scalar("SELECT next_run_at FROM jobs WHERE name = 'once'") is None  # stored, not only shown
            assert tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue") == 0
    finally:
        new_host.close()
    redo = cli("--json", "export", "--format", "json", db=other)
    assert redo.json["document"] == doc  # and it exports done again


def test_done_is_a_job_file_key_for_one_shots_only(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [{"name": "m", "schedule_kind": "manual", "payload_message": "true", "done": True},
                                            {**ONCE, "name": "o", "done": "yes"}])
    out = cli("--json", "apply", str(f))
    assert out.code != 0 and out.json["code"] == "VALIDATION_FAILED", out
    assert {(d["job"], d["field"], d["code"]) for d in out.json["details"]} == {("m", "done", "CONFLICT"),
                                                                                ("o", "done", "INVALID_TYPE")}
    assert job_names(store) == []
    added = cli("--json", "jobs", "add", json.dumps({**ONCE, "done": True}))  # not a spec field: jobs add refuses it
    assert added.code != 0 and ("done", "UNKNOWN_FIELD") in {(d["field"], d["code"]) for d in added.json["details"]}, added


# --------------------------------------------------------------------------- 3. JSON columns as objects


def test_json_job_objects_carry_objects_not_json_text(cli: Any, store: Any) -> None:
    spec = {"name": "obj", "schedule_kind": "manual", "payload_message": "true",
            "executor_options": {"env_policy": "inherit"}, "retention": {"keep_runs": 3},
            "delivery_mode": "on_failure", "delivery_channel": "webhook", "delivery_to": "http://127.0.0.1:9/x"}
    added = cli("--json", "jobs", "add", json.dumps(spec))
    assert added.code == 0, added
    views = [added.json["job"], cli("--json", "jobs", "get", "obj").json["job"],
             cli("--json", "jobs", "list").json["jobs"][0]]
    for view in views:
        assert view["executor_options"] == {"env_policy": "inherit"}
        assert view["constraints"] == {} and view["delivery_options"] == {} and view["credentials"] == []
        assert view["retention"] == {"keep_runs": 3} and view["evidence"] is None
    # A job object read back is a spec jobs add takes (the spec fields of it), and stores the same job.
    copy = {k: v for k, v in views[1].items() if k in SPEC_FIELD_NAMES and v is not None}
    again = cli("--json", "jobs", "add", json.dumps({**copy, "name": "obj2"}))
    assert again.code == 0, again
    second = cli("--json", "jobs", "get", "obj2").json["job"]
    assert {k: v for k, v in second.items() if k in SPEC_FIELD_NAMES and k != "name"} == \
        {k: v for k, v in views[1].items() if k in SPEC_FIELD_NAMES and k != "name"}
    human = cli("jobs", "get", "obj")
    assert '{"env_policy": "inherit"}' in human.out, human  # the human view prints JSON, not a Python repr


# --------------------------------------------------------------------------- 11. schedule_kind inferred


@pytest.mark.parametrize(("field", "value", "kind"), [("schedule_every", "5m", "every"), ("schedule_cron", "0 3 * * *", "cron"),
                                                      ("schedule_at", FUTURE, "at")])
def test_schedule_kind_is_inferred_from_the_one_schedule_field(cli: Any, field: str, value: str, kind: str) -> None:
    out = cli("--json", "jobs", "add", json.dumps({"name": "j", field: value, "payload_message": "true"}))
    assert out.code == 0, out
    assert out.json["job"]["schedule_kind"] == kind and out.json["job"][field] == value


def test_two_schedule_fields_without_a_kind_are_ambiguous(cli: Any, store: Any, tmp_path: Path) -> None:
    out = cli("--json", "jobs", "add", json.dumps({"name": "j", "schedule_every": "5m", "schedule_cron": "0 3 * * *",
                                                   "payload_message": "true"}))
    assert out.code != 0 and out.json["code"] == "VALIDATION_FAILED", out
    assert [(d["field"], d["code"]) for d in out.json["details"]] == [("schedule_kind", "SCHEDULE_KIND_AMBIGUOUS")]
    assert "schedule_cron" in out.json["details"][0]["error"] and "schedule_every" in out.json["details"][0]["error"]
    none = cli("--json", "jobs", "add", json.dumps({"name": "j", "payload_message": "true"}))
    assert [(d["field"], d["code"]) for d in none.json["details"]] == [("schedule_kind", "REQUIRED")]
    f = write_toml(tmp_path / "jobs.toml", [{"name": "t", "schedule_every": "90s", "payload_message": "date"}])
    assert cli("--json", "apply", str(f)).code == 0  # a job file may leave it out too
    assert cli("--json", "apply", str(f)).json["summary"]["unchanged"] == 1
    assert job_names(store) == ["t"]


# --------------------------------------------------------------------------- 12. human apply errors


def test_human_apply_errors_name_the_job_and_the_file(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [{"name": "good", "schedule_kind": "manual", "payload_message": "true"},
                                            {"name": "bad", "schedule_kind": "cron", "schedule_cron": "61 * * * *",
                                             "payload_message": "true"}])
    out = cli("apply", str(f))
    assert out.code != 0 and out.out == "", out
    line = next(ln for ln in out.err.splitlines() if "schedule_cron" in ln)
    assert "bad" in line and str(f) in line, out.err
    # An error met while carrying the plan out (a missing chain parent) names its job and file too, in both modes.
    write_toml(f, [{"name": "kid", "schedule_kind": "chain", "parent_id": "nobody", "payload_message": "true"}])
    human = cli("apply", str(f))
    assert human.code != 0 and "NOT_FOUND" in human.err and "kid" in human.err and str(f) in human.err, human
    as_json = cli("--json", "apply", str(f))
    assert as_json.json["code"] == "NOT_FOUND", as_json
    assert as_json.json["details"]["job"] == "kid" and as_json.json["details"]["file"] == str(f)
    assert job_names(store) == []


# --------------------------------------------------------------------------- 14. jobs delete confirmation


def test_jobs_delete_without_a_terminal_does_not_ask(cli: Any, store: Any) -> None:
    assert cli("--json", "jobs", "add", json.dumps({"name": "gone", "schedule_kind": "manual", "payload_message": "true"})).code == 0
    out = cli("jobs", "delete", "gone")
    assert out.code == 0 and "deleted gone" in out.out and "?" not in out.out + out.err, out
    assert job_names(store) == []


def _delete_on_a_terminal(db: str, *args: str, answer: str | None, command: tuple[str, ...] = ("jobs", "delete")) -> tuple[int, str]:
    """``scheduler jobs delete ARGS`` (or ``command``) in a subprocess whose stdin and stderr are a pseudo-terminal; type ``answer``."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "--db", db, *command, *args],
                            stdin=slave, stdout=subprocess.PIPE, stderr=slave, close_fds=True)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    answered = answer is None
    while proc.poll() is None and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                seen += os.read(master, 4096)
            except OSError:
                break
        if not answered and b"[y/N]" in seen:
            os.write(master, answer.encode() + b"\n")  # type: ignore[union-attr]
            answered = True
    out, _ = proc.communicate(timeout=60)
    os.close(master)
    return proc.returncode, seen.decode(errors="replace") + out.decode(errors="replace")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminals as the tests drive them: Linux")
def test_jobs_delete_on_a_terminal_asks_first(tmp_path: Path) -> None:
    db = str(tmp_path / "tty.db")
    add = [sys.executable, "-m", "scheduler", "--db", db, "jobs", "add"]
    for name in ("keep", "drop", "forced", "removed"):
        spec = json.dumps({"name": name, "schedule_kind": "manual", "payload_message": "true"})
        assert subprocess.run([*add, spec], capture_output=True, timeout=60).returncode == 0
    code, text = _delete_on_a_terminal(db, "keep", answer="n")
    assert code == 130 and "Delete job 'keep'" in text and "INTERRUPTED" in text, text
    code, text = _delete_on_a_terminal(db, "drop", answer="y")
    assert code == 0 and "deleted drop" in text, text
    code, text = _delete_on_a_terminal(db, "forced", "--yes", answer=None)
    assert code == 0 and "[y/N]" not in text and "deleted forced" in text, text
    remove = ("schedule", "remove")  # the same command under another name asks the same way
    code, text = _delete_on_a_terminal(db, "keep", answer="n", command=remove)
    assert code == 130 and "Delete job 'keep'" in text, text
    code, text = _delete_on_a_terminal(db, "removed", "-y", answer=None, command=remove)
    assert code == 0 and "[y/N]" not in text and "deleted removed" in text, text
    listed = subprocess.run([sys.executable, "-m", "scheduler", "--db", db, "--json", "jobs", "list"],
                            capture_output=True, text=True, timeout=60)
    assert [j["name"] for j in json.loads(listed.stdout)["jobs"]] == ["keep"]
