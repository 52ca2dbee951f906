"""Approval gate transitions (``approvals.status``, compare-and-swap on ``version``): open a job's gate at claim,
decide it, dispatch an approved run, and escalate a running run to a gate (an authorization provider asked)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scheduler.core.events import append_event
from scheduler.core.runs import StaleFence
from scheduler.core.store.base import Tx
from scheduler.core.transitions.commit import notify
from scheduler.core.transitions.runs import cancel_waiting_run

if TYPE_CHECKING:
    from scheduler.core.lease import Lease


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
    notify(run_id, job["id"], None, "awaiting_approval", now)


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
            notify(run["id"], run["job_id"], "awaiting_approval", "approved", now)
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
    notify(run["id"], run["job_id"], "approved", "running", now)
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
    notify(run_id, run["job_id"], "running", "awaiting_approval", now)
    return run
