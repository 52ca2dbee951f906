"""Table layouts the schema no longer has, kept for the record of the migrations that replaced them.

``DropEmptyTable`` steps carry these: what the table looked like before the step (so a
reader, and the test that rebuilds a version-1 database, know exactly what was dropped).
"""

from __future__ import annotations

from scheduler.core.store.schema import Column, Guard, Index, Table

HANDOFF_ARTIFACTS_V3 = Table(
    'handoff_artifacts',
    (
        Column(name='digest', type='text', primary_key=True, check='length(digest) = 64'),
        Column(name='schema_name', type='text', not_null=True),
        Column(name='schema_version', type='bigint', not_null=True),
        Column(name='payload', type='text', not_null=True),
        Column(name='created_at', type='bigint', not_null=True),
    ),
    guards=(Guard(name='handoff_artifacts_no_update', event='UPDATE', message='ARTIFACT_IMMUTABLE: handoff artifacts cannot be updated'), Guard(name='handoff_artifacts_no_delete', event='DELETE', message='ARTIFACT_IMMUTABLE: handoff artifacts cannot be deleted'),),
    comment='Immutable handoff artifacts keyed by the SHA-256 of their canonical (json-sort-v1) payload.',
)

APPROVALS_V3 = Table(
    'approvals',
    (
        Column(name='id', type='text', primary_key=True),
        Column(name='job_id', type='text', not_null=True, references='jobs(id) ON DELETE CASCADE'),
        Column(name='run_id', type='text', references='runs(id) ON DELETE CASCADE'),
        Column(name='dispatch_id', type='text'),
        Column(name='status', type='text', not_null=True, default='pending', choices=(
            'pending',
            'approved',
            'rejected',
            'cancelled',
            'timed_out',
            'dispatching',
            'dispatched',
        )),
        Column(name='version', type='bigint', not_null=True, default=1, check='version >= 1'),
        Column(name='risk_level', type='text', not_null=True, choices=(
            'low',
            'medium',
            'high',
            'critical',
        )),
        Column(name='approver_scope', type='text'),
        Column(name='contract_sha256', type='text', not_null=True),
        Column(name='requested_at', type='bigint', not_null=True),
        Column(name='expires_at', type='bigint'),
        Column(name='decided_by', type='text'),
        Column(name='decision_reason', type='text'),
        Column(name='approved_at', type='bigint'),
        Column(name='rejected_at', type='bigint'),
        Column(name='cancelled_at', type='bigint'),
        Column(name='timed_out_at', type='bigint'),
        Column(name='dispatching_at', type='bigint'),
        Column(name='dispatched_at', type='bigint'),
        Column(name='proof_not_before', type='bigint'),
        Column(name='proof_expires_at', type='bigint'),
        Column(name='proof_clock_skew_ms', type='bigint'),
        Column(name='handoff_artifact_digest', type='text'),
    ),
    indexes=(Index(name='approvals_status_idx', on='status, expires_at'),),
)

EVIDENCE_RECORDS_V3 = Table(
    'evidence_records',
    (
        Column(name='id', type='text', primary_key=True),
        Column(name='run_id', type='text', not_null=True, unique=True),
        Column(name='job_id', type='text'),
        Column(name='provider', type='text', not_null=True),
        Column(name='methods', type='text', not_null=True),
        Column(name='payload_sha256', type='text', not_null=True, check='length(payload_sha256) = 64'),
        Column(name='canonical_payload', type='text', not_null=True),
        Column(name='envelope', type='text'),
        Column(name='handoff_artifact_digest', type='text'),
        Column(name='verification', type='text'),
        Column(name='verified', type='flag', not_null=True, default=0),
        Column(name='created_at', type='bigint', not_null=True),
    ),
    guards=(Guard(name='evidence_records_no_update', event='UPDATE', message='EVIDENCE_IMMUTABLE: evidence records cannot be updated'),),
    comment='One immutable evidence row per run.',
)

PROVIDER_SESSIONS_V3 = Table(
    'provider_sessions',
    (
        Column(name='id', type='text', primary_key=True),
        Column(name='provider', type='text', not_null=True),
        Column(name='session_key', type='text', not_null=True),
        Column(name='handoff_artifact_digest', type='text'),
        Column(name='runtime_instance', type='text'),
        Column(name='state', type='text'),
        Column(name='expires_at', type='bigint'),
        Column(name='revoked_at', type='bigint'),
        Column(name='created_at', type='bigint', not_null=True),
        Column(name='updated_at', type='bigint', not_null=True),
    ),
    constraints=('UNIQUE (provider, session_key, handoff_artifact_digest)',),
    comment='Resumable provider sessions scoped to an exact artifact and runtime instance.',
)

CREDENTIAL_PRESENTATIONS_V3 = Table(
    'credential_presentations',
    (
        Column(name='id', type='text', primary_key=True),
        Column(name='run_id', type='text'),
        Column(name='binding_name', type='text', not_null=True),
        Column(name='provider', type='text', not_null=True),
        Column(name='medium', type='text', not_null=True, choices=(
            'env',
            'file',
            'stdin',
            'header',
        )),
        Column(name='env_key', type='text'),
        Column(name='file_name', type='text'),
        Column(name='cardinality', type='text', not_null=True, default='one', choices=(
            'one',
            'many',
        )),
        Column(name='required', type='flag', not_null=True, default=1),
        Column(name='status', type='text', not_null=True, default='materialized', choices=(
            'materialized',
            'cleaned',
            'failed',
        )),
        Column(name='handoff_artifact_digest', type='text'),
        Column(name='materialized_at', type='bigint', not_null=True),
        Column(name='cleaned_at', type='bigint'),
    ),
    comment='Credential release bookkeeping. There is deliberately no column for the value.',
)

AUTHORIZATION_PROOF_REPLAY_V3 = Table(
    'authorization_proof_replay',
    (
        Column(name='proof_id', type='text', primary_key=True),
        Column(name='handoff_artifact_digest', type='text', not_null=True),
        Column(name='run_id', type='text'),
        Column(name='claimed_at', type='bigint', not_null=True),
        Column(name='expires_at', type='bigint'),
    ),
    comment='Proof nonce / JTI claims: a proof is accepted once, for one artifact.',
)
