"""Schema versions and the one list of migrations every store runs.

Contract (the same for every store): a fresh database gets the schema in one
transaction; an older one runs every migration newer than its recorded version and
then applies the schema again (every statement is ``IF NOT EXISTS`` / ``OR REPLACE``),
in the same transaction, so a failure or a ``kill -9`` leaves nothing half-done. Each
step checks before it acts, so running it twice is harmless.

Steps are written once, for every dialect: the schema steps are
``scheduler.core.store.schema_steps`` (``AddColumn``, ``WidenCheck``, ...), the data moves of
particular versions ``scheduler.core.store.data_moves``; both run through the small
``SchemaConnection`` adapter each store provides. A store calls ``upgrade`` inside its
own write transaction; which transaction and lock that is stays the store's business.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources
from typing import NamedTuple

from scheduler.base.errors import SchedulerError
from scheduler.core.store import legacy_tables, schema
from scheduler.core.store.data_moves import BindArtifacts, MoveExecutorFields
from scheduler.core.store.schema import BIGINT, SCHEMA_VERSION, TEXT, Column
from scheduler.core.store.schema_steps import (
    AddColumn,
    CreateTable,
    DropColumn,
    DropEmptyTable,
    DropIndex,
    DropReference,
    DropTrigger,
    ReplaceGuard,
    RespellChoices,
    SchemaConnection,
    WidenCheck,
)

__all__ = [
    "MIGRATIONS", "SCHEMA_VERSION", "Migration", "SchemaConnection", "Step", "StepHook", "UpgradeFailed", "migrate",
    "schema_fingerprint", "schema_statements", "schema_text", "upgrade",
]


@lru_cache(maxsize=1)
def schema_text() -> str:
    """The packaged ``schema.sql``: the SQLite schema (in a source tree a symlink to the top-level file)."""
    return resources.files("scheduler").joinpath("schema.sql").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _sqlite_statements() -> tuple[str, ...]:
    statements: list[str] = []
    buf: list[str] = []
    for line in schema_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("--")):
            continue
        buf.append(line)
        chunk = "\n".join(buf)
        if sqlite3.complete_statement(chunk):
            statements.append(chunk.strip())
            buf = []
    if buf and "".join(buf).strip():
        raise ValueError("schema.sql ends with an incomplete statement")
    return tuple(statements)


def schema_statements(dialect: str = "sqlite") -> tuple[str, ...]:
    """The schema's statements for ``dialect``, in order.

    SQLite's come from the shipped ``schema.sql`` (what the embedded store applies
    verbatim); every other dialect's are generated from ``scheduler.core.store.schema``. A test
    holds ``schema.sql`` to the generated SQLite text, so both come from one definition.
    """
    return _sqlite_statements() if dialect == "sqlite" else schema.statements(dialect)


@lru_cache(maxsize=2)
def schema_fingerprint(dialect: str) -> str:
    """SHA-256 of the schema text for ``dialect``: recorded by a store so an unchanged schema is recognised cheaply."""
    text = schema_text() if dialect == "sqlite" else schema.render(dialect)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


Step = (AddColumn | DropColumn | DropIndex | DropTrigger | WidenCheck | DropReference | MoveExecutorFields | CreateTable
        | DropEmptyTable | BindArtifacts | ReplaceGuard | RespellChoices)


class Migration(NamedTuple):
    """One numbered, named migration made of idempotent steps."""

    version: int
    name: str
    steps: tuple[Step, ...]


def _current(table: str, column: str) -> Column:
    """A column as the current schema defines it (for steps that add or widen it)."""
    return schema.table(table).column(column)


_PROCESS_STATES_V2 = ("running", "terminated", "gone", "unknown")

#: Placeholder tables (never written by a released kernel) rebuilt by v4 with artifact bindings.
_PLACEHOLDER_TABLES = (legacy_tables.APPROVALS_V3, legacy_tables.EVIDENCE_RECORDS_V3, legacy_tables.PROVIDER_SESSIONS_V3,
                       legacy_tables.CREDENTIAL_PRESENTATIONS_V3, legacy_tables.AUTHORIZATION_PROOF_REPLAY_V3)
_OLD_DIGEST = Column("handoff_artifact_digest", TEXT)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        2,
        "per-job schedule policies: misfire, DST gap and fold, auto-pause threshold",
        (
            AddColumn("jobs", Column("misfire_policy", TEXT, not_null=True, default="coalesce", choices=("coalesce", "skip"))),
            AddColumn("jobs", Column("dst_gap_policy", TEXT, not_null=True, default="shift", choices=("shift", "skip"))),
            AddColumn("jobs", Column("dst_fold_policy", TEXT, not_null=True, default="once", choices=("once", "twice"))),
            AddColumn("jobs", Column("max_consecutive_failures", BIGINT, not_null=True, default=3,
                                     check="max_consecutive_failures >= 0")),
        ),
    ),
    Migration(
        3,
        "plugin-owned options: executor fields into executor_options, process identity into executor_handle",
        (
            AddColumn("jobs", Column("executor_options", TEXT, not_null=True, default="{}")),
            AddColumn("jobs", Column("delivery_options", TEXT, not_null=True, default="{}")),
            AddColumn("jobs", Column("constraints", TEXT, not_null=True, default="{}")),
            AddColumn("runs", Column("executor_handle", TEXT)),
            AddColumn("runs", Column("usage_json", TEXT)),
            MoveExecutorFields(),
            DropColumn("jobs", Column("shell_env_policy", TEXT, not_null=True, default="minimal", choices=("minimal", "inherit"))),
            DropColumn("jobs", Column("working_dir", TEXT)),
            DropColumn("jobs", Column("stdin_text", TEXT)),
            DropColumn("jobs", Column("context_mode", TEXT, not_null=True, default="isolated", choices=("session", "isolated"))),
            DropColumn("jobs", Column("heartbeat_file", TEXT)),
            DropColumn("runs", Column("pid", BIGINT)),
            DropColumn("runs", Column("pgid", BIGINT)),
            DropColumn("runs", Column("process_start_time", TEXT)),
            WidenCheck("runs", _current("runs", "process_state"),
                       before=Column("process_state", TEXT, choices=_PROCESS_STATES_V2)),
            # Objects early databases had, replaced by the current schema's (which upgrade creates next).
            DropIndex("dispatch_pending_idx", "CREATE INDEX dispatch_pending_idx ON job_dispatch_queue(due_at) WHERE status = 'pending'"),
            DropTrigger(
                "outbox_delivered_is_final", "delivery_outbox",
                "CREATE TRIGGER outbox_delivered_is_final\nBEFORE UPDATE OF status ON delivery_outbox\n"
                "WHEN OLD.status = 'delivered' AND NEW.status <> 'delivered'\n"
                "BEGIN\n    SELECT RAISE(ABORT, 'OUTBOX_DELIVERED: a delivered part is never re-sent');\nEND",
            ),
        ),
    ),
    Migration(
        4,
        "execution artifacts (one table of immutable canonical artifacts, digest bindings on jobs, dispatches, runs,"
        " events) and the approval gate (versioned approvals, dispatches awaiting approval)",
        (
            CreateTable("execution_artifacts"),
            DropEmptyTable(legacy_tables.HANDOFF_ARTIFACTS_V3),
            *(DropEmptyTable(t, old_column="handoff_artifact_digest") for t in _PLACEHOLDER_TABLES),
            AddColumn("jobs", _current("jobs", "artifact_digest")),
            AddColumn("jobs", _current("jobs", "handoff_version")),
            AddColumn("jobs", _current("jobs", "effective_task_hash")),
            AddColumn("job_dispatch_queue", _current("job_dispatch_queue", "artifact_digest")),
            AddColumn("job_dispatch_queue", _current("job_dispatch_queue", "source_artifact_digest")),
            AddColumn("runs", _current("runs", "artifact_digest")),
            AddColumn("runs", _current("runs", "source_run_id")),
            AddColumn("runs", _current("runs", "source_artifact_digest")),
            AddColumn("runtime_events", _current("runtime_events", "artifact_digest")),
            *(DropColumn(t, _OLD_DIGEST) for t in ("jobs", "job_dispatch_queue", "runs", "runtime_events")),
            WidenCheck("job_dispatch_queue", _current("job_dispatch_queue", "status"),
                       before=Column("status", TEXT, not_null=True, default="pending",
                                     choices=("pending", "claimed", "done", "cancelled", "failed"))),
            BindArtifacts(),
        ),
    ),
    Migration(
        5,
        "delivery consumer (outbox receipts, error codes, attempt times, indexes), executor state kept between runs,"
        " the per-job notifications opt-out",
        (
            AddColumn("delivery_outbox", _current("delivery_outbox", "error_code")),
            AddColumn("delivery_outbox", _current("delivery_outbox", "last_attempt_at")),
            AddColumn("delivery_outbox", _current("delivery_outbox", "receipt_id")),
            AddColumn("delivery_outbox", _current("delivery_outbox", "receipt_json")),
            CreateTable("executor_state"),
            AddColumn("jobs", _current("jobs", "notify")),
        ),
    ),
    Migration(
        6,
        "identity, credentials and governance (job fields, run outcomes, presentation bookkeeping, provider sessions)"
        " and evidence (job declarations, evidence status and retention, run tombstones)",
        (
            *(AddColumn("jobs", _current("jobs", c)) for c in (
                "identity", "credentials", "child_credential_policy", "evidence", "evidence_ref")),
            *(AddColumn("runs", _current("runs", c)) for c in (
                "identity_json", "trust_level", "principal", "delegation_json", "governance_json", "credentials_json",
                "evidence_status")),
            *(AddColumn("runtime_events", _current("runtime_events", c)) for c in ("principal", "trust_level")),
            *(AddColumn("evidence_records", _current("evidence_records", c)) for c in (
                "status", "error_code", "evidence_ref", "declaration", "source_run_id", "retention_policy", "retention_until")),
            *(AddColumn("provider_sessions", _current("provider_sessions", c)) for c in ("scopes", "status", "refresh_after")),
            *(AddColumn("credential_presentations", _current("credential_presentations", c)) for c in (
                "presented_sha256", "temp_path", "provider_session_id", "expires_at", "last_error")),
            WidenCheck("credential_presentations", _current("credential_presentations", "status"),
                       before=Column("status", TEXT, not_null=True, default="materialized",
                                     choices=("materialized", "cleaned", "failed"))),
            CreateTable("run_tombstones"),
        ),
    ),
    Migration(
        7,
        "authorization: authorization_ref and proof declarations on jobs, decisions on runs, the proof replay ledger's"
        " dispatch binding, proof revocations",
        (
            *(AddColumn("jobs", _current("jobs", c)) for c in ("authorization_ref", "authorization", "authorization_proof")),
            *(AddColumn("runs", _current("runs", c)) for c in ("authorization_json", "proof_json")),
            *(AddColumn("authorization_proof_replay", _current("authorization_proof_replay", c))
              for c in ("dispatch_id", "job_id", "method", "key_id")),
            CreateTable("proof_revocations"),
        ),
    ),
    Migration(
        8,
        "retention: per-job run retention, the append-only prune_cutoffs log, and a runtime events delete guard that"
        " lets the pruning path delete events older than the newest recorded cutoff (and nothing else)",
        (
            AddColumn("jobs", _current("jobs", "retention")),
            CreateTable("prune_cutoffs"),
            # The unconditional guard (BEFORE DELETE ON runtime_events ... RAISE(ABORT, 'EVENTS_APPEND_ONLY: ...'))
            # becomes the cutoff-aware one of the current schema.
            ReplaceGuard("runtime_events", "runtime_events_no_delete"),
            # Also new in 8, created by the schema statements applied after the migrations (CREATE INDEX IF NOT
            # EXISTS, on columns version 6 added): credential_presentations_materialized_idx (the recovery sweep's
            # WHERE status = 'materialized') and credential_presentations_failed_idx (status/doctor counts).
        ),
    ),
    Migration(
        9,
        "runs.verify_status may be 'interrupted': the run ended while its post-success verification ran",
        (
            WidenCheck("runs", _current("runs", "verify_status"),
                       before=Column("verify_status", TEXT, choices=("passed", "failed", "timeout", "cancelled", "error"))),
        ),
    ),
    Migration(
        10,
        "approvals outlive their job and run (no foreign keys): deleting a job cancels its approvals and keeps them",
        (
            DropReference("approvals", _current("approvals", "job_id"),
                          before=Column("job_id", TEXT, not_null=True, references="jobs(id) ON DELETE CASCADE")),
            DropReference("approvals", _current("approvals", "run_id"),
                          before=Column("run_id", TEXT, references="runs(id) ON DELETE CASCADE")),
        ),
    ),
    Migration(
        11,
        "a slimmer write set: dispatch_run_idx goes (pruning finds an open dispatch naming a run through its job's"
        " dispatch_job_idx), so claiming a dispatch writes one index entry fewer",
        (
            DropIndex("dispatch_run_idx",
                      "CREATE INDEX dispatch_run_idx ON job_dispatch_queue(run_id) WHERE run_id IS NOT NULL"),
        ),
    ),
    Migration(
        12,
        "SQLite spells every list-of-choices CHECK as equalities joined by OR (the same refusal, without the ephemeral"
        " index SQLite builds for IN (...) each time a statement runs); PostgreSQL's CHECKs are unchanged",
        tuple(RespellChoices(t.name) for t in schema.TABLES if any(c.choices for c in t.columns)),
    ),
    Migration(
        13,
        "a slimmer write set: runtime_events_job_idx goes, so a run's two events write one index entry each instead of"
        " two; queue show finds a dispatch's run events through its runs and the others through a partial index, and"
        " status finds the events of no job through another (both created by the schema statements)",
        (
            DropIndex("runtime_events_job_idx", "CREATE INDEX runtime_events_job_idx ON runtime_events(job_id, at)"),
        ),
    ),
)

#: Test hook: called with (version, step_index) before each step; lets tests interrupt a migration.
StepHook = Callable[[int, int], None]


def migrate(
    conn: SchemaConnection,
    from_version: int,
    now: int,
    step_hook: StepHook | None = None,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> list[int]:
    """Apply every migration above ``from_version`` inside the caller's open transaction; return the versions applied.

    Each applied version is recorded in ``schema_migrations`` (``ON CONFLICT DO NOTHING``).
    """
    applied = []
    for migration in sorted(migrations, key=lambda m: m.version):
        if migration.version <= from_version:
            continue
        for index, step in enumerate(migration.steps):
            if step_hook is not None:
                step_hook(migration.version, index)
            step.apply(conn)
        conn.execute(
            "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?) ON CONFLICT (version) DO NOTHING",
            (migration.version, migration.name, now),
        )
        applied.append(migration.version)
    return applied


class UpgradeFailed(Exception):
    """``upgrade`` failed in ``phase`` (``migration`` or ``schema``); the store reports it as ``DB_INIT_FAILED``."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        super().__init__(f"{phase}: {cause}")
        self.phase = phase
        self.cause = cause


def upgrade(
    conn: SchemaConnection,
    version: int | None,
    now: int,
    *,
    step_hook: StepHook | None = None,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> list[int]:
    """Bring a fresh (``version`` None) or older database to ``SCHEMA_VERSION`` inside the caller's write transaction.

    Runs the migrations above ``version``, then every schema statement for the
    connection's dialect, then records ``SCHEMA_VERSION``. Any failure raises
    ``UpgradeFailed`` naming the phase, except a retryable ``SchedulerError`` (``DB_BUSY``),
    which propagates as it is. The caller rolls back in both cases.
    """
    phase = "migration"
    try:
        applied = migrate(conn, version, now, step_hook, migrations) if version is not None else []
        phase = "schema"
        for statement in schema_statements(conn.dialect):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?) ON CONFLICT (version) DO NOTHING",
            (SCHEMA_VERSION, "current schema.sql", now),
        )
        return applied
    except SchedulerError as exc:
        if exc.retryable:
            raise
        raise UpgradeFailed(phase, exc) from exc
    except Exception as exc:  # every failure fails closed, naming its phase
        raise UpgradeFailed(phase, exc) from exc

