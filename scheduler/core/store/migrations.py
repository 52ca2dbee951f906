"""Schema versions and the one list of migrations every store runs.

Contract (the same for every store): a fresh database gets the schema in one
transaction; an older one runs every migration newer than its recorded version and
then applies the schema again (every statement is ``IF NOT EXISTS`` / ``OR REPLACE``),
in the same transaction, so a failure or a ``kill -9`` leaves nothing half-done. Each
step checks before it acts, so running it twice is harmless.

Steps are written once, for every dialect: ``AddColumn`` / ``DropColumn`` carry a
``schema.Column`` (rendered per dialect), data moves run through the small
``SchemaConnection`` adapter each store provides (``?`` placeholders, rows as dicts),
and raw per-dialect SQL appears only where the dialects cannot share it
(``WidenCheck``: SQLite cannot alter a constraint). A store calls ``upgrade`` inside its
own write transaction; which transaction and lock that is stays the store's business.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple, Protocol

from scheduler.base.errors import SchedulerError
from scheduler.core.store import legacy_tables, schema
from scheduler.core.store.base import Params
from scheduler.core.store.schema import BIGINT, SCHEMA_VERSION, TEXT, Column

__all__ = [
    "MIGRATIONS", "SCHEMA_VERSION", "AddColumn", "DropColumn", "DropIndex", "DropTrigger", "Migration",
    "MoveExecutorFields", "CreateTable", "DropEmptyTable", "BindArtifacts", "ReplaceGuard", "SchemaConnection", "StepHook",
    "UpgradeFailed", "WidenCheck", "migrate",
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


class SchemaConnection(Protocol):
    """What migration steps need from a store: its dialect, statements with ``?`` placeholders, a column list.

    Every call runs inside the store's open write transaction.
    """

    #: ``"sqlite"`` or ``"postgresql"``: picks the DDL a ``schema.Column`` renders to.
    dialect: str

    def execute(self, sql: str, params: Params = ()) -> Any:
        """Run one statement."""

    def all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Every row of a query, as dicts."""

    def columns(self, table: str) -> list[str]:
        """The column names of ``table`` in the store's schema (empty when there is no such table)."""


# -- steps --------------------------------------------------------------------------------------------


class AddColumn(NamedTuple):
    """Add ``column`` to ``table`` when it is missing."""

    table: str
    column: Column

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction (a missing table is left to the schema, which creates it whole)."""
        columns = conn.columns(self.table)
        if columns and self.column.name not in columns:
            conn.execute(f"ALTER TABLE {self.table} ADD COLUMN {self.column.definition(conn.dialect)}")


class DropColumn(NamedTuple):
    """Drop ``column`` (as it was defined, kept for the record) from ``table`` when it is present."""

    table: str
    column: Column

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        if self.column.name in conn.columns(self.table):
            conn.execute(f"ALTER TABLE {self.table} DROP COLUMN {self.column.name}")


class DropIndex(NamedTuple):
    """Drop an index the schema no longer has (``sql`` is how it was created, for the record)."""

    name: str
    sql: str

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        conn.execute(f"DROP INDEX IF EXISTS {self.name}")


class DropTrigger(NamedTuple):
    """Drop a guard trigger the schema replaced (``sql`` is the SQLite text it had, for the record)."""

    name: str
    table: str
    sql: str

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        on = f" ON {self.table}" if conn.dialect != "sqlite" else ""
        conn.execute(f"DROP TRIGGER IF EXISTS {self.name}{on}")


class WidenCheck(NamedTuple):
    """Give ``column`` the CHECK of its new definition, which accepts more than ``before`` did.

    Existing rows stay valid (the new check is wider), so no data changes. PostgreSQL
    replaces the column's constraint; SQLite cannot alter a constraint, so the column's
    text in ``sqlite_schema`` is rewritten as SQLite documents for exactly this case
    (``PRAGMA writable_schema``, schema version bumped, inside the migration's
    transaction), after the new table text is proved to parse and every row to pass.
    """

    table: str
    column: Column
    before: Column

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        if self.column.name not in conn.columns(self.table):
            return
        check = self.column.check_expression()
        if conn.dialect != "sqlite":
            name = f"{self.table}_{self.column.name}_check"
            conn.execute(f"ALTER TABLE {self.table} DROP CONSTRAINT IF EXISTS {name}")
            conn.execute(f"ALTER TABLE {self.table} ADD CONSTRAINT {name} CHECK ({check})")
            return
        (row,) = conn.all("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,))
        old_sql = row["sql"]
        new_sql = replace_column_definition(old_sql, self.column.name, self.column.definition("sqlite"))
        if new_sql == old_sql:
            return
        probe = sqlite3.connect(":memory:")
        try:
            probe.execute(new_sql)  # a syntax error here would make the database unreadable below
        finally:
            probe.close()
        if check:
            bad = conn.all(f"SELECT COUNT(*) AS n FROM {self.table} WHERE NOT ({check})")[0]["n"]
            if bad:
                raise ValueError(f"{bad} row(s) of {self.table} fail the new CHECK ({check})")
        version = conn.all("PRAGMA schema_version")[0]["schema_version"]
        conn.execute("PRAGMA writable_schema = ON")
        try:
            conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (new_sql, self.table))
            conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
        finally:
            conn.execute("PRAGMA writable_schema = OFF")


def _split_items(body: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each top-level comma-separated item of a ``CREATE TABLE`` body."""
    items, depth, start, i, n = [], 0, 0, 0, len(body)
    while i < n:
        ch = body[i]
        if ch in "'\"":
            end = body.find(ch, i + 1)
            while end != -1 and body.startswith(ch * 2, end):
                end = body.find(ch, end + 2)
            i = n if end == -1 else end + 1
            continue
        if body.startswith("--", i):
            end = body.find("\n", i)
            i = n if end == -1 else end
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append((start, i))
            start = i + 1
        i += 1
    items.append((start, n))
    return items


_LEADING = re.compile(r"(?:\s+|--[^\n]*(?:\n|$))*")


def replace_column_definition(create_sql: str, column: str, definition: str) -> str:
    """``create_sql`` (a stored ``CREATE TABLE``) with ``column``'s definition replaced by ``definition``.

    Comments and layout around the column are kept. Returns the text unchanged when the
    column already reads ``definition`` (whitespace aside); ``ValueError`` when the column
    is not found.
    """
    open_paren = create_sql.index("(")
    close_paren = create_sql.rindex(")")
    body = create_sql[open_paren + 1 : close_paren]
    for start, end in _split_items(body):
        item = body[start:end]
        lead = _LEADING.match(item)
        code_start = lead.end() if lead else 0
        code = item[code_start:].rstrip()
        if re.match(rf'"?{re.escape(column)}"?\s', code + " ", re.IGNORECASE):
            if code.split() == definition.split():
                return create_sql
            new_item = item[:code_start] + definition + item[code_start + len(code):]
            new_body = body[:start] + new_item + body[end:]
            return create_sql[: open_paren + 1] + new_body + create_sql[close_paren:]
    raise ValueError(f"column {column} not found in {create_sql[:60]!r}...")


#: Executor-specific job columns that v3 moves into ``executor_options`` (old column -> option name).
V3_SHELL_FIELDS = {"shell_env_policy": "env_policy", "working_dir": "working_dir", "stdin_text": "stdin_text"}
V3_AGENT_FIELDS = {"context_mode": "context_mode", "heartbeat_file": "heartbeat_file"}
_V3_DEFAULTS = {"shell_env_policy": "minimal", "context_mode": "isolated"}
_DEFAULT_EXECUTORS = {"shell": "shell", "isolated": "agent", "main": "main-session"}


def v3_executor_options(row: dict[str, Any]) -> str:
    """The ``executor_options`` JSON a v2 job row becomes: its executor's non-default fields under their new names.

    Fields of another executor kind (``context_mode`` on a shell job) were never
    enforced by that executor, so they are not carried over: nothing changes behaviour.
    """
    executor = row.get("executor") or _DEFAULT_EXECUTORS.get(row.get("session_target") or "shell", "shell")
    fields = V3_SHELL_FIELDS if executor == "shell" else V3_AGENT_FIELDS
    options = {}
    for column, option in fields.items():
        value = row.get(column)
        if value is not None and value != _V3_DEFAULTS.get(column):
            options[option] = value
    return json.dumps(options, sort_keys=True)


def v3_executor_handle(row: dict[str, Any]) -> str | None:
    """The ``executor_handle`` JSON of a v2 run row that recorded a process identity."""
    if row.get("pid") is None:
        return None
    owner = row.get("dispatcher_owner")
    return json.dumps({
        "pid": row["pid"], "pgid": row.get("pgid"), "start_time": row.get("process_start_time"),
        "host": owner.split(":", 1)[0] if owner else None,
    }, sort_keys=True)


class MoveExecutorFields(NamedTuple):
    """v3 data move: executor-specific job columns into ``executor_options``, process identity into ``executor_handle``.

    Runs between adding the new columns and dropping the old ones; a second run finds
    the old columns gone and does nothing.
    """

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        if "shell_env_policy" in conn.columns("jobs"):
            cols = ", ".join(["id", "executor", "session_target", *V3_SHELL_FIELDS, *V3_AGENT_FIELDS])
            for row in conn.all(f"SELECT {cols} FROM jobs"):
                conn.execute("UPDATE jobs SET executor_options = ? WHERE id = ?", (v3_executor_options(row), row["id"]))
        if "pid" in conn.columns("runs"):
            for row in conn.all("SELECT id, pid, pgid, process_start_time, dispatcher_owner FROM runs WHERE pid IS NOT NULL"):
                conn.execute("UPDATE runs SET executor_handle = ? WHERE id = ?", (v3_executor_handle(row), row["id"]))


class CreateTable(NamedTuple):
    """Create a table of the current schema (with its indexes and guards) that later steps of a migration fill."""

    table: str

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        for statement in schema.statements_for((schema.table(self.table),), conn.dialect):
            conn.execute(statement)


class DropEmptyTable(NamedTuple):
    """Drop a table no released kernel ever wrote (a placeholder whose layout changed); refuse when it holds rows.

    Only the old layout is dropped: when ``old_column`` is given, a table without it is
    left alone (so running the step again is harmless). The schema applied after the
    migrations re-creates the table in its current layout when it still exists there.
    """

    #: The layout dropped (``scheduler.core.store.legacy_tables``), kept for the record.
    before: schema.Table
    old_column: str | None = None

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        table = self.before.name
        columns = conn.columns(table)
        if not columns or (self.old_column is not None and self.old_column not in columns):
            return
        rows = conn.all(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"]
        if rows:
            raise ValueError(f"{table} holds {rows} row(s) no kernel version wrote; move them aside before upgrading")
        conn.execute(f"DROP TABLE {table}")


class BindArtifacts(NamedTuple):
    """v4 data move: give every job its native execution artifact, and bind its open work to it.

    Open dispatches and unfinished runs are bound to the job's artifact (they were queued
    for the job as it is); finished runs keep no binding (they predate artifacts).
    """

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        from scheduler.base.canonical import canonical_json
        from scheduler.core.artifact import native_payload
        from scheduler.core.spec import spec_from_row

        for job in conn.all("SELECT * FROM jobs WHERE artifact_digest IS NULL"):
            payload = native_payload(spec_from_row(job), job["id"])
            text = canonical_json(payload)
            digest = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
            conn.execute(
                "INSERT INTO execution_artifacts(digest, kind, job_id, payload, payload_bytes, created_at)"
                " VALUES (?, 'native', ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                (digest, job["id"], text, len(text.encode("utf-8")), job["updated_at"]),
            )
            conn.execute("UPDATE jobs SET artifact_digest = ? WHERE id = ?", (digest, job["id"]))
            conn.execute("UPDATE job_dispatch_queue SET artifact_digest = ? WHERE job_id = ? AND artifact_digest IS NULL"
                         " AND status IN ('pending', 'claimed')", (digest, job["id"]))
            conn.execute("UPDATE runs SET artifact_digest = ? WHERE job_id = ? AND artifact_digest IS NULL"
                         " AND status IN ('pending', 'running', 'awaiting_approval', 'approved', 'recovery_blocked')",
                         (digest, job["id"]))


class ReplaceGuard(NamedTuple):
    """Re-create guard ``guard`` of ``table`` as the current schema defines it (a changed ``when``).

    SQLite's ``CREATE TRIGGER IF NOT EXISTS`` would keep the old text, so the trigger is
    dropped and created again in the same transaction; running the step twice gives the same trigger.
    """

    table: str
    guard: str

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        current = schema.table(self.table)
        guard = next(g for g in current.guards if g.name == self.guard)
        statements = schema.guard_statements(current, guard, conn.dialect)
        if conn.dialect == "sqlite":
            def words(sql: str) -> str:
                return " ".join(sql.replace("IF NOT EXISTS ", "").split())

            rows = conn.all("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (self.guard,))
            if rows and words(rows[0]["sql"]) == words(statements[0]):
                return  # already the current guard
            conn.execute(f"DROP TRIGGER IF EXISTS {self.guard}")
        for statement in statements:  # PostgreSQL: CREATE OR REPLACE
            conn.execute(statement)


Step = (AddColumn | DropColumn | DropIndex | DropTrigger | WidenCheck | MoveExecutorFields | CreateTable | DropEmptyTable
        | BindArtifacts | ReplaceGuard)


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
    except Exception as exc:  # noqa: BLE001 - every failure fails closed, naming its phase
        raise UpgradeFailed(phase, exc) from exc

