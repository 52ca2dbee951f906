"""One module owns every run and dispatch transition (issue 8), on both stores.

Observer hooks fire after commit for every terminal status and for start, in the
process that committed; one function cancels a job's pending work (disable, delete,
auto-pause, update, ``jobs cancel`` behave alike); the watchdog rule; final process
states; missed slots always leave a record (issue 9, defect 3); the recovery audit
names what really happened and who recovered it (issue 9, defect 9).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import RunningDispatcher, add_job, run_rows, wait_for

from scheduler.base.timeutil import now_ms
from scheduler.core import lease as leases
from scheduler.core.cancel import cancel_job, cancel_run
from scheduler.core.completion import complete_run, watchdog_alerts
from scheduler.core.execution import ExecutionResult
from scheduler.core.jobs import delete_job, set_enabled, update_job
from scheduler.core.queue import claim_and_start, enqueue_manual, insert_dispatch, materialize_due, record_skip
from scheduler.core.recovery import recover
from scheduler.core.rows import JobRow, RunRow
from scheduler.core.runs import TERMINAL
from scheduler.core.transitions import committing
from scheduler.pipeline.participants import default_completion_participants, default_recovery_participants
from scheduler.plugins.hookspecs import hookimpl
from scheduler.testing import hooks_with

COMPLETION = default_completion_participants()
RECOVERY = default_recovery_participants()
ROOT = Path(__file__).resolve().parents[1]


class Recorder:
    """An observer hook module that remembers what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    @hookimpl
    def scheduler_run_state_changed(self, run_id: str, job_id: str, old_status: str | None, new_status: str, at_ms: int) -> None:
        with self.lock:
            self.calls.append(("state", (run_id, job_id, old_status, new_status, at_ms)))

    @hookimpl
    def scheduler_run_completed(self, run: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append(("completed", run))

    def states(self, run_id: str) -> list[tuple[str | None, str]]:
        with self.lock:
            return [(a[2], a[3]) for k, a in self.calls if k == "state" and a[0] == run_id]

    def completed(self, run_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [a for k, a in self.calls if k == "completed" and a["id"] == run_id]


@pytest.fixture
def hooked(store):
    """``start(hooks, **config)``: a real dispatcher (``scheduler.testing.RunningDispatcher``) with these observer hooks."""
    started: list[RunningDispatcher] = []

    def start(hooks: Any, **config: Any) -> RunningDispatcher:
        d = RunningDispatcher(store, hooks=hooks, **config)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.thread.is_alive():
            d.stop()


def statuses(store, job_id):
    return [r["status"] for r in run_rows(store, job_id)]


def events(store, **where: Any) -> list[dict[str, Any]]:
    sql = "SELECT * FROM runtime_events" + (" WHERE " + " AND ".join(f"{k} = ?" for k in where) if where else "") + " ORDER BY id"
    with store.read() as tx:
        rows = tx.all(sql, list(where.values()))
    for r in rows:
        r["data"] = json.loads(r["data"]) if r["data"] else None
    return rows


def one(store, sql: str, *params: Any) -> Any:
    with store.read() as tx:
        return tx.one(sql, params)


def insert_run(store, job_id: str, status: str, **cols: Any) -> str:
    """A run row written directly (statuses the kernel reaches only through plugins not built yet)."""
    run_id = cols.pop("id", None) or str(uuid.uuid4())
    values = {"id": run_id, "job_id": job_id, "status": status, "created_at": now_ms(), **cols}
    with store.transaction() as tx:
        tx.execute(f"INSERT INTO runs({', '.join(values)}) VALUES ({', '.join('?' for _ in values)})", list(values.values()))
    return run_id


def insert_approval(store, job_id: str, run_id: str | None, status: str = "pending") -> str:
    approval_id = str(uuid.uuid4())
    with store.transaction() as tx:
        tx.execute(
            "INSERT INTO approvals(id, job_id, run_id, status, risk_level, requested_at, artifact_digest)"
            " VALUES (?, ?, ?, ?, 'high', ?, (SELECT artifact_digest FROM jobs WHERE id = ?))",
            (approval_id, job_id, run_id, status, now_ms(), job_id))
    return approval_id


# -- one owner --------------------------------------------------------------------------------------


def test_only_the_transitions_module_writes_run_and_dispatch_statuses():
    """Run status and dispatch status are written in one module (the store migrations aside)."""
    pattern = re.compile(r"(UPDATE runs SET[^\"]*\bstatus\s*=|INSERT INTO runs\b|UPDATE job_dispatch_queue SET[^\"]*\bstatus\s*="
                         r"|UPDATE approvals SET[^\"]*\bstatus\s*=)")
    offenders = []
    for path in sorted((ROOT / "scheduler").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("scheduler/core/transitions/", "scheduler/core/state/")) or rel in ("scheduler/core/store/migrations.py",
                                                                     "scheduler/core/store/data_moves.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


# -- observer hooks after commit -------------------------------------------------------------------


def test_observers_hear_start_and_every_terminal_status_from_the_dispatcher(store, hooked):
    rec = Recorder()
    jobs = {
        "ok": add_job(store, payload_message="echo:hi"),
        "error": add_job(store, payload_message="fail", max_retries=0),
        "timeout": add_job(store, payload_message="sleep:5", run_timeout_ms=300, max_retries=0),
        "cancelled": add_job(store, payload_message="sleep:30"),
    }
    skip_job = add_job(store, payload_message="sleep:30", overlap_policy="skip")
    hooked(hooks_with(rec), concurrency=8)
    for job in jobs.values():
        enqueue_manual(store, job["id"])
    enqueue_manual(store, skip_job["id"])
    victim = wait_for(lambda: [r for r in run_rows(store, jobs["cancelled"]["id"]) if r["status"] == "running"], what="running")[0]
    cancel_run(store, victim["id"], hooks=hooks_with())  # the dispatcher's completion tells its observers
    wait_for(lambda: statuses(store, skip_job["id"]) == ["running"], what="skip job running")
    insert_dispatch_now(store, skip_job["id"])
    wait_for(lambda: sorted(statuses(store, skip_job["id"])) == ["running", "skipped"], what="overlap skip")
    for expected, job in jobs.items():
        run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] in TERMINAL], what=expected)[0]  # noqa: B023 - wait_for calls it at once
        assert run["status"] == expected
        wait_for(lambda: rec.states(run["id"]) == [(None, "running"), ("running", expected)], what=f"{expected} notices")  # noqa: B023 - wait_for calls it at once
        done = wait_for(lambda: rec.completed(run["id"]), what=f"{expected} completed")  # noqa: B023 - wait_for calls it at once
        assert len(done) == 1 and done[0]["status"] == expected and done[0]["finished_at"]
    skipped = next(r for r in run_rows(store, skip_job["id"]) if r["status"] == "skipped")
    wait_for(lambda: rec.states(skipped["id"]) == [(None, "skipped")], what="skip notice")
    assert rec.completed(skipped["id"])[0]["skip_reason"] == "overlap: job already running"
    with rec.lock:
        at = {a[0]: a[4] for k, a in rec.calls if k == "state" and a[3] == "ok"}
    ok_run = run_rows(store, jobs["ok"]["id"])[0]
    assert at[ok_run["id"]] == ok_run["finished_at"]


def insert_dispatch_now(store, job_id: str) -> None:
    from scheduler.core.queue import slot_dispatch_id

    slot = now_ms() - 1
    with store.transaction() as tx:
        insert_dispatch(tx, id=slot_dispatch_id(job_id, "schedule", slot), job_id=job_id, kind="schedule", due_at=slot, now=slot)
    store.notify_change()


def test_cancelling_a_waiting_run_notifies_the_observers_of_the_committing_process(store):
    rec = Recorder()
    job = add_job(store, payload_message="ok")
    run_id = insert_run(store, job["id"], "awaiting_approval")
    assert cancel_run(store, run_id, reason="no", hooks=hooks_with(rec))["outcome"] == "cancelled"
    assert rec.states(run_id) == [("awaiting_approval", "cancelled")]
    done = rec.completed(run_id)[0]
    assert done["status"] == "cancelled" and done["cancel_reason"] == "no" and done["process_state"] is None


def test_a_cli_process_runs_the_installed_hook_modules(store_url, store, tmp_path):
    """``runs cancel`` in its own process calls the entry-point hook modules installed there."""
    from importlib.metadata import entry_points

    if not any(ep.name == "hello" for ep in entry_points(group="scheduler.hooks")):
        pytest.skip("the example hook module (scheduler-executor-hello) is not installed")
    job = add_job(store, payload_message="ok")
    run_id = insert_run(store, job["id"], "pending")
    log = tmp_path / "states.jsonl"
    import os
    import sys

    res = subprocess.run([sys.executable, "-m", "scheduler", "--db", store_url, "--json", "runs", "cancel", run_id],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "HELLO_STATE_LOG": str(log)})
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [(ln["run_id"], ln["old"], ln["new"]) for ln in lines] == [(run_id, "pending", "cancelled")]


def test_notifications_fire_after_commit_once_and_never_after_a_rollback(store, store_url):
    from scheduler.plugins.stores import open_store

    job = add_job(store, payload_message="ok")
    other = open_store(store_url)  # another connection: sees only committed data
    seen: list[tuple[str, bool]] = []

    class Probe:
        @hookimpl
        def scheduler_run_state_changed(self, run_id, job_id, old_status, new_status, at_ms):
            with other.read() as tx:
                seen.append((new_status, tx.one("SELECT id FROM runs WHERE id = ?", (run_id,)) is not None))

    try:
        with pytest.raises(RuntimeError), committing(store, hooks_with(Probe())) as tx:
            record_skip(tx, JobRow.from_row(job), slot_ms=1, reason="test", now=now_ms())
            raise RuntimeError("roll back")
        assert seen == [] and run_rows(store, job["id"]) == []
        with committing(store, hooks_with(Probe())) as tx:
            # a nested committing block joins the outer one: nothing fires before the outer commit
            with committing(store, hooks_with()) as inner:
                record_skip(inner, JobRow.from_row(job), slot_ms=2, reason="test", now=now_ms())
            assert seen == []
            record_skip(tx, JobRow.from_row(job), slot_ms=3, reason="test", now=now_ms())
        assert seen == [("skipped", True), ("skipped", True)]
    finally:
        other.close()


def test_recovery_and_a_failed_completion_notify_observers(store, hooked):
    rec = Recorder()
    job = add_job(store, payload_message="ok")
    dead = leases.acquire(store, "dispatcher", "ghost:1:x", 1000, now=now_ms() - 5000)
    run_id = insert_run(store, job["id"], "running", dispatcher_owner=dead.owner, dispatcher_token=dead.token, started_at=now_ms())
    live = leases.acquire(store, "recovery-test", "rescuer", 10_000)
    assert [r["outcome"] for r in recover(store, live, participants=RECOVERY, hooks=hooks_with(rec))] == ["crashed"]
    assert rec.states(run_id) == [("running", "crashed")]
    assert rec.completed(run_id)[0]["error_code"] == "DISPATCHER_LOST"
    # a completion that itself fails still ends the run, and says so
    bad = add_job(store, name="bad", payload_message="sleep:0.4")
    hooked(hooks_with(rec))
    enqueue_manual(store, bad["id"])
    wait_for(lambda: statuses(store, bad["id"]) == ["running"], what="running")
    with store.transaction() as tx:
        tx.execute("UPDATE runs SET started_at = ? WHERE job_id = ?", (now_ms() + 3_600_000, bad["id"]))
    run = wait_for(lambda: [r for r in run_rows(store, bad["id"]) if r["status"] == "error"], what="error")[0]
    assert run["error_code"] == "COMPLETION_FAILED"
    wait_for(lambda: rec.states(run["id"]) == [(None, "running"), ("running", "error")], what="failure notice")
    assert rec.completed(run["id"])[0]["error_code"] == "COMPLETION_FAILED"


# -- one function cancels a job's pending work ------------------------------------------------------


def _pending_work(store) -> dict[str, Any]:
    """A job with every kind of pending work: a scheduled and a manual dispatch, a waiting run, approvals."""
    job = add_job(store, schedule_kind="every", schedule_every="1h", payload_message="fail", max_consecutive_failures=1,
                  overlap_policy="allow",  # the manual run below starts beside the run awaiting approval
                  max_retries=0)
    later = now_ms() + 3_600_000
    ids = {"scheduled": f"{job['id']}:schedule:{later}", "manual": f"{job['id']}:manual:x", "waiting": f"{job['id']}:schedule:w"}
    with store.transaction() as tx:
        for kind, dispatch_id in ids.items():
            insert_dispatch(tx, id=dispatch_id, job_id=job["id"], kind="manual" if kind == "manual" else "schedule", due_at=later,
                            now=now_ms())
        tx.execute("UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = 'x', claim_token = 'y', claim_expires_at = ?"
                   " WHERE id = ?", (later, ids["waiting"]))
    waiting = insert_run(store, job["id"], "awaiting_approval", dispatch_id=ids["waiting"], dispatch_kind="schedule")
    return {"job": job, "dispatches": ids, "waiting": waiting, "run_approval": insert_approval(store, job["id"], waiting),
            "job_approval": insert_approval(store, job["id"], None)}


def _outcome(store, work: dict[str, Any]) -> dict[str, Any]:
    """What became of the work ``_pending_work`` created (statuses only, comparable across jobs)."""
    out: dict[str, Any] = {}
    for kind, dispatch_id in work["dispatches"].items():
        out[f"dispatch:{kind}"] = one(store, "SELECT status FROM job_dispatch_queue WHERE id = ?", dispatch_id)["status"]
    run = one(store, "SELECT status, process_state FROM runs WHERE id = ?", work["waiting"])
    out.update(waiting_run=run["status"], waiting_process_state=run["process_state"])
    for key in ("run_approval", "job_approval"):
        out[key] = one(store, "SELECT status FROM approvals WHERE id = ?", work[key])["status"]
    out["enabled"] = one(store, "SELECT enabled FROM jobs WHERE id = ?", work["job"]["id"])["enabled"]
    return out


def test_auto_pause_cancels_pending_work_exactly_like_disable(store):
    """Auto-pause used to skip the approvals that disable cancels; both now use one function."""
    disabled, paused = _pending_work(store), _pending_work(store)
    set_enabled(store, disabled["job"]["id"], False, hooks=hooks_with())
    # auto-pause: one failure with max_consecutive_failures=1, committed by a dispatcher's completion
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    enqueue_manual(store, paused["job"]["id"])
    started = claim_and_start(store, lease, limit=1)
    assert len(started) == 1
    rec = Recorder()
    with committing(store, hooks_with(rec)):
        complete_run(store, lease, started[0].run_id, ExecutionResult(status="error", error_code="X"), participants=COMPLETION)
    assert _outcome(store, paused) == _outcome(store, disabled)
    out = _outcome(store, paused)
    assert out["enabled"] == 0 and out["waiting_run"] == "cancelled" and out["run_approval"] == "cancelled"
    assert out["job_approval"] == "cancelled" and out["dispatch:manual"] == "pending"  # an operator's explicit run survives
    assert out["dispatch:scheduled"] == out["dispatch:waiting"] == "cancelled"
    assert rec.states(paused["waiting"]) == [("awaiting_approval", "cancelled")]
    for work, reason in ((disabled, "job disabled"), (paused, "auto-paused after 1 consecutive failures")):
        assert one(store, "SELECT cancel_reason FROM runs WHERE id = ?", work["waiting"])["cancel_reason"] == reason
        summary = events(store, job_id=work["job"]["id"], kind="job.pending_cancelled")
        # every approval cancelled is counted: the waiting run's and the job's other one
        assert [e["data"] for e in summary] == [{"reason": reason, "dispatches": 1, "runs": 1, "approvals": 2}]


def test_update_delete_and_jobs_cancel_use_the_same_pending_work_cancel(store):
    updated = _pending_work(store)
    update_job(store, updated["job"]["id"], {"description": "cosmetic"}, hooks=hooks_with())  # not the contract: nothing ends
    out = _outcome(store, updated)
    assert (out["waiting_run"], out["run_approval"], out["job_approval"], out["dispatch:manual"]) == (
        "awaiting_approval", "pending", "pending", "pending")
    update_job(store, updated["job"]["id"], {"payload_message": "ok"}, hooks=hooks_with())
    out = _outcome(store, updated)
    # a new contract supersedes the artifact all of this was bound to, manual requests included
    assert (out["waiting_run"], out["run_approval"], out["job_approval"], out["dispatch:manual"]) == (
        "cancelled", "cancelled", "cancelled", "cancelled")
    cancelled = _pending_work(store)
    result = cancel_job(store, cancelled["job"]["id"], reason="stop", hooks=hooks_with())
    out = _outcome(store, cancelled)
    assert out["dispatch:manual"] == "cancelled" and out["waiting_run"] == "cancelled" and out["job_approval"] == "cancelled"
    assert result["runs"] == [{"run_id": cancelled["waiting"], "outcome": "cancelled"}] and result["dispatches"] == 2
    rec = Recorder()
    deleted = _pending_work(store)
    delete_job(store, deleted["job"]["id"], hooks=hooks_with(rec))
    assert rec.states(deleted["waiting"]) == [("awaiting_approval", "cancelled")]  # observers saw it end before it went
    assert rec.completed(deleted["waiting"])[0]["status"] == "cancelled"
    assert [e["data"]["reason"] for e in events(store, job_id=deleted["job"]["id"], kind="job.pending_cancelled")] == ["job deleted"]


# -- the watchdog rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "code", "alert"), [
    ("ok", None, False),
    ("error", "EXIT_NONZERO", True),
    ("error", "EXECUTOR_NOT_AVAILABLE", True),
    ("timeout", "RUN_TIMEOUT", True),
    ("timeout", "EXECUTOR_DEADLINE_EXCEEDED", True),
    ("error", "STALE_FENCE", False),
    ("error", "LEASE_LOST", False),
    ("error", "COMPLETION_FAILED", False),
    ("crashed", "DISPATCHER_LOST", False),
    ("cancelled", "RUN_CANCELLED", False),
    ("cancelled", "EXECUTOR_ABANDONED", False),
    ("skipped", None, False),
])
def test_watchdog_alerts_only_when_the_check_itself_failed(status, code, alert):
    assert watchdog_alerts(status, code) is alert


def _watchdog(store, **spec: Any) -> dict[str, Any]:
    return add_job(store, payload_message="ok", job_type="watchdog", watchdog_alert_channel="webhook", watchdog_alert_to="http://127.0.0.1:9/ops",
                   max_retries=0, max_consecutive_failures=0, **spec)


def _alerts(store, job_id: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT * FROM delivery_outbox WHERE job_id = ? AND group_key LIKE '%:watchdog-alert'", (job_id,))


def _run_once(store, lease, job, result: ExecutionResult) -> RunRow:
    enqueue_manual(store, job["id"])
    started = claim_and_start(store, lease, limit=1)
    return complete_run(store, lease, started[0].run_id, result, participants=COMPLETION)


def test_watchdog_alert_rows_follow_the_rule_through_completion_and_recovery(store):
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    failing, fenced, timed_out, cancelled = (_watchdog(store) for _ in range(4))
    _run_once(store, lease, failing, ExecutionResult(status="error", error_code="EXIT_NONZERO", exit_code=2))
    _run_once(store, lease, fenced, ExecutionResult(status="error", error_code="STALE_FENCE", error_message="fence lost"))
    _run_once(store, lease, timed_out, ExecutionResult(status="timeout", error_code="RUN_TIMEOUT"))
    _run_once(store, lease, cancelled, ExecutionResult(status="cancelled", error_code="RUN_CANCELLED"))
    assert len(_alerts(store, failing["id"])) == 1 and len(_alerts(store, timed_out["id"])) == 1
    assert _alerts(store, fenced["id"]) == [] and _alerts(store, cancelled["id"]) == []
    # a watchdog run its dispatcher lost, ended by crash recovery: no alert
    crashed = _watchdog(store)
    enqueue_manual(store, crashed["id"])
    dead = leases.acquire(store, "dead", "ghost:1:y", 1000, now=now_ms() - 5000)
    claim_and_start(store, dead, limit=1, check_lease=False)
    assert recover(store, lease, participants=RECOVERY, hooks=hooks_with())[0]["outcome"] == "crashed"
    assert statuses(store, crashed["id"]) == ["crashed"] and _alerts(store, crashed["id"]) == []


def test_watchdog_self_destruct_disables_the_job_and_cancels_its_pending_work(store):
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    job = _watchdog(store, schedule_kind="every", schedule_every="1h", watchdog_self_destruct=True)
    later = now_ms() + 3_600_000
    with store.transaction() as tx:
        insert_dispatch(tx, id=f"{job['id']}:schedule:{later}", job_id=job["id"], kind="schedule", due_at=later, now=now_ms())
    _run_once(store, lease, job, ExecutionResult(status="ok", exit_code=0))
    row = one(store, "SELECT * FROM jobs WHERE id = ?", job["id"])
    assert row is not None and row["enabled"] == 0 and row["next_run_at"] is None  # kept (not deleted), disabled
    assert one(store, "SELECT status FROM job_dispatch_queue WHERE id = ?", f"{job['id']}:schedule:{later}")["status"] == "cancelled"
    assert _alerts(store, job["id"]) == []


# -- process_state is final -------------------------------------------------------------------------


def test_no_finished_run_keeps_process_state_running(store, hooked):
    rec = Recorder()
    job = add_job(store, payload_message="ok")
    # cancel of a waiting run, a skip
    waiting = insert_run(store, job["id"], "pending")
    cancel_run(store, waiting, hooks=hooks_with())
    with committing(store, hooks_with()) as tx:
        record_skip(tx, JobRow.from_row(job), slot_ms=1, reason="test", now=now_ms())
    # a run that recorded a handle (process_state running): normal completion, and a completion that fails
    ok = add_job(store, name="spawn-ok", payload_message="spawn:0.2")
    bad = add_job(store, name="spawn-bad", payload_message="spawn:0.5")
    hooked(hooks_with(rec))
    enqueue_manual(store, ok["id"])
    enqueue_manual(store, bad["id"])
    wait_for(lambda: one(store, "SELECT process_state FROM runs WHERE job_id = ?", bad["id"]) is not None
             and one(store, "SELECT process_state FROM runs WHERE job_id = ?", bad["id"])["process_state"] == "running",
             what="handle recorded")
    with store.transaction() as tx:
        tx.execute("UPDATE runs SET started_at = ? WHERE job_id = ?", (now_ms() + 3_600_000, bad["id"]))
    wait_for(lambda: statuses(store, bad["id"]) == ["error"] and statuses(store, ok["id"]) == ["ok"], what="both ended")
    assert run_rows(store, ok["id"])[0]["process_state"] == "exited"
    assert run_rows(store, bad["id"])[0]["process_state"] == "exited"
    # recovery of a run that recorded a handle of work that is gone
    dead = leases.acquire(store, "dead", "ghost:1:z", 1000, now=now_ms() - 5000)
    crashed = insert_run(store, job["id"], "running", dispatcher_owner=dead.owner, dispatcher_token=dead.token, started_at=now_ms(),
                         executor="testkit", process_state="running", executor_handle=json.dumps({"note": "no pid"}))
    live = leases.acquire(store, "rescue", "rescuer", 10_000)
    recover(store, live, participants=RECOVERY, hooks=hooks_with())
    assert one(store, "SELECT process_state FROM runs WHERE id = ?", crashed)["process_state"] == "gone"
    with store.read() as tx:
        left = tx.all("SELECT id, status FROM runs WHERE process_state = 'running' AND status IN"
                      " ('ok', 'error', 'timeout', 'cancelled', 'crashed', 'skipped')")
    assert left == []


def test_an_abandoned_worker_leaves_process_state_unknown_not_exited(store):
    """The dispatcher committed the run without its executor: whether its work ended is not known."""
    from scheduler.core.transitions import fenced_update

    job = add_job(store, payload_message="ok")
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    enqueue_manual(store, job["id"])
    [started] = claim_and_start(store, lease, limit=1)
    with store.transaction() as tx:
        fenced_update(tx, started.run_id, lease.owner, lease.token, "running", {"process_state": "running"})
    complete_run(store, lease, started.run_id, ExecutionResult(status="cancelled", error_code="EXECUTOR_ABANDONED",
                                                               details={"abandoned": True}), participants=COMPLETION)
    assert run_rows(store, job["id"])[0]["process_state"] == "unknown"


# -- missed slots leave a record (issue 9, defect 3) ------------------------------------------------


def _slot_accounting(store, job_id: str, every_ms: int, until: int) -> tuple[set[int], set[int]]:
    """(every slot of the job's grid up to ``until``, the slots a run, skipped run or misfire event accounts for)."""
    runs = run_rows(store, job_id)
    accounted = {r["scheduled_for"] for r in runs}
    for e in events(store, job_id=job_id):
        d = e["data"] or {}
        if e["kind"] in ("slot.misfire_coalesced", "run.skipped") and "first" in d:
            accounted.update(range(d["first"], d["last"] + 1, every_ms))
    first = min(accounted)
    grid = set(range(first, until + 1, every_ms))
    return grid, accounted


@pytest.mark.parametrize("policy", ["coalesce", "skip"])
def test_a_short_gap_is_recorded_whatever_its_length(store, policy):
    job = add_job(store, schedule_kind="every", schedule_every="1s", payload_message="ok", misfire_policy=policy)
    first = job["next_run_at"]
    now = first + 5_200  # 5 s down: far below the misfire grace, but five slots cannot all run
    assert materialize_due(store, now=now) == 1
    with store.read() as tx:
        dispatch = tx.one("SELECT * FROM job_dispatch_queue WHERE job_id = ?", (job["id"],))
    assert dispatch["due_at"] == first + 5_000  # the latest slot runs
    if policy == "coalesce":
        [e] = events(store, job_id=job["id"], kind="slot.misfire_coalesced")
        assert (e["data"]["first"], e["data"]["last"], e["data"]["missed"], e["data"]["not_run"]) == (first, first + 5_000, 6, 5)
    else:
        [skipped] = run_rows(store, job["id"])
        assert skipped["status"] == "skipped" and skipped["skip_reason"] == "misfire: 5 slot(s) missed while down"
        [e] = events(store, job_id=job["id"], kind="run.skipped")
        assert (e["data"]["first"], e["data"]["last"], e["data"]["missed"]) == (first, first + 4_000, 5)
    grid, accounted = _slot_accounting(store, job["id"], 1000, first + 5_000)
    assert grid <= accounted | {dispatch["due_at"]}


def test_a_day_long_gap_is_counted_without_listing_it(store):
    job = add_job(store, schedule_kind="every", schedule_every="1s", payload_message="ok")
    first = job["next_run_at"]
    t0 = time.monotonic()
    materialize_due(store, now=first + 86_400_000 + 300)
    assert time.monotonic() - t0 < 5
    [e] = events(store, job_id=job["id"], kind="slot.misfire_coalesced")
    assert (e["data"]["missed"], e["data"]["last"], e["data"]["exact"]) == (86_401, first + 86_400_000, True)


def test_a_cron_gap_longer_than_the_scan_limit_finds_its_last_slot(store):
    from scheduler.core.queue import GAP_SCAN_LIMIT

    job = add_job(store, schedule_kind="cron", schedule_cron="*/1 * * * * *", payload_message="ok", misfire_policy="skip")
    first = job["next_run_at"]
    now = first + 5 * 3_600_000 + 500  # 18,001 one-second slots
    materialize_due(store, now=now)
    [skipped] = run_rows(store, job["id"])
    assert skipped["scheduled_for"] == first + 5 * 3_600_000
    [e] = events(store, job_id=job["id"], kind="run.skipped")
    assert e["data"]["exact"] is False and e["data"]["missed"] == GAP_SCAN_LIMIT + 1 and e["data"]["last"] == skipped["scheduled_for"]
    assert skipped["skip_reason"] == f"misfire: {GAP_SCAN_LIMIT + 1}+ slot(s) missed while down"


def test_missed_slots_between_two_dispatcher_processes_leave_a_record(tmp_path):
    """The adversarial run: every 1s; ``run --duration 3s``; 5 s down; ``run --duration 3s``: every slot accounted for."""
    import os
    import sys

    from scheduler.plugins.stores import open_store

    db = tmp_path / "gap.db"
    store = open_store(db)
    try:
        job = add_job(store, schedule_kind="every", schedule_every="1s", payload_message="ok", overlap_policy="allow")
        cmd = [sys.executable, "-m", "scheduler", "--db", str(db), "run", "--duration", "3s", "--lease-ttl", "1500ms"]
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))
        assert first.returncode == 0, first.stdout + first.stderr
        time.sleep(5)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))
        assert second.returncode == 0, second.stdout + second.stderr
        last_slot = max(r["scheduled_for"] for r in run_rows(store, job["id"]))
        grid, accounted = _slot_accounting(store, job["id"], 1000, last_slot)
        assert sorted(grid - accounted) == []
        gaps = events(store, job_id=job["id"], kind="slot.misfire_coalesced")
        assert gaps and max(e["data"]["not_run"] for e in gaps) >= 4  # the 5 s gap: its first slots did not run, on record
    finally:
        store.close()


# -- the recovery audit (issue 9, defect 9) ---------------------------------------------------------


def test_recovery_records_work_that_already_exited_as_gone_by_the_recovering_dispatcher(store):
    """A run whose process had already exited: ``gone``, nothing signalled, and the recovering dispatcher is the actor."""
    import socket

    from scheduler.core.processes import process_identity

    job = add_job(store, payload_message="true", executor="shell")
    proc = subprocess.Popen(["sleep", "0.2"], start_new_session=True)
    handle = {"pid": proc.pid, "pgid": proc.pid, "start_time": process_identity(proc.pid), "host": socket.gethostname()}
    proc.wait()  # exited and reaped: only the recorded identity is left
    dead = leases.acquire(store, "dispatcher", f"{socket.gethostname()}:999999:dead", 1000, now=now_ms() - 5000)
    run_id = insert_run(store, job["id"], "running", dispatcher_owner=dead.owner, dispatcher_token=dead.token, started_at=now_ms(),
                        executor="shell", process_state="running", executor_handle=json.dumps(handle))
    rescuer = leases.acquire(store, "rescuer-lease", "rescuer", 10_000)
    [item] = recover(store, rescuer, participants=RECOVERY, hooks=hooks_with())
    assert item["outcome"] == "crashed" and item["process"] == "gone"
    run = one(store, "SELECT * FROM runs WHERE id = ?", run_id)
    assert (run["process_state"], run["process_signal"], run["process_terminated_at"]) == ("gone", None, None)
    recovered, = events(store, run_id=run_id, kind="run.recovered")
    finished, = events(store, run_id=run_id, kind="run.finished")
    assert recovered["actor"] == finished["actor"] == "rescuer"
    assert recovered["data"]["signal"] is None and recovered["data"]["from_owner"] == dead.owner
    assert finished["data"]["run_owner"] == dead.owner and finished["data"]["status"] == "crashed"


def test_kill9_of_a_dispatcher_whose_shell_run_already_ended_is_recorded_gone(tmp_path):
    """A real ``kill -9`` while a shell run's command is finishing: recovery signals nothing and says ``gone``."""
    import os
    import signal
    import sys

    from scheduler.core.processes import group_alive
    from scheduler.plugins.stores import open_store
    from scheduler.testing import RunningDispatcher

    db = tmp_path / "kill9.db"
    store = open_store(db)
    log = open(tmp_path / "dispatcher.log", "wb")  # noqa: SIM115 - the child's log, open for its life
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "--db", str(db), "run", "--lease-ttl", "1500ms"],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    rescuer = None
    try:
        job = add_job(store, payload_message="sleep 1", executor="shell", delivery_guarantee="at-most-once")
        enqueue_manual(store, job["id"])
        run = wait_for(lambda: next((r for r in run_rows(store, job["id"]) if r["executor_handle"]), None), timeout=20,
                       what="handle recorded")
        handle = json.loads(run["executor_handle"])
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not group_alive(handle["pgid"]), timeout=10, what="the command ended by itself")
        assert statuses(store, job["id"]) == ["running"]  # nobody committed its end
        rescuer = RunningDispatcher(store)
        ended = wait_for(lambda: next((r for r in run_rows(store, job["id"]) if r["status"] == "crashed"), None), what="recovered")
        assert (ended["process_state"], ended["process_signal"], ended["process_terminated_at"]) == ("gone", None, None)
        owner = rescuer.dispatcher.owner
        assert {e["kind"]: e["actor"] for e in events(store, run_id=run["id"])
                if e["kind"] in ("run.recovered", "run.finished")} == {"run.recovered": owner, "run.finished": owner}
    finally:
        if rescuer is not None:
            rescuer.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
        store.close()
