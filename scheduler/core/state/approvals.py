"""The named statements that change an approval (table ``approvals``, compare-and-swap on ``version``)."""

from __future__ import annotations

SOURCE = """
-- name: insert_approval
-- (new) -> pending, version 1: the one INSERT of the approvals table, bound to the gated run's execution artifact and
-- source run; the proof window when the run verified a proof before it escalated.
INSERT INTO approvals(id, job_id, run_id, dispatch_id, gate_kind, status, version, risk_level, approver_scope,
  timeout_action, requested_at, expires_at, artifact_digest, source_run_id, source_artifact_digest, proof_not_before,
  proof_expires_at, proof_clock_skew_ms)
VALUES (:id, :job_id, :run_id, :dispatch_id, :gate_kind, 'pending', 1, :risk_level, :approver_scope, :timeout_action,
  :requested_at, :expires_at, :artifact_digest, :source_run_id, :source_artifact_digest, :proof_not_before,
  :proof_expires_at, :proof_clock_skew_ms)

-- name: decide_approval
-- pending -> approved | rejected | timed_out if still the version the caller read; the decision's time column is set.
UPDATE approvals SET status = :decision, version = version + 1, decided_by = :actor, decided_uid = :uid, note = :note,
  approved_at = CASE WHEN :decision = 'approved' THEN :now ELSE approved_at END,
  rejected_at = CASE WHEN :decision = 'rejected' THEN :now ELSE rejected_at END,
  timed_out_at = CASE WHEN :decision = 'timed_out' THEN :now ELSE timed_out_at END
WHERE id = :approval_id AND status = 'pending' AND version = :version

-- name: dispatch_approval
-- approved -> dispatched (once) if still the version the caller read: its run starts.
UPDATE approvals SET status = 'dispatched', version = version + 1, dispatched_at = :now
WHERE id = :approval_id AND status = 'approved' AND version = :version

-- name: cancel_run_approvals
-- pending | approved -> cancelled for the open approvals of a run cancelled while waiting (an earlier reason stays).
UPDATE approvals SET status = 'cancelled', cancelled_at = :now, decision_reason = COALESCE(decision_reason, :reason),
  version = version + 1
WHERE run_id = :run_id AND status IN ('pending', 'approved')

-- name: cancel_job_approvals
-- pending | approved -> cancelled for every open approval of a job whose pending work is cancelled.
UPDATE approvals SET status = 'cancelled', cancelled_at = :now, decision_reason = :reason, version = version + 1
WHERE job_id = :job_id AND status IN ('pending', 'approved')
"""
