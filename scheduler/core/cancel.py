"""Cancellation requests: recorded (who, why, when) before anything acts on them.

Pending, awaiting-approval and approved runs are cancelled here directly. A
running run only gets the request recorded; its owning dispatcher notices,
signals the executor's cancellation token, and commits the final state under its
own fence (the completion transaction turns the outcome into ``cancelled``).
The status writes are ``scheduler.core.transitions``'; observers installed in this
process hear of runs cancelled here once the transaction committed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core import transitions
from scheduler.core.events import append_event, os_identity
from scheduler.core.jobs import resolve_job
from scheduler.core.rows import RunRow
from scheduler.core.runs import CANCEL_DIRECTLY, TERMINAL, get_run
from scheduler.core.store.base import Store, Tx
from scheduler.core.transitions import committing

if TYPE_CHECKING:
    from scheduler.core.observers import Observers
    from scheduler.core.rows import JSONObject, JSONValue


def _cancel_one(tx: Tx, run: RunRow, reason: str | None, who: str, now: int) -> str:
    """Record the request on one run and finish it if no executor holds it; returns what happened."""
    if run.status in TERMINAL:
        return "already_terminal"
    transitions.request_cancel(tx, run, reason=reason, actor=who, now=now)
    if run.status in CANCEL_DIRECTLY:
        return "cancelled" if transitions.cancel_waiting_run(tx, run, reason=reason, actor=who, now=now) else "requested"
    return "requested"


def cancel_run(store: Store, run_id: str, *, reason: str | None = None, now: int | None = None,
               hooks: Observers | None = None) -> JSONObject:
    """``runs cancel``: cancel one run (``RUN_ALREADY_FINISHED`` if it is terminal).

    ``hooks``: the observers to tell about a run cancelled directly (default: the hook
    modules installed in this process).
    """
    now = now_ms() if now is None else now
    who = os_identity()
    with committing(store, hooks) as tx:
        run = get_run(tx, run_id)
        if run.status in TERMINAL:
            raise SchedulerError("RUN_ALREADY_FINISHED", f"run {run_id} already finished with status {run.status}")
        outcome = _cancel_one(tx, run, reason, who, now)
    store.notify_change()
    return {"run_id": run_id, "outcome": outcome, "requested_by": who}


def cancel_job(store: Store, ref: str, *, reason: str | None = None, now: int | None = None,
               hooks: Observers | None = None) -> JSONObject:
    """``jobs cancel``: cancel every pending dispatch (manual ones too) and every active run of a job.

    Waiting work goes through ``transitions.cancel_pending_work`` (the same function as
    disable, delete, auto-pause and update); running runs get a cancel request.
    """
    now = now_ms() if now is None else now
    who = os_identity()
    with committing(store, hooks) as tx:
        job = resolve_job(tx, ref)
        running = [RunRow.from_row(r) for r in tx.all("SELECT * FROM runs WHERE job_id = ? AND status = 'running'", (job.id,))]
        waiting = [RunRow.from_row(r) for r in tx.all(
            "SELECT * FROM runs WHERE job_id = ? AND status IN ('pending', 'awaiting_approval', 'approved')", (job.id,))]
        for r in waiting:  # the request is recorded (who, why) before the run is ended
            transitions.request_cancel(tx, r, reason=reason, actor=who, now=now)
        work = transitions.cancel_pending_work(tx, job.id, reason=reason or "cancelled", now=now, actor=who, include_manual=True)
        results: list[JSONValue] = [{"run_id": r.id, "outcome": "cancelled" if r.id in work.runs else "requested"}
                                    for r in waiting]
        results += [{"run_id": r.id, "outcome": _cancel_one(tx, r, reason, who, now)} for r in running]
        append_event(tx, "job.cancel_requested", job_id=job.id, actor=who, at=now,
                     data={"reason": reason, "dispatches": work.dispatches})
    store.notify_change()
    return {"job_id": job.id, "runs": results, "dispatches": work.dispatches, "requested_by": who}
