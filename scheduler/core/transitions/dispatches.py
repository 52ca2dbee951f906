"""Dispatch row transitions (``job_dispatch_queue.status``): insert, claim, finish (one at a time or batched at the end
of a dispatcher pass), cancel, and the release of expired claims."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from scheduler.core.events import append_event
from scheduler.core.store.base import Tx

if TYPE_CHECKING:
    from scheduler.core.lease import Lease


def insert_dispatch(tx: Tx, *, id: str, job_id: str, kind: str, due_at: int, now: int, source_run_id: str | None = None,
                    requested_by: str | None = None, replay_count: int = 0) -> bool:
    """(new) -> ``pending``: insert a dispatch row; False if that id already exists (idempotent).

    The row is bound to the job's current execution artifact and, for chain, retry and
    replay work, to its source run and that run's artifact (database guards keep the binding).
    """
    changed = tx.execute(
        "INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, source_run_id, requested_by,"
        " replay_count, artifact_digest, source_artifact_digest)"
        " VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, (SELECT artifact_digest FROM jobs WHERE id = ?),"
        " (SELECT artifact_digest FROM runs WHERE id = ?)) ON CONFLICT (id) DO NOTHING",
        (id, job_id, kind, due_at, now, now, source_run_id, requested_by, replay_count, job_id, source_run_id),
    )
    return changed == 1


def claim_dispatch(tx: Tx, dispatch_id: str, lease: Lease, *, run_id: str, claim_token: str, expires_at: int, now: int) -> bool:
    """``pending`` -> ``claimed`` under ``lease`` (owner, fencing token), naming the run it becomes."""
    changed = tx.execute(
        "UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = ?, claim_token = ?, claim_fence = ?, claim_expires_at = ?,"
        " attempts = attempts + 1, run_id = ?, updated_at = ? WHERE id = ? AND status = 'pending'",
        (lease.owner, claim_token, lease.token, expires_at, run_id, now, dispatch_id),
    )
    return changed == 1


_KEEP: Any = object()


class _Finishes:
    """The ``done`` finishes deferred in one ``batched_finishes`` block: ``(dispatch id, last error, now)``."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[tuple[str, str | None, int]] = []


_finishes: ContextVar[_Finishes | None] = ContextVar("scheduler_dispatch_finishes", default=None)
#: Dispatch rows per deferred-finish UPDATE (3 parameters each).
_FINISH_ROWS = 200


@contextmanager
def batched_finishes(tx: Tx) -> Iterator[None]:
    """Defer the ``done`` finishes completions ask for (``finish_dispatch(..., deferrable=True)``) to one UPDATE at the end.

    The dispatcher's pass completes several runs; their dispatch rows go ``claimed`` -> ``done``
    in one statement instead of one each. Nothing in the pass reads those rows' status in
    between (claims look at ``pending`` rows, which a run's claimed dispatch is not), and the
    UPDATE runs in ``tx`` before the caller commits; when the block raises, nothing is written.
    Nested blocks join the outermost one.
    """
    if _finishes.get() is not None:
        yield
        return
    batch = _Finishes()
    token = _finishes.set(batch)
    try:
        yield
    finally:
        _finishes.reset(token)
    rows = batch.rows
    for i in range(0, len(rows), _FINISH_ROWS):
        chunk = rows[i:i + _FINISH_ROWS]
        marks = ", ".join("?" for _ in chunk)
        ids = [d for d, _e, _n in chunk]
        if any(e is not None for _d, e, _n in chunk):
            errors = "CASE id " + " ".join("WHEN ? THEN ?" for _ in chunk) + " END"
            error_params = [v for d, e, _n in chunk for v in (d, e)]
        else:
            errors, error_params = "NULL", []
        if len({n for _d, _e, n in chunk}) == 1:
            at, at_params = "?", [chunk[0][2]]
        else:
            at = "CASE id " + " ".join("WHEN ? THEN ?" for _ in chunk) + " END"
            at_params = [v for d, _e, n in chunk for v in (d, n)]
        tx.execute(f"UPDATE job_dispatch_queue SET status = 'done', last_error = {errors}, updated_at = {at}"
                   f" WHERE id IN ({marks}) AND status IN ('pending', 'claimed')", [*error_params, *at_params, *ids])


def finish_dispatch(tx: Tx, dispatch_id: str | None, status: str, *, now: int, last_error: str | None = _KEEP,
                    deferrable: bool = False) -> bool:
    """``pending``/``claimed`` -> ``done``/``failed``; a cancelled or finished row is never rewritten.

    ``last_error`` replaces the row's last error when given (``None`` clears it).
    ``deferrable`` (a caller that does not use the answer): inside ``batched_finishes`` a
    ``done`` finish with a ``last_error`` is written with the block's others at its end,
    and True is returned without a statement.
    """
    if dispatch_id is None:
        return False
    if status not in ("done", "failed"):
        raise ValueError(f"finish_dispatch: {status!r} is not done or failed")
    if deferrable and status == "done" and last_error is not _KEEP:
        batch = _finishes.get()
        if batch is not None:
            batch.rows.append((dispatch_id, last_error, now))
            return True
    if last_error is _KEEP:
        changed = tx.execute(
            "UPDATE job_dispatch_queue SET status = ?, updated_at = ? WHERE id = ? AND status IN ('pending', 'claimed')",
            (status, now, dispatch_id),
        )
    else:
        changed = tx.execute(
            "UPDATE job_dispatch_queue SET status = ?, last_error = ?, updated_at = ? WHERE id = ? AND status IN ('pending', 'claimed')",
            (status, last_error, now, dispatch_id),
        )
    return changed == 1


def cancel_dispatch(tx: Tx, dispatch_id: str, *, job_id: str, reason: str, now: int, actor: str | None = None) -> bool:
    """``pending`` -> ``cancelled`` with a reason and a ``dispatch.cancelled`` event."""
    changed = tx.execute(
        "UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = ?, updated_at = ? WHERE id = ? AND status = 'pending'",
        (reason, now, dispatch_id),
    )
    if changed == 1:
        append_event(tx, "dispatch.cancelled", job_id=job_id, dispatch_id=dispatch_id, actor=actor, at=now, data={"reason": reason})
    return changed == 1


def release_expired_claims(tx: Tx, *, now: int) -> int:
    """``claimed`` -> ``pending`` for expired claims with no active run (attempts and last error stay)."""
    rows = tx.all(
        "UPDATE job_dispatch_queue SET status = 'pending', claim_owner = NULL, claim_token = NULL, claim_fence = NULL,"
        " claim_expires_at = NULL, last_error = 'claim expired', updated_at = ?"
        " WHERE status = 'claimed' AND claim_expires_at <= ? AND NOT EXISTS ("
        "   SELECT 1 FROM runs r WHERE r.dispatch_id = job_dispatch_queue.id"
        "   AND r.status IN ('running', 'pending', 'awaiting_approval', 'approved', 'recovery_blocked'))"
        " RETURNING id, job_id",
        (now, now),
    )
    for r in rows:
        append_event(tx, "dispatch.claim_released", job_id=r["job_id"], dispatch_id=r["id"], at=now, data={"reason": "claim expired"})
    return len(rows)
