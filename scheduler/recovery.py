"""Crash recovery: finish every run whose owner's fence is gone, and free stale claims.

A run is orphaned when no live lease carries its owner and token. Before ending it
we make sure its process group is gone (killing it if the recorded identity still
matches: a reused PID is never signalled). A run whose processes cannot be
confirmed gone becomes ``recovery_blocked`` and is retried on every pass; the rest
become ``crashed`` and get the usual consequences in the same transaction, plus a
replay when the job asked for ``at-least-once``.
"""

from __future__ import annotations

import json
from typing import Any

from scheduler.completion import apply_consequences
from scheduler.errors import SchedulerError
from scheduler.events import append_event
from scheduler.jobs import repair_missing_next_runs
from scheduler.lease import FENCE_COUNTER, Lease, assert_live, describe_lost_dispatcher, next_token, owner_host
from scheduler.execution import RecoveryOutcome, RecoveryRequest
from scheduler.queue import insert_dispatch, release_expired_claims
from scheduler.store.base import Store
from scheduler.timeutil import now_ms


def _settle_process(run: dict[str, Any], grace_s: float) -> tuple[str, str | None]:
    """Ask the run's executor to make sure its work is gone: ``("gone"|"terminated"|"unknown"|"blocked", detail)``.

    The executor's ``recover`` reads the handle the run recorded (a process identity, a
    remote turn id). A run that recorded nothing never started its work: ``gone``. An
    executor that cannot be loaded or has no ``recover`` cannot confirm anything: ``unknown``.
    """
    raw = run.get("executor_handle")
    if not raw:
        return "gone", None
    from scheduler.plugins.loader import load_provider

    try:
        executor = load_provider("executor", run.get("executor") or "shell")
    except SchedulerError as exc:
        return "unknown", f"executor not available: {exc.code}"
    recover_fn = getattr(executor, "recover", None)
    if recover_fn is None:
        return "unknown", "executor has no recover()"
    request = RecoveryRequest(
        run_id=run["id"], job_id=run["job_id"], handle=json.loads(raw), owner=run.get("dispatcher_owner"),
        owner_host=owner_host(run.get("dispatcher_owner")), kill_grace_s=grace_s,
    )
    try:
        outcome = recover_fn(request)
    except Exception as exc:  # a failing recover must not end the run as if its work were gone
        return "blocked", f"recover() raised {type(exc).__name__}: {exc}"
    if not isinstance(outcome, RecoveryOutcome) or outcome.state not in ("gone", "terminated", "unknown", "blocked"):
        return "blocked", "recover() returned an invalid outcome"
    return outcome.state, outcome.detail


def find_orphans(store: Store, *, now: int | None = None) -> list[dict[str, Any]]:
    """Active runs whose owner no longer holds a live lease with the run's token."""
    now = now_ms() if now is None else now
    with store.read() as tx:
        return tx.all(
            "SELECT r.* FROM runs r WHERE r.status IN ('running', 'recovery_blocked') AND NOT EXISTS ("
            " SELECT 1 FROM dispatcher_leases l WHERE l.owner = r.dispatcher_owner AND l.token = r.dispatcher_token"
            " AND l.expires_at > ?)",
            (now,),
        )


def fence_out(store: Store, owner: str, *, now: int | None = None) -> int:
    """Take the expired leases of a dead or stalled owner away from it (new token, no owner).

    After this, the stalled process's next renewal or commit fails even if it wakes up:
    it learns it lost its lease instead of carrying on with a token nobody revoked.
    """
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        names = [r["name"] for r in tx.all(
            "SELECT name FROM dispatcher_leases WHERE owner = ? AND expires_at <= ? AND name <> ?", (owner, now, FENCE_COUNTER))]
        for name in names:
            tx.execute("UPDATE dispatcher_leases SET owner = NULL, token = ? WHERE name = ? AND owner = ?", (next_token(tx), name, owner))
            append_event(tx, "lease.fenced_out", actor=owner, at=now, data={"lease": name})
    return len(names)


def recover(store: Store, lease: Lease, *, kill_grace_s: float = 2.0) -> list[dict[str, Any]]:
    """One recovery pass under our live lease; returns what was done to each orphan."""
    report = []
    orphans = find_orphans(store)
    for owner in {r["dispatcher_owner"] for r in orphans if r["dispatcher_owner"]}:
        fence_out(store, owner)
    for run in orphans:
        state, sig = _settle_process(run, kill_grace_s)
        now = now_ms()
        with store.transaction() as tx:
            assert_live(tx, lease, now=now)
            if state == "blocked":
                tx.execute(
                    "UPDATE runs SET status = 'recovery_blocked', error_code = 'RECOVERY_BLOCKED',"
                    " error_message = 'process group still alive and cannot be signalled' WHERE id = ? AND status = 'running'",
                    (run["id"],),
                )
                append_event(tx, "run.recovery_blocked", job_id=run["job_id"], run_id=run["id"], actor=lease.owner, at=now)
                report.append({"run_id": run["id"], "outcome": "recovery_blocked"})
                continue
            changed = tx.execute(
                "UPDATE runs SET status = 'crashed', finished_at = ?, terminal_at = ?, duration_ms = ? - COALESCE(started_at, ?),"
                " error_code = 'DISPATCHER_LOST', error_message = ?, process_state = ?, process_signal = ?,"
                " process_terminated_at = ? WHERE id = ? AND status IN ('running', 'recovery_blocked')"
                " AND dispatcher_owner = ? AND dispatcher_token = ?",
                (now, now, now, now, describe_lost_dispatcher(run["dispatcher_owner"], run["dispatcher_token"]),
                 state, sig, now if state == "terminated" else None, run["id"], run["dispatcher_owner"], run["dispatcher_token"]),
            )
            if changed != 1:
                continue
            fresh = tx.one("SELECT * FROM runs WHERE id = ?", (run["id"],))
            assert fresh is not None
            replay = fresh["delivery_guarantee"] == "at-least-once" and fresh["dispatch_id"] is not None
            append_event(tx, "run.recovered", job_id=run["job_id"], run_id=run["id"], actor=lease.owner, at=now,
                         data={"process": state, "signal": sig, "replay": replay, "from_owner": run["dispatcher_owner"]})
            if replay:
                d = tx.one("SELECT kind, replay_count FROM job_dispatch_queue WHERE id = ?", (fresh["dispatch_id"],))
                count = (d["replay_count"] if d else 0) + 1
                kind = d["kind"] if d else "manual"
                insert_dispatch(tx, id=f"{fresh['dispatch_id']}:replay:{count}", job_id=fresh["job_id"], kind=kind,
                                due_at=now, now=now, source_run_id=fresh["id"], replay_count=count)
            # a replay stands in for a retry: both would run the work a third time
            apply_consequences(tx, fresh, now=now, allow_retry=not replay)
            report.append({"run_id": run["id"], "outcome": "crashed", "process": state, "replayed": replay})
    release_expired_claims(store)
    repair_missing_next_runs(store)
    return report
