-- scheduler executable SQLite schema.
--
-- GENERATED from scheduler/core/store/schema.py, the one definition of the schema for every
-- dialect: edit that module, then run `python -m scheduler.core.store.schema --write`.
-- A test fails when this file differs from the generated text.
--
-- This file ships inside the kernel wheel as scheduler/schema.sql (a symlink to this
-- file in the source tree) and is what the embedded store applies: to a fresh database
-- in one transaction, and after the migrations of an older one. Every statement is
-- therefore idempotent (IF NOT EXISTS).
--
-- Conventions:
--   * times are INTEGER UTC epoch milliseconds (columns ending in _at, _ms or named *_for);
--   * booleans are INTEGER 0/1 guarded by CHECK;
--   * enumerations are TEXT guarded by CHECK so a bad write fails at the database (spelled as equalities
--     joined by OR: SQLite evaluates IN (...) by building an ephemeral index per statement);
--   * append-only and immutable tables are enforced by triggers, not by convention.
--
-- Schema version: 13

CREATE TABLE IF NOT EXISTS schema_migrations (
    version     INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL,
    applied_at  INTEGER NOT NULL
);

-- Execution artifacts: each job's execution contract as canonical JSON, stored once by digest.
-- Immutable; foreign keys and a delete guard keep a referenced one from deletion.
CREATE TABLE IF NOT EXISTS execution_artifacts (
    -- sha256:<hex> of payload (json-sort-v1 canonical JSON); the one stored digest form
    digest         TEXT    PRIMARY KEY CHECK (digest LIKE 'sha256:%' AND length(digest) = 71),
    kind           TEXT    NOT NULL CHECK (kind = 'native' OR kind = 'handoff-v4'),
    -- the job it was made for (no foreign key: an artifact outlives its job's edits)
    job_id         TEXT,
    payload        TEXT    NOT NULL,
    payload_bytes  INTEGER NOT NULL CHECK (payload_bytes > 0),
    created_at     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS execution_artifacts_job_idx ON execution_artifacts(job_id, created_at);
CREATE TRIGGER IF NOT EXISTS execution_artifacts_no_update
BEFORE UPDATE ON execution_artifacts
BEGIN
    SELECT RAISE(ABORT, 'ARTIFACT_IMMUTABLE: execution artifacts cannot be updated');
END;

-- Jobs: one row per job spec field (see `scheduler schema jobs`) plus runtime bookkeeping.
CREATE TABLE IF NOT EXISTS jobs (
    id                        TEXT    PRIMARY KEY,
    name                      TEXT    NOT NULL UNIQUE,
    description               TEXT,
    enabled                   INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    job_type                  TEXT    NOT NULL DEFAULT 'standard' CHECK (job_type = 'standard' OR job_type = 'watchdog'),
    provenance                TEXT    NOT NULL DEFAULT 'user_added' CHECK (provenance = 'static' OR provenance = 'user_added' OR provenance = 'external'),
    schedule_kind             TEXT    NOT NULL CHECK (schedule_kind = 'cron' OR schedule_kind = 'every' OR schedule_kind = 'at' OR schedule_kind = 'manual' OR schedule_kind = 'chain'),
    schedule_cron             TEXT,
    schedule_every            TEXT,
    schedule_at               INTEGER,
    schedule_tz               TEXT    NOT NULL DEFAULT 'UTC',
    dst_gap_policy            TEXT    NOT NULL DEFAULT 'shift' CHECK (dst_gap_policy = 'shift' OR dst_gap_policy = 'skip'),
    dst_fold_policy           TEXT    NOT NULL DEFAULT 'once' CHECK (dst_fold_policy = 'once' OR dst_fold_policy = 'twice'),
    misfire_policy            TEXT    NOT NULL DEFAULT 'coalesce' CHECK (misfire_policy = 'coalesce' OR misfire_policy = 'skip'),
    allow_past_at             INTEGER NOT NULL DEFAULT 0 CHECK (allow_past_at IN (0, 1)),
    session_target            TEXT    NOT NULL DEFAULT 'shell' CHECK (session_target = 'shell' OR session_target = 'isolated' OR session_target = 'main'),
    executor                  TEXT,
    -- plugin-owned per-job options (JSON objects validated by the named plugin's options class)
    executor_options          TEXT    NOT NULL DEFAULT '{}',
    delivery_options          TEXT    NOT NULL DEFAULT '{}',
    notify                    INTEGER NOT NULL DEFAULT 1 CHECK (notify IN (0, 1)),
    -- what the job demands its executor enforce (JSON); governance compares it with capabilities
    constraints               TEXT    NOT NULL DEFAULT '{}',
    payload_message           TEXT    NOT NULL,
    run_timeout_ms            INTEGER NOT NULL DEFAULT 300000 CHECK (run_timeout_ms > 0),
    max_retries               INTEGER NOT NULL DEFAULT 0 CHECK (max_retries >= 0),
    retry_backoff_ms          INTEGER NOT NULL DEFAULT 30000 CHECK (retry_backoff_ms >= 0),
    overlap_policy            TEXT    NOT NULL DEFAULT 'skip' CHECK (overlap_policy = 'skip' OR overlap_policy = 'allow' OR overlap_policy = 'queue'),
    queue_limit               INTEGER NOT NULL DEFAULT 10 CHECK (queue_limit >= 1),
    max_consecutive_failures  INTEGER NOT NULL DEFAULT 3 CHECK (max_consecutive_failures >= 0),
    delivery_guarantee        TEXT    NOT NULL DEFAULT 'at-most-once' CHECK (delivery_guarantee = 'at-most-once' OR delivery_guarantee = 'at-least-once'),
    parent_id                 TEXT    REFERENCES jobs(id) ON DELETE CASCADE,
    trigger_on                TEXT    CHECK (trigger_on IS NULL OR trigger_on = 'success' OR trigger_on = 'failure' OR trigger_on = 'complete'),
    trigger_delay_s           INTEGER NOT NULL DEFAULT 0 CHECK (trigger_delay_s >= 0),
    trigger_condition         TEXT,
    delivery_mode             TEXT    NOT NULL DEFAULT 'none' CHECK (delivery_mode = 'none' OR delivery_mode = 'always' OR delivery_mode = 'on_success' OR delivery_mode = 'on_failure'),
    delivery_channel          TEXT,
    delivery_to               TEXT,
    output_format             TEXT    NOT NULL DEFAULT 'text' CHECK (output_format = 'text' OR output_format = 'json' OR output_format = 'ndjson'),
    verify_shell              TEXT,
    verify_timeout_s          INTEGER NOT NULL DEFAULT 60 CHECK (verify_timeout_s > 0),
    verify_on_failure         TEXT    NOT NULL DEFAULT 'error' CHECK (verify_on_failure = 'error' OR verify_on_failure = 'warn'),
    approval_required         INTEGER NOT NULL DEFAULT 0 CHECK (approval_required IN (0, 1)),
    approval_timeout_s        INTEGER NOT NULL DEFAULT 3600 CHECK (approval_timeout_s > 0),
    approval_timeout_action   TEXT    NOT NULL DEFAULT 'reject' CHECK (approval_timeout_action = 'reject' OR approval_timeout_action = 'approve'),
    approval_risk_level       TEXT    NOT NULL DEFAULT 'medium' CHECK (approval_risk_level = 'low' OR approval_risk_level = 'medium' OR approval_risk_level = 'high' OR approval_risk_level = 'critical'),
    approval_approver_scope   TEXT,
    watchdog_alert_channel    TEXT,
    watchdog_alert_to         TEXT,
    watchdog_self_destruct    INTEGER NOT NULL DEFAULT 0 CHECK (watchdog_self_destruct IN (0, 1)),
    -- who the run acts as (JSON: subject, trust level, delegation policy); NULL: the job's owner
    identity                  TEXT,
    -- credential bindings (JSON list of name, provider, ref, present): names and references, never values
    credentials               TEXT    NOT NULL DEFAULT '[]',
    child_credential_policy   TEXT    NOT NULL DEFAULT 'none' CHECK (child_credential_policy = 'none' OR child_credential_policy = 'inherit' OR child_credential_policy = 'downscope' OR child_credential_policy = 'independent'),
    -- the evidence declaration (JSON: provider, methods, provider_config, payload, verify, ...)
    evidence                  TEXT,
    evidence_ref              TEXT,
    -- <provider>:<policy-ref> decided before every run (authorization providers)
    authorization_ref         TEXT,
    -- how the authorization_ref provider is asked (JSON: provider_config, request, on_error)
    "authorization"           TEXT,
    -- the proof a run must present (JSON: method, source, issuer, keys, ...): never the proof itself
    authorization_proof       TEXT,
    -- the job's run retention (JSON: keep_runs, max_age); NULL: the settings file's [retention]
    retention                 TEXT,
    -- runtime bookkeeping (owned by the kernel, never by a spec): the current execution artifact
    artifact_digest           TEXT    REFERENCES execution_artifacts(digest) CHECK (artifact_digest IS NULL OR (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71)),
    handoff_version           INTEGER CHECK (handoff_version IS NULL OR handoff_version = 4),
    effective_task_hash       TEXT    CHECK (effective_task_hash IS NULL OR (effective_task_hash LIKE 'sha256:%' AND length(effective_task_hash) = 71)),
    created_at                INTEGER NOT NULL,
    updated_at                INTEGER NOT NULL,
    next_run_at               INTEGER,
    schedule_anchor_at        INTEGER,
    last_run_at               INTEGER,
    last_status               TEXT,
    last_error                TEXT,
    last_duration_ms          INTEGER,
    run_count                 INTEGER NOT NULL DEFAULT 0,
    consecutive_failures      INTEGER NOT NULL DEFAULT 0,
    paused_at                 INTEGER,
    paused_reason             TEXT,
    CHECK (schedule_kind <> 'cron'  OR schedule_cron IS NOT NULL),
    CHECK (schedule_kind <> 'every' OR schedule_every IS NOT NULL),
    CHECK (schedule_kind <> 'at'    OR schedule_at IS NOT NULL),
    CHECK ((schedule_kind = 'chain') = (parent_id IS NOT NULL))
);
-- The dispatcher's wake-up query: earliest due enabled job. Partial index keeps it O(log n).
CREATE INDEX IF NOT EXISTS jobs_due_idx ON jobs(next_run_at) WHERE enabled = 1 AND next_run_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_parent_idx ON jobs(parent_id) WHERE parent_id IS NOT NULL;
-- Recurring jobs that lost their next run (direct SQL, an old import): found without a scan, repaired by recovery.
CREATE INDEX IF NOT EXISTS jobs_missing_next_idx ON jobs(id) WHERE enabled = 1 AND next_run_at IS NULL AND schedule_kind IN ('cron', 'every');
CREATE TRIGGER IF NOT EXISTS jobs_handoff_no_downgrade
BEFORE UPDATE OF handoff_version, effective_task_hash, artifact_digest ON jobs
WHEN OLD.handoff_version = 4 AND (NEW.handoff_version IS NULL OR NEW.handoff_version <> 4 OR NEW.effective_task_hash IS NULL OR NEW.artifact_digest IS NULL)
BEGIN
    SELECT RAISE(ABORT, 'HANDOFF_ARTIFACT_DOWNGRADE_REFUSED: a handoff v4 job stays bound to a v4 artifact');
END;

-- Named leases with fencing tokens. Rows are never deleted so tokens never go back.
CREATE TABLE IF NOT EXISTS dispatcher_leases (
    name         TEXT    PRIMARY KEY,
    owner        TEXT,
    token        INTEGER NOT NULL DEFAULT 0 CHECK (token >= 0),
    acquired_at  INTEGER,
    renewed_at   INTEGER,
    expires_at   INTEGER
);
CREATE TRIGGER IF NOT EXISTS dispatcher_leases_token_monotonic
BEFORE UPDATE OF token ON dispatcher_leases
WHEN NEW.token < OLD.token
BEGIN
    SELECT RAISE(ABORT, 'LEASE_TOKEN_REGRESSION: fencing tokens never decrease');
END;
CREATE TRIGGER IF NOT EXISTS dispatcher_leases_no_delete
BEFORE DELETE ON dispatcher_leases
BEGIN
    SELECT RAISE(ABORT, 'LEASE_IMMUTABLE: lease rows are kept so tokens never go back');
END;

-- Durable dispatch queue. Scheduled slots have deterministic ids, so materialising
-- the same slot twice is a no-op (INSERT ... ON CONFLICT DO NOTHING).
CREATE TABLE IF NOT EXISTS job_dispatch_queue (
    id                      TEXT    PRIMARY KEY,
    job_id                  TEXT    NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    kind                    TEXT    NOT NULL CHECK (kind = 'schedule' OR kind = 'at' OR kind = 'manual' OR kind = 'chain' OR kind = 'retry'),
    status                  TEXT    NOT NULL DEFAULT 'pending' CHECK (status = 'pending' OR status = 'claimed' OR status = 'awaiting_approval' OR status = 'done' OR status = 'cancelled' OR status = 'failed'),
    due_at                  INTEGER NOT NULL,
    created_at              INTEGER NOT NULL,
    updated_at              INTEGER NOT NULL,
    claim_owner             TEXT,
    claim_token             TEXT,
    claim_fence             INTEGER,
    claim_expires_at        INTEGER,
    attempts                INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    replay_count            INTEGER NOT NULL DEFAULT 0 CHECK (replay_count >= 0),
    last_error              TEXT,
    run_id                  TEXT,
    source_run_id           TEXT,
    requested_by            TEXT,
    cancel_reason           TEXT,
    -- execution artifact binding: the job's artifact when the work was queued; chain, retry and replay work also bind their source run and its artifact
    artifact_digest         TEXT    REFERENCES execution_artifacts(digest) CHECK (artifact_digest IS NULL OR (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71)),
    source_artifact_digest  TEXT    REFERENCES execution_artifacts(digest) CHECK (source_artifact_digest IS NULL OR (source_artifact_digest LIKE 'sha256:%' AND length(source_artifact_digest) = 71)),
    CHECK (status <> 'claimed' OR (claim_owner IS NOT NULL AND claim_token IS NOT NULL AND claim_expires_at IS NOT NULL))
);
-- The claim query orders by (due_at, id): the index covers both, so a backlog is never sorted.
CREATE INDEX IF NOT EXISTS dispatch_pending_due_idx ON job_dispatch_queue(due_at, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS dispatch_claimed_idx ON job_dispatch_queue(claim_expires_at) WHERE status = 'claimed';
CREATE INDEX IF NOT EXISTS dispatch_job_idx ON job_dispatch_queue(job_id, status);
-- Pruning asks whether any dispatch names a run as its source (lineage). Partial: a plain
-- slot has no source, so the hot path never writes it. Whether an open dispatch names a run
-- as its run is asked through dispatch_job_idx (the run's job, the open statuses).
CREATE INDEX IF NOT EXISTS dispatch_source_run_idx ON job_dispatch_queue(source_run_id) WHERE source_run_id IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS job_dispatch_queue_binding_immutable
BEFORE UPDATE OF artifact_digest, source_run_id, source_artifact_digest ON job_dispatch_queue
WHEN OLD.artifact_digest IS NOT NULL AND (NEW.artifact_digest IS DISTINCT FROM OLD.artifact_digest OR NEW.source_run_id IS DISTINCT FROM OLD.source_run_id OR NEW.source_artifact_digest IS DISTINCT FROM OLD.source_artifact_digest)
BEGIN
    SELECT RAISE(ABORT, 'ARTIFACT_BINDING_IMMUTABLE: a dispatch''s artifact binding never changes');
END;

-- Runs: one row per attempt to execute a job.
CREATE TABLE IF NOT EXISTS runs (
    id                        TEXT    PRIMARY KEY,
    job_id                    TEXT    NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    dispatch_id               TEXT,
    dispatch_kind             TEXT    CHECK (dispatch_kind IS NULL OR dispatch_kind = 'schedule' OR dispatch_kind = 'at' OR dispatch_kind = 'manual' OR dispatch_kind = 'chain' OR dispatch_kind = 'retry'),
    status                    TEXT    NOT NULL CHECK (status = 'pending' OR status = 'running' OR status = 'ok' OR status = 'error' OR status = 'timeout' OR status = 'cancelled' OR status = 'crashed' OR status = 'skipped' OR status = 'awaiting_approval' OR status = 'approved' OR status = 'recovery_blocked'),
    attempt                   INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    scheduled_for             INTEGER,
    created_at                INTEGER NOT NULL,
    started_at                INTEGER,
    finished_at               INTEGER,
    terminal_at               INTEGER,
    duration_ms               INTEGER,
    dispatcher_owner          TEXT,
    dispatcher_token          INTEGER,
    parent_run_id             TEXT,
    retry_of_run_id           TEXT,
    replay_of_run_id          TEXT,
    delivery_guarantee        TEXT    NOT NULL DEFAULT 'at-most-once' CHECK (delivery_guarantee = 'at-most-once' OR delivery_guarantee = 'at-least-once'),
    executor                  TEXT,
    exit_code                 INTEGER,
    error_code                TEXT,
    error_message             TEXT,
    skip_reason               TEXT,
    summary                   TEXT,
    -- what the executor recorded to find its work after a crash (JSON: a process identity, a remote turn id)
    executor_handle           TEXT,
    process_state             TEXT    CHECK (process_state IS NULL OR process_state = 'running' OR process_state = 'exited' OR process_state = 'terminated' OR process_state = 'gone' OR process_state = 'unknown'),
    process_terminated_at     INTEGER,
    process_signal            TEXT,
    -- cancellation
    cancel_requested_at       INTEGER,
    cancel_requested_by       TEXT,
    cancel_reason             TEXT,
    agent_abort_requested_at  INTEGER,
    agent_abort_outcome       TEXT,
    -- output (excerpts in the row, full streams offloaded above a threshold)
    stdout_excerpt            TEXT,
    stderr_excerpt            TEXT,
    stdout_bytes              INTEGER,
    stderr_bytes              INTEGER,
    stdout_sha256             TEXT,
    stderr_sha256             TEXT,
    stdout_artifact           TEXT,
    stderr_artifact           TEXT,
    stdout_truncated          INTEGER NOT NULL DEFAULT 0 CHECK (stdout_truncated IN (0, 1)),
    stderr_truncated          INTEGER NOT NULL DEFAULT 0 CHECK (stderr_truncated IN (0, 1)),
    -- structured output
    output_format             TEXT    CHECK (output_format IS NULL OR output_format = 'text' OR output_format = 'json' OR output_format = 'ndjson'),
    output_valid              INTEGER CHECK (output_valid IS NULL OR output_valid IN (0, 1)),
    output_warning            TEXT,
    output_bytes              INTEGER,
    output_sha256             TEXT,
    output_parsed             TEXT,
    output_artifact           TEXT,
    -- post-success verification (status, timing, exit metadata, sizes and hashes only); interrupted: the run ended while its check ran (a crash, an abandoned worker)
    verify_status             TEXT    CHECK (verify_status IS NULL OR verify_status = 'passed' OR verify_status = 'failed' OR verify_status = 'timeout' OR verify_status = 'cancelled' OR verify_status = 'error' OR verify_status = 'interrupted'),
    verify_json               TEXT,
    env_policy_warning        TEXT,
    usage_json                TEXT,
    -- pipeline outcomes before execution (JSON): resolved identity and trust, delegation, governance
    identity_json             TEXT,
    trust_level               TEXT    CHECK (trust_level IS NULL OR trust_level = 'untrusted' OR trust_level = 'user' OR trust_level = 'operator' OR trust_level = 'system'),
    -- who the run acted as (KIND:NAME), copied onto each of its events
    principal                 TEXT,
    delegation_json           TEXT,
    governance_json           TEXT,
    -- what was presented (names, media, digests, redactions): never a value
    credentials_json          TEXT,
    -- the authorization_ref decision (provider, policy ref, decision, reason)
    authorization_json        TEXT,
    -- the verified proof (method, proof id, key id, verified window and skew)
    proof_json                TEXT,
    -- the run's evidence row, when its job declares evidence
    evidence_status           TEXT    CHECK (evidence_status IS NULL OR evidence_status = 'attested' OR evidence_status = 'verified' OR evidence_status = 'failed' OR evidence_status = 'interrupted'),
    -- execution artifact binding (from the dispatch), with the source run of chain, retry and replay work
    artifact_digest           TEXT    REFERENCES execution_artifacts(digest) CHECK (artifact_digest IS NULL OR (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71)),
    source_run_id             TEXT,
    source_artifact_digest    TEXT    REFERENCES execution_artifacts(digest) CHECK (source_artifact_digest IS NULL OR (source_artifact_digest LIKE 'sha256:%' AND length(source_artifact_digest) = 71)),
    CHECK (finished_at IS NULL OR started_at IS NULL OR finished_at >= started_at)
);
CREATE INDEX IF NOT EXISTS runs_job_idx ON runs(job_id, created_at);
CREATE INDEX IF NOT EXISTS runs_status_idx ON runs(status) WHERE status IN ('pending', 'running', 'awaiting_approval', 'approved', 'recovery_blocked');
-- Pruning deletes a run's dispatch only when no other run names it: the one exact lookup of
-- that (a run of a released and claimed-again dispatch, a skipped run) without a scan.
CREATE INDEX IF NOT EXISTS runs_dispatch_idx ON runs(dispatch_id);
-- A run reaches a terminal status once. Terminal rows may gain audit fields but never change status.
CREATE TRIGGER IF NOT EXISTS runs_terminal_is_final
BEFORE UPDATE OF status ON runs
WHEN OLD.status IN ('ok', 'error', 'timeout', 'cancelled', 'crashed', 'skipped') AND NEW.status <> OLD.status
BEGIN
    SELECT RAISE(ABORT, 'RUN_TERMINAL: a terminal run status never changes');
END;
CREATE TRIGGER IF NOT EXISTS runs_binding_immutable
BEFORE UPDATE OF artifact_digest, source_run_id, source_artifact_digest ON runs
WHEN OLD.artifact_digest IS NOT NULL AND (NEW.artifact_digest IS DISTINCT FROM OLD.artifact_digest OR NEW.source_run_id IS DISTINCT FROM OLD.source_run_id OR NEW.source_artifact_digest IS DISTINCT FROM OLD.source_artifact_digest)
BEGIN
    SELECT RAISE(ABORT, 'ARTIFACT_BINDING_IMMUTABLE: a run''s artifact binding never changes');
END;

-- Approval gates: one row per gated run, versioned, bound to the run's execution artifact.
CREATE TABLE IF NOT EXISTS approvals (
    id                      TEXT    PRIMARY KEY,
    -- no foreign key: an approval outlives its job (deleting the job cancels it; docs/approvals.md)
    job_id                  TEXT    NOT NULL,
    -- no foreign key: its run may be gone (a tombstone says why); pruning deletes it with its run
    run_id                  TEXT,
    dispatch_id             TEXT,
    -- why the gate opened: the job's approval_required, or an authorization decision `escalate`
    gate_kind               TEXT    NOT NULL DEFAULT 'job' CHECK (gate_kind = 'job' OR gate_kind = 'authorization'),
    status                  TEXT    NOT NULL DEFAULT 'pending' CHECK (status = 'pending' OR status = 'approved' OR status = 'rejected' OR status = 'cancelled' OR status = 'timed_out' OR status = 'dispatched'),
    -- compare-and-swap version: every transition is `... WHERE status = ? AND version = ?`, version + 1
    version                 INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1),
    -- snapshots of the job when the gate opened
    risk_level              TEXT    NOT NULL CHECK (risk_level = 'low' OR risk_level = 'medium' OR risk_level = 'high' OR risk_level = 'critical'),
    approver_scope          TEXT,
    timeout_action          TEXT    NOT NULL DEFAULT 'reject' CHECK (timeout_action = 'reject' OR timeout_action = 'approve'),
    requested_at            INTEGER NOT NULL,
    expires_at              INTEGER,
    -- the deciding OS account (name) and its uid; the system for timeouts
    decided_by              TEXT,
    decided_uid             INTEGER,
    note                    TEXT,
    decision_reason         TEXT,
    approved_at             INTEGER,
    rejected_at             INTEGER,
    cancelled_at            INTEGER,
    timed_out_at            INTEGER,
    dispatched_at           INTEGER,
    proof_not_before        INTEGER,
    proof_expires_at        INTEGER,
    proof_clock_skew_ms     INTEGER,
    -- the execution contract approved: the run's artifact
    artifact_digest         TEXT    NOT NULL REFERENCES execution_artifacts(digest) CHECK (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71),
    source_run_id           TEXT,
    source_artifact_digest  TEXT    REFERENCES execution_artifacts(digest) CHECK (source_artifact_digest IS NULL OR (source_artifact_digest LIKE 'sha256:%' AND length(source_artifact_digest) = 71))
);
CREATE INDEX IF NOT EXISTS approvals_status_idx ON approvals(status, expires_at);
CREATE INDEX IF NOT EXISTS approvals_job_idx ON approvals(job_id, status);
CREATE INDEX IF NOT EXISTS approvals_run_idx ON approvals(run_id);
CREATE TRIGGER IF NOT EXISTS approvals_binding_immutable
BEFORE UPDATE OF artifact_digest, source_run_id, source_artifact_digest ON approvals
WHEN OLD.artifact_digest IS NOT NULL AND (NEW.artifact_digest IS DISTINCT FROM OLD.artifact_digest OR NEW.source_run_id IS DISTINCT FROM OLD.source_run_id OR NEW.source_artifact_digest IS DISTINCT FROM OLD.source_artifact_digest)
BEGIN
    SELECT RAISE(ABORT, 'ARTIFACT_BINDING_IMMUTABLE: an approval''s artifact binding never changes');
END;
CREATE TRIGGER IF NOT EXISTS approvals_decision_is_final
BEFORE UPDATE OF status ON approvals
WHEN OLD.status IN ('rejected', 'cancelled', 'timed_out', 'dispatched') AND NEW.status <> OLD.status
BEGIN
    SELECT RAISE(ABORT, 'APPROVAL_FINAL: a decided approval never changes its decision');
END;
CREATE TRIGGER IF NOT EXISTS approvals_version_advances
BEFORE UPDATE OF status ON approvals
WHEN NEW.status <> OLD.status AND NEW.version <= OLD.version
BEGIN
    SELECT RAISE(ABORT, 'APPROVAL_VERSION: every approval change advances its version');
END;

-- What an executor keeps for a job between runs (an agent's conversation), written only by the completion
-- transaction of an ok run and handed to the next run: shared by every dispatcher, lost by no crash.
CREATE TABLE IF NOT EXISTS executor_state (
    job_id       TEXT    NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    executor     TEXT    NOT NULL,
    -- a JSON object the executor returned as ExecutionResult.state
    state        TEXT    NOT NULL,
    state_bytes  INTEGER NOT NULL CHECK (state_bytes >= 0),
    -- the ok run whose completion kept it
    run_id       TEXT,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (job_id, executor)
);

-- Delivery outbox: the only durable route for external channel output.
CREATE TABLE IF NOT EXISTS delivery_outbox (
    id                TEXT    PRIMARY KEY,
    run_id            TEXT    REFERENCES runs(id) ON DELETE SET NULL,
    job_id            TEXT,
    channel           TEXT    NOT NULL,
    target            TEXT,
    idempotency_key   TEXT    NOT NULL UNIQUE,
    group_key         TEXT    NOT NULL,
    part_index        INTEGER NOT NULL DEFAULT 1 CHECK (part_index >= 1),
    part_count        INTEGER NOT NULL DEFAULT 1 CHECK (part_count >= 1),
    body              TEXT    NOT NULL,
    status            TEXT    NOT NULL DEFAULT 'pending' CHECK (status = 'pending' OR status = 'claimed' OR status = 'delivered' OR status = 'failed' OR status = 'cancelled'),
    attempts          INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts      INTEGER NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    due_at            INTEGER NOT NULL,
    claim_owner       TEXT,
    claim_token       TEXT,
    claim_expires_at  INTEGER,
    last_error        TEXT,
    -- what the consumer recorded: the channel's error code, its receipt
    error_code        TEXT,
    last_attempt_at   INTEGER,
    receipt_id        TEXT,
    receipt_json      TEXT,
    delivered_at      INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    CHECK (part_index <= part_count),
    UNIQUE (group_key, part_index)
);
CREATE INDEX IF NOT EXISTS outbox_due_idx ON delivery_outbox(due_at) WHERE status = 'pending';
-- Expired claims (a dispatcher died between sending and recording) are found without a scan.
CREATE INDEX IF NOT EXISTS outbox_claimed_idx ON delivery_outbox(claim_expires_at) WHERE status = 'claimed';
CREATE INDEX IF NOT EXISTS outbox_job_idx ON delivery_outbox(job_id, status);
-- Pruning keeps a run while its parts may still be sent.
CREATE INDEX IF NOT EXISTS outbox_run_idx ON delivery_outbox(run_id) WHERE run_id IS NOT NULL;
-- A delivered part is final: never sent again, never rewritten.
CREATE TRIGGER IF NOT EXISTS outbox_delivered_immutable
BEFORE UPDATE ON delivery_outbox
WHEN OLD.status = 'delivered'
BEGIN
    SELECT RAISE(ABORT, 'OUTBOX_DELIVERED: a delivered part is final and never re-sent');
END;

CREATE TABLE IF NOT EXISTS delivery_attachments (
    id          TEXT    PRIMARY KEY,
    outbox_id   TEXT    NOT NULL REFERENCES delivery_outbox(id) ON DELETE CASCADE,
    ordinal     INTEGER NOT NULL CHECK (ordinal >= 0),
    name        TEXT    NOT NULL,
    mime_type   TEXT    NOT NULL,
    size_bytes  INTEGER NOT NULL CHECK (size_bytes >= 0),
    sha256      TEXT    NOT NULL CHECK (length(sha256) = 64),
    content     BLOB,
    path        TEXT,
    created_at  INTEGER NOT NULL,
    UNIQUE (outbox_id, ordinal),
    CHECK ((content IS NULL) <> (path IS NULL))
);

-- Completion delivery ownership, scoped to (task label, session, run): open from the completion transaction that enqueued the run's messages until reconciliation finds every part of the run settled.
CREATE TABLE IF NOT EXISTS completion_debts (
    id            TEXT    PRIMARY KEY,
    task_label    TEXT    NOT NULL,
    session_key   TEXT    NOT NULL,
    run_id        TEXT    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'open' CHECK (status = 'open' OR status = 'reconciled' OR status = 'failed'),
    outbox_group  TEXT,
    claim_owner   TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    UNIQUE (task_label, session_key, run_id)
);
-- A run's debt (deliveries checkpoint, pruning).
CREATE INDEX IF NOT EXISTS completion_debts_run_idx ON completion_debts(run_id);
-- Reconciliation, status and doctor read only the debts not yet reconciled.
CREATE INDEX IF NOT EXISTS completion_debts_unsettled_idx ON completion_debts(created_at) WHERE status <> 'reconciled';

-- One immutable evidence row per run.
CREATE TABLE IF NOT EXISTS evidence_records (
    id                 TEXT    PRIMARY KEY,
    run_id             TEXT    NOT NULL UNIQUE,
    job_id             TEXT,
    provider           TEXT    NOT NULL,
    methods            TEXT    NOT NULL,
    payload_sha256     TEXT    NOT NULL CHECK (length(payload_sha256) = 64),
    canonical_payload  TEXT    NOT NULL,
    envelope           TEXT,
    artifact_digest    TEXT    REFERENCES execution_artifacts(digest) CHECK (artifact_digest IS NULL OR (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71)),
    verification       TEXT,
    verified           INTEGER NOT NULL DEFAULT 0 CHECK (verified IN (0, 1)),
    created_at         INTEGER NOT NULL,
    status             TEXT    NOT NULL DEFAULT 'attested' CHECK (status = 'attested' OR status = 'failed' OR status = 'interrupted'),
    error_code         TEXT,
    evidence_ref       TEXT,
    declaration        TEXT,
    source_run_id      TEXT,
    retention_policy   TEXT,
    -- NULL: kept forever; before this time the row cannot be deleted
    retention_until    INTEGER
);
CREATE INDEX IF NOT EXISTS evidence_records_job_idx ON evidence_records(job_id, created_at);
CREATE TRIGGER IF NOT EXISTS evidence_records_no_update
BEFORE UPDATE ON evidence_records
BEGIN
    SELECT RAISE(ABORT, 'EVIDENCE_IMMUTABLE: evidence records cannot be updated');
END;
-- Evidence outlives its run: deletable only once its retention deadline has passed.
CREATE TRIGGER IF NOT EXISTS evidence_records_retained
BEFORE DELETE ON evidence_records
WHEN OLD.retention_until IS NULL OR OLD.retention_until > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
BEGIN
    SELECT RAISE(ABORT, 'EVIDENCE_RETAINED: evidence records cannot be deleted before their retention ends');
END;

-- What is left of a pruned run whose evidence is retained.
CREATE TABLE IF NOT EXISTS run_tombstones (
    run_id           TEXT    PRIMARY KEY,
    job_id           TEXT,
    job_name         TEXT,
    status           TEXT,
    artifact_digest  TEXT    REFERENCES execution_artifacts(digest) CHECK (artifact_digest IS NULL OR (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71)),
    evidence_id      TEXT,
    finished_at      INTEGER,
    pruned_at        INTEGER NOT NULL,
    reason           TEXT
);
CREATE TRIGGER IF NOT EXISTS run_tombstones_no_update
BEFORE UPDATE ON run_tombstones
BEGIN
    SELECT RAISE(ABORT, 'TOMBSTONE_APPEND_ONLY: run tombstones cannot be updated');
END;
CREATE TRIGGER IF NOT EXISTS run_tombstones_no_delete
BEFORE DELETE ON run_tombstones
BEGIN
    SELECT RAISE(ABORT, 'TOMBSTONE_APPEND_ONLY: run tombstones cannot be deleted');
END;

-- One row per retention pass, written first by its pruning transaction. Append-only; the largest
-- events_before is the runtime events' delete cutoff (never less than an hour old), so it only moves forward.
CREATE TABLE IF NOT EXISTS prune_cutoffs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    at             INTEGER NOT NULL,
    actor          TEXT,
    -- runtime events older than this may be deleted; NULL: this pass deletes none
    events_before  INTEGER,
    -- the retention rules of the pass (JSON)
    rules          TEXT,
    CHECK (events_before IS NULL OR events_before <= at - 3600000)
);
CREATE INDEX IF NOT EXISTS prune_cutoffs_events_idx ON prune_cutoffs(events_before);
CREATE INDEX IF NOT EXISTS prune_cutoffs_at_idx ON prune_cutoffs(at);
CREATE TRIGGER IF NOT EXISTS prune_cutoffs_no_update
BEFORE UPDATE ON prune_cutoffs
BEGIN
    SELECT RAISE(ABORT, 'PRUNE_CUTOFFS_APPEND_ONLY: prune cutoffs cannot be updated');
END;
CREATE TRIGGER IF NOT EXISTS prune_cutoffs_no_delete
BEFORE DELETE ON prune_cutoffs
BEGIN
    SELECT RAISE(ABORT, 'PRUNE_CUTOFFS_APPEND_ONLY: prune cutoffs cannot be deleted');
END;

-- Append-only audit trail of every transition; pruned only below a recorded prune cutoff.
CREATE TABLE IF NOT EXISTS runtime_events (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    at               INTEGER NOT NULL,
    kind             TEXT    NOT NULL,
    job_id           TEXT,
    run_id           TEXT,
    dispatch_id      TEXT,
    actor            TEXT,
    artifact_digest  TEXT    REFERENCES execution_artifacts(digest) CHECK (artifact_digest IS NULL OR (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71)),
    data             TEXT,
    -- who the run acted as (kind:name) and its trust level, on events of a run
    principal        TEXT,
    trust_level      TEXT
);
CREATE INDEX IF NOT EXISTS runtime_events_run_idx ON runtime_events(run_id) WHERE run_id IS NOT NULL;
-- Events naming a dispatch and no run (queue show finds a dispatch's run events through its
-- runs) and, below, events of no job (status's last disk-full episode): partial, so the two
-- events of a run write one index entry each (runtime_events_run_idx).
CREATE INDEX IF NOT EXISTS runtime_events_dispatch_idx ON runtime_events(dispatch_id) WHERE run_id IS NULL AND dispatch_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runtime_events_jobless_idx ON runtime_events(kind, at) WHERE job_id IS NULL;
CREATE TRIGGER IF NOT EXISTS runtime_events_no_update
BEFORE UPDATE ON runtime_events
BEGIN
    SELECT RAISE(ABORT, 'EVENTS_APPEND_ONLY: runtime events cannot be updated');
END;
-- Only events older than the newest prune cutoff (prune_cutoffs) may go: the retention path's.
CREATE TRIGGER IF NOT EXISTS runtime_events_no_delete
BEFORE DELETE ON runtime_events
WHEN OLD.at >= (SELECT COALESCE(MAX(events_before), 0) FROM prune_cutoffs)
BEGIN
    SELECT RAISE(ABORT, 'EVENTS_APPEND_ONLY: runtime events cannot be deleted');
END;

-- Resumable provider sessions scoped to an exact artifact and runtime instance.
CREATE TABLE IF NOT EXISTS provider_sessions (
    id                TEXT    PRIMARY KEY,
    provider          TEXT    NOT NULL,
    session_key       TEXT    NOT NULL,
    artifact_digest   TEXT    REFERENCES execution_artifacts(digest) CHECK (artifact_digest IS NULL OR (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71)),
    runtime_instance  TEXT,
    state             TEXT,
    expires_at        INTEGER,
    revoked_at        INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    scopes            TEXT,
    status            TEXT    NOT NULL DEFAULT 'active' CHECK (status = 'active' OR status = 'expired' OR status = 'revoked' OR status = 'revoke_failed'),
    refresh_after     INTEGER,
    UNIQUE (provider, session_key, artifact_digest)
);
CREATE TRIGGER IF NOT EXISTS provider_sessions_binding_immutable
BEFORE UPDATE OF artifact_digest ON provider_sessions
WHEN OLD.artifact_digest IS NOT NULL AND (NEW.artifact_digest IS DISTINCT FROM OLD.artifact_digest)
BEGIN
    SELECT RAISE(ABORT, 'ARTIFACT_BINDING_IMMUTABLE: a provider session''s artifact binding never changes');
END;

-- Credential release bookkeeping. There is deliberately no column for the value.
CREATE TABLE IF NOT EXISTS credential_presentations (
    id                   TEXT    PRIMARY KEY,
    run_id               TEXT,
    binding_name         TEXT    NOT NULL,
    provider             TEXT    NOT NULL,
    medium               TEXT    NOT NULL CHECK (medium = 'env' OR medium = 'file' OR medium = 'stdin' OR medium = 'header'),
    env_key              TEXT,
    file_name            TEXT,
    cardinality          TEXT    NOT NULL DEFAULT 'one' CHECK (cardinality = 'one' OR cardinality = 'many'),
    required             INTEGER NOT NULL DEFAULT 1 CHECK (required IN (0, 1)),
    status               TEXT    NOT NULL DEFAULT 'materialized' CHECK (status = 'materialized' OR status = 'cleaned' OR status = 'recovery_cleaned' OR status = 'failed'),
    artifact_digest      TEXT    REFERENCES execution_artifacts(digest) CHECK (artifact_digest IS NULL OR (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71)),
    materialized_at      INTEGER NOT NULL,
    cleaned_at           INTEGER,
    presented_sha256     TEXT,
    -- the private directory a file presentation lives in (recovery removes it)
    temp_path            TEXT,
    provider_session_id  TEXT,
    expires_at           INTEGER,
    last_error           TEXT
);
CREATE INDEX IF NOT EXISTS credential_presentations_run_idx ON credential_presentations(run_id, status);
-- The recovery sweep: presentations not cleaned yet (a handful at any time, whatever the history).
CREATE INDEX IF NOT EXISTS credential_presentations_materialized_idx ON credential_presentations(status, run_id) WHERE status = 'materialized';
-- status and doctor count cleanup failures without reading every presentation.
CREATE INDEX IF NOT EXISTS credential_presentations_failed_idx ON credential_presentations(status, run_id) WHERE status = 'failed';
CREATE TRIGGER IF NOT EXISTS credential_presentations_binding_immutable
BEFORE UPDATE OF artifact_digest ON credential_presentations
WHEN OLD.artifact_digest IS NOT NULL AND (NEW.artifact_digest IS DISTINCT FROM OLD.artifact_digest)
BEGIN
    SELECT RAISE(ABORT, 'ARTIFACT_BINDING_IMMUTABLE: a credential presentation''s artifact binding never changes');
END;

-- Proof nonce / JTI claims: a proof is accepted once, for one artifact.
CREATE TABLE IF NOT EXISTS authorization_proof_replay (
    proof_id         TEXT    PRIMARY KEY,
    artifact_digest  TEXT    NOT NULL REFERENCES execution_artifacts(digest) CHECK (artifact_digest LIKE 'sha256:%' AND length(artifact_digest) = 71),
    run_id           TEXT,
    claimed_at       INTEGER NOT NULL,
    expires_at       INTEGER,
    -- the dispatch that claimed the proof: its retries and replays reuse the claim
    dispatch_id      TEXT,
    job_id           TEXT,
    method           TEXT,
    key_id           TEXT
);

-- Revoked proofs and signing keys, checked before every use of a proof. Append-only.
CREATE TABLE IF NOT EXISTS proof_revocations (
    id          TEXT    PRIMARY KEY,
    proof_id    TEXT,
    key_id      TEXT,
    reason      TEXT,
    revoked_by  TEXT,
    revoked_at  INTEGER NOT NULL,
    CHECK (proof_id IS NOT NULL OR key_id IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS proof_revocations_proof_idx ON proof_revocations(proof_id);
CREATE INDEX IF NOT EXISTS proof_revocations_key_idx ON proof_revocations(key_id);
CREATE TRIGGER IF NOT EXISTS proof_revocations_no_update
BEFORE UPDATE ON proof_revocations
BEGIN
    SELECT RAISE(ABORT, 'REVOCATIONS_APPEND_ONLY: proof revocations cannot be updated');
END;
CREATE TRIGGER IF NOT EXISTS proof_revocations_no_delete
BEFORE DELETE ON proof_revocations
BEGIN
    SELECT RAISE(ABORT, 'REVOCATIONS_APPEND_ONLY: proof revocations cannot be deleted');
END;

-- Agent prompt messages. `prompt_claimed` means a dispatcher owns prompt injection.
CREATE TABLE IF NOT EXISTS messages (
    id           TEXT    PRIMARY KEY,
    job_id       TEXT,
    run_id       TEXT,
    session_key  TEXT,
    role         TEXT    NOT NULL CHECK (role = 'user' OR role = 'assistant' OR role = 'system'),
    body         TEXT    NOT NULL,
    status       TEXT    NOT NULL DEFAULT 'pending' CHECK (status = 'pending' OR status = 'prompt_claimed' OR status = 'consumed' OR status = 'expired'),
    claimed_by   TEXT,
    claimed_at   INTEGER,
    created_at   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_session_idx ON messages(session_key, status);

-- Foreign keys alone keep a referenced artifact only on connections that enforce them.
CREATE TRIGGER IF NOT EXISTS execution_artifacts_referenced
BEFORE DELETE ON execution_artifacts
WHEN (EXISTS (SELECT 1 FROM jobs WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM job_dispatch_queue WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM job_dispatch_queue WHERE source_artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM runs WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM runs WHERE source_artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM approvals WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM approvals WHERE source_artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM evidence_records WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM run_tombstones WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM runtime_events WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM provider_sessions WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM credential_presentations WHERE artifact_digest = OLD.digest) OR EXISTS (SELECT 1 FROM authorization_proof_replay WHERE artifact_digest = OLD.digest))
BEGIN
    SELECT RAISE(ABORT, 'ARTIFACT_REFERENCED: an execution artifact cannot be deleted while a row refers to it');
END;
