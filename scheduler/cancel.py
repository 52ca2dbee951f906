"""Cancellation requests: recorded (who, why, when) before anything acts on them.

Pending, awaiting-approval and approved runs are cancelled here directly. A
running run only gets the request recorded; its owning dispatcher notices,
signals the executor's cancellation token, and commits the final state under its
own fence (the completion transaction turns the outcome into ``cancelled``).
"""

from __future__ import annotations

from typing import Any

from scheduler.errors import SchedulerError
from scheduler.events import append_event, os_identity
from scheduler.jobs import resolve_job
from scheduler.runs import CANCEL_DIRECTLY, TERMINAL, get_run
from scheduler.store.base import Store, Tx
from scheduler.timeutil import now_ms


def _cancel_one(tx: Tx, run: dict[str, Any], reason: str | None, who: str, now: int) -> str:
    """Record the request on one run and finish it if no executor holds it; returns what happened."""
    if run["status"] in TERMINAL:
        return "already_terminal"
    tx.execute(
        "UPDATE runs SET cancel_requested_at = ?, cancel_requested_by = ?, cancel_reason = ? WHERE id = ? AND cancel_requested_at IS NULL",
        (now, who, reason, run["id"]),
    )
    append_event(tx, "run.cancel_requested", job_id=run["job_id"], run_id=run["id"], actor=who, at=now, data={"reason": reason})
    if run["status"] in CANCEL_DIRECTLY:
        tx.execute(
            "UPDATE runs SET status = 'cancelled', finished_at = ?, terminal_at = ? WHERE id = ? AND status = ?",
            (now, now, run["id"], run["status"]),
        )
        if run["dispatch_id"]:
            tx.execute("UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = ?, updated_at = ? WHERE id = ?",
                       (reason or "cancelled", now, run["dispatch_id"]))
        tx.execute("UPDATE approvals SET status = 'cancelled', cancelled_at = ?, version = version + 1 WHERE run_id = ? AND status IN ('pending', 'approved')",
                   (now, run["id"]))
        append_event(tx, "run.cancelled", job_id=run["job_id"], run_id=run["id"], actor=who, at=now)
        return "cancelled"
    return "requested"


def cancel_run(store: Store, run_id: str, *, reason: str | None = None, now: int | None = None) -> dict[str, Any]:
    """``runs cancel``: cancel one run (``RUN_ALREADY_FINISHED`` if it is terminal)."""
    now = now_ms() if now is None else now
    who = os_identity()
    with store.transaction() as tx:
        run = get_run(tx, run_id)
        if run["status"] in TERMINAL:
            raise SchedulerError("RUN_ALREADY_FINISHED", f"run {run_id} already finished with status {run['status']}")
        outcome = _cancel_one(tx, run, reason, who, now)
    store.notify_change()
    return {"run_id": run_id, "outcome": outcome, "requested_by": who}


def cancel_job(store: Store, ref: str, *, reason: str | None = None, now: int | None = None) -> dict[str, Any]:
    """``jobs cancel``: cancel every pending dispatch and every active run of a job."""
    now = now_ms() if now is None else now
    who = os_identity()
    with store.transaction() as tx:
        job = resolve_job(tx, ref)
        dispatches = tx.execute(
            "UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = ?, updated_at = ? WHERE job_id = ? AND status = 'pending'",
            (reason or "cancelled", now, job["id"]),
        )
        runs = tx.all(
            "SELECT * FROM runs WHERE job_id = ? AND status IN ('pending', 'running', 'awaiting_approval', 'approved')", (job["id"],)
        )
        results = [{"run_id": r["id"], "outcome": _cancel_one(tx, r, reason, who, now)} for r in runs]
        append_event(tx, "job.cancel_requested", job_id=job["id"], actor=who, at=now, data={"reason": reason, "dispatches": dispatches})
    store.notify_change()
    return {"job_id": job["id"], "runs": results, "dispatches": dispatches, "requested_by": who}
