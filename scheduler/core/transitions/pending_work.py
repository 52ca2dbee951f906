"""Cancelling a job's pending work (waiting runs, pending dispatch rows, open approvals) in one place, through the named
statements ``cancel_job_dispatches`` and ``cancel_job_approvals`` (``scheduler.core.state``)."""

from __future__ import annotations

import attrs

from scheduler.core import state
from scheduler.core.events import append_event
from scheduler.core.rows import RunRow
from scheduler.core.store.base import Tx
from scheduler.core.transitions.runs import cancel_waiting_run


@attrs.frozen
class CancelledWork:
    """What ``cancel_pending_work`` cancelled."""

    #: Pending dispatch rows (not yet runs).
    dispatches: int
    #: Waiting runs (``pending``, ``awaiting_approval``, ``approved``), by id.
    runs: tuple[str, ...]
    #: Open approvals of the job, those of the waiting runs included.
    approvals: int


def cancel_pending_work(
    tx: Tx, job_id: str, *, reason: str, now: int, actor: str | None = None, include_manual: bool = False
) -> CancelledWork:
    """Cancel everything of a job that has not started executing; the one place disable, delete, auto-pause,
    watchdog self-destruct, update and ``jobs cancel`` do it.

    * waiting runs (``pending``, ``awaiting_approval``, ``approved``) end ``cancelled``, with
      their dispatch rows and approvals (an approval was asked for the job as it was);
    * pending dispatch rows are cancelled, except ``manual`` ones unless ``include_manual``
      (an operator's explicit ``jobs run`` survives disable/update/auto-pause, as before);
    * every open approval of the job (``pending``, ``approved``) is cancelled, first, so that
      ``approvals`` counts those of the waiting runs too (it used to count only the others).

    Running runs are not touched (cancelling them is a request to their owner). One
    ``job.pending_cancelled`` event summarises it when anything was cancelled.
    """
    # Every open approval of the job first, those of its waiting runs included, so the event counts them all (the
    # waiting runs' own cancel then finds theirs already cancelled).
    approvals = state.execute(tx, "cancel_job_approvals", job_id=job_id, reason=reason, now=now)
    # What cancel_waiting_run reads of each run (the row's other columns are None).
    waiting = [RunRow.from_row(r) for r in tx.all(
        "SELECT id, job_id, status, dispatch_id FROM runs WHERE job_id = ? AND status IN ('pending', 'awaiting_approval', 'approved')",
        (job_id,),
    )]
    runs = tuple(r.id for r in waiting if cancel_waiting_run(tx, r, reason=reason, actor=actor, now=now))
    dispatches = state.execute(tx, "cancel_job_dispatches", job_id=job_id, reason=reason, now=now,
                               include_manual=1 if include_manual else 0)
    if dispatches or runs or approvals:
        append_event(tx, "job.pending_cancelled", job_id=job_id, actor=actor, at=now,
                     data={"reason": reason, "dispatches": dispatches, "runs": len(runs), "approvals": approvals})
    return CancelledWork(dispatches=dispatches, runs=runs, approvals=approvals)
