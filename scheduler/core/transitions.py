"""Every run and dispatch status transition, in one module.

Each transition is one compare-and-swap on the row's current status (and, for a
running run, on the owning dispatcher's fence), its runtime event in the same
transaction, and, for runs, an observer notification queued to fire once that
transaction has committed. The other kernel modules (queue, completion, cancel,
recovery, jobs, the dispatcher) decide *which* transition happens; only this
module writes ``runs.status``, ``job_dispatch_queue.status`` and ``approvals.status``.

Runs::

    (new)     -> running                          start_run        (claim, under the claimer's fence)
    (new)     -> skipped                          record_skipped   (misfire, overlap, veto)
    running   -> ok|error|timeout|cancelled       finish_run       (completion, owner + token)
    running   -> error (COMPLETION_FAILED)        fail_completion  (owner + token)
    pending|awaiting_approval|approved -> cancelled   cancel_waiting_run
    (new)     -> awaiting_approval                open_approval_gate  (claim of a gated job's dispatch)
    awaiting_approval -> approved | cancelled     decide_approval  (approve; reject or time out)
    approved  -> running                          dispatch_approved_run (claim again, under the claimer's fence)
    running   -> awaiting_approval                escalate_run     (an authorization provider escalated; owner + token)
    running   -> recovery_blocked                 block_recovery   (the dead owner's token)
    running|recovery_blocked -> crashed           crash_run        (the dead owner's token)

Dispatch rows::

    (new) -> pending              insert_dispatch (idempotent: deterministic ids)
    pending -> claimed            claim_dispatch
    claimed -> pending            release_expired_claims
    claimed -> awaiting_approval  open_approval_gate, escalate_run
    awaiting_approval -> pending  decide_approval (approved: claimed again by one dispatcher)
    pending|claimed -> done|failed   finish_dispatch
    pending -> cancelled          cancel_dispatch, cancel_pending_work
    pending|claimed|awaiting_approval -> cancelled   cancel_waiting_run (with its run)

Approvals (``approvals.status``, compare-and-swap on ``version``)::

    (new) -> pending -> approved -> dispatched      open_approval_gate, decide_approval, dispatch_approved_run
             pending -> rejected | timed_out        decide_approval
    pending|approved -> cancelled                   cancel_waiting_run, cancel_pending_work

Observer hooks (``scheduler_run_state_changed``, and ``scheduler_run_completed`` for
every terminal status) fire after commit, in the process that committed: open the
outermost write transaction with ``committing(store, hooks)``; transitions made in it
(also from nested ``committing`` blocks) are queued on it and fired once it committed,
never when it rolled back. ``hooks=None`` means the process's default observers
(``scheduler.core.observers``: the composition root installs the entry-point hook modules,
built only when there is something to tell), so a CLI ``runs cancel`` of a pending run
notifies that process's observers just like the dispatcher does for its runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import attrs

from scheduler.core import observers
from scheduler.core.events import append_event
from scheduler.core.runs import CANCEL_DIRECTLY, TERMINAL, StaleFence, run_to_json
from scheduler.core.store.base import Store, Tx

if TYPE_CHECKING:
    from scheduler.core.lease import Lease
    from scheduler.core.observers import Observers

log = logging.getLogger(__name__)

#: Rows read per query when observers of ``scheduler_run_completed`` need full runs.
_READ_CHUNK = 500


# -- after-commit notifications --------------------------------------------------------------------


@attrs.frozen
class RunNotice:
    """One committed run transition, as observers are told about it."""

    run_id: str
    job_id: str
    old_status: str | None
    new_status: str
    at_ms: int

    @property
    def terminal(self) -> bool:
        """Whether the run ended with this transition (``scheduler_run_completed`` fires too)."""
        return self.new_status in TERMINAL


class AfterCommit:
    """The observer notifications queued by the transitions of one transaction."""

    def __init__(self) -> None:
        self.notices: list[RunNotice] = []

    def add(self, notice: RunNotice) -> None:
        """Queue one notification (fired by ``fire`` once the transaction committed)."""
        self.notices.append(notice)

    def fire(self, store: Store, hooks: Observers | None = None) -> None:
        """Tell observers about every queued transition, in order; never raises.

        ``scheduler_run_completed`` gets the run's full JSON view, read once for all
        terminal runs of the transaction and only when a plugin implements that hook
        (the dispatcher's hot path pays nothing for observers nobody installed).
        """
        notices, self.notices = self.notices, []
        if not notices:
            return
        try:
            if hooks is None:
                hooks = observers.default()
                if hooks is None:
                    return
            wants_state = hooks.wants("scheduler_run_state_changed")
            wants_done = hooks.wants("scheduler_run_completed")
            if not (wants_state or wants_done):
                return
            rows = _read_runs(store, [n.run_id for n in notices if n.terminal]) if wants_done else {}
            for n in notices:
                if wants_state:
                    hooks.run_state_changed(n.run_id, n.job_id, n.old_status, n.new_status, n.at_ms)
                if wants_done and n.terminal:
                    row = rows.get(n.run_id)  # None: deleted meanwhile (``jobs delete``)
                    view = run_to_json(row, full=True) if row is not None else {
                        "id": n.run_id, "job_id": n.job_id, "status": n.new_status}
                    hooks.run_completed(view)
        except Exception:  # an observer problem never undoes or blocks a committed transition
            log.exception("could not notify observers of %d run transition(s)", len(notices))


def _read_runs(store: Store, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with store.read() as tx:
        for i in range(0, len(run_ids), _READ_CHUNK):
            chunk = run_ids[i:i + _READ_CHUNK]
            marks = ", ".join("?" for _ in chunk)
            for row in tx.all(f"SELECT * FROM runs WHERE id IN ({marks})", chunk):
                out[row["id"]] = row
    return out


_scope: ContextVar[AfterCommit | None] = ContextVar("scheduler_after_commit", default=None)


@contextmanager
def committing(store: Store, hooks: Observers | None = None) -> Iterator[Tx]:
    """A write transaction whose run transitions notify observers once it committed.

    Use it for the outermost transaction of any code that may change a run's status.
    Nested inside another ``committing`` block it joins that block (its ``hooks`` are
    the outer block's): the notifications fire when the outermost transaction commits,
    and are dropped if it rolls back.
    """
    if _scope.get() is not None:
        with store.transaction() as tx:
            yield tx
        return
    pending = AfterCommit()
    token = _scope.set(pending)
    try:
        with store.transaction() as tx:
            yield tx
    finally:
        _scope.reset(token)
    pending.fire(store, hooks)


def _notify(run_id: str, job_id: str, old: str | None, new: str, at_ms: int) -> None:
    scope = _scope.get()
    if scope is None:
        log.debug("run %s %s -> %s outside a committing() transaction: observers not notified", run_id, old, new)
        return
    scope.add(RunNotice(run_id, job_id, old, new, at_ms))


# -- dispatch rows ---------------------------------------------------------------------------------


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


# -- runs ------------------------------------------------------------------------------------------


def fenced_update(tx: Tx, run_id: str, owner: str, token: int, expected_status: str, values: dict[str, Any]) -> None:
    """Bookkeeping on a run this owner holds (its executor handle, process state): only with the fence, never the status.

    Raises ``StaleFence`` unless the run still has ``expected_status`` under ``owner`` and ``token``.
    """
    if "status" in values:
        raise ValueError("fenced_update never writes a run's status: use a transition")
    sets = ", ".join(f"{k} = ?" for k in values)
    changed = tx.execute(
        f"UPDATE runs SET {sets} WHERE id = ? AND status = ? AND dispatcher_owner = ? AND dispatcher_token = ?",
        [*values.values(), run_id, expected_status, owner, token],
    )
    if changed != 1:
        raise StaleFence(f"run {run_id} is no longer {expected_status} under owner {owner} token {token}")


def start_run(
    tx: Tx, lease: Lease, *, run_id: str, job: dict[str, Any], dispatch_id: str, dispatch_kind: str, attempt: int,
    scheduled_for: int, executor: str | None, parent_run_id: str | None, retry_of_run_id: str | None,
    replay_of_run_id: str | None, now: int, artifact_digest: str | None = None,
) -> None:
    """(new) -> ``running`` under ``lease``'s fence (the caller claimed its dispatch in this transaction).

    The run inherits its dispatch's artifact binding (artifact, source run, source artifact).
    ``artifact_digest`` is the dispatch's binding when the caller read it (its ``run.started``
    event then needs no lookups: a new run has no identity recorded yet).
    """
    tx.execute(
        "INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, attempt, scheduled_for, created_at, started_at,"
        " dispatcher_owner, dispatcher_token, parent_run_id, retry_of_run_id, replay_of_run_id, delivery_guarantee, executor, output_format,"
        " artifact_digest, source_run_id, source_artifact_digest)"
        " SELECT ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, d.artifact_digest, d.source_run_id, d.source_artifact_digest"
        " FROM job_dispatch_queue d WHERE d.id = ?",
        (run_id, job["id"], dispatch_id, dispatch_kind, attempt, scheduled_for, now, now, lease.owner, lease.token, parent_run_id,
         retry_of_run_id, replay_of_run_id, job["delivery_guarantee"], executor, job["output_format"], dispatch_id),
    )
    append_event(tx, "run.started", job_id=job["id"], run_id=run_id, dispatch_id=dispatch_id, actor=lease.owner, at=now,
                 data={"kind": dispatch_kind, "attempt": attempt, "token": lease.token}, artifact_digest=artifact_digest,
                 principal=None, trust_level=None)
    _notify(run_id, job["id"], None, "running", now)


@attrs.frozen
class NewRun:
    """A run ``claim_and_start_many`` claims and starts: its dispatch row's values and the run's own."""

    run_id: str
    claim_token: str
    job: dict[str, Any]
    #: The claimed dispatch row as the claimer read it in this transaction (id, kind, due_at, artifact_digest,
    #: source_run_id, source_artifact_digest).
    dispatch: dict[str, Any]
    attempt: int
    executor: str | None
    parent_run_id: str | None
    retry_of_run_id: str | None
    replay_of_run_id: str | None


#: Rows per multi-row statement of ``claim_and_start_many`` (19 parameters a run row: inside every dialect's limit).
_START_ROWS = 40


def claim_and_start_many(tx: Tx, lease: Lease, runs: list[NewRun], *, expires_at: int, now: int) -> list[NewRun]:
    """``pending`` -> ``claimed`` and (new) -> ``running`` for several dispatches at once; returns the runs started.

    The same transitions as ``claim_dispatch`` then ``start_run`` per run, in three statements
    for the whole list (one claim UPDATE ... RETURNING, one multi-row runs INSERT, the events
    through ``append_event``): a dispatch no longer ``pending`` is not claimed and gets no run
    (never a run without its claim). The dispatch rows must have been read in this
    transaction (SQLite: the write transaction is exclusive; PostgreSQL: the rows are locked),
    so the run's binding (artifact, source run, source artifact) is the dispatch's, as
    ``start_run``'s INSERT ... SELECT gives it.
    """
    started: list[NewRun] = []
    for i in range(0, len(runs), _START_ROWS):
        chunk = runs[i:i + _START_ROWS]
        ids = [r.dispatch["id"] for r in chunk]
        cases_run = " ".join("WHEN ? THEN ?" for _ in chunk)
        marks = ", ".join("?" for _ in chunk)
        claimed = {row["id"] for row in tx.all(
            f"UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = ?, claim_token = CASE id {cases_run} END,"
            f" claim_fence = ?, claim_expires_at = ?, attempts = attempts + 1, run_id = CASE id {cases_run} END, updated_at = ?"
            f" WHERE id IN ({marks}) AND status = 'pending' RETURNING id",
            [lease.owner, *(v for r in chunk for v in (r.dispatch["id"], r.claim_token)), lease.token, expires_at,
             *(v for r in chunk for v in (r.dispatch["id"], r.run_id)), now, *ids],
        )}
        chunk = [r for r in chunk if r.dispatch["id"] in claimed]
        if not chunk:
            continue
        rows = ", ".join(["(?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
        tx.execute(
            "INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, attempt, scheduled_for, created_at, started_at,"
            " dispatcher_owner, dispatcher_token, parent_run_id, retry_of_run_id, replay_of_run_id, delivery_guarantee, executor,"
            f" output_format, artifact_digest, source_run_id, source_artifact_digest) VALUES {rows}",
            [v for r in chunk for v in (
                r.run_id, r.job["id"], r.dispatch["id"], r.dispatch["kind"], r.attempt, r.dispatch["due_at"], now, now,
                lease.owner, lease.token, r.parent_run_id, r.retry_of_run_id, r.replay_of_run_id, r.job["delivery_guarantee"],
                r.executor, r.job["output_format"], r.dispatch["artifact_digest"], r.dispatch["source_run_id"],
                r.dispatch["source_artifact_digest"])],
        )
        for r in chunk:
            d = r.dispatch
            append_event(tx, "run.started", job_id=r.job["id"], run_id=r.run_id, dispatch_id=d["id"], actor=lease.owner, at=now,
                         data={"kind": d["kind"], "attempt": r.attempt, "token": lease.token},
                         artifact_digest=d["artifact_digest"], principal=None, trust_level=None)
            _notify(r.run_id, r.job["id"], None, "running", now)
        started += chunk
    return started


def record_skipped(
    tx: Tx, job: dict[str, Any], *, run_id: str, slot_ms: int | None, reason: str, now: int, dispatch_id: str | None = None,
    dispatch_kind: str | None = None, actor: str | None = None, data: dict[str, Any] | None = None,
) -> None:
    """(new) -> ``skipped``: a run that says why a slot did not run (nothing is dropped silently)."""
    tx.execute(
        "INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, scheduled_for, created_at, finished_at, terminal_at,"
        " skip_reason, delivery_guarantee, artifact_digest) VALUES (?, ?, ?, ?, 'skipped', ?, ?, ?, ?, ?, ?, ?)",
        (run_id, job["id"], dispatch_id, dispatch_kind, slot_ms, now, now, now, reason, job["delivery_guarantee"],
         job.get("artifact_digest")),
    )
    append_event(tx, "run.skipped", job_id=job["id"], run_id=run_id, dispatch_id=dispatch_id, actor=actor, at=now,
                 data={"reason": reason, **(data or {})})
    _notify(run_id, job["id"], None, "skipped", now)


def finish_run(
    tx: Tx, run_id: str, *, owner: str, token: int, status: str, values: dict[str, Any], error_message: str | None,
    now: int, process_state: str = "exited", returning: str,
) -> dict[str, Any] | None:
    """``running`` -> terminal under the run's fence (owner and token); None if the run is no longer ours.

    One compare-and-swap decides everything: if a cancel request was recorded first,
    cancellation wins (``cancelled``, the message says so). ``process_state`` replaces a
    ``running`` process state (the executor returned: ``exited``; an abandoned worker:
    ``unknown``). RETURNING hands back the ``returning`` columns (which must include
    ``job_id`` and ``status``) without another read.
    """
    key = (tuple(values), returning)
    sql = _FINISH_SQL.get(key)
    if sql is None:
        sets = ", ".join(f"{k} = ?" for k in values)
        sql = (
            f"UPDATE runs SET {sets}{', ' if sets else ''}finished_at = ?, terminal_at = ?,"
            " status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE ? END,"
            " error_message = CASE WHEN cancel_requested_at IS NOT NULL AND ? <> 'cancelled'"
            "   THEN COALESCE(?, '') || ' (cancellation won)' ELSE ? END,"
            " duration_ms = ? - COALESCE(started_at, ?),"
            " process_state = CASE WHEN process_state = 'running' THEN ? ELSE process_state END"
            " WHERE id = ? AND status = 'running' AND dispatcher_owner = ? AND dispatcher_token = ?"
            f" RETURNING {returning}"
        )
        if len(_FINISH_SQL) >= _FINISH_SQL_MAX:
            _FINISH_SQL.clear()
        _FINISH_SQL[key] = sql
    run = tx.one(
        sql,
        [*values.values(), now, now, status, status, error_message, error_message, now, now, process_state, run_id, owner, token],
    )
    if run is not None:
        _notify(run_id, run["job_id"], "running", run["status"], now)
    return run


#: ``finish_run``'s statement per (columns set, RETURNING list): a run's result columns come in a handful of shapes,
#: so the text is built once per shape, not once per run. Bounded; cleared when full.
_FINISH_SQL: dict[tuple[tuple[str, ...], str], str] = {}
_FINISH_SQL_MAX = 256


def fail_completion(tx: Tx, run_id: str, *, owner: str, token: int, message: str, now: int) -> bool:
    """``running`` -> ``error`` (``COMPLETION_FAILED``) under the fence, when the completion itself failed.

    Nothing stays ``running`` forever; the dispatch row becomes ``failed``. No other
    consequence is attempted (the completion that would create them just failed).
    """
    run = tx.one(
        "UPDATE runs SET status = 'error', error_code = 'COMPLETION_FAILED', error_message = ?,"
        " finished_at = CASE WHEN started_at > ? THEN started_at ELSE ? END,"
        " terminal_at = CASE WHEN started_at > ? THEN started_at ELSE ? END,"
        " process_state = CASE WHEN process_state = 'running' THEN 'exited' ELSE process_state END"
        " WHERE id = ? AND status = 'running' AND dispatcher_owner = ? AND dispatcher_token = ?"
        " RETURNING job_id, dispatch_id, finished_at",
        (message, now, now, now, now, run_id, owner, token),
    )
    if run is None:
        return False
    finish_dispatch(tx, run["dispatch_id"], "failed", now=now, last_error=message)
    append_event(tx, "run.completion_failed", job_id=run["job_id"], run_id=run_id, dispatch_id=run["dispatch_id"], actor=owner,
                 at=now, data={"error": message})
    _notify(run_id, run["job_id"], "running", "error", run["finished_at"])
    return True


def request_cancel(tx: Tx, run: dict[str, Any], *, reason: str | None, actor: str, now: int) -> bool:
    """Record who asked to cancel a run, why and when (first request wins); the status is not changed here.

    A running run's owner sees the request, stops its executor and commits ``cancelled``
    through ``finish_run``; a waiting run is then ended by ``cancel_waiting_run``.
    """
    changed = tx.execute(
        "UPDATE runs SET cancel_requested_at = ?, cancel_requested_by = ?, cancel_reason = ? WHERE id = ? AND cancel_requested_at IS NULL",
        (now, actor, reason, run["id"]),
    )
    append_event(tx, "run.cancel_requested", job_id=run["job_id"], run_id=run["id"], actor=actor, at=now, data={"reason": reason})
    return changed == 1


def cancel_waiting_run(tx: Tx, run: dict[str, Any], *, reason: str | None, actor: str | None, now: int,
                       error_code: str | None = None) -> bool:
    """``pending``/``awaiting_approval``/``approved`` -> ``cancelled``, with its dispatch row and open approvals.

    No executor holds a waiting run, so it ends at once. The request fields are filled
    in unless an earlier request already did; ``error_code`` says why when a gate ended it
    (``APPROVAL_REJECTED``, ``APPROVAL_TIMED_OUT``).
    """
    old = run["status"]
    if old not in CANCEL_DIRECTLY:
        return False
    why = reason or "cancelled"
    changed = tx.execute(
        "UPDATE runs SET status = 'cancelled', finished_at = ?, terminal_at = ?,"
        " cancel_requested_at = COALESCE(cancel_requested_at, ?), cancel_requested_by = COALESCE(cancel_requested_by, ?),"
        " cancel_reason = COALESCE(cancel_reason, ?), error_code = COALESCE(?, error_code),"
        " process_state = CASE WHEN process_state = 'running' THEN 'unknown' ELSE process_state END"
        " WHERE id = ? AND status = ?",
        (now, now, now, actor, why, error_code, run["id"], old),
    )
    if changed != 1:
        return False
    if run.get("dispatch_id"):
        tx.execute(
            "UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = ?, updated_at = ? WHERE id = ?"
            " AND status IN ('pending', 'claimed', 'awaiting_approval')",
            (why, now, run["dispatch_id"]),
        )
    tx.execute(
        "UPDATE approvals SET status = 'cancelled', cancelled_at = ?, decision_reason = COALESCE(decision_reason, ?),"
        " version = version + 1 WHERE run_id = ? AND status IN ('pending', 'approved')",
        (now, why, run["id"]),
    )
    append_event(tx, "run.cancelled", job_id=run["job_id"], run_id=run["id"], dispatch_id=run.get("dispatch_id"), actor=actor,
                 at=now, data={"reason": why, "from": old})
    _notify(run["id"], run["job_id"], old, "cancelled", now)
    return True


# -- the approval gate ------------------------------------------------------------------------------


def open_approval_gate(
    tx: Tx, *, run_id: str, approval_id: str, job: dict[str, Any], dispatch_id: str, dispatch_kind: str, attempt: int,
    scheduled_for: int, executor: str | None, parent_run_id: str | None, retry_of_run_id: str | None,
    replay_of_run_id: str | None, now: int, actor: str | None, gate_kind: str = "job", risk_level: str | None = None,
) -> None:
    """claimed dispatch -> ``awaiting_approval``; (new) run -> ``awaiting_approval``; (new) approval ``pending``.

    The caller claimed the dispatch in this transaction (so exactly one dispatcher opens the
    gate). The approval snapshots the job's risk level, approver scope and timeout, and binds
    the dispatch's execution artifact and source run. A scoped gate never auto-approves.
    """
    tx.execute(
        "UPDATE job_dispatch_queue SET status = 'awaiting_approval', claim_owner = NULL, claim_token = NULL, claim_fence = NULL,"
        " claim_expires_at = NULL, updated_at = ? WHERE id = ? AND status = 'claimed'",
        (now, dispatch_id),
    )
    tx.execute(
        "INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, attempt, scheduled_for, created_at, parent_run_id,"
        " retry_of_run_id, replay_of_run_id, delivery_guarantee, executor, output_format, artifact_digest, source_run_id,"
        " source_artifact_digest)"
        " SELECT ?, ?, ?, ?, 'awaiting_approval', ?, ?, ?, ?, ?, ?, ?, ?, ?, d.artifact_digest, d.source_run_id,"
        " d.source_artifact_digest FROM job_dispatch_queue d WHERE d.id = ?",
        (run_id, job["id"], dispatch_id, dispatch_kind, attempt, scheduled_for, now, parent_run_id, retry_of_run_id,
         replay_of_run_id, job["delivery_guarantee"], executor, job["output_format"], dispatch_id),
    )
    scope = job.get("approval_approver_scope")
    timeout_action = "reject" if scope else job["approval_timeout_action"]
    tx.execute(
        "INSERT INTO approvals(id, job_id, run_id, dispatch_id, gate_kind, status, version, risk_level, approver_scope,"
        " timeout_action, requested_at, expires_at, artifact_digest, source_run_id, source_artifact_digest)"
        " SELECT ?, ?, ?, ?, ?, 'pending', 1, ?, ?, ?, ?, ?, d.artifact_digest, d.source_run_id, d.source_artifact_digest"
        " FROM job_dispatch_queue d WHERE d.id = ?",
        (approval_id, job["id"], run_id, dispatch_id, gate_kind, risk_level or job["approval_risk_level"], scope, timeout_action,
         now, now + int(job["approval_timeout_s"]) * 1000, dispatch_id),
    )
    append_event(tx, "approval.requested", job_id=job["id"], run_id=run_id, dispatch_id=dispatch_id, actor=actor, at=now,
                 data={"approval_id": approval_id, "gate": gate_kind, "risk_level": risk_level or job["approval_risk_level"],
                       "approver_scope": scope, "kind": dispatch_kind, "attempt": attempt})
    _notify(run_id, job["id"], None, "awaiting_approval", now)


#: Decisions an approval can take while ``pending``, and the column recording when.
_DECISION_COLUMNS = {"approved": "approved_at", "rejected": "rejected_at", "timed_out": "timed_out_at"}


def decide_approval(
    tx: Tx, approval: dict[str, Any], decision: str, *, actor: str, uid: int | None, note: str | None, now: int,
) -> bool:
    """``pending`` -> ``approved`` | ``rejected`` | ``timed_out`` by compare-and-swap on the approval's version.

    False when the approval is no longer the ``pending`` version the caller read (someone
    else decided first). Approving makes the run ``approved`` and its dispatch ``pending``
    again, so one dispatcher claims and starts it; rejecting or timing out ends the run
    ``cancelled`` (``APPROVAL_REJECTED`` / ``APPROVAL_TIMED_OUT``) with its dispatch.
    """
    column = _DECISION_COLUMNS[decision]
    changed = tx.execute(
        f"UPDATE approvals SET status = ?, version = version + 1, decided_by = ?, decided_uid = ?, note = ?, {column} = ?"
        " WHERE id = ? AND status = 'pending' AND version = ?",
        (decision, actor, uid, note, now, approval["id"], approval["version"]),
    )
    if changed != 1:
        return False
    run = tx.one("SELECT id, job_id, status, dispatch_id FROM runs WHERE id = ?", (approval["run_id"],))
    append_event(tx, f"approval.{decision}", job_id=approval["job_id"], run_id=approval["run_id"],
                 dispatch_id=approval["dispatch_id"], actor=actor, at=now,
                 data={"approval_id": approval["id"], "uid": uid, "note": note, "artifact_digest": approval["artifact_digest"]})
    if run is None:
        return True
    if decision == "approved":
        if tx.execute("UPDATE runs SET status = 'approved' WHERE id = ? AND status = 'awaiting_approval'", (run["id"],)) == 1:
            tx.execute("UPDATE job_dispatch_queue SET status = 'pending', updated_at = ? WHERE id = ? AND status = 'awaiting_approval'",
                       (now, run["dispatch_id"]))
            _notify(run["id"], run["job_id"], "awaiting_approval", "approved", now)
        return True
    code = "APPROVAL_REJECTED" if decision == "rejected" else "APPROVAL_TIMED_OUT"
    why = f"approval rejected by {actor}" if decision == "rejected" else "approval timed out"
    cancel_waiting_run(tx, run, reason=why + (f": {note}" if note else ""), actor=actor, now=now, error_code=code)
    return True


def dispatch_approved_run(tx: Tx, lease: Lease, run: dict[str, Any], *, now: int) -> bool:
    """``approved`` -> ``running`` under ``lease``'s fence, its approval ``approved`` -> ``dispatched`` (once).

    The caller claimed the run's dispatch in this transaction. False (nothing changed) when
    the approval is no longer ``approved`` or the run no longer waits.
    """
    approval = tx.one("SELECT id, version FROM approvals WHERE run_id = ? AND status = 'approved'", (run["id"],))
    if approval is None:
        return False
    if tx.execute("UPDATE approvals SET status = 'dispatched', version = version + 1, dispatched_at = ?"
                  " WHERE id = ? AND status = 'approved' AND version = ?", (now, approval["id"], approval["version"])) != 1:
        return False
    if tx.execute("UPDATE runs SET status = 'running', started_at = ?, dispatcher_owner = ?, dispatcher_token = ?"
                  " WHERE id = ? AND status = 'approved'", (now, lease.owner, lease.token, run["id"])) != 1:
        raise StaleFence(f"run {run['id']} stopped waiting while its approval was being dispatched")
    append_event(tx, "run.started", job_id=run["job_id"], run_id=run["id"], dispatch_id=run["dispatch_id"], actor=lease.owner,
                 at=now, data={"kind": run["dispatch_kind"], "attempt": run["attempt"], "token": lease.token,
                               "approval_id": approval["id"]})
    _notify(run["id"], run["job_id"], "approved", "running", now)
    return True


def escalate_run(
    tx: Tx, run_id: str, *, owner: str, token: int, values: dict[str, Any], approval_id: str, gate_kind: str,
    risk_level: str, reason: str | None, now: int, proof_window: dict[str, int | None] | None = None,
) -> dict[str, Any] | None:
    """``running`` -> ``awaiting_approval`` under the run's fence (an authorization provider escalated); its dispatch
    ``claimed`` -> ``awaiting_approval``; (new) approval ``pending`` of ``gate_kind``.

    Nothing of the payload ran. ``values`` are the run columns the pipeline decided so far
    (``authorization_json``, ...). None (nothing changed) when the run is no longer ours or a
    cancel request came first: the caller then ends it as usual. The approval snapshots the
    job's approver scope and timeout like a job gate (``open_approval_gate``), and
    ``proof_window`` (``proofs.approval_columns``: the verified proof's ``proof_not_before``,
    ``proof_expires_at``, ``proof_clock_skew_ms``) when the run verified a proof before escalating.
    """
    window = proof_window or {}
    sets = "".join(f"{k} = ?, " for k in values)
    run = tx.one(
        f"UPDATE runs SET {sets}status = 'awaiting_approval' WHERE id = ? AND status = 'running'"
        " AND dispatcher_owner = ? AND dispatcher_token = ? AND cancel_requested_at IS NULL"
        " RETURNING id, job_id, dispatch_id, dispatch_kind, attempt, status, error_code, duration_ms",
        [*values.values(), run_id, owner, token],
    )
    if run is None:
        return None
    job = tx.one("SELECT id, approval_approver_scope, approval_timeout_action, approval_timeout_s FROM jobs WHERE id = ?",
                 (run["job_id"],))
    tx.execute(
        "UPDATE job_dispatch_queue SET status = 'awaiting_approval', claim_owner = NULL, claim_token = NULL, claim_fence = NULL,"
        " claim_expires_at = NULL, updated_at = ? WHERE id = ? AND status = 'claimed'",
        (now, run["dispatch_id"]),
    )
    scope = job.get("approval_approver_scope") if job else None
    timeout_action = "reject" if scope or job is None else job["approval_timeout_action"]
    tx.execute(
        "INSERT INTO approvals(id, job_id, run_id, dispatch_id, gate_kind, status, version, risk_level, approver_scope,"
        " timeout_action, requested_at, expires_at, artifact_digest, source_run_id, source_artifact_digest,"
        " proof_not_before, proof_expires_at, proof_clock_skew_ms)"
        " SELECT ?, r.job_id, r.id, r.dispatch_id, ?, 'pending', 1, ?, ?, ?, ?, ?, r.artifact_digest, r.source_run_id,"
        " r.source_artifact_digest, ?, ?, ? FROM runs r WHERE r.id = ?",
        (approval_id, gate_kind, risk_level, scope, timeout_action, now,
         now + int(job["approval_timeout_s"] if job else 3600) * 1000, window.get("proof_not_before"),
         window.get("proof_expires_at"), window.get("proof_clock_skew_ms"), run_id),
    )
    append_event(tx, "approval.requested", job_id=run["job_id"], run_id=run_id, dispatch_id=run["dispatch_id"], actor=owner, at=now,
                 data={"approval_id": approval_id, "gate": gate_kind, "risk_level": risk_level, "approver_scope": scope,
                       "kind": run["dispatch_kind"], "attempt": run["attempt"], "reason": reason})
    _notify(run_id, run["job_id"], "running", "awaiting_approval", now)
    return run


def block_recovery(tx: Tx, run: dict[str, Any], *, actor: str, now: int, detail: str | None, message: str | None = None) -> bool:
    """``running`` -> ``recovery_blocked``: the dead owner's work may still run and cannot be stopped, or what it
    left (credential files) cannot be proven removed (``message`` says which; retried later)."""
    changed = tx.execute(
        "UPDATE runs SET status = 'recovery_blocked', error_code = 'RECOVERY_BLOCKED', error_message = ?"
        " WHERE id = ? AND status = 'running' AND dispatcher_owner = ? AND dispatcher_token = ?",
        (message or "process group still alive and cannot be signalled", run["id"], run["dispatcher_owner"],
         run["dispatcher_token"]),
    )
    if changed != 1:
        return False
    append_event(tx, "run.recovery_blocked", job_id=run["job_id"], run_id=run["id"], actor=actor, at=now,
                 data={"detail": detail, "from_owner": run["dispatcher_owner"]})
    _notify(run["id"], run["job_id"], "running", "recovery_blocked", now)
    return True


def crash_run(
    tx: Tx, run: dict[str, Any], *, actor: str, now: int, message: str, process_state: str, process_signal: str | None,
    data: dict[str, Any], returning: str,
) -> dict[str, Any] | None:
    """``running``/``recovery_blocked`` -> ``crashed`` (``DISPATCHER_LOST``), recorded by the recovering ``actor``.

    The compare-and-swap names the dead owner and token the row still carries, so a run
    that its owner finished meanwhile is left alone. ``process_state`` is final
    (``gone``, ``terminated`` with ``process_signal``, or ``unknown``); the
    ``run.recovered`` event carries ``data``. Returns the ``returning`` columns, or None.
    """
    row = tx.one(
        "UPDATE runs SET status = 'crashed', finished_at = ?, terminal_at = ?, duration_ms = ? - COALESCE(started_at, ?),"
        " error_code = 'DISPATCHER_LOST', error_message = ?, process_state = ?, process_signal = ?,"
        " process_terminated_at = ? WHERE id = ? AND status IN ('running', 'recovery_blocked')"
        " AND dispatcher_owner = ? AND dispatcher_token = ?"
        f" RETURNING {returning}",
        (now, now, now, now, message, process_state, process_signal, now if process_state == "terminated" else None,
         run["id"], run["dispatcher_owner"], run["dispatcher_token"]),
    )
    if row is None:
        return None
    append_event(tx, "run.recovered", job_id=run["job_id"], run_id=run["id"], dispatch_id=run.get("dispatch_id"), actor=actor,
                 at=now, data=data)
    _notify(run["id"], run["job_id"], run["status"], "crashed", now)
    return row


# -- a job's pending work --------------------------------------------------------------------------


@attrs.frozen
class CancelledWork:
    """What ``cancel_pending_work`` cancelled."""

    #: Pending dispatch rows (not yet runs).
    dispatches: int
    #: Waiting runs (``pending``, ``awaiting_approval``, ``approved``), by id.
    runs: tuple[str, ...]
    #: Open approvals of the job not tied to one of those runs.
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
    * the job's other open approvals (``pending``, ``approved``) are cancelled.

    Running runs are not touched (cancelling them is a request to their owner). One
    ``job.pending_cancelled`` event summarises it when anything was cancelled.
    """
    waiting = tx.all(
        "SELECT id, job_id, status, dispatch_id FROM runs WHERE job_id = ? AND status IN ('pending', 'awaiting_approval', 'approved')",
        (job_id,),
    )
    runs = tuple(r["id"] for r in waiting if cancel_waiting_run(tx, r, reason=reason, actor=actor, now=now))
    kinds = "" if include_manual else " AND kind <> 'manual'"
    dispatches = tx.execute(
        f"UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = ?, updated_at = ? WHERE job_id = ? AND status = 'pending'{kinds}",
        (reason, now, job_id),
    )
    approvals = tx.execute(
        "UPDATE approvals SET status = 'cancelled', cancelled_at = ?, decision_reason = ?, version = version + 1"
        " WHERE job_id = ? AND status IN ('pending', 'approved')",
        (now, reason, job_id),
    )
    if dispatches or runs or approvals:
        append_event(tx, "job.pending_cancelled", job_id=job_id, actor=actor, at=now,
                     data={"reason": reason, "dispatches": dispatches, "runs": len(runs), "approvals": approvals})
    return CancelledWork(dispatches=dispatches, runs=runs, approvals=approvals)


__all__ = [
    "AfterCommit",
    "CancelledWork",
    "RunNotice",
    "block_recovery",
    "cancel_dispatch",
    "cancel_pending_work",
    "batched_finishes",
    "cancel_waiting_run",
    "claim_and_start_many",
    "claim_dispatch",
    "committing",
    "crash_run",
    "decide_approval",
    "dispatch_approved_run",
    "escalate_run",
    "fail_completion",
    "fenced_update",
    "finish_dispatch",
    "finish_run",
    "insert_dispatch",
    "NewRun",
    "open_approval_gate",
    "record_skipped",
    "release_expired_claims",
    "request_cancel",
    "start_run",
]
