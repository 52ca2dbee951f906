"""The kinds of schema step a migration is made of, written once for every dialect.

``AddColumn`` / ``DropColumn`` carry a ``schema.Column`` (rendered per dialect); raw
per-dialect SQL appears only where the dialects cannot share it (``WidenCheck``,
``DropReference``: SQLite cannot alter a constraint). Every step runs through the small ``SchemaConnection`` adapter
each store provides (``?`` placeholders, rows as dicts) inside the store's write transaction,
and checks before it acts, so running it twice is harmless. The data moves of particular
versions are ``scheduler.core.store.data_moves``; the list of migrations is ``migrations``.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, NamedTuple, Protocol

from scheduler.core.store import schema
from scheduler.core.store.base import Params
from scheduler.core.store.schema import Column

__all__ = [
    "AddColumn", "CreateTable", "DropColumn", "DropEmptyTable", "DropIndex", "DropReference", "DropTrigger", "ReplaceGuard",
    "RespellChoices", "SchemaConnection", "WidenCheck", "replace_column_definition",
]


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
        check = self.column.check_expression(conn.dialect)
        if conn.dialect != "sqlite":
            name = f"{self.table}_{self.column.name}_check"
            conn.execute(f"ALTER TABLE {self.table} DROP CONSTRAINT IF EXISTS {name}")
            conn.execute(f"ALTER TABLE {self.table} ADD CONSTRAINT {name} CHECK ({check})")
            return
        _rewrite_sqlite_column(conn, self.table, self.column, check)


def _rewrite_sqlite_column(conn: SchemaConnection, table: str, column: Column, check: str | None) -> None:
    """Give ``column`` of a SQLite ``table`` its new definition by rewriting the table's text in ``sqlite_schema``.

    The procedure SQLite documents for removing or changing CHECK and FOREIGN KEY constraints
    (``PRAGMA writable_schema``, schema version bumped, inside the caller's transaction); the
    new table text is proved to parse first, and every row to pass ``check`` when one is given.
    """
    (row,) = conn.all("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    old_sql = row["sql"]
    new_sql = replace_column_definition(old_sql, column.name, column.definition("sqlite"))
    if new_sql == old_sql:
        return
    _probe_sqlite_table(new_sql)
    if check:
        bad = conn.all(f"SELECT COUNT(*) AS n FROM {table} WHERE NOT ({check})")[0]["n"]
        if bad:
            raise ValueError(f"{bad} row(s) of {table} fail the new CHECK ({check})")
    _store_sqlite_table(conn, table, new_sql)


def _probe_sqlite_table(create_sql: str) -> None:
    """Raise when ``create_sql`` does not parse (stored as it is, it would make the database unreadable)."""
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute(create_sql)
    finally:
        probe.close()


def _store_sqlite_table(conn: SchemaConnection, table: str, new_sql: str) -> None:
    """Make ``new_sql`` the stored text of ``table`` (``PRAGMA writable_schema``, schema version bumped)."""
    version = conn.all("PRAGMA schema_version")[0]["schema_version"]
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (new_sql, table))
        conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")


class RespellChoices(NamedTuple):
    """Give the list-of-choices CHECKs of ``table`` the spelling the current schema renders for the store's dialect.

    The refusal is the same (a value outside the list fails either way), so no row is read and
    none changes. Only SQLite's spelling changed (``Column.check_expression``: equalities joined
    by OR, which SQLite evaluates without building an ephemeral index per statement): each
    column's ``CHECK (<IN spelling>)`` in the stored table text becomes ``CHECK (<OR spelling>)``,
    as ``WidenCheck`` rewrites a column; a column whose stored text reads otherwise is left alone.
    """

    table: str

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        if conn.dialect != "sqlite":
            return
        rows = conn.all("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,))
        if not rows:
            return
        old_sql = new_sql = rows[0]["sql"]
        for column in schema.table(self.table).columns:
            if column.choices:
                new_sql = new_sql.replace(f"CHECK ({column.check_expression()})", f"CHECK ({column.check_expression('sqlite')})")
        if new_sql != old_sql:
            _probe_sqlite_table(new_sql)
            _store_sqlite_table(conn, self.table, new_sql)


class DropReference(NamedTuple):
    """Take the foreign key off ``column`` (its new definition has none; ``before`` is the old one, for the record).

    Removing a foreign key fails no row, so no data changes. PostgreSQL drops the column's
    constraint (``<table>_<column>_fkey``, the name it gives an inline ``REFERENCES``); SQLite
    rewrites the column's text as ``WidenCheck`` does.
    """

    table: str
    column: Column
    before: Column

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        if self.column.name not in conn.columns(self.table):
            return
        if conn.dialect != "sqlite":
            conn.execute(f"ALTER TABLE {self.table} DROP CONSTRAINT IF EXISTS {self.table}_{self.column.name}_fkey")
            return
        _rewrite_sqlite_column(conn, self.table, self.column, None)


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
