"""The named statements that change an outbox part (table ``delivery_outbox``): its one INSERT and every UPDATE.

A part is claimed by one consumer (claim token, expiry), then delivered, retried later or failed
under that token; a delivered part is final (the schema's guard refuses any later change).
"""

from __future__ import annotations

SOURCE = """
-- name: insert_outbox_part
-- (new) -> pending: one part of a message, idempotent on its key (its id); the one INSERT of the outbox.
INSERT INTO delivery_outbox(id, run_id, job_id, channel, target, idempotency_key, group_key, part_index, part_count,
  body, status, max_attempts, due_at, created_at, updated_at)
VALUES (:idempotency_key, :run_id, :job_id, :channel, :target, :idempotency_key, :group_key, :part_index, :part_count,
  :body, 'pending', :max_attempts, :now, :now, :now)
ON CONFLICT (idempotency_key) DO NOTHING

-- name: claim_outbox_part
-- pending (or claimed with an expired claim) -> claimed by a consumer, counting the attempt.
UPDATE delivery_outbox SET status = 'claimed', claim_owner = :owner, claim_token = :claim_token,
  claim_expires_at = :expires_at, attempts = attempts + 1, last_attempt_at = :now, updated_at = :now
WHERE id = :part_id AND (status = 'pending' OR (status = 'claimed' AND claim_expires_at <= :now))

-- name: deliver_outbox_part
-- claimed -> delivered under the claim token, with the channel's receipt (final).
UPDATE delivery_outbox SET status = 'delivered', delivered_at = :now, receipt_id = :receipt_id,
  receipt_json = :receipt_json, last_error = NULL, error_code = NULL, claim_owner = NULL, claim_token = NULL,
  claim_expires_at = NULL, updated_at = :now
WHERE id = :part_id AND status = 'claimed' AND claim_token = :claim_token

-- name: retry_outbox_part
-- claimed -> pending under the claim token: a transient failure, sent again at due_at.
UPDATE delivery_outbox SET status = 'pending', due_at = :due_at, last_error = :error, error_code = :code,
  claim_owner = NULL, claim_token = NULL, claim_expires_at = NULL, updated_at = :now
WHERE id = :part_id AND status = 'claimed' AND claim_token = :claim_token

-- name: fail_outbox_part
-- claimed -> failed under the claim token: a permanent failure, or the last attempt.
UPDATE delivery_outbox SET status = 'failed', last_error = :error, error_code = :code, claim_owner = NULL,
  claim_token = NULL, claim_expires_at = NULL, updated_at = :now
WHERE id = :part_id AND status = 'claimed' AND claim_token = :claim_token

-- name: fail_later_outbox_parts
-- pending -> failed (EARLIER_PART_FAILED) for the parts after a failed one: they cannot go out in order any more.
UPDATE delivery_outbox SET status = 'failed', error_code = 'EARLIER_PART_FAILED', last_error = :error,
  updated_at = :now
WHERE group_key = :group_key AND part_index > :part_index AND status = 'pending'

-- name: release_outbox_part
-- claimed -> pending, unsent, under the claim token: the attempt is not counted.
UPDATE delivery_outbox SET status = 'pending', attempts = attempts - 1, claim_owner = NULL, claim_token = NULL,
  claim_expires_at = NULL
WHERE id = :part_id AND status = 'claimed' AND claim_token = :claim_token

-- name: rearm_outbox_parts
-- failed -> pending with fresh attempts for every failed part of a message (deliveries retry).
UPDATE delivery_outbox SET status = 'pending', attempts = 0, due_at = :now, updated_at = :now
WHERE group_key = :group_key AND status = 'failed'
"""
