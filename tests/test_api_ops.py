"""``scheduler.api.ops``, the plugin's way to act on the scheduler, is the CLI: same values, same state changes, same codes.

Every operation runs through the facade and through the real CLI (in-process, ``main``) on one
SQLite file. Reads must give exactly what the command prints under ``--json``; an action is
done through the facade on one job (run, approval, part) and through the CLI on its twin,
and the answers and the stored state of both must match once ids, names and instants are
set aside. Refused input must give the CLI's code through both and leave every table as it
was. The runs come from a real dispatcher with the testkit executor, the failed deliveries
from the webhook channel against a loopback server that answers 400.
"""

from __future__ import annotations

import base64
import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.api import ops
from scheduler.base.errors import SchedulerError
from scheduler.settings import reload_settings
from scheduler.testing.http import LoopbackHTTPServer, Reply

#: The id of an outbox part that has not failed (``deliveries retry`` refuses it).
PART = "g-1:part:1/1"
TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")
#: Keys whose values differ between twins by construction: ids, names (and principals: ``job:NAME``), instants, durations,
#: digests, claims.
VOLATILE = re.compile(r"(^|_)(id|at|for|name|digest|key|ms|owner|token|part|principal)$")


@pytest.fixture
def store_url(db_path: Path) -> str:
    """This module runs on a real SQLite file only (the ``store``, ``cli`` and ``dispatcher`` fixtures follow it)."""
    return str(db_path)


# -- helpers ---------------------------------------------------------------------------------------


def as_printed(value: Any) -> Any:
    """``value`` as the CLI's JSON printer renders it (``json.dumps(default=str)``) and a reader parses it back."""
    return json.loads(json.dumps(value, default=str))


def cli_ok(cli: Any, *args: str, key: str | None = None) -> Any:
    """The ``--json`` answer of a successful command: its ``key`` member, or the whole payload without ``ok``."""
    res = cli("--json", *args)
    assert res.code == 0, res
    doc = res.json
    assert doc.pop("ok") is True, doc
    return doc[key] if key is not None else doc


def cli_code(cli: Any, *args: str) -> str:
    """The error code a refused command prints under ``--json``."""
    res = cli("--json", *args)
    assert res.code != 0, res
    doc = res.json
    assert doc["ok"] is False, doc
    return doc["code"]


def facade_code(call: Callable[[], Any]) -> str:
    """The code of the ``SchedulerError`` a facade call raises (it must raise one)."""
    with pytest.raises(SchedulerError) as err:
        call()
    return err.value.code


def shape(value: Any) -> Any:
    """``value`` without what differs between twins (``VOLATILE`` keys), to compare what an action did to each."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if not VOLATILE.search(k)}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return value


def snapshot(db: Path) -> list[str]:
    """Every row of every table, as SQL text (read through a connection of its own)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def job_state(store: Any, job_id: str) -> dict[str, Any]:
    """What an action may change about a job: its view, its runs, its queued dispatches and its events."""
    with store.read() as tx:
        dispatches = tx.all("SELECT kind, status, requested_by, cancel_reason FROM job_dispatch_queue WHERE job_id = ? ORDER BY id",
                            (job_id,))
        events = tx.all("SELECT kind, actor, data FROM runtime_events WHERE job_id = ? ORDER BY id", (job_id,))
    return {"job": shape(ops.get_job(store, job_id)), "runs": shape([ops.get_run(store, r["id"]) for r in run_rows(store, job_id)]),
            "dispatches": dispatches, "events": shape([{**e, "data": json.loads(e["data"]) if e["data"] else None} for e in events])}


def twins(store: Any, **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two jobs that differ only by name: one for the facade, one for the CLI."""
    return add_job(store, **spec), add_job(store, **spec)


def pending_approvals(store: Any, count: int) -> list[dict[str, Any]]:
    """Wait until ``count`` approvals are pending; return them, oldest first."""
    return wait_for(lambda: len(rows := ops.list_approvals(store, pending=True)) == count and rows[::-1], timeout=20,
                    what=f"{count} pending approvals")


# -- the facade itself -----------------------------------------------------------------------------


def test_every_operation_is_documented_and_exported() -> None:
    """The module docstring lists each operation with its CLI command; ``__all__`` exports exactly the public names."""
    doc = ops.__doc__ or ""
    operations = [n for n in ops.__all__ if n not in ("JsonObject", "StoreTarget", "open_store")]
    assert len(operations) == 29
    for name in operations:
        assert callable(getattr(ops, name)) and getattr(ops, name).__doc__, name
        assert f"``{name}(store" in doc, f"the docstring of scheduler.api.ops does not list {name}"
    public = {n for n, v in vars(ops).items() if not n.startswith("_") and callable(v) and getattr(v, "__module__", "") == ops.__name__}
    assert public == set(operations)


def test_importing_the_facade_imports_no_cli() -> None:
    """A plugin that imports ``scheduler.api.ops`` does not pull in the CLI (the facade sits below it)."""
    code = "import sys, scheduler.api.ops; print(sorted(m for m in sys.modules if m.startswith('scheduler.cli')))"
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_a_path_or_url_is_opened_for_the_call_and_anything_else_refused(store: Any, db_path: Path) -> None:
    job = add_job(store, name="by-path", payload_message="ok")
    assert ops.get_job(str(db_path), "by-path") == ops.get_job(db_path, job["id"]) == ops.get_job(store, "by-path")
    assert ops.get_job(f"sqlite:///{db_path}", "by-path")["id"] == job["id"]
    assert ops.disable_job(db_path, "by-path")["state"] == "disabled"  # an action through a path commits
    assert ops.get_job(store, job["id"])["state"] == "disabled"
    assert facade_code(lambda: ops.get_job(None, "by-path")) == "INVALID_ARGUMENT"  # type: ignore[arg-type]
    assert facade_code(lambda: ops.list_jobs(42)) == "INVALID_ARGUMENT"  # type: ignore[arg-type]


# -- reading ---------------------------------------------------------------------------------------


def test_reads_are_what_the_cli_prints(store: Any, cli: Any, dispatcher: Any, db_path: Path) -> None:
    alpha = add_job(store, name="alpha", payload_message="echo:one")
    beta = add_job(store, name="beta", payload_message="fail")
    add_job(store, name="gamma", schedule_kind="every", schedule_every="1h", payload_message="ok")
    gated = add_job(store, name="gated", payload_message="ok", approval_required=True, approval_risk_level="high")
    ops.disable_job(store, "gamma")
    for job in (alpha, beta, gated):
        ops.run_job(store, job["id"])
    d = dispatcher()
    for job in (alpha, beta):
        wait_for(lambda j=job: [r for r in run_rows(store, j["id"]) if r["status"] in TERMINAL], timeout=20, what="finished run")
    (approval,) = pending_approvals(store, 1)
    d.stop()
    run = run_rows(store, alpha["id"])[0]

    for kwargs, args in [({}, []), ({"enabled": True}, ["--enabled"]), ({"enabled": False}, ["--disabled"]),
                         ({"limit": 2}, ["--limit", "2"])]:
        assert as_printed(ops.list_jobs(store, **kwargs)) == cli_ok(cli, "jobs", "list", *args, key="jobs"), kwargs
    assert [j["state"] for j in ops.list_jobs(db_path)] == ["enabled", "enabled", "disabled", "enabled"]
    assert as_printed(ops.get_job(store, "beta")) == cli_ok(cli, "jobs", "get", beta["id"], key="job")
    for ref, count in (("gamma", 3), ("alpha", 5)):  # a disabled interval job: from now; a manual one: none
        assert ops.next_runs(store, ref, count)["fires"] == cli_ok(cli, "jobs", "next", ref, "-n", str(count), key="fires")
    assert len(ops.next_runs(store, "gamma", 3)["fires"]) == 3 and ops.next_runs(store, "alpha")["fires"] == []

    for kwargs, args in [({}, []), ({"job": "alpha"}, ["alpha"]), ({"status": "error"}, ["--status", "error"]),
                         ({"limit": 1}, ["--limit", "1"]), ({"job": gated["id"], "status": "awaiting_approval"},
                                                             [gated["id"], "--status", "awaiting_approval"])]:
        got = as_printed(ops.list_runs(store, **kwargs))
        assert got and got == cli_ok(cli, "runs", "list", *args, key="runs"), kwargs
    assert [r["status"] for r in ops.list_runs(store, job="beta")] == ["error"]
    for ref in (run["id"], run["id"][-8:]):
        view = ops.get_run(db_path, ref)
        assert as_printed(view) == cli_ok(cli, "runs", "get", ref, key="run") and view["stdout_excerpt"] == "one"

    for kwargs, args in [({}, []), ({"pending": True}, ["--pending"]), ({"job": "gated"}, ["--job", "gated"]),
                         ({"pending": True, "job": "alpha"}, ["--pending", "--job", "alpha"])]:
        assert as_printed(ops.list_approvals(store, **kwargs)) == cli_ok(cli, "approvals", "list", *args, key="approvals"), kwargs
    assert [a["risk_level"] for a in ops.list_approvals(store, pending=True)] == ["high"]
    for ref in (approval["id"], approval["id"][:8]):
        assert as_printed(ops.get_approval(store, ref)) == cli_ok(cli, "approvals", "show", ref, key="approval")
    assert ops.list_deliveries(store) == cli_ok(cli, "deliveries", "list", key="deliveries") == []


def test_events_output_evidence_status_doctor_and_run_pages_are_what_the_cli_prints(store: Any, cli: Any, dispatcher: Any,
                                                                                       db_path: Path) -> None:
    """The reads the web view added (issue 33) are the CLI's: ``runs events``, ``runs output --both``, ``runs evidence``,
    ``status`` and ``doctor`` give the same values through the facade; ``list_runs`` pages by a keyset cursor and a window."""
    job = add_job(store, name="proved", payload_message="echo:<b>out</b>", evidence={"provider": "checksum"})
    for n in range(1, 4):  # one run per dispatcher: three distinct creation instants
        ops.run_job(store, "proved")
        d = dispatcher()
        wait_for(lambda n=n: len([r for r in run_rows(store, job["id"]) if r["status"] in TERMINAL]) == n, timeout=20,
                 what="finished run")
        d.stop()
    runs = ops.list_runs(store, job="proved")
    assert len(runs) == 3
    assert ops.job_names(store) == {job["id"]: "proved"}
    newest = runs[0]["id"]
    assert as_printed(ops.run_events(store, newest)) == cli_ok(cli, "runs", "events", newest, key="events")
    assert [e["kind"] for e in ops.run_events(store, newest)][:1] and ops.run_events(store, newest)[0]["run_id"] == newest
    output = ops.run_output(db_path, newest[-8:])
    assert output == cli_ok(cli, "runs", "output", newest, "--both")
    assert output["streams"]["stdout"]["content"] == "<b>out</b>" and output["complete"] is True
    assert as_printed(ops.verify_evidence(store, newest)) == cli_ok(cli, "runs", "evidence", newest)
    status = as_printed(ops.status(store))
    printed = cli_ok(cli, "status", key="status")
    for volatile in ("free_bytes",):
        status.pop(volatile), printed.pop(volatile)
    assert status == printed and status["runs"] == {"ok": 3}
    doctor = ops.doctor(store)
    res = cli("--json", "doctor")
    assert [c["check"] for c in doctor["checks"]] == [c["check"] for c in (res.json.get("checks") or res.json["details"])]
    assert doctor["healthy"] is (res.code == 0)
    # pages: the cursor gives the runs after it, the window the runs created in it; the three runs are the three pages
    pages = [ops.list_runs(store, job="proved", limit=1)]
    while len(pages) < 4:
        pages.append(ops.list_runs(store, job="proved", limit=1, before=pages[-1][0]["id"]) if pages[-1] else [])
    assert [p[0]["id"] for p in pages[:3]] == [r["id"] for r in runs] and pages[3] == []
    created = sorted(r["created_at"] for r in run_rows(store, job["id"]))
    assert [r["id"] for r in ops.list_runs(store, since_ms=created[1], until_ms=created[2])] == [runs[1]["id"]]
    assert facade_code(lambda: ops.list_runs(store, before="nope-nope")) == "NOT_FOUND"


# -- acting ----------------------------------------------------------------------------------------


def test_run_enable_disable_and_cancel_job_do_what_the_cli_does(store: Any, cli: Any, db_path: Path) -> None:
    a, b = twins(store, schedule_kind="every", schedule_every="1h", payload_message="ok")
    mine = ops.run_job(store, a["name"])
    theirs = cli_ok(cli, "jobs", "run", b["name"], key="dispatch")
    assert mine["job_id"] == a["id"] and mine["kind"] == "manual" and mine["status"] == "pending"
    assert shape(as_printed(mine)) == shape(theirs) and job_state(store, a["id"]) == job_state(store, b["id"])

    mine = ops.disable_job(db_path, a["id"])
    theirs = cli_ok(cli, "jobs", "disable", b["id"], key="job")
    assert mine["state"] == "disabled" and mine["next_run_at"] is None  # a job that will not fire shows no next run
    assert shape(as_printed(mine)) == shape(theirs) and job_state(store, a["id"]) == job_state(store, b["id"])

    mine = ops.enable_job(store, a["name"])
    theirs = cli_ok(cli, "jobs", "enable", b["name"], key="job")
    assert mine["state"] == "enabled"
    assert shape(as_printed(mine)) == shape(theirs) and job_state(store, a["id"]) == job_state(store, b["id"])

    ops.run_job(store, a["id"])
    cli_ok(cli, "jobs", "run", b["id"])
    mine = ops.cancel_job(store, a["id"], reason="tidy up")
    theirs = cli_ok(cli, "jobs", "cancel", b["id"], "--reason", "tidy up")
    assert mine["job_id"] == a["id"] and mine["dispatches"] == 2 and mine["runs"] == []  # disable kept the manual one
    assert shape(as_printed(mine)) == shape(theirs) and job_state(store, a["id"]) == job_state(store, b["id"])
    with store.read() as tx:
        kinds = [r["kind"] for r in tx.all("SELECT kind FROM runtime_events WHERE job_id = ? ORDER BY id", (a["id"],))]
    assert kinds == ["job.created", "dispatch.manual", "job.disabled", "job.enabled", "dispatch.manual", "job.pending_cancelled",
                     "job.cancel_requested"]


def test_approvals_and_run_cancels_do_what_the_cli_does(store: Any, cli: Any, dispatcher: Any, db_path: Path) -> None:
    """Approve, reject (by id and by job) and cancel an awaiting run, each through both; then a running run."""
    pairs = [twins(store, payload_message="ok", approval_required=True) for _ in range(5)]
    for a, b in pairs:
        ops.run_job(store, a["id"])
        ops.run_job(store, b["id"])
    d = dispatcher()
    pending_approvals(store, 10)
    d.stop()  # the decided runs stay approved / cancelled: nothing else moves while the two are compared
    approval_of = {a["job_id"]: a for a in ops.list_approvals(store, pending=True)}
    (approve_a, approve_b), (reject_a, reject_b), (job_approve_a, job_approve_b), (job_reject_a, job_reject_b), (cancel_a, cancel_b) = pairs

    mine = ops.approve(store, approval_of[approve_a["id"]]["id"], note="fine")
    theirs = cli_ok(cli, "approvals", "approve", approval_of[approve_b["id"]]["id"][:8], "--note", "fine", key="approval")
    assert mine["status"] == "approved" and mine["note"] == "fine" and mine["decided_by"]
    assert shape(as_printed(mine)) == shape(theirs)
    mine = ops.reject(db_path, approval_of[reject_a["id"]]["id"])
    theirs = cli_ok(cli, "approvals", "reject", approval_of[reject_b["id"]]["id"], key="approval")
    assert mine["status"] == "rejected" and shape(as_printed(mine)) == shape(theirs)
    mine = ops.approve_job(store, job_approve_a["name"])
    theirs = cli_ok(cli, "jobs", "approve", job_approve_b["name"], key="approval")
    assert mine["status"] == "approved" and shape(as_printed(mine)) == shape(theirs)
    mine = ops.reject_job(store, job_reject_a["id"], note="no")
    theirs = cli_ok(cli, "jobs", "reject", job_reject_b["id"], "--note", "no", key="approval")
    assert mine["status"] == "rejected" and shape(as_printed(mine)) == shape(theirs)

    (waiting_a,) = run_rows(store, cancel_a["id"])
    (waiting_b,) = run_rows(store, cancel_b["id"])
    mine = ops.cancel_run(store, waiting_a["id"][-10:], reason="not now")
    theirs = cli_ok(cli, "runs", "cancel", waiting_b["id"][-10:], "--reason", "not now")
    assert mine["run_id"] == waiting_a["id"] and mine["outcome"] == "cancelled"
    assert shape(as_printed(mine)) == shape(theirs)

    for a, b in pairs:
        assert job_state(store, a["id"]) == job_state(store, b["id"]), a["name"]
    assert [r["status"] for r in run_rows(store, approve_a["id"])] == ["approved"]
    assert [(r["status"], r["error_code"]) for r in run_rows(store, reject_a["id"])] == [("cancelled", "APPROVAL_REJECTED")]
    assert [r["status"] for r in run_rows(store, cancel_a["id"])] == ["cancelled"]

    # A running run only gets the request; its dispatcher ends it cancelled.
    sleepers = twins(store, payload_message="sleep:30")
    for job in sleepers:
        ops.run_job(store, job["id"])
    d = dispatcher()
    running = [wait_for(lambda j=job: [r for r in run_rows(store, j["id"]) if r["status"] == "running"], timeout=20,
                        what="a running run")[0] for job in sleepers]
    mine = ops.cancel_run(store, running[0]["id"])
    theirs = cli_ok(cli, "runs", "cancel", running[1]["id"])
    assert mine["outcome"] == theirs["outcome"] == "requested" and mine["requested_by"] == theirs["requested_by"]
    for job in sleepers:
        wait_for(lambda j=job: run_rows(store, j["id"])[0]["status"] == "cancelled", timeout=20, what="cancelled run")
    d.stop()
    assert shape(job_state(store, sleepers[0]["id"])) == shape(job_state(store, sleepers[1]["id"]))


@pytest.fixture
def receiver() -> Iterator[LoopbackHTTPServer]:
    srv = LoopbackHTTPServer()
    yield srv
    srv.close()


@pytest.fixture
def webhook_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The webhook channel signs with a known secret and cuts parts at 100 characters; retries are quick."""
    config = tmp_path / "scheduler.toml"
    config.write_text('[channels.webhook]\nsecret = {credential = "env:TEST_WEBHOOK_SECRET"}\nmax_chars = 100\ntimeout_s = 2\n'
                      "[delivery]\nretry_base_ms = 30\nretry_max_ms = 200\nclaim_ttl_ms = 600\n")
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode())
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    reload_settings()


def test_deliveries_read_and_retry_as_the_cli_does(store: Any, cli: Any, dispatcher: Any, receiver: LoopbackHTTPServer,
                                                   webhook_settings: None, db_path: Path) -> None:
    receiver.default("/hook", Reply(status=400, json={"error": "bad"}))  # permanent: each message fails at its first part
    a, b = twins(store, payload_message="echo:" + "z" * 250, delivery_mode="always", delivery_channel="webhook",
                 delivery_to=f"{receiver.url}/hook")
    for job in (a, b):
        ops.run_job(store, job["id"])
    d = dispatcher()
    for job in (a, b):
        wait_for(lambda j=job: (rows := ops.list_deliveries(store, job=j["id"])) and all(p["status"] == "failed" for p in rows),
                 timeout=20, what="failed parts")
    d.stop()

    for kwargs, args in [({}, []), ({"status": "failed"}, ["--status", "failed"]), ({"job": a["name"]}, ["--job", a["name"]]),
                         ({"limit": 3}, ["--limit", "3"]), ({"status": "delivered"}, ["--status", "delivered"])]:
        assert as_printed(ops.list_deliveries(store, **kwargs)) == cli_ok(cli, "deliveries", "list", *args, key="deliveries"), kwargs
    (run_a,) = run_rows(store, a["id"])
    of_run = ops.list_deliveries(db_path, run=run_a["id"][-8:])
    assert len(of_run) > 1 and of_run == [p for p in ops.list_deliveries(store) if p["run_id"] == run_a["id"]]
    assert ops.list_deliveries(store, run=run_a["id"], job=b["id"]) == []
    assert ops.list_deliveries(store, run=run_a["id"], status="pending") == []
    part_a, part_b = (ops.list_deliveries(store, job=j["id"])[0] for j in (a, b))
    assert as_printed(ops.get_delivery(store, part_a["id"])) == cli_ok(cli, "deliveries", "show", part_a["id"], key="delivery")

    mine = ops.retry_delivery(store, part_a["id"])
    theirs = cli_ok(cli, "deliveries", "retry", part_b["id"], key="delivery")
    assert mine["status"] == "pending" and mine["attempts"] == 0
    assert shape(as_printed(mine)) == shape(theirs)
    assert all(p["status"] == "pending" for p in ops.list_deliveries(store, run=run_a["id"]))  # the whole message is re-armed
    assert job_state(store, a["id"]) == job_state(store, b["id"])
    assert shape(ops.list_deliveries(store, job=a["id"])) == shape(ops.list_deliveries(store, job=b["id"]))


# -- refusals --------------------------------------------------------------------------------------


def test_refusals_have_the_cli_codes_and_change_nothing(store: Any, cli: Any, dispatcher: Any, db_path: Path) -> None:
    done = add_job(store, name="done", payload_message="ok")
    add_job(store, name="gated", payload_message="ok", approval_required=True)
    add_job(store, name="off", payload_message="ok")
    ops.disable_job(store, "off")
    add_job(store, name="busy", payload_message="ok", approval_required=True, overlap_policy="skip")
    for name in ("done", "gated", "busy"):
        ops.run_job(store, name)
    d = dispatcher()
    (finished,) = wait_for(lambda: [r for r in run_rows(store, done["id"]) if r["status"] == "ok"], timeout=20, what="ok run")
    pending_approvals(store, 2)
    d.stop()
    decided = ops.approve_job(store, "gated")
    with store.transaction() as tx:  # a part that has not failed, of the finished run
        tx.execute("INSERT INTO delivery_outbox (id, run_id, job_id, channel, target, idempotency_key, group_key, part_index,"
                   " part_count, body, status, max_attempts, due_at, created_at, updated_at) VALUES (?, ?, ?, 'webhook', NULL, ?,"
                   " 'g-1', 1, 1, 'hello', 'pending', 5, 0, 0, 0)", (PART, finished["id"], done["id"], PART))
    unknown_run = "5f0c9a2e-0000-4000-8000-000000000000"

    cases: list[tuple[str, Callable[[], Any], list[str]]] = [
        ("NOT_FOUND", lambda: ops.get_job(store, "nope"), ["jobs", "get", "nope"]),
        ("NOT_FOUND", lambda: ops.run_job(store, "nope"), ["jobs", "run", "nope"]),
        ("NOT_FOUND", lambda: ops.enable_job(db_path, "nope"), ["jobs", "enable", "nope"]),
        ("NOT_FOUND", lambda: ops.disable_job(store, "nope"), ["jobs", "disable", "nope"]),
        ("NOT_FOUND", lambda: ops.cancel_job(store, "nope"), ["jobs", "cancel", "nope"]),
        ("NOT_FOUND", lambda: ops.list_runs(store, job="nope"), ["runs", "list", "nope"]),
        ("NOT_FOUND", lambda: ops.list_approvals(store, job="nope"), ["approvals", "list", "--job", "nope"]),
        ("NOT_FOUND", lambda: ops.list_deliveries(store, job="nope"), ["deliveries", "list", "--job", "nope"]),
        ("NOT_FOUND", lambda: ops.approve_job(store, "nope"), ["jobs", "approve", "nope"]),
        ("NOT_FOUND", lambda: ops.approve_job(store, "done"), ["jobs", "approve", "done"]),  # no pending approval
        ("NOT_FOUND", lambda: ops.get_run(store, unknown_run), ["runs", "get", unknown_run]),
        ("NOT_FOUND", lambda: ops.cancel_run(store, unknown_run), ["runs", "cancel", unknown_run]),
        ("NOT_FOUND", lambda: ops.cancel_run(db_path, "nope"), ["runs", "cancel", "nope"]),
        ("NOT_FOUND", lambda: ops.approve(store, "nope"), ["approvals", "approve", "nope"]),
        ("NOT_FOUND", lambda: ops.get_approval(store, "nope"), ["approvals", "show", "nope"]),
        ("NOT_FOUND", lambda: ops.retry_delivery(store, "nope"), ["deliveries", "retry", "nope"]),
        ("NOT_FOUND", lambda: ops.get_delivery(store, "nope"), ["deliveries", "show", "nope"]),
        ("RUN_ALREADY_FINISHED", lambda: ops.cancel_run(store, finished["id"]), ["runs", "cancel", finished["id"]]),
        ("RUN_ALREADY_FINISHED", lambda: ops.cancel_run(db_path, finished["id"][-8:]), ["runs", "cancel", finished["id"][-8:]]),
        ("APPROVAL_CONFLICT", lambda: ops.approve(store, decided["id"]), ["approvals", "approve", decided["id"]]),
        ("APPROVAL_CONFLICT", lambda: ops.reject(db_path, decided["id"]), ["approvals", "reject", decided["id"]]),
        ("JOB_DISABLED", lambda: ops.run_job(store, "off"), ["jobs", "run", "off"]),
        ("JOB_ALREADY_RUNNING", lambda: ops.run_job(store, "busy"), ["jobs", "run", "busy"]),  # awaiting approval, skip
        ("DELIVERY_NOT_FAILED", lambda: ops.retry_delivery(store, PART), ["deliveries", "retry", PART]),
        ("INVALID_ARGUMENT", lambda: ops.list_runs(store, status="finished"), ["runs", "list", "--status", "finished"]),
        ("INVALID_ARGUMENT", lambda: ops.list_runs(store, status=""), ["runs", "list", "--status", ""]),
        ("INVALID_ARGUMENT", lambda: ops.list_runs(store, limit=0), ["runs", "list", "--limit", "0"]),
        ("INVALID_ARGUMENT", lambda: ops.list_jobs(store, limit=100_001), ["jobs", "list", "--limit", "100001"]),
        ("INVALID_ARGUMENT", lambda: ops.list_approvals(store, limit=-1), ["approvals", "list", "--limit", "-1"]),
        ("INVALID_ARGUMENT", lambda: ops.list_deliveries(store, status="lost"), ["deliveries", "list", "--status", "lost"]),
    ]
    before = snapshot(db_path)
    for code, call, args in cases:
        assert (facade_code(call), cli_code(cli, *args)) == (code, code), args
        assert snapshot(db_path) == before, f"{args} changed the database"
    ops.disable_job(store, "done")  # and the snapshot does see a change
    assert snapshot(db_path) != before
