"""Run transitions (``runs.status``) of the dispatcher and of cancels: start (one or many, with their claims), skip,
finish under the owner's fence, fail a completion, request and carry out a cancel of a waiting run; and those of
recovery, on a dead owner's runs (block, crash). Each writes through its named statement (``scheduler.core.state``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from scheduler.core import state
from scheduler.core.events import append_event
from scheduler.core.rows import DispatchRow, JobRow, JSONObject, RunRow, SQLValue
from scheduler.core.runs import CANCEL_DIRECTLY, StaleFence
from scheduler.core.store.base import Tx
from scheduler.core.transitions.commit import notify
from scheduler.core.transitions.dispatches import finish_dispatch

if TYPE_CHECKING:
    from scheduler.core.lease import Lease


#: The bookkeeping columns ``fenced_update`` writes (statement ``update_run_bookkeeping``).
BOOKKEEPING_COLUMNS = ("executor_handle", "process_state", "process_signal", "process_terminated_at")


def fenced_update(tx: Tx, run_id: str, owner: str, token: int, expected_status: str,
                  values: Mapping[str, SQLValue]) -> None:
    """Bookkeeping on a run this owner holds (its executor handle, process state): only with the fence, never the status.

    ``values`` are some of ``BOOKKEEPING_COLUMNS``; the others are left as they are. Raises
    ``StaleFence`` unless the run still has ``expected_status`` under ``owner`` and ``token``.
    """
    if "status" in values:
        raise ValueError("fenced_update never writes a run's status: use a transition")
    unknown = set(values).difference(BOOKKEEPING_COLUMNS)
    if unknown:
        raise ValueError(f"fenced_update writes only {', '.join(BOOKKEEPING_COLUMNS)}, not {', '.join(sorted(unknown))}")
    params: dict[str, SQLValue] = {}
    for column in BOOKKEEPING_COLUMNS:
        params[column] = values.get(column)
        params["set_" + column] = 1 if column in values else 0
    changed = state.execute(tx, "update_run_bookkeeping", run_id=run_id, expected_status=expected_status, owner=owner,
                            token=token, **params)
    if changed != 1:
        raise StaleFence(f"run {run_id} is no longer {expected_status} under owner {owner} token {token}")


def run_row(
    *, id: str, job_id: str, status: str, created_at: int, delivery_guarantee: str, dispatch_id: str | None = None,
    dispatch_kind: str | None = None, attempt: int = 1, scheduled_for: int | None = None, started_at: int | None = None,
    finished_at: int | None = None, terminal_at: int | None = None, skip_reason: str | None = None,
    dispatcher_owner: str | None = None, dispatcher_token: int | None = None, parent_run_id: str | None = None,
    retry_of_run_id: str | None = None, replay_of_run_id: str | None = None, executor: str | None = None,
    output_format: str | None = None, artifact_digest: str | None = None, source_run_id: str | None = None,
    source_artifact_digest: str | None = None,
) -> dict[str, SQLValue]:
    """One row of ``insert_runs``: a new run's columns, each not given as a run row leaves it (``attempt`` 1, else NULL)."""
    return {
        "id": id, "job_id": job_id, "dispatch_id": dispatch_id, "dispatch_kind": dispatch_kind, "status": status,
        "attempt": attempt, "scheduled_for": scheduled_for, "created_at": created_at, "started_at": started_at,
        "finished_at": finished_at, "terminal_at": terminal_at, "skip_reason": skip_reason,
        "dispatcher_owner": dispatcher_owner, "dispatcher_token": dispatcher_token, "parent_run_id": parent_run_id,
        "retry_of_run_id": retry_of_run_id, "replay_of_run_id": replay_of_run_id, "delivery_guarantee": delivery_guarantee,
        "executor": executor, "output_format": output_format, "artifact_digest": artifact_digest,
        "source_run_id": source_run_id, "source_artifact_digest": source_artifact_digest,
    }


def start_run(
    tx: Tx, lease: Lease, *, run_id: str, job: JobRow, dispatch_id: str, dispatch_kind: str, attempt: int,
    scheduled_for: int, executor: str | None, parent_run_id: str | None, retry_of_run_id: str | None,
    replay_of_run_id: str | None, now: int, artifact_digest: str | None = None,
) -> None:
    """(new) -> ``running`` under ``lease``'s fence (the caller claimed its dispatch in this transaction).

    The run inherits its dispatch's artifact binding (artifact, source run, source artifact).
    ``artifact_digest`` is the dispatch's binding when the caller read it (its ``run.started``
    event then needs no lookups: a new run has no identity recorded yet).
    """
    binding = tx.one("SELECT artifact_digest, source_run_id, source_artifact_digest FROM job_dispatch_queue WHERE id = ?",
                     (dispatch_id,))
    if binding is not None:  # the run inherits its dispatch's binding (no dispatch row: no run, as INSERT ... SELECT did)
        state.execute(tx, "insert_runs", rows=[run_row(
            id=run_id, job_id=job.id, dispatch_id=dispatch_id, dispatch_kind=dispatch_kind, status="running",
            attempt=attempt, scheduled_for=scheduled_for, created_at=now, started_at=now, dispatcher_owner=lease.owner,
            dispatcher_token=lease.token, parent_run_id=parent_run_id, retry_of_run_id=retry_of_run_id,
            replay_of_run_id=replay_of_run_id, delivery_guarantee=job.delivery_guarantee, executor=executor,
            output_format=job.output_format, **binding)])
    append_event(tx, "run.started", job_id=job.id, run_id=run_id, dispatch_id=dispatch_id, actor=lease.owner, at=now,
                 data={"kind": dispatch_kind, "attempt": attempt, "token": lease.token}, artifact_digest=artifact_digest,
                 principal=None, trust_level=None)
    notify(run_id, job.id, None, "running", now)


@attrs.frozen
class NewRun:
    """A run ``claim_and_start_many`` claims and starts: its dispatch row's values and the run's own."""

    run_id: str
    claim_token: str
    job: JobRow
    #: The claimed dispatch row as the claimer read it in this transaction (a partial read: id, kind, due_at,
    #: artifact_digest, source_run_id, source_artifact_digest at least; ``scheduler.core.queue.claim_and_start``).
    dispatch: DispatchRow
    attempt: int
    executor: str | None
    parent_run_id: str | None
    retry_of_run_id: str | None
    replay_of_run_id: str | None


#: Rows per multi-row statement of ``claim_and_start_many`` (23 parameters a run row: inside every dialect's limit).
_START_ROWS = 40


def claim_and_start_many(tx: Tx, lease: Lease, runs: list[NewRun], *, expires_at: int, now: int) -> list[NewRun]:
    """``pending`` -> ``claimed`` and (new) -> ``running`` for several dispatches at once; returns the runs started.

    The same transitions as ``claim_dispatch`` then ``start_run`` per run, in three statements
    for the whole list (``claim_dispatches`` ... RETURNING, one multi-row ``insert_runs``, the events
    through ``append_event``): a dispatch no longer ``pending`` is not claimed and gets no run
    (never a run without its claim). The dispatch rows must have been read in this
    transaction (SQLite: the write transaction is exclusive; PostgreSQL: the rows are locked),
    so the run's binding (artifact, source run, source artifact) is the dispatch's, as
    ``start_run`` reads it.
    """
    started: list[NewRun] = []
    for i in range(0, len(runs), _START_ROWS):
        chunk = runs[i:i + _START_ROWS]
        claimed = {row["id"] for row in state.rows(
            tx, "claim_dispatches", owner=lease.owner, token=lease.token, expires_at=expires_at, now=now,
            rows=[{"dispatch_id": r.dispatch.id, "claim_token": r.claim_token, "run_id": r.run_id} for r in chunk],
        )}
        chunk = [r for r in chunk if r.dispatch.id in claimed]
        if not chunk:
            continue
        state.execute(tx, "insert_runs", rows=[{
            "id": r.run_id, "job_id": r.job.id, "dispatch_id": r.dispatch.id, "dispatch_kind": r.dispatch.kind,
            "status": "running", "attempt": r.attempt, "scheduled_for": r.dispatch.due_at, "created_at": now,
            "started_at": now, "finished_at": None, "terminal_at": None, "skip_reason": None,
            "dispatcher_owner": lease.owner, "dispatcher_token": lease.token, "parent_run_id": r.parent_run_id,
            "retry_of_run_id": r.retry_of_run_id, "replay_of_run_id": r.replay_of_run_id,
            "delivery_guarantee": r.job.delivery_guarantee, "executor": r.executor, "output_format": r.job.output_format,
            "artifact_digest": r.dispatch.artifact_digest, "source_run_id": r.dispatch.source_run_id,
            "source_artifact_digest": r.dispatch.source_artifact_digest} for r in chunk])
        for r in chunk:
            d = r.dispatch
            append_event(tx, "run.started", job_id=r.job.id, run_id=r.run_id, dispatch_id=d.id, actor=lease.owner, at=now,
                         data={"kind": d.kind, "attempt": r.attempt, "token": lease.token},
                         artifact_digest=d.artifact_digest, principal=None, trust_level=None)
            notify(r.run_id, r.job.id, None, "running", now)
        started += chunk
    return started


def record_skipped(
    tx: Tx, job: JobRow, *, run_id: str, slot_ms: int | None, reason: str, now: int, dispatch_id: str | None = None,
    dispatch_kind: str | None = None, actor: str | None = None, data: JSONObject | None = None,
    replay_of_run_id: str | None = None,
) -> None:
    """(new) -> ``skipped``: a run that says why a slot did not run (nothing is dropped silently).

    ``replay_of_run_id``: the run a skipped replay dispatch stood for (its lineage stays on the row).
    """
    state.execute(tx, "insert_runs", rows=[run_row(
        id=run_id, job_id=job.id, dispatch_id=dispatch_id, dispatch_kind=dispatch_kind, status="skipped",
        scheduled_for=slot_ms, created_at=now, finished_at=now, terminal_at=now, skip_reason=reason,
        delivery_guarantee=job.delivery_guarantee, artifact_digest=job.artifact_digest, replay_of_run_id=replay_of_run_id)])
    append_event(tx, "run.skipped", job_id=job.id, run_id=run_id, dispatch_id=dispatch_id, actor=actor, at=now,
                 data={"reason": reason, **(data or {})})
    notify(run_id, job.id, None, "skipped", now)


#: The result columns ``finish_run`` always writes (an executor's result has each, None or not).
RESULT_COLUMNS = ("exit_code", "error_code", "summary", "env_policy_warning")
#: Result columns written as a group or not at all (a result without a stdout capture leaves the stdout columns).
RESULT_GROUPS: dict[str, tuple[str, ...]] = {
    "stdout": ("stdout_excerpt", "stdout_bytes", "stdout_sha256", "stdout_artifact", "stdout_truncated"),
    "stderr": ("stderr_excerpt", "stderr_bytes", "stderr_sha256", "stderr_artifact", "stderr_truncated"),
    "output": ("output_format", "output_valid", "output_warning", "output_bytes", "output_sha256", "output_parsed",
               "output_artifact"),
    "usage": ("usage_json",),
    "verify": ("verify_status", "verify_json"),
}
#: The run columns the pipeline's steps decide (``RunOutcomes.columns``), each written only when decided.
OUTCOME_COLUMNS = ("identity_json", "trust_level", "principal", "delegation_json", "governance_json", "credentials_json",
                   "authorization_json", "proof_json", "evidence_status")
_GROUP_OF = {column: group for group, columns in RESULT_GROUPS.items() for column in columns}
_FINISHED = frozenset((*RESULT_COLUMNS, *_GROUP_OF, *OUTCOME_COLUMNS))
#: ``(group, its columns, its flag)`` and ``(outcome column, its flag)``: finish_run's flags, named once.
_GROUP_FLAGS = tuple((group, frozenset(columns), "set_" + group) for group, columns in RESULT_GROUPS.items())
_OUTCOME_FLAGS = tuple((column, "set_" + column) for column in OUTCOME_COLUMNS)


def outcome_params(values: Mapping[str, SQLValue], params: dict[str, SQLValue]) -> None:
    """``params`` gain each ``OUTCOME_COLUMNS`` value and its ``set_`` flag (1 when ``values`` decided it)."""
    for column in OUTCOME_COLUMNS:
        if column in values:
            params[column], params["set_" + column] = values[column], 1
        else:
            params[column], params["set_" + column] = None, 0


#: ``finish_run``'s prepared statement per set of columns given (a few shapes of result: checked and rendered once per
#: shape, ``state.prepare``).
_SHAPES: dict[frozenset[str], state.Rendered] = {}
#: Shapes kept at most (an unbounded variety of column sets is not expected; the cache starts over past it).
_SHAPES_MAX = 256


def _finish_flags(keys: frozenset[str]) -> dict[str, int]:
    """The ``set_`` flags for a result and outcome of these columns; ``ValueError`` for an unknown column or a partial group."""
    if not _FINISHED.issuperset(keys):
        raise ValueError(f"finish_run: not a result or outcome column: {', '.join(sorted(keys - _FINISHED))}")
    flags: dict[str, int] = {}
    for group, columns, flag in _GROUP_FLAGS:
        given = len(keys & columns)
        if given and given != len(columns):
            raise ValueError(f"finish_run: the {group} columns are written together ({', '.join(RESULT_GROUPS[group])})")
        flags[flag] = 1 if given else 0
    for column, flag in _OUTCOME_FLAGS:
        flags[flag] = 1 if column in keys else 0
    return flags


def _finish_shape(keys: frozenset[str]) -> state.Rendered:
    """``finish_run`` as a call writing the columns ``keys`` runs it: its flags checked, every keyword passed once."""
    params: dict[str, SQLValue] = dict.fromkeys(_FINISHED)
    params.update(_finish_flags(keys))
    shape = state.prepare("finish_run", run_id=None, owner=None, token=None, status=None, error_message=None, now=None,
                          process_state=None, **params)
    if len(_SHAPES) >= _SHAPES_MAX:
        _SHAPES.clear()
    _SHAPES[keys] = shape
    return shape


def finish_run(
    tx: Tx, run_id: str, *, owner: str, token: int, status: str, values: Mapping[str, SQLValue], error_message: str | None,
    now: int, process_state: str = "exited",
) -> RunRow | None:
    """``running`` -> terminal under the run's fence (owner and token); None if the run is no longer ours.

    One compare-and-swap decides everything: if a cancel request was recorded first,
    cancellation wins (``cancelled``, the message says so). ``process_state`` replaces a
    ``running`` process state (the executor returned: ``exited``; an abandoned worker:
    ``unknown``). ``values`` are the run's result columns (``RESULT_COLUMNS``, whole
    ``RESULT_GROUPS``) and the pipeline's (``OUTCOME_COLUMNS``); a group or column not in it is
    left as it is. RETURNING hands back what completion and its consequences read (statement
    ``finish_run``) without another read: the returned row holds those columns (the others are None).

    The statement is prepared once per set of columns given (``state.prepare``: the flags and
    keywords checked then); a call binds only the values its text uses.
    """
    keys = frozenset(values)
    shape = _SHAPES.get(keys)
    if shape is None:
        shape = _finish_shape(keys)
    params = dict(values)
    params["run_id"], params["owner"], params["token"], params["status"] = run_id, owner, token, status
    params["error_message"], params["now"], params["process_state"] = error_message, now, process_state
    row = tx.one(shape.sql, shape.values(params))
    if row is None:
        return None
    run = RunRow.from_row(row)
    notify(run_id, run.job_id, "running", run.status, now)
    return run


def fail_completion(tx: Tx, run_id: str, *, owner: str, token: int, message: str, now: int) -> bool:
    """``running`` -> ``error`` (``COMPLETION_FAILED``) under the fence, when the completion itself failed.

    Nothing stays ``running`` forever; the dispatch row becomes ``failed``. No other
    consequence is attempted (the completion that would create them just failed).
    """
    run = state.one(tx, "fail_completion", run_id=run_id, owner=owner, token=token, message=message, now=now)
    if run is None:
        return False
    job_id, dispatch_id, finished_at = run["job_id"], run["dispatch_id"], run["finished_at"]
    finish_dispatch(tx, dispatch_id, "failed", now=now, last_error=message)
    append_event(tx, "run.completion_failed", job_id=job_id, run_id=run_id, dispatch_id=dispatch_id, actor=owner,
                 at=now, data={"error": message})
    notify(run_id, job_id, "running", "error", finished_at)
    return True


def request_cancel(tx: Tx, run: RunRow, *, reason: str | None, actor: str, now: int) -> bool:
    """Record who asked to cancel a run, why and when (first request wins); the status is not changed here.

    ``run`` needs ``id`` and ``job_id`` (a partial read is enough).

    A running run's owner sees the request, stops its executor and commits ``cancelled``
    through ``finish_run``; a waiting run is then ended by ``cancel_waiting_run``.
    """
    changed = state.execute(tx, "request_cancel", run_id=run.id, now=now, actor=actor, reason=reason)
    append_event(tx, "run.cancel_requested", job_id=run.job_id, run_id=run.id, actor=actor, at=now, data={"reason": reason})
    return changed == 1


def cancel_waiting_run(tx: Tx, run: RunRow, *, reason: str | None, actor: str | None, now: int,
                       error_code: str | None = None) -> bool:
    """``pending``/``awaiting_approval``/``approved`` -> ``cancelled``, with its dispatch row and open approvals.

    No executor holds a waiting run, so it ends at once. The request fields are filled
    in unless an earlier request already did; ``error_code`` says why when a gate ended it
    (``APPROVAL_REJECTED``, ``APPROVAL_TIMED_OUT``). ``run`` needs ``id``, ``job_id``, ``status`` and
    ``dispatch_id`` (a partial read is enough).
    """
    old = run.status
    if old not in CANCEL_DIRECTLY:
        return False
    why = reason or "cancelled"
    changed = state.execute(tx, "cancel_waiting_run", run_id=run.id, status=old, now=now, actor=actor, reason=why,
                            error_code=error_code)
    if changed != 1:
        return False
    if run.dispatch_id:
        state.execute(tx, "cancel_run_dispatch", dispatch_id=run.dispatch_id, reason=why, now=now)
    state.execute(tx, "cancel_run_approvals", run_id=run.id, reason=why, now=now)
    append_event(tx, "run.cancelled", job_id=run.job_id, run_id=run.id, dispatch_id=run.dispatch_id, actor=actor,
                 at=now, data={"reason": why, "from": old})
    notify(run.id, run.job_id, old, "cancelled", now)
    return True


def block_recovery(tx: Tx, run: RunRow, *, actor: str, now: int, detail: str | None, message: str | None = None) -> bool:
    """``running`` -> ``recovery_blocked``: the dead owner's work may still run and cannot be stopped, or what it
    left (credential files) cannot be proven removed (``message`` says which; retried later)."""
    changed = state.execute(tx, "block_recovery", run_id=run.id, owner=run.dispatcher_owner,
                            token=run.dispatcher_token,
                            message=message or "process group still alive and cannot be signalled")
    if changed != 1:
        return False
    append_event(tx, "run.recovery_blocked", job_id=run.job_id, run_id=run.id, actor=actor, at=now,
                 data={"detail": detail, "from_owner": run.dispatcher_owner})
    notify(run.id, run.job_id, "running", "recovery_blocked", now)
    return True


def crash_run(
    tx: Tx, run: RunRow, *, actor: str, now: int, message: str, process_state: str, process_signal: str | None,
    data: JSONObject,
) -> RunRow | None:
    """``running``/``recovery_blocked`` -> ``crashed`` (``DISPATCHER_LOST``), recorded by the recovering ``actor``.

    The compare-and-swap names the dead owner and token the row still carries, so a run
    that its owner finished meanwhile is left alone. ``process_state`` is final
    (``gone``, ``terminated`` with ``process_signal``, or ``unknown``); the
    ``run.recovered`` event carries ``data``. Returns what its consequences read (as ``finish_run``: the
    statement's RETURNING columns, the others None), or None.
    """
    row = state.one(tx, "crash_run", run_id=run.id, owner=run.dispatcher_owner, token=run.dispatcher_token,
                    now=now, message=message, process_state=process_state, process_signal=process_signal,
                    process_terminated_at=now if process_state == "terminated" else None)
    if row is None:
        return None
    append_event(tx, "run.recovered", job_id=run.job_id, run_id=run.id, dispatch_id=run.dispatch_id, actor=actor,
                 at=now, data=data)
    notify(run.id, run.job_id, run.status, "crashed", now)
    return RunRow.from_row(row)
