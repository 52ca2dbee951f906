"""The named statements that change a run (table ``runs``): its one INSERT and every UPDATE.

The transitions (``scheduler.core.transitions``) decide and call them; the state table is in that
package's docstring. A ``set_<name>`` parameter says whether its column (or group of columns) is
written (1) or left as it is (0): the statement's text never depends on which columns a caller has.
``finish_run`` and ``crash_run`` return the same columns: what completion and its consequences read
(narrow, since wide rows cost on every pass).
"""

from __future__ import annotations

SOURCE = """
-- name: insert_runs
-- (new) -> running | skipped | awaiting_approval, one row per run: the one INSERT of the runs table. A run's binding
-- (artifact_digest, source_run_id, source_artifact_digest) is its dispatch's, as the caller read it in this transaction.
INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, attempt, scheduled_for, created_at, started_at,
  finished_at, terminal_at, skip_reason, dispatcher_owner, dispatcher_token, parent_run_id, retry_of_run_id,
  replay_of_run_id, delivery_guarantee, executor, output_format, artifact_digest, source_run_id, source_artifact_digest)
VALUES [[, (:id, :job_id, :dispatch_id, :dispatch_kind, :status, :attempt, :scheduled_for, :created_at, :started_at,
  :finished_at, :terminal_at, :skip_reason, :dispatcher_owner, :dispatcher_token, :parent_run_id, :retry_of_run_id,
  :replay_of_run_id, :delivery_guarantee, :executor, :output_format, :artifact_digest, :source_run_id,
  :source_artifact_digest)]]

-- name: update_run_bookkeeping
-- Bookkeeping on a run its owner holds (executor handle, process state), under the fence; never the status.
UPDATE runs SET
  executor_handle = CASE WHEN :set_executor_handle = 1 THEN :executor_handle ELSE executor_handle END,
  process_state = CASE WHEN :set_process_state = 1 THEN :process_state ELSE process_state END,
  process_signal = CASE WHEN :set_process_signal = 1 THEN :process_signal ELSE process_signal END,
  process_terminated_at = CASE WHEN :set_process_terminated_at = 1 THEN :process_terminated_at
    ELSE process_terminated_at END
WHERE id = :run_id AND status = :expected_status AND dispatcher_owner = :owner AND dispatcher_token = :token

-- name: finish_run
-- running -> ok | error | timeout | cancelled under the run's fence (owner and token): a cancel request recorded first
-- wins (cancelled, and the message says so). set_stdout, set_stderr, set_output, set_usage, set_verify write their
-- group of result columns; set_<column> one pipeline column (sections: a column not set is not in the text at all).
-- A running process state becomes process_state.
UPDATE runs SET
  exit_code = :exit_code, error_code = :error_code, summary = :summary, env_policy_warning = :env_policy_warning,
  {{set_stdout: stdout_excerpt = :stdout_excerpt, stdout_bytes = :stdout_bytes, stdout_sha256 = :stdout_sha256,
    stdout_artifact = :stdout_artifact, stdout_truncated = :stdout_truncated,}}
  {{set_stderr: stderr_excerpt = :stderr_excerpt, stderr_bytes = :stderr_bytes, stderr_sha256 = :stderr_sha256,
    stderr_artifact = :stderr_artifact, stderr_truncated = :stderr_truncated,}}
  {{set_output: output_format = :output_format, output_valid = :output_valid, output_warning = :output_warning,
    output_bytes = :output_bytes, output_sha256 = :output_sha256, output_parsed = :output_parsed,
    output_artifact = :output_artifact,}}
  {{set_usage: usage_json = :usage_json,}}
  {{set_verify: verify_status = :verify_status, verify_json = :verify_json,}}
  {{set_identity_json: identity_json = :identity_json,}}
  {{set_trust_level: trust_level = :trust_level,}}
  {{set_principal: principal = :principal,}}
  {{set_delegation_json: delegation_json = :delegation_json,}}
  {{set_governance_json: governance_json = :governance_json,}}
  {{set_credentials_json: credentials_json = :credentials_json,}}
  {{set_authorization_json: authorization_json = :authorization_json,}}
  {{set_proof_json: proof_json = :proof_json,}}
  {{set_evidence_status: evidence_status = :evidence_status,}}
  finished_at = :now, terminal_at = :now,
  status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE :status END,
  error_message = CASE WHEN cancel_requested_at IS NOT NULL AND :status <> 'cancelled'
    THEN COALESCE(:error_message, '') || ' (cancellation won)' ELSE :error_message END,
  duration_ms = :now - COALESCE(started_at, :now),
  process_state = CASE WHEN process_state = 'running' THEN :process_state ELSE process_state END
WHERE id = :run_id AND status = 'running' AND dispatcher_owner = :owner AND dispatcher_token = :token
RETURNING id, job_id, status, attempt, dispatch_id, started_at, finished_at, duration_ms, error_code, error_message,
  dispatcher_owner, dispatcher_token, summary, stdout_excerpt, delivery_guarantee, stdout_bytes, stdout_sha256,
  stdout_artifact, artifact_digest, principal, trust_level

-- name: fail_completion
-- running -> error (COMPLETION_FAILED) under the fence, when the completion itself failed; never before its start.
UPDATE runs SET status = 'error', error_code = 'COMPLETION_FAILED', error_message = :message,
  finished_at = CASE WHEN started_at > :now THEN started_at ELSE :now END,
  terminal_at = CASE WHEN started_at > :now THEN started_at ELSE :now END,
  process_state = CASE WHEN process_state = 'running' THEN 'exited' ELSE process_state END
WHERE id = :run_id AND status = 'running' AND dispatcher_owner = :owner AND dispatcher_token = :token
RETURNING job_id, dispatch_id, finished_at

-- name: request_cancel
-- Who asked to cancel a run, why and when (the first request wins); the status is not changed here.
UPDATE runs SET cancel_requested_at = :now, cancel_requested_by = :actor, cancel_reason = :reason
WHERE id = :run_id AND cancel_requested_at IS NULL

-- name: cancel_waiting_run
-- pending | awaiting_approval | approved -> cancelled at once (no executor holds it); an earlier request's fields stay.
UPDATE runs SET status = 'cancelled', finished_at = :now, terminal_at = :now,
  cancel_requested_at = COALESCE(cancel_requested_at, :now), cancel_requested_by = COALESCE(cancel_requested_by, :actor),
  cancel_reason = COALESCE(cancel_reason, :reason), error_code = COALESCE(:error_code, error_code),
  process_state = CASE WHEN process_state = 'running' THEN 'unknown' ELSE process_state END
WHERE id = :run_id AND status = :status

-- name: approve_run
-- awaiting_approval -> approved (its approval was approved).
UPDATE runs SET status = 'approved' WHERE id = :run_id AND status = 'awaiting_approval'

-- name: start_approved_run
-- approved -> running under the claimer's fence (its dispatch was claimed again in this transaction).
UPDATE runs SET status = 'running', started_at = :now, dispatcher_owner = :owner, dispatcher_token = :token
WHERE id = :run_id AND status = 'approved'

-- name: escalate_run
-- running -> awaiting_approval under the fence, unless a cancel request came first (an authorization provider
-- escalated); set_<column> writes that pipeline column. Returns what the gate's approval and the caller need.
UPDATE runs SET
  identity_json = CASE WHEN :set_identity_json = 1 THEN :identity_json ELSE identity_json END,
  trust_level = CASE WHEN :set_trust_level = 1 THEN :trust_level ELSE trust_level END,
  principal = CASE WHEN :set_principal = 1 THEN :principal ELSE principal END,
  delegation_json = CASE WHEN :set_delegation_json = 1 THEN :delegation_json ELSE delegation_json END,
  governance_json = CASE WHEN :set_governance_json = 1 THEN :governance_json ELSE governance_json END,
  credentials_json = CASE WHEN :set_credentials_json = 1 THEN :credentials_json ELSE credentials_json END,
  authorization_json = CASE WHEN :set_authorization_json = 1 THEN :authorization_json ELSE authorization_json END,
  proof_json = CASE WHEN :set_proof_json = 1 THEN :proof_json ELSE proof_json END,
  evidence_status = CASE WHEN :set_evidence_status = 1 THEN :evidence_status ELSE evidence_status END,
  status = 'awaiting_approval'
WHERE id = :run_id AND status = 'running' AND dispatcher_owner = :owner AND dispatcher_token = :token
  AND cancel_requested_at IS NULL
RETURNING id, job_id, dispatch_id, dispatch_kind, attempt, status, error_code, duration_ms, artifact_digest,
  source_run_id, source_artifact_digest

-- name: block_recovery
-- running -> recovery_blocked under the dead owner's fence: its work may still run, or what it left is not cleaned.
UPDATE runs SET status = 'recovery_blocked', error_code = 'RECOVERY_BLOCKED', error_message = :message
WHERE id = :run_id AND status = 'running' AND dispatcher_owner = :owner AND dispatcher_token = :token

-- name: crash_run
-- running | recovery_blocked -> crashed (DISPATCHER_LOST) under the dead owner's fence, with the final process state.
UPDATE runs SET status = 'crashed', finished_at = :now, terminal_at = :now, duration_ms = :now - COALESCE(started_at, :now),
  error_code = 'DISPATCHER_LOST', error_message = :message, process_state = :process_state,
  process_signal = :process_signal, process_terminated_at = :process_terminated_at
WHERE id = :run_id AND status IN ('running', 'recovery_blocked') AND dispatcher_owner = :owner
  AND dispatcher_token = :token
RETURNING id, job_id, status, attempt, dispatch_id, started_at, finished_at, duration_ms, error_code, error_message,
  dispatcher_owner, dispatcher_token, summary, stdout_excerpt, delivery_guarantee, stdout_bytes, stdout_sha256,
  stdout_artifact, artifact_digest, principal, trust_level

-- name: mark_verify_interrupted
-- A run crashed while its post-success verification ran (its last handle was the check's): the run says so, unless
-- the check's own status was recorded.
UPDATE runs SET verify_status = 'interrupted', verify_json = :verify_json WHERE id = :run_id AND verify_status IS NULL

-- name: mark_evidence_interrupted
-- A run committed without its worker got its interrupted evidence row: the run says so.
UPDATE runs SET evidence_status = 'interrupted' WHERE id = :run_id
"""
