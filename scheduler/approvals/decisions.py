"""The approval gate: a durable, versioned decision before anything of a gated job's payload runs.

Every dispatch of a job with ``approval_required`` (schedule, at, manual, chain, retry,
replay) opens a gate when it is claimed: its run waits in ``awaiting_approval`` beside a
``pending`` approval that snapshots the risk level, the approver scope, the timeout and
the execution artifact being approved. A decision is one compare-and-swap on the
approval's version (``scheduler.core.transitions.decide_approval``), so two approvers cannot
both win; an approved run is claimed again by exactly one dispatcher and proceeds through
the rest of the run pipeline (the artifact check first).

Who decides is the invoking operating-system account: its *effective uid* and that uid's
user name from the password database. Nothing the caller controls (a flag, ``$USER``,
``$LOGNAME``) can name another identity. ``approval_approver_scope`` is matched against it
(``uid:N``, or a local user name compared after Unicode NFKC normalisation); a decision
outside the scope fails with ``APPROVAL_SCOPE_MISMATCH`` and changes nothing.

Timeouts are decided by the dispatcher when they are due (its wake-up covers the earliest
pending expiry): ``approval_timeout_action`` ``reject`` ends the run ``cancelled``
(``APPROVAL_TIMED_OUT``); ``approve`` releases it, except for a scoped gate, which never
auto-approves.
"""

from __future__ import annotations

import os
import pwd
import unicodedata
import uuid
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import short_run_id
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core import transitions
from scheduler.core.id_refs import ids_with_end
from scheduler.core.rows import ApprovalRow, JobRow
from scheduler.core.spec import executor_name_of
from scheduler.core.store.base import Store, Tx
from scheduler.delivery.outbox import enqueue as enqueue_message

#: Approvals still waiting for a decision, and those whose decision is not final yet.
OPEN_STATUSES = ("pending", "approved")
#: How many due timeouts one dispatcher pass decides (the rest wait for the next pass).
EXPIRY_BATCH = 200
#: The actor recorded for decisions the dispatcher takes on a timeout.
TIMEOUT_ACTOR = "scheduler:timeout"


def approver_identity() -> tuple[str, int]:
    """``(user name, effective uid)`` of this process, from the password database (never the environment)."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry is still that uid
        name = f"uid:{uid}"
    return name, uid


def normalise_principal(name: str) -> str:
    """A local principal as compared with scopes: NFKC-normalised, surrounding white space removed."""
    return unicodedata.normalize("NFKC", name).strip()


def scope_matches(scope: str | None, name: str, uid: int) -> bool:
    """Whether the account ``name`` / ``uid`` may decide a gate with ``scope`` (None: anyone who can reach the database)."""
    if scope is None:
        return True
    scope = normalise_principal(scope)
    if scope.startswith("uid:"):
        return scope[4:].isdigit() and int(scope[4:]) == uid
    return scope == normalise_principal(name)


def open_gate(
    tx: Tx, *, run_id: str, job: JobRow, dispatch_id: str, dispatch_kind: str, attempt: int, scheduled_for: int,
    parent_run_id: str | None, retry_of_run_id: str | None, replay_of_run_id: str | None, now: int, actor: str | None,
    gate_kind: str = "job", risk_level: str | None = None,
) -> str:
    """Open the gate for a claimed dispatch (run ``awaiting_approval``, approval ``pending``); return the approval id.

    When the job delivers its results somewhere, an approval notice goes out through the
    delivery outbox in the same transaction.
    """
    approval_id = str(uuid.uuid4())
    transitions.open_approval_gate(
        tx, run_id=run_id, approval_id=approval_id, job=job, dispatch_id=dispatch_id, dispatch_kind=dispatch_kind,
        attempt=attempt, scheduled_for=scheduled_for, executor=executor_name_of(job), parent_run_id=parent_run_id,
        retry_of_run_id=retry_of_run_id, replay_of_run_id=replay_of_run_id, now=now, actor=actor, gate_kind=gate_kind,
        risk_level=risk_level,
    )
    if job.delivery_mode != "none" and job.delivery_channel:
        scope = job.approval_approver_scope
        body = (f"[Approval required] {job.name} ({dispatch_kind} run {short_run_id(run_id)}), risk {risk_level or job.approval_risk_level}"
                f"{f', approver {scope}' if scope else ''}.\nApprove: scheduler approvals approve {approval_id}\n"
                f"Reject:  scheduler approvals reject {approval_id}")
        enqueue_message(tx, {"id": run_id, "job_id": job.id}, job.delivery_channel, job.delivery_to, body,
                        f"{approval_id}:approval-notice", now)
    return approval_id


def decide(store: Store, approval_id: str, decision: str, *, note: str | None = None, now: int | None = None) -> dict[str, Any]:
    """Approve or reject one pending approval as the invoking OS account; return the decided approval.

    ``NOT_FOUND`` for an unknown id, ``APPROVAL_CONFLICT`` when it is no longer pending (decided,
    timed out, cancelled, or decided by someone else a moment ago), ``APPROVAL_SCOPE_MISMATCH``
    when this account is outside the approval's scope. Nothing changes on a refusal.
    """
    if decision not in ("approved", "rejected"):
        raise ValueError(f"decide: {decision!r} is not approved or rejected")
    name, uid = approver_identity()
    now = now_ms() if now is None else now
    with transitions.committing(store) as tx:
        approval = get_approval(tx, approval_id)
        if approval["status"] != "pending":
            raise SchedulerError("APPROVAL_CONFLICT", f"approval {approval['id']} is already {approval['status']}",
                                 details={"status": approval["status"], "version": approval["version"]})
        if not scope_matches(approval["approver_scope"], name, uid):
            raise SchedulerError("APPROVAL_SCOPE_MISMATCH",
                                 f"approval {approval['id']} may be decided by {approval['approver_scope']!r}, not {name} (uid {uid})",
                                 details={"approver_scope": approval["approver_scope"], "user": name, "uid": uid})
        if not transitions.decide_approval(tx, ApprovalRow.from_row(approval), decision, actor=f"{name}(uid:{uid})", uid=uid,
                                           note=note, now=now):
            raise SchedulerError("APPROVAL_CONFLICT", f"approval {approval['id']} was decided by someone else first")
        out = get_approval(tx, approval["id"])
    store.notify_change()  # an idle dispatcher claims the released run within milliseconds
    return out


def pending_for_job(tx: Tx, job_id: str) -> dict[str, Any]:
    """The one pending approval of a job (``jobs approve`` / ``jobs reject``); ``NOT_FOUND`` or ``APPROVAL_AMBIGUOUS``."""
    rows = tx.all("SELECT id FROM approvals WHERE job_id = ? AND status = 'pending' ORDER BY requested_at, id", (job_id,))
    if not rows:
        raise SchedulerError("NOT_FOUND", "the job has no pending approval")
    if len(rows) > 1:
        raise SchedulerError("APPROVAL_AMBIGUOUS", f"the job has {len(rows)} pending approvals; decide one by id",
                             details={"approvals": [r["id"] for r in rows]})
    return rows[0]


def expire_due(tx: Tx, *, now: int) -> int:
    """Decide every pending approval whose timeout has come (the dispatcher calls this each pass that has due work)."""
    rows = tx.all(
        "SELECT * FROM approvals WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at LIMIT ?",
        (now, EXPIRY_BATCH),
    )
    decided = 0
    for approval in rows:
        auto_approve = approval["timeout_action"] == "approve" and approval["approver_scope"] is None
        decision = "approved" if auto_approve else "timed_out"
        note = "timeout: approved by the job's approval_timeout_action" if auto_approve else None
        decided += transitions.decide_approval(tx, ApprovalRow.from_row(approval), decision, actor=TIMEOUT_ACTOR, uid=None,
                                               note=note, now=now)
    return decided


def get_approval(tx: Tx, approval_id: str) -> dict[str, Any]:
    """An approval by id or a unique prefix or suffix of it (at least 8 characters), with its job's ``job_name``;
    ``INVALID_ARGUMENT`` for a piece two approvals share, ``NOT_FOUND`` for none."""
    select = "SELECT a.*, j.name AS job_name FROM approvals a LEFT JOIN jobs j ON j.id = a.job_id"
    row = tx.one(f"{select} WHERE a.id = ?", (approval_id,))
    if row is None and len(approval_id) >= 8:
        matches = ids_with_end(tx, "approvals", approval_id, limit=2)
        if len(matches) > 1:
            raise SchedulerError("INVALID_ARGUMENT", f"approval id prefix or suffix {approval_id!r} is ambiguous: give more of the id")
        row = tx.one(f"{select} WHERE a.id = ?", (matches[0],)) if matches else None
    if row is None:
        raise SchedulerError("NOT_FOUND", f"Approval not found: {approval_id}")
    return row


def list_approvals(tx: Tx, *, pending: bool = False, job_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Approvals, newest first (only pending ones with ``pending``)."""
    sql = "SELECT a.*, j.name AS job_name FROM approvals a LEFT JOIN jobs j ON j.id = a.job_id WHERE 1 = 1"
    params: list[object] = []
    if pending:
        sql += " AND a.status = 'pending'"
    if job_id is not None:
        sql += " AND a.job_id = ?"
        params.append(job_id)
    sql += " ORDER BY a.requested_at DESC, a.id LIMIT ?"
    params.append(limit)
    return tx.all(sql, params)


_TIMES = ("requested_at", "expires_at", "approved_at", "rejected_at", "cancelled_at", "timed_out_at", "dispatched_at")


def approval_to_json(row: dict[str, Any], *, now: int | None = None) -> dict[str, Any]:
    """JSON view of an approval row (instants as ISO-8601 ``Z``; ``expired`` for a pending one past its timeout)."""
    out = {k: row.get(k) for k in (
        "id", "job_id", "job_name", "run_id", "dispatch_id", "gate_kind", "status", "version", "risk_level", "approver_scope",
        "timeout_action", "decided_by", "decided_uid", "note", "decision_reason", "artifact_digest", "source_run_id",
        "source_artifact_digest", *_TIMES)}
    out["created_at"] = row.get("requested_at")
    for key in (*_TIMES, "created_at"):
        out[key] = to_iso(out[key])
    now = now_ms() if now is None else now
    out["expired"] = row["status"] == "pending" and row.get("expires_at") is not None and row["expires_at"] <= now
    return out
