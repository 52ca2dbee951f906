"""Crash recovery: finish every run whose owner's fence is gone, and free stale claims.

A run is orphaned when no live lease carries its owner and token. Before ending it
we make sure its process group is gone (killing it if the recorded identity still
matches: a reused PID is never signalled). A run whose processes cannot be
confirmed gone becomes ``recovery_blocked`` and is retried on every pass; the rest
become ``crashed`` and get the usual consequences in the same transaction, plus a
replay when the job asked for ``at-least-once``.
"""

from __future__ import annotations

import socket
from typing import Any

from scheduler.completion import apply_consequences
from scheduler.errors import SchedulerError
from scheduler.events import append_event
from scheduler.jobs import repair_missing_next_runs
from scheduler.lease import FENCE_COUNTER, Lease, assert_live, next_token, owner_host
from scheduler.processes import kill_group, orphan_group_safe_to_kill
from scheduler.queue import insert_dispatch, release_expired_claims
from scheduler.store.base import Store
from scheduler.timeutil import now_ms


def _settle_process(run: dict[str, Any], grace_s: float) -> tuple[str, str | None]:
    """Make sure the run's process group is gone: ``("gone"|"terminated"|"unknown"|"blocked", signal)``."""
    pgid, pid = run.get("pgid"), run.get("pid")
    if not pgid or not pid:
        return "gone", None
    if owner_host(run.get("dispatcher_owner")) != socket.gethostname():
        return "unknown", None  # another host: its lease expired, so the host is presumed down
    verdict = orphan_group_safe_to_kill(pid, pgid, run.get("process_start_time"))
    if not verdict:
        return "gone", None
    try:
        return "terminated", kill_group(pgid, grace_s)
    except PermissionError:
        return "blocked", None
    except SchedulerError:  # PROCESS_GROUP_SURVIVED: members stuck even after SIGKILL
        return "blocked", None


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
                (now, now, now, now, f"dispatcher {run['dispatcher_owner']} (token {run['dispatcher_token']}) lost its lease",
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
