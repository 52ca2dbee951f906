"""The PostgreSQL schema file, its statements, and the idempotent PostgreSQL migrations.

Same contract as the kernel's SQLite migrations (``scheduler.store.migrations``): a
fresh schema gets ``schema.sql`` in one transaction; an existing one runs every
migration newer than its recorded version and then re-applies ``schema.sql``, in the
same transaction (PostgreSQL DDL is transactional, so a failure leaves nothing
behind). Each step checks before it acts (``ADD COLUMN IF NOT EXISTS``), so running
it twice is harmless.

The version numbers are shared with the kernel: this store refuses to run when the
kernel expects a schema version other than the one ``schema.sql`` here describes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import Any, Protocol

import attrs

#: The version this package's ``schema.sql`` describes (must equal the kernel's
#: ``scheduler.store.migrations.SCHEMA_VERSION``; ``initialize`` checks).
SCHEMA_VERSION = 3

_DOLLAR_QUOTE = re.compile(r"\$[A-Za-z_]*\$")


@lru_cache(maxsize=1)
def schema_text() -> str:
    """The packaged PostgreSQL ``schema.sql``."""
    return resources.files("scheduler_store_postgres").joinpath("schema.sql").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def schema_fingerprint() -> str:
    """SHA-256 of ``schema.sql``: lets ``initialize`` skip re-applying an unchanged schema (no table locks)."""
    return hashlib.sha256(schema_text().encode("utf-8")).hexdigest()


def split_statements(text: str) -> tuple[str, ...]:
    """Split SQL text into statements on ``;`` at end of line, keeping dollar-quoted bodies whole.

    Comment-only lines between statements are dropped. An unterminated statement or an
    unclosed dollar quote raises ``ValueError`` so a broken schema file fails loudly.
    """
    statements: list[str] = []
    buf: list[str] = []
    open_quote: str | None = None
    for line in text.splitlines():
        if not buf and open_quote is None and (not line.strip() or line.lstrip().startswith("--")):
            continue
        buf.append(line)
        code = line if open_quote else line.split("--", 1)[0]
        for tag in _DOLLAR_QUOTE.findall(code):
            if open_quote is None:
                open_quote = tag
            elif tag == open_quote:
                open_quote = None
        if open_quote is None and code.rstrip().endswith(";"):
            statements.append("\n".join(buf).strip())
            buf = []
    if open_quote is not None:
        raise ValueError(f"schema.sql ends inside a {open_quote} quoted body")
    if buf and "".join(buf).strip():
        raise ValueError("schema.sql ends with an incomplete statement")
    return tuple(statements)


@lru_cache(maxsize=1)
def schema_statements() -> tuple[str, ...]:
    """The packaged ``schema.sql`` split into statements."""
    return split_statements(schema_text())


_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS\s+(\w+)", re.IGNORECASE)
_CREATE_TRIGGER = re.compile(r"^CREATE (?:OR REPLACE )?TRIGGER\s+(\w+)\s+\w+\s+(?:\w+\s+)*?ON\s+(\w+)", re.IGNORECASE)
_CREATE_INDEX = re.compile(r"^CREATE INDEX IF NOT EXISTS\s+(\w+)", re.IGNORECASE)


@lru_cache(maxsize=1)
def expected_tables() -> frozenset[str]:
    """Table names ``schema.sql`` creates (for ``health`` and the fast path of ``initialize``)."""
    return frozenset(m.group(1) for s in schema_statements() if (m := _CREATE_TABLE.match(s)))


@lru_cache(maxsize=1)
def expected_triggers() -> frozenset[tuple[str, str]]:
    """``(trigger, table)`` pairs ``schema.sql`` creates."""
    pairs = set()
    for statement in schema_statements():
        head = " ".join(statement.split())
        m = _CREATE_TRIGGER.match(head)
        if m:
            pairs.add((m.group(1), m.group(2)))
    return frozenset(pairs)


@lru_cache(maxsize=1)
def expected_indexes() -> frozenset[str]:
    """Named indexes ``schema.sql`` creates."""
    return frozenset(m.group(1) for s in schema_statements() if (m := _CREATE_INDEX.match(s)))


class Cursorish(Protocol):
    """The slice of a psycopg connection the migration steps use."""

    def execute(self, query: Any, params: Any = None, /) -> Any: ...


@attrs.frozen
class AddColumn:
    """Add a column when it is missing (``ADD COLUMN IF NOT EXISTS``: idempotent)."""

    table: str
    column: str
    ddl: str

    def apply(self, conn: Cursorish) -> None:
        """Run the step on the caller's open transaction."""
        conn.execute(f"ALTER TABLE {self.table} ADD COLUMN IF NOT EXISTS {self.column} {self.ddl}")


@attrs.frozen
class Sql:
    """A raw, already idempotent statement (``CREATE INDEX IF NOT EXISTS ...``)."""

    statement: str

    def apply(self, conn: Cursorish) -> None:
        """Run the step on the caller's open transaction."""
        conn.execute(self.statement)


@attrs.frozen
class DropColumn:
    """Drop a column when it is present (``DROP COLUMN IF EXISTS``: idempotent)."""

    table: str
    column: str

    def apply(self, conn: Cursorish) -> None:
        """Run the step on the caller's open transaction."""
        conn.execute(f"ALTER TABLE {self.table} DROP COLUMN IF EXISTS {self.column}")


def _column_names(conn: Cursorish, table: str) -> set[str]:
    cur = conn.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = %s",
                       (table,))
    return {r[0] for r in cur.fetchall()}


def _dict_rows(conn: Cursorish, sql: str) -> list[dict[str, Any]]:
    cur = conn.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, values)) for values in cur.fetchall()]


@attrs.frozen
class MoveExecutorFields:
    """v3 data move, the same rule as the kernel's (``v3_executor_options`` / ``v3_executor_handle``)."""

    def apply(self, conn: Cursorish) -> None:
        """Run the step on the caller's open transaction."""
        from scheduler.store.migrations import V3_AGENT_FIELDS, V3_SHELL_FIELDS, v3_executor_handle, v3_executor_options

        if "shell_env_policy" in _column_names(conn, "jobs"):
            cols = ", ".join(["id", "executor", "session_target", *V3_SHELL_FIELDS, *V3_AGENT_FIELDS])
            for row in _dict_rows(conn, f"SELECT {cols} FROM jobs"):
                conn.execute("UPDATE jobs SET executor_options = %s WHERE id = %s", (v3_executor_options(row), row["id"]))
        if "pid" in _column_names(conn, "runs"):
            for row in _dict_rows(conn, "SELECT id, pid, pgid, process_start_time, dispatcher_owner FROM runs WHERE pid IS NOT NULL"):
                conn.execute("UPDATE runs SET executor_handle = %s WHERE id = %s", (v3_executor_handle(row), row["id"]))


Step = AddColumn | Sql | DropColumn | MoveExecutorFields


@attrs.frozen
class Migration:
    """One numbered, named migration made of idempotent steps."""

    version: int
    name: str
    steps: tuple[Step, ...]


#: PostgreSQL migrations. No PostgreSQL database was ever created below version 2,
#: but version 2 mirrors the kernel's migration 2 so both stores share one history and
#: the mechanism is exercised by a real step (the tests rebuild a v1 schema and upgrade it).
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        2,
        "per-job schedule policies: misfire, DST gap and fold, auto-pause threshold",
        (
            AddColumn(
                "jobs", "misfire_policy", "TEXT NOT NULL DEFAULT 'coalesce' CHECK (misfire_policy IN ('coalesce', 'skip'))"
            ),
            AddColumn("jobs", "dst_gap_policy", "TEXT NOT NULL DEFAULT 'shift' CHECK (dst_gap_policy IN ('shift', 'skip'))"),
            AddColumn("jobs", "dst_fold_policy", "TEXT NOT NULL DEFAULT 'once' CHECK (dst_fold_policy IN ('once', 'twice'))"),
            AddColumn(
                "jobs",
                "max_consecutive_failures",
                "BIGINT NOT NULL DEFAULT 3 CHECK (max_consecutive_failures >= 0)",
            ),
        ),
    ),
    Migration(
        3,
        "plugin-owned options: executor fields into executor_options, process identity into executor_handle",
        (
            AddColumn("jobs", "executor_options", "TEXT NOT NULL DEFAULT '{}'"),
            AddColumn("jobs", "delivery_options", "TEXT NOT NULL DEFAULT '{}'"),
            AddColumn("jobs", "constraints", "TEXT NOT NULL DEFAULT '{}'"),
            AddColumn("runs", "executor_handle", "TEXT"),
            AddColumn("runs", "usage_json", "TEXT"),
            MoveExecutorFields(),
            *(DropColumn("jobs", c) for c in ("shell_env_policy", "working_dir", "stdin_text", "context_mode", "heartbeat_file")),
            *(DropColumn("runs", c) for c in ("pid", "pgid", "process_start_time")),
        ),
    ),
)

#: Test hook: called with (version, step_index) before each step; lets tests interrupt a migration.
StepHook = Callable[[int, int], None]


def migrate(
    conn: Cursorish,
    from_version: int,
    now: int,
    step_hook: StepHook | None = None,
    migrations: tuple[Migration, ...] = MIGRATIONS,
) -> list[int]:
    """Apply every migration above ``from_version`` inside the caller's open transaction.

    Returns the versions applied, in order. Each applied version is recorded in
    ``schema_migrations`` (``ON CONFLICT DO NOTHING``) in the same transaction.
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
            "INSERT INTO schema_migrations(version, name, applied_at) VALUES (%s, %s, %s) ON CONFLICT (version) DO NOTHING",
            (migration.version, migration.name, now),
        )
        applied.append(migration.version)
    return applied
