"""The named statements that change a job (table ``jobs``): its one INSERT and every UPDATE.

``insert_job`` and ``update_job`` name every spec column (``scheduler.core.spec.SPEC_FIELDS``): a new
spec field is a new column here too (a test compares them).
"""

from __future__ import annotations

SOURCE = """
-- name: insert_job
-- (new) job: its spec columns, its execution artifact binding and its first schedule; the one INSERT of the jobs table.
INSERT INTO jobs(id, name, description, enabled, job_type, provenance, schedule_kind, schedule_cron, schedule_every,
  schedule_at, schedule_tz, dst_gap_policy, dst_fold_policy, misfire_policy, allow_past_at, session_target, executor,
  executor_options, delivery_options, notify, constraints, payload_message, run_timeout_ms, max_retries,
  retry_backoff_ms, overlap_policy, queue_limit, max_consecutive_failures, delivery_guarantee, parent_id, trigger_on,
  trigger_delay_s, trigger_condition, delivery_mode, delivery_channel, delivery_to, output_format, verify_shell,
  verify_timeout_s, verify_on_failure, approval_required, approval_timeout_s, approval_timeout_action,
  approval_risk_level, approval_approver_scope, watchdog_alert_channel, watchdog_alert_to, watchdog_self_destruct,
  identity, credentials, child_credential_policy, evidence, evidence_ref, authorization_ref, "authorization",
  authorization_proof, retention, artifact_digest, handoff_version, effective_task_hash, created_at, updated_at,
  next_run_at, schedule_anchor_at)
VALUES (:id, :name, :description, :enabled, :job_type, :provenance, :schedule_kind, :schedule_cron, :schedule_every,
  :schedule_at, :schedule_tz, :dst_gap_policy, :dst_fold_policy, :misfire_policy, :allow_past_at, :session_target,
  :executor, :executor_options, :delivery_options, :notify, :constraints, :payload_message, :run_timeout_ms,
  :max_retries, :retry_backoff_ms, :overlap_policy, :queue_limit, :max_consecutive_failures, :delivery_guarantee,
  :parent_id, :trigger_on, :trigger_delay_s, :trigger_condition, :delivery_mode, :delivery_channel, :delivery_to,
  :output_format, :verify_shell, :verify_timeout_s, :verify_on_failure, :approval_required, :approval_timeout_s,
  :approval_timeout_action, :approval_risk_level, :approval_approver_scope, :watchdog_alert_channel,
  :watchdog_alert_to, :watchdog_self_destruct, :identity, :credentials, :child_credential_policy, :evidence,
  :evidence_ref, :authorization_ref, :authorization, :authorization_proof, :retention, :artifact_digest,
  :handoff_version, :effective_task_hash, :created_at, :updated_at, :next_run_at, :schedule_anchor_at)

-- name: update_job
-- A revalidated spec replaces the job's: every spec column, the artifact binding (the handoff columns only when
-- set_handoff is 1) and, when set_schedule is 1 (its schedule changed), its next run.
UPDATE jobs SET name = :name, description = :description, enabled = :enabled, job_type = :job_type,
  provenance = :provenance, schedule_kind = :schedule_kind, schedule_cron = :schedule_cron,
  schedule_every = :schedule_every, schedule_at = :schedule_at, schedule_tz = :schedule_tz,
  dst_gap_policy = :dst_gap_policy, dst_fold_policy = :dst_fold_policy, misfire_policy = :misfire_policy,
  allow_past_at = :allow_past_at, session_target = :session_target, executor = :executor,
  executor_options = :executor_options, delivery_options = :delivery_options, notify = :notify,
  constraints = :constraints, payload_message = :payload_message, run_timeout_ms = :run_timeout_ms,
  max_retries = :max_retries, retry_backoff_ms = :retry_backoff_ms, overlap_policy = :overlap_policy,
  queue_limit = :queue_limit, max_consecutive_failures = :max_consecutive_failures,
  delivery_guarantee = :delivery_guarantee, parent_id = :parent_id, trigger_on = :trigger_on,
  trigger_delay_s = :trigger_delay_s, trigger_condition = :trigger_condition, delivery_mode = :delivery_mode,
  delivery_channel = :delivery_channel, delivery_to = :delivery_to, output_format = :output_format,
  verify_shell = :verify_shell, verify_timeout_s = :verify_timeout_s, verify_on_failure = :verify_on_failure,
  approval_required = :approval_required, approval_timeout_s = :approval_timeout_s,
  approval_timeout_action = :approval_timeout_action, approval_risk_level = :approval_risk_level,
  approval_approver_scope = :approval_approver_scope, watchdog_alert_channel = :watchdog_alert_channel,
  watchdog_alert_to = :watchdog_alert_to, watchdog_self_destruct = :watchdog_self_destruct, identity = :identity,
  credentials = :credentials, child_credential_policy = :child_credential_policy, evidence = :evidence,
  evidence_ref = :evidence_ref, authorization_ref = :authorization_ref, "authorization" = :authorization,
  authorization_proof = :authorization_proof, retention = :retention, artifact_digest = :artifact_digest,
  {{set_handoff: handoff_version = :handoff_version, effective_task_hash = :effective_task_hash,}}
  {{set_schedule: next_run_at = :next_run_at, schedule_anchor_at = :schedule_anchor_at,}}
  updated_at = :updated_at
WHERE id = :id

-- name: enable_job
-- disabled | paused -> enabled: an auto-pause is cleared and the next run recomputed from now.
UPDATE jobs SET enabled = 1, consecutive_failures = 0, paused_at = NULL, paused_reason = NULL,
  next_run_at = :next_run_at, schedule_anchor_at = :schedule_anchor_at, updated_at = :now
WHERE id = :job_id

-- name: disable_job
-- enabled | paused | auto-paused -> disabled by an operator (the operator's word replaces a pause).
UPDATE jobs SET enabled = 0, paused_at = NULL, paused_reason = NULL, updated_at = :now WHERE id = :job_id

-- name: pause_job
-- enabled | disabled | auto-paused -> paused by an operator (jobs pause): paused_at with no reason marks the
-- operator's pause; every pause by the scheduler (auto_pause_job, quarantine_job, block_job) gives its reason.
UPDATE jobs SET enabled = 0, paused_at = :now, paused_reason = NULL, updated_at = :now WHERE id = :job_id

-- name: auto_pause_job
-- enabled -> paused after too many failures in a row (in the completion transaction of the last one).
UPDATE jobs SET enabled = 0, paused_at = :now, paused_reason = :reason WHERE id = :job_id

-- name: quarantine_job
-- -> paused: the job presented an authorization proof already claimed (PROOF_REPLAYED).
UPDATE jobs SET enabled = 0, paused_at = :now, paused_reason = :reason, updated_at = :now WHERE id = :job_id

-- name: block_job
-- enabled -> paused: a run's credential cleanup cannot be proven (recovery blocked); jobs enable re-arms it.
UPDATE jobs SET enabled = 0, paused_at = :now, paused_reason = :reason, updated_at = :now
WHERE id = :job_id AND enabled = 1

-- name: self_destruct_job
-- enabled -> disabled with no next run: a watchdog whose check passed and that was told to self-destruct.
UPDATE jobs SET enabled = 0, next_run_at = NULL, paused_reason = :reason, updated_at = :now WHERE id = :job_id

-- name: count_job_run
-- A terminal run counted on its job (last run, status, error, duration; consecutive failures by outcome ok |
-- failure | other); returns what the run's consequences decide on.
UPDATE jobs SET run_count = run_count + 1, last_run_at = :last_run_at, last_status = :status, last_error = :error,
  last_duration_ms = :duration_ms,
  consecutive_failures = CASE :outcome WHEN 'ok' THEN 0 WHEN 'failure' THEN consecutive_failures + 1
    ELSE consecutive_failures END,
  updated_at = :now
WHERE id = :job_id
RETURNING id, name, enabled, job_type, consecutive_failures, max_consecutive_failures, max_retries, retry_backoff_ms,
  delivery_mode, delivery_channel, delivery_to, watchdog_alert_channel, watchdog_alert_to, watchdog_self_destruct, notify,
  session_target, EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = jobs.id) AS has_children

-- name: count_job_runs
-- count_job_run for several runs of distinct jobs at once (a dispatcher pass's completions), each row one run of its
-- job; returns count_job_run's columns for every job counted.
UPDATE jobs SET run_count = run_count + 1,
  last_run_at = CASE id [[WHEN :job_id THEN :last_run_at]] ELSE last_run_at END,
  last_status = CASE id [[WHEN :job_id THEN :status]] ELSE last_status END,
  last_error = CASE id [[WHEN :job_id THEN :error]] ELSE last_error END,
  last_duration_ms = CASE id [[WHEN :job_id THEN :duration_ms]] ELSE last_duration_ms END,
  consecutive_failures = CASE CASE id [[WHEN :job_id THEN :outcome]] END WHEN 'ok' THEN 0
    WHEN 'failure' THEN consecutive_failures + 1 ELSE consecutive_failures END,
  updated_at = :now
WHERE id IN ([[, :job_id]])
RETURNING id, name, enabled, job_type, consecutive_failures, max_consecutive_failures, max_retries, retry_backoff_ms,
  delivery_mode, delivery_channel, delivery_to, watchdog_alert_channel, watchdog_alert_to, watchdog_self_destruct, notify,
  session_target, EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = jobs.id) AS has_children

-- name: advance_next_run
-- A due slot materialised: the job's next run advances, by compare-and-swap on the slot read (one dispatcher wins).
UPDATE jobs SET next_run_at = :next_run_at, schedule_anchor_at = :schedule_anchor_at, updated_at = :now
WHERE id = :job_id AND next_run_at = :slot

-- name: clear_next_runs
-- One-shot jobs materialised together: no next run any more; returns the ids cleared.
UPDATE jobs SET next_run_at = NULL, updated_at = :now
WHERE id IN ([[, :job_id]]) AND next_run_at IS NOT NULL
RETURNING id

-- name: repair_next_run
-- A recurring job with no next run gets one computed from its schedule (a missing next run never means fire now).
UPDATE jobs SET next_run_at = :next_run_at, schedule_anchor_at = :schedule_anchor_at, updated_at = :now
WHERE id = :job_id AND next_run_at IS NULL

-- name: set_imported_phase
-- An imported recurring job keeps its source's phase: its first run and anchor are the source's next slot.
UPDATE jobs SET next_run_at = :next_run_at, schedule_anchor_at = :schedule_anchor_at WHERE id = :job_id
"""
