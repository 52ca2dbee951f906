"""Schema version bookkeeping and the idempotent migrations of the embedded SQLite store.

Contract: a fresh database gets ``schema.sql`` in one transaction; an existing one
runs every migration newer than its recorded version and then re-applies
``schema.sql`` (all ``IF NOT EXISTS``), in the same transaction. Each migration
step checks before it acts, so running it twice is harmless.
"""

from __future__ import annotations

import json
import sqlite3
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Iterable

import attrs

#: The version ``schema.sql`` describes. Bump with a new ``Migration`` below.
SCHEMA_VERSION = 3


@lru_cache(maxsize=1)
def schema_text() -> str:
    """The packaged ``schema.sql`` (the single copy; in a source tree a symlink to the top-level file)."""
    return resources.files("scheduler").joinpath("schema.sql").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def schema_statements() -> tuple[str, ...]:
    """``schema.sql`` split into complete statements (trigger bodies kept whole)."""
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


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


@attrs.frozen
class AddColumn:
    """Add a column when it is missing (idempotent)."""

    table: str
    column: str
    ddl: str

    def apply(self, conn: sqlite3.Connection) -> None:
        if self.column not in _columns(conn, self.table):
            conn.execute(f"ALTER TABLE {self.table} ADD COLUMN {self.column} {self.ddl}")


@attrs.frozen
class DropColumn:
    """Drop a column when it is present (idempotent)."""

    table: str
    column: str

    def apply(self, conn: sqlite3.Connection) -> None:
        if self.column in _columns(conn, self.table):
            conn.execute(f"ALTER TABLE {self.table} DROP COLUMN {self.column}")


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


def _rows(conn: sqlite3.Connection, sql: str) -> Iterable[dict[str, Any]]:
    cur = conn.execute(sql)
    names = [d[0] for d in cur.description]
    for values in cur.fetchall():
        yield dict(zip(names, values))


@attrs.frozen
class MoveExecutorFields:
    """v3 data move: executor-specific job columns into ``executor_options``, process identity into ``executor_handle``.

    Runs between adding the new columns and dropping the old ones; a second run finds
    the old columns gone and does nothing.
    """

    def apply(self, conn: sqlite3.Connection) -> None:
        jobs = _columns(conn, "jobs")
        if "shell_env_policy" in jobs:
            cols = ", ".join(["id", "executor", "session_target", *V3_SHELL_FIELDS, *V3_AGENT_FIELDS])
            for row in list(_rows(conn, f"SELECT {cols} FROM jobs")):
                conn.execute("UPDATE jobs SET executor_options = ? WHERE id = ?", (v3_executor_options(row), row["id"]))
        if "pid" in _columns(conn, "runs"):
            for row in list(_rows(conn, "SELECT id, pid, pgid, process_start_time, dispatcher_owner FROM runs WHERE pid IS NOT NULL")):
                conn.execute("UPDATE runs SET executor_handle = ? WHERE id = ?", (v3_executor_handle(row), row["id"]))


@attrs.frozen
class Migration:
    """One numbered, named migration made of idempotent steps."""

    version: int
    name: str
    steps: tuple[AddColumn | DropColumn | MoveExecutorFields, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        2,
        "per-job schedule policies: misfire, DST gap and fold, auto-pause threshold",
        (
            AddColumn("jobs", "misfire_policy", "TEXT NOT NULL DEFAULT 'coalesce' CHECK (misfire_policy IN ('coalesce', 'skip'))"),
            AddColumn("jobs", "dst_gap_policy", "TEXT NOT NULL DEFAULT 'shift' CHECK (dst_gap_policy IN ('shift', 'skip'))"),
            AddColumn("jobs", "dst_fold_policy", "TEXT NOT NULL DEFAULT 'once' CHECK (dst_fold_policy IN ('once', 'twice'))"),
            AddColumn(
                "jobs",
                "max_consecutive_failures",
                "INTEGER NOT NULL DEFAULT 3 CHECK (max_consecutive_failures >= 0)",
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
            *(DropColumn("jobs", c) for c in (*V3_SHELL_FIELDS, *V3_AGENT_FIELDS)),
            *(DropColumn("runs", c) for c in ("pid", "pgid", "process_start_time")),
        ),
    ),
)

#: Test hook: called with (version, step_index) before each step; lets tests interrupt a migration.
StepHook = Callable[[int, int], None]


def migrate(conn: sqlite3.Connection, from_version: int, now: int, step_hook: StepHook | None = None) -> list[int]:
    """Apply every migration above ``from_version`` inside the caller's open transaction."""
    applied = []
    for migration in MIGRATIONS:
        if migration.version <= from_version:
            continue
        for index, step in enumerate(migration.steps):
            if step_hook is not None:
                step_hook(migration.version, index)
            step.apply(conn)
        conn.execute(
            "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?) ON CONFLICT(version) DO NOTHING",
            (migration.version, migration.name, now),
        )
        applied.append(migration.version)
    return applied
