"""Dispatch row transitions (``job_dispatch_queue.status``): insert, claim, finish (one at a time or batched at the end
of a dispatcher pass), cancel, and the release of expired claims; each through its named statement (``scheduler.core.state``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from scheduler.core import state
from scheduler.core.events import append_event
from scheduler.core.rows import SQLValue
from scheduler.core.store.base import Tx

if TYPE_CHECKING:
    from scheduler.core.lease import Lease


def dispatch_row(*, id: str, job_id: str, kind: str, due_at: int, now: int, source_run_id: str | None = None,
                 requested_by: str | None = None, replay_count: int = 0,
                 artifact_digest: str | None = None) -> dict[str, SQLValue]:
    """One row of ``insert_dispatches``; ``artifact_digest`` None: the statement reads the job's."""
    return {"id": id, "job_id": job_id, "kind": kind, "due_at": due_at, "now": now, "source_run_id": source_run_id,
            "requested_by": requested_by, "replay_count": replay_count, "artifact_digest": artifact_digest}


def insert_dispatch(tx: Tx, *, id: str, job_id: str, kind: str, due_at: int, now: int, source_run_id: str | None = None,
                    requested_by: str | None = None, replay_count: int = 0) -> bool:
    """(new) -> ``pending``: insert a dispatch row; False if that id already exists (idempotent).

    The row is bound to the job's current execution artifact and, for chain, retry and
    replay work, to its source run and that run's artifact (database guards keep the binding).
    """
    inserted = state.rows(tx, "insert_dispatches", rows=[dispatch_row(
        id=id, job_id=job_id, kind=kind, due_at=due_at, now=now, source_run_id=source_run_id, requested_by=requested_by,
        replay_count=replay_count)])
    return len(inserted) == 1


def claim_dispatch(tx: Tx, dispatch_id: str, lease: Lease, *, run_id: str, claim_token: str, expires_at: int, now: int) -> bool:
    """``pending`` -> ``claimed`` under ``lease`` (owner, fencing token), naming the run it becomes."""
    claimed = state.rows(tx, "claim_dispatches", owner=lease.owner, token=lease.token, expires_at=expires_at, now=now,
                         rows=[{"dispatch_id": dispatch_id, "claim_token": claim_token, "run_id": run_id}])
    return len(claimed) == 1


class _Keep:
    """``finish_dispatch``'s default ``last_error``: the row's last error stays as it is."""

    __slots__ = ()


_KEEP = _Keep()


class _Finishes:
    """The ``done`` finishes deferred in one ``batched_finishes`` block: ``(dispatch id, last error, now)``."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[tuple[str, str | None, int]] = []


_finishes: ContextVar[_Finishes | None] = ContextVar("scheduler_dispatch_finishes", default=None)
#: Dispatch rows per deferred-finish UPDATE (at most 5 parameters each).
_FINISH_ROWS = 200


@contextmanager
def batched_finishes(tx: Tx) -> Iterator[None]:
    """Defer the ``done`` finishes completions ask for (``finish_dispatch(..., deferrable=True)``) to one UPDATE at the end.

    The dispatcher's pass completes several runs; their dispatch rows go ``claimed`` -> ``done``
    in one statement instead of one each. Nothing in the pass reads those rows' status in
    between (claims look at ``pending`` rows, which a run's claimed dispatch is not), and the
    statement runs in ``tx`` before the caller commits; when the block raises, nothing is written.
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
        if all(e is None for _d, e, _n in chunk) and len({n for _d, _e, n in chunk}) == 1:
            state.execute(tx, "finish_dispatches_clean", now=chunk[0][2], rows=[{"dispatch_id": d} for d, _e, _n in chunk])
        else:
            state.execute(tx, "finish_dispatches",
                          rows=[{"dispatch_id": d, "last_error": e, "now": n} for d, e, n in chunk])


def finish_dispatch(tx: Tx, dispatch_id: str | None, status: str, *, now: int, last_error: str | _Keep | None = _KEEP,
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
    if deferrable and status == "done" and not isinstance(last_error, _Keep):
        batch = _finishes.get()
        if batch is not None:
            batch.rows.append((dispatch_id, last_error, now))
            return True
    keep = isinstance(last_error, _Keep)
    changed = state.execute(tx, "finish_dispatch", dispatch_id=dispatch_id, status=status, now=now,
                            set_last_error=0 if keep else 1, last_error=None if isinstance(last_error, _Keep) else last_error)
    return changed == 1


def cancel_dispatch(tx: Tx, dispatch_id: str, *, job_id: str, reason: str, now: int, actor: str | None = None) -> bool:
    """``pending`` -> ``cancelled`` with a reason and a ``dispatch.cancelled`` event."""
    changed = state.execute(tx, "cancel_dispatch", dispatch_id=dispatch_id, reason=reason, now=now)
    if changed == 1:
        append_event(tx, "dispatch.cancelled", job_id=job_id, dispatch_id=dispatch_id, actor=actor, at=now, data={"reason": reason})
    return changed == 1


def release_expired_claims(tx: Tx, *, now: int) -> int:
    """``claimed`` -> ``pending`` for expired claims with no active run.

    The row keeps its attempts and last error; the expiry is a ``dispatch.claim_released`` event carrying both, so
    no error of an earlier attempt is lost.
    """
    rows = state.rows(tx, "release_expired_claims", now=now)
    for r in rows:
        append_event(tx, "dispatch.claim_released", job_id=r["job_id"], dispatch_id=r["id"], at=now,
                     data={"reason": "claim expired", "attempts": r["attempts"], "last_error": r["last_error"]})
    return len(rows)
