"""``scheduler queue list`` / ``queue show`` (issue 29 piece 1): the dispatch queue's attempts, claims and error history.

Through the real CLI (in-process) on SQLite and PostgreSQL, with a real dispatcher for a run that
fails; ``scheduler.api.ops`` gives what the command prints under ``--json``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from kernel_testing import run_job_once

from scheduler.api import ops
from scheduler.base.timeutil import now_ms
from scheduler.core.queue import release_expired_claims


def ok(res: Any) -> dict[str, Any]:
    """The JSON answer of a command that succeeded."""
    assert res.code == 0, res
    doc: dict[str, Any] = res.json
    assert doc["ok"] is True, doc
    return doc


def add(cli: Any, name: str, command: str = "echo hi") -> dict[str, Any]:
    """A manual shell job added through ``jobs add``."""
    job: dict[str, Any] = ok(cli("--json", "jobs", "add", json.dumps(
        {"name": name, "schedule_kind": "manual", "payload_message": command})))["job"]
    return job


def queue(cli: Any, *args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ok(cli("--json", "queue", "list", *args))["dispatches"]
    return rows


def test_queue_list_and_show_give_attempts_claims_and_every_error(cli: Any, store: Any, dispatcher: Any) -> None:
    failing = add(cli, "failing", "exit 3")
    quiet = add(cli, "quiet")
    run = run_job_once(store, dispatcher, failing)
    assert run["status"] == "error"
    manual = ok(cli("--json", "jobs", "run", "quiet"))["dispatch"]
    # A claim whose dispatcher died after a first attempt failed: the claim expires and is released.
    with store.transaction() as tx:
        tx.execute("UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = 'ghost', claim_token = 'x',"
                   " claim_expires_at = ?, attempts = 1, last_error = 'EXECUTOR_CRASHED: the first attempt' WHERE id = ?",
                   (now_ms() - 1, manual["id"]))
    (claimed,) = queue(cli, "--status", "claimed")
    assert (claimed["id"], claimed["claim_owner"], claimed["claim_expired"]) == (manual["id"], "ghost", True)
    assert claimed["claim_expires_at"].endswith("Z")
    assert release_expired_claims(store) == 1

    rows = queue(cli)
    assert {r["job_name"] for r in rows} == {"failing", "quiet"}
    (failed,) = [r for r in rows if r["job_name"] == "failing"]
    assert (failed["kind"], failed["status"], failed["attempts"], failed["run_id"]) == ("manual", "done", 1, run["id"])
    assert failed["last_error"] == run["error_code"] and failed["last_error"]
    (released,) = [r for r in rows if r["job_name"] == "quiet"]
    assert (released["id"], released["status"], released["attempts"]) == (manual["id"], "pending", 1)
    assert released["last_error"] == "EXECUTOR_CRASHED: the first attempt"
    assert released["claim_owner"] is None and released["claim_expired"] is False
    assert "claim_token" not in released  # the fencing token is the claimer's, not shown

    # Filters: status, job (name or id), limit.
    assert [r["id"] for r in queue(cli, "--status", "pending")] == [manual["id"]]
    assert [r["id"] for r in queue(cli, "--job", failing["id"])] == [failed["id"]]
    assert [r["id"] for r in queue(cli, "--job", "quiet", "--status", "done")] == []
    assert len(queue(cli, "--limit", "1")) == 1

    shown = ok(cli("--json", "queue", "show", manual["id"]))["dispatch"]
    assert {k: shown[k] for k in released} == released
    assert [e["kind"] for e in shown["events"]] == ["dispatch.manual", "dispatch.claim_released"]
    assert shown["errors"] == [{"at": shown["events"][1]["at"], "kind": "dispatch.claim_released", "run_id": None,
                                "attempts": 1, "error": "EXECUTOR_CRASHED: the first attempt"}]
    # The failed run's error is in the history of its dispatch, read from its run.finished event.
    history = ok(cli("--json", "queue", "show", failed["id"]))["dispatch"]
    assert "run.finished" in [e["kind"] for e in history["events"]]
    assert [(e["kind"], e["run_id"], e["error"]) for e in history["errors"]] == [("run.finished", run["id"], run["error_code"])]

    # A unique prefix or the suffix the table shows names the dispatch too.
    assert ok(cli("--json", "queue", "show", manual["id"][-28:]))["dispatch"]["id"] == manual["id"]
    assert ok(cli("--json", "queue", "show", manual["id"][:20]))["dispatch"]["id"] == manual["id"]

    # The facade returns what the command prints.
    assert json.loads(json.dumps(ops.list_queue(store), default=str)) == rows
    assert json.loads(json.dumps(ops.get_dispatch(store, manual["id"]), default=str)) == shown

    # The human table names the job, the kind, the attempts and the last error.
    text = cli("queue", "list")
    assert text.code == 0, text
    line = next(ln for ln in text.out.splitlines() if "quiet" in ln)
    assert "manual" in line and "pending" in line and "EXECUTOR_CRASHED" in line and manual["id"][-28:] in line
    detail = cli("queue", "show", manual["id"])
    assert detail.code == 0 and "dispatch.claim_released" in detail.out and "EXECUTOR_CRASHED: the first attempt" in detail.out
    assert quiet["id"] in detail.out


def test_unknown_dispatch_and_bad_filters_are_coded_errors(cli: Any) -> None:
    add(cli, "one")
    ok(cli("--json", "jobs", "run", "one"))
    for args, code in ((["queue", "show", "no-such-dispatch"], "NOT_FOUND"),
                       (["queue", "show", "one"], "NOT_FOUND"),  # a job name is not a dispatch
                       (["queue", "list", "--job", "nope"], "NOT_FOUND"),
                       (["queue", "list", "--status", "lost"], "INVALID_ARGUMENT"),
                       (["queue", "list", "--limit", "0"], "INVALID_ARGUMENT")):
        res = cli("--json", *args)
        assert res.code != 0 and res.json["ok"] is False and res.json["code"] == code, (args, res)
    # Two manual dispatches of one job share the prefix JOB_ID:manual: an ambiguous prefix is refused, not guessed.
    ok(cli("--json", "jobs", "run", "one"))
    job_id = ok(cli("--json", "jobs", "get", "one"))["job"]["id"]
    res = cli("--json", "queue", "show", f"{job_id}:manual:")
    assert res.code != 0 and res.json["code"] == "INVALID_ARGUMENT" and "ambiguous" in res.json["error"], res


def test_queue_reads_open_the_database_read_only(db_path: Path, monkeypatch: Any) -> None:
    """While another connection holds SQLite's write lock, ``queue list`` and ``queue show`` still answer."""
    from scheduler.cli.main import main

    def run(*args: str) -> tuple[int, str]:
        import io
        from contextlib import redirect_stderr, redirect_stdout

        out = io.StringIO()
        with redirect_stdout(out), redirect_stderr(io.StringIO()):
            code = main(["--db", str(db_path), "--json", *args])
        return code, out.getvalue()

    assert run("jobs", "add", json.dumps({"name": "a", "schedule_kind": "manual", "payload_message": "true"}))[0] == 0
    code, out = run("jobs", "run", "a")
    dispatch_id = json.loads(out.splitlines()[-1])["dispatch"]["id"]
    holder = sqlite3.connect(db_path, isolation_level=None, timeout=0.1)
    holder.execute("BEGIN IMMEDIATE")
    try:
        code, out = run("queue", "list")
        assert code == 0 and [d["id"] for d in json.loads(out.splitlines()[-1])["dispatches"]] == [dispatch_id], out
        code, out = run("queue", "show", dispatch_id)
        assert code == 0 and json.loads(out.splitlines()[-1])["dispatch"]["status"] == "pending", out
    finally:
        holder.execute("ROLLBACK")
        holder.close()
