"""Schema version bookkeeping and the idempotent migrations of the embedded SQLite store.

Contract: a fresh database gets ``schema.sql`` in one transaction; an existing one
runs every migration newer than its recorded version and then re-applies
``schema.sql`` (all ``IF NOT EXISTS``), in the same transaction. Each migration
step checks before it acts, so running it twice is harmless.
"""

from __future__ import annotations

import sqlite3
from functools import lru_cache
from importlib import resources
from typing import Callable

import attrs

#: The version ``schema.sql`` describes. Bump with a new ``Migration`` below.
SCHEMA_VERSION = 2


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
class Migration:
    """One numbered, named migration made of idempotent steps."""

    version: int
    name: str
    steps: tuple[AddColumn, ...]


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
