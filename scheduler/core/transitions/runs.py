"""Run transitions (``runs.status``) of the dispatcher and of cancels: start (one or many, with their claims), skip,
finish under the owner's fence, fail a completion, request and carry out a cancel of a waiting run; and those of
recovery, on a dead owner's runs (block, crash)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from scheduler.core.events import append_event
from scheduler.core.runs import CANCEL_DIRECTLY, StaleFence
from scheduler.core.store.base import Tx
from scheduler.core.transitions.commit import notify
from scheduler.core.transitions.dispatches import finish_dispatch

if TYPE_CHECKING:
    from scheduler.core.lease import Lease


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
    notify(run_id, job["id"], None, "running", now)


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
            notify(r.run_id, r.job["id"], None, "running", now)
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
    notify(run_id, job["id"], None, "skipped", now)


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
        notify(run_id, run["job_id"], "running", run["status"], now)
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
    notify(run_id, run["job_id"], "running", "error", run["finished_at"])
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
    notify(run["id"], run["job_id"], old, "cancelled", now)
    return True


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
    notify(run["id"], run["job_id"], "running", "recovery_blocked", now)
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
    notify(run["id"], run["job_id"], run["status"], "crashed", now)
    return row
