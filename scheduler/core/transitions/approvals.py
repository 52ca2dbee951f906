"""Approval gate transitions (``approvals.status``, compare-and-swap on ``version``): open a job's gate at claim,
decide it, dispatch an approved run, and escalate a running run to a gate (an authorization provider asked); each
through its named statements (``scheduler.core.state``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from scheduler.core import state
from scheduler.core.events import append_event
from scheduler.core.rows import ApprovalRow, JobRow, RunRow, SQLValue
from scheduler.core.runs import StaleFence
from scheduler.core.store.base import Tx
from scheduler.core.transitions.commit import notify
from scheduler.core.transitions.runs import OUTCOME_COLUMNS, cancel_waiting_run, outcome_params, run_row

if TYPE_CHECKING:
    from scheduler.core.lease import Lease


def open_approval_gate(
    tx: Tx, *, run_id: str, approval_id: str, job: JobRow, dispatch_id: str, dispatch_kind: str, attempt: int,
    scheduled_for: int, executor: str | None, parent_run_id: str | None, retry_of_run_id: str | None,
    replay_of_run_id: str | None, now: int, actor: str | None, gate_kind: str = "job", risk_level: str | None = None,
) -> None:
    """claimed dispatch -> ``awaiting_approval``; (new) run -> ``awaiting_approval``; (new) approval ``pending``.

    The caller claimed the dispatch in this transaction (so exactly one dispatcher opens the
    gate). The approval snapshots the job's risk level, approver scope and timeout, and binds
    the dispatch's execution artifact and source run. A scoped gate never auto-approves.
    """
    # The gate's run and approval bind the dispatch's artifact and source run (returned by the gate's own UPDATE).
    binding = state.one(tx, "gate_dispatch", dispatch_id=dispatch_id, now=now) or tx.one(
        "SELECT artifact_digest, source_run_id, source_artifact_digest FROM job_dispatch_queue WHERE id = ?", (dispatch_id,))
    scope = job.approval_approver_scope
    timeout_action = "reject" if scope else job.approval_timeout_action
    risk = risk_level or job.approval_risk_level
    if binding is not None:  # no dispatch row: neither a run nor an approval (there is nothing to bind them to)
        state.execute(tx, "insert_runs", rows=[run_row(
            id=run_id, job_id=job.id, dispatch_id=dispatch_id, dispatch_kind=dispatch_kind, status="awaiting_approval",
            attempt=attempt, scheduled_for=scheduled_for, created_at=now, parent_run_id=parent_run_id,
            retry_of_run_id=retry_of_run_id, replay_of_run_id=replay_of_run_id, delivery_guarantee=job.delivery_guarantee,
            executor=executor, output_format=job.output_format, **binding)])
        state.execute(tx, "insert_approval", id=approval_id, job_id=job.id, run_id=run_id, dispatch_id=dispatch_id,
                      gate_kind=gate_kind, risk_level=risk, approver_scope=scope,
                      timeout_action=timeout_action, requested_at=now, expires_at=now + int(job.approval_timeout_s) * 1000,
                      proof_not_before=None, proof_expires_at=None, proof_clock_skew_ms=None, **binding)
    append_event(tx, "approval.requested", job_id=job.id, run_id=run_id, dispatch_id=dispatch_id, actor=actor, at=now,
                 data={"approval_id": approval_id, "gate": gate_kind, "risk_level": risk,
                       "approver_scope": scope, "kind": dispatch_kind, "attempt": attempt})
    notify(run_id, job.id, None, "awaiting_approval", now)


#: Decisions an approval can take while ``pending`` (statement ``decide_approval`` records when in its column).
_DECISIONS = frozenset({"approved", "rejected", "timed_out"})


def decide_approval(
    tx: Tx, approval: ApprovalRow, decision: str, *, actor: str, uid: int | None, note: str | None, now: int,
) -> bool:
    """``pending`` -> ``approved`` | ``rejected`` | ``timed_out`` by compare-and-swap on the approval's version.

    False when the approval is no longer the ``pending`` version the caller read (someone
    else decided first). Approving makes the run ``approved`` and its dispatch ``pending``
    again, so one dispatcher claims and starts it; rejecting or timing out ends the run
    ``cancelled`` (``APPROVAL_REJECTED`` / ``APPROVAL_TIMED_OUT``) with its dispatch.
    """
    if decision not in _DECISIONS:
        raise KeyError(decision)
    changed = state.execute(tx, "decide_approval", approval_id=approval.id, version=approval.version, decision=decision,
                            actor=actor, uid=uid, note=note, now=now)
    if changed != 1:
        return False
    found = tx.one("SELECT id, job_id, status, dispatch_id FROM runs WHERE id = ?", (approval.run_id,))
    append_event(tx, f"approval.{decision}", job_id=approval.job_id, run_id=approval.run_id,
                 dispatch_id=approval.dispatch_id, actor=actor, at=now,
                 data={"approval_id": approval.id, "uid": uid, "note": note, "artifact_digest": approval.artifact_digest})
    if found is None:
        return True
    run = RunRow.from_row(found)  # id, job_id, status, dispatch_id (what the decision's transitions read)
    if decision == "approved":
        if state.execute(tx, "approve_run", run_id=run.id) == 1:
            state.execute(tx, "requeue_approved_dispatch", dispatch_id=run.dispatch_id, now=now)
            notify(run.id, run.job_id, "awaiting_approval", "approved", now)
        return True
    code = "APPROVAL_REJECTED" if decision == "rejected" else "APPROVAL_TIMED_OUT"
    why = f"approval rejected by {actor}" if decision == "rejected" else "approval timed out"
    cancel_waiting_run(tx, run, reason=why + (f": {note}" if note else ""), actor=actor, now=now, error_code=code)
    return True


def dispatch_approved_run(tx: Tx, lease: Lease, run: RunRow, *, now: int) -> bool:
    """``approved`` -> ``running`` under ``lease``'s fence, its approval ``approved`` -> ``dispatched`` (once).

    The caller claimed the run's dispatch in this transaction. False (nothing changed) when
    the approval is no longer ``approved`` or the run no longer waits.
    """
    approval = tx.one("SELECT id, version FROM approvals WHERE run_id = ? AND status = 'approved'", (run.id,))
    if approval is None:
        return False
    if state.execute(tx, "dispatch_approval", approval_id=approval["id"], version=approval["version"], now=now) != 1:
        return False
    if state.execute(tx, "start_approved_run", run_id=run.id, now=now, owner=lease.owner, token=lease.token) != 1:
        raise StaleFence(f"run {run.id} stopped waiting while its approval was being dispatched")
    append_event(tx, "run.started", job_id=run.job_id, run_id=run.id, dispatch_id=run.dispatch_id, actor=lease.owner,
                 at=now, data={"kind": run.dispatch_kind, "attempt": run.attempt, "token": lease.token,
                               "approval_id": approval["id"]})
    notify(run.id, run.job_id, "approved", "running", now)
    return True


def escalate_run(
    tx: Tx, run_id: str, *, owner: str, token: int, values: Mapping[str, SQLValue], approval_id: str, gate_kind: str,
    risk_level: str, reason: str | None, now: int, proof_window: Mapping[str, int | None] | None = None,
) -> RunRow | None:
    """``running`` -> ``awaiting_approval`` under the run's fence (an authorization provider escalated); its dispatch
    ``claimed`` -> ``awaiting_approval``; (new) approval ``pending`` of ``gate_kind``.

    Nothing of the payload ran. ``values`` are the run columns the pipeline decided so far
    (``authorization_json``, ...: some of ``OUTCOME_COLUMNS``; the others are left as they are). None (nothing changed) when the run is no longer ours or a
    cancel request came first: the caller then ends it as usual. The approval snapshots the
    job's approver scope and timeout like a job gate (``open_approval_gate``), and
    ``proof_window`` (``proofs.approval_columns``: the verified proof's ``proof_not_before``,
    ``proof_expires_at``, ``proof_clock_skew_ms``) when the run verified a proof before escalating.
    The returned row holds the columns statement ``escalate_run`` returns (the others are None).
    """
    window = proof_window or {}
    unknown = set(values).difference(OUTCOME_COLUMNS)
    if unknown:
        raise ValueError(f"escalate_run: not a pipeline column: {', '.join(sorted(unknown))}")
    params: dict[str, SQLValue] = {}
    outcome_params(values, params)
    row = state.one(tx, "escalate_run", run_id=run_id, owner=owner, token=token, **params)
    if row is None:
        return None
    run = RunRow.from_row(row)
    job = tx.one("SELECT id, approval_approver_scope, approval_timeout_action, approval_timeout_s FROM jobs WHERE id = ?",
                 (run.job_id,))
    state.rows(tx, "gate_dispatch", dispatch_id=run.dispatch_id, now=now)
    scope = job.get("approval_approver_scope") if job else None
    timeout_action = "reject" if scope or job is None else job["approval_timeout_action"]
    state.execute(tx, "insert_approval", id=approval_id, job_id=run.job_id, run_id=run.id, dispatch_id=run.dispatch_id,
                  gate_kind=gate_kind, risk_level=risk_level, approver_scope=scope, timeout_action=timeout_action,
                  requested_at=now, expires_at=now + int(job["approval_timeout_s"] if job else 3600) * 1000,
                  proof_not_before=window.get("proof_not_before"), proof_expires_at=window.get("proof_expires_at"),
                  proof_clock_skew_ms=window.get("proof_clock_skew_ms"), artifact_digest=run.artifact_digest,
                  source_run_id=run.source_run_id, source_artifact_digest=run.source_artifact_digest)
    append_event(tx, "approval.requested", job_id=run.job_id, run_id=run_id, dispatch_id=run.dispatch_id, actor=owner, at=now,
                 data={"approval_id": approval_id, "gate": gate_kind, "risk_level": risk_level, "approver_scope": scope,
                       "kind": run.dispatch_kind, "attempt": run.attempt, "reason": reason})
    notify(run_id, run.job_id, "running", "awaiting_approval", now)
    return run
