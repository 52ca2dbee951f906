"""The PostgreSQL side of the kernel's schema machinery: a ``SchemaConnection`` over psycopg.

The schema and the migrations themselves are the kernel's, the same for every store
(``scheduler_toolkit.store``): this module only lets them run on a psycopg connection inside
the store's initialisation transaction. Kernel SQL uses ``?`` placeholders; they become
psycopg's ``%s`` here exactly as in ``PgTx`` (``sqlcompat.prepare``), and a statement
without parameters (a PL/pgSQL body full of ``%``) goes through untouched.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from scheduler_toolkit.store import Params

from scheduler_store_postgres.sqlcompat import prepare


class PgSchemaConnection:
    """``scheduler_toolkit.store.SchemaConnection`` on one psycopg connection (inside its open transaction)."""

    dialect = "postgresql"

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Params = ()) -> None:
        """Run one statement."""
        query, args = prepare(sql, params)
        with self._conn.cursor() as cur:
            cur.execute(query, args)

    def all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Every row of a query, as dicts."""
        query, args = prepare(sql, params)
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, args)
            return [dict(r) for r in cur.fetchall()] if cur.description is not None else []

    def columns(self, table: str) -> list[str]:
        """The column names of ``table`` in the store's schema (``current_schema()``), in order."""
        rows = self.all(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ?"
            " ORDER BY ordinal_position",
            (table,),
        )
        return [r["column_name"] for r in rows]
