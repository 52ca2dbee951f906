"""The named statements that change a dispatch row (table ``job_dispatch_queue``): its one INSERT and every UPDATE."""

from __future__ import annotations

SOURCE = """
-- name: insert_dispatches
-- (new) -> pending, one row per dispatch, idempotent on the id (returns the ids inserted): the one INSERT of the queue.
-- A row is bound to its job's execution artifact (artifact_digest when the caller read the job row, else NULL: the
-- statement reads it) and, for chain, retry and replay work, to its source run and that run's artifact.
INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, source_run_id, requested_by,
  replay_count, artifact_digest, source_artifact_digest)
VALUES [[, (:id, :job_id, :kind, 'pending', :due_at, :now, :now, :source_run_id, :requested_by, :replay_count,
  COALESCE(:artifact_digest, (SELECT j.artifact_digest FROM jobs j WHERE j.id = :job_id)),
  (SELECT r.artifact_digest FROM runs r WHERE r.id = :source_run_id))]]
ON CONFLICT (id) DO NOTHING RETURNING id

-- name: claim_dispatches
-- pending -> claimed under the claimer's lease (owner, fencing token), each row naming its claim token and the run it
-- becomes; returns the ids claimed. (Every row updated matches a WHEN: the ELSE only gives the CASE its column's type.)
UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = :owner,
  claim_token = CASE id [[WHEN :dispatch_id THEN :claim_token]] ELSE claim_token END,
  claim_fence = :token, claim_expires_at = :expires_at, attempts = attempts + 1,
  run_id = CASE id [[WHEN :dispatch_id THEN :run_id]] ELSE run_id END, updated_at = :now
WHERE id IN ([[, :dispatch_id]]) AND status = 'pending'
RETURNING id

-- name: finish_dispatch
-- pending | claimed -> done | failed; last_error is replaced only when set_last_error is 1 (a finished or cancelled
-- row is never rewritten).
UPDATE job_dispatch_queue SET status = :status, {{set_last_error: last_error = :last_error,}} updated_at = :now
WHERE id = :dispatch_id AND status IN ('pending', 'claimed')

-- name: finish_dispatches
-- pending | claimed -> done for several rows at once (a dispatcher pass's completions), each with its last error and time.
UPDATE job_dispatch_queue SET status = 'done', last_error = CASE id [[WHEN :dispatch_id THEN :last_error]] ELSE last_error END,
  updated_at = CASE id [[WHEN :dispatch_id THEN :now]] ELSE updated_at END
WHERE id IN ([[, :dispatch_id]]) AND status IN ('pending', 'claimed')

-- name: finish_dispatches_clean
-- finish_dispatches when no row has a last error and all finished at one time (the common pass).
UPDATE job_dispatch_queue SET status = 'done', last_error = NULL, updated_at = :now
WHERE id IN ([[, :dispatch_id]]) AND status IN ('pending', 'claimed')

-- name: cancel_dispatch
-- pending -> cancelled, with the reason.
UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = :reason, updated_at = :now
WHERE id = :dispatch_id AND status = 'pending'

-- name: cancel_run_dispatch
-- pending | claimed | awaiting_approval -> cancelled: the dispatch of a waiting run cancelled with it.
UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = :reason, updated_at = :now
WHERE id = :dispatch_id AND status IN ('pending', 'claimed', 'awaiting_approval')

-- name: cancel_job_dispatches
-- pending -> cancelled for a job's queued work; manual dispatches only when include_manual is 1.
UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = :reason, updated_at = :now
WHERE job_id = :job_id AND status = 'pending' AND (:include_manual = 1 OR kind <> 'manual')

-- name: gate_dispatch
-- claimed -> awaiting_approval (its run waits for a decision): the claim is cleared; returns the row's binding.
UPDATE job_dispatch_queue SET status = 'awaiting_approval', claim_owner = NULL, claim_token = NULL, claim_fence = NULL,
  claim_expires_at = NULL, updated_at = :now
WHERE id = :dispatch_id AND status = 'claimed'
RETURNING artifact_digest, source_run_id, source_artifact_digest

-- name: requeue_approved_dispatch
-- awaiting_approval -> pending: its run was approved, so one dispatcher claims and starts it.
UPDATE job_dispatch_queue SET status = 'pending', updated_at = :now
WHERE id = :dispatch_id AND status = 'awaiting_approval'

-- name: release_expired_claims
-- claimed -> pending for expired claims with no active run (attempts and the last error stay: the expiry is an
-- event, dispatch.claim_released); returns them.
UPDATE job_dispatch_queue SET status = 'pending', claim_owner = NULL, claim_token = NULL, claim_fence = NULL,
  claim_expires_at = NULL, updated_at = :now
WHERE status = 'claimed' AND claim_expires_at <= :now AND NOT EXISTS (
  SELECT 1 FROM runs r WHERE r.dispatch_id = job_dispatch_queue.id
  AND r.status IN ('running', 'pending', 'awaiting_approval', 'approved', 'recovery_blocked'))
RETURNING id, job_id, attempts, last_error
"""
