"""The store interface: what the kernel needs from a database, and nothing dialect-specific.

Kernel logic (jobs, queue, lease, run state, completion) writes portable SQL with
``?`` placeholders and ``ON CONFLICT`` / ``RETURNING`` clauses that both SQLite
(>= 3.35) and PostgreSQL understand. Rules for that SQL: no SQLite-only syntax
(``INSERT OR IGNORE``, ``IFNULL``, two-argument ``MAX``/``MIN``, ``json_*``, ``GLOB``);
no TEXT column compared with an integer parameter; never continue a transaction
after catching ``CONSTRAINT_VIOLATION`` (PostgreSQL aborts the whole transaction:
use ``ON CONFLICT`` instead); never write inside ``read()`` (PostgreSQL refuses it). Everything that differs between dialects
lives behind this interface: connection handling, transaction start, row locking
for claims, wake-up signalling, schema initialisation and health checks.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, Sequence, runtime_checkable

Params = Sequence[Any]


@runtime_checkable
class Tx(Protocol):
    """One open transaction (or read snapshot) on a store."""

    #: ``" FOR UPDATE SKIP LOCKED"`` where the dialect has row locks; ``""`` where
    #: the whole write transaction is already exclusive (SQLite ``BEGIN IMMEDIATE``).
    skip_locked: str
    #: ``" FOR UPDATE"`` where the dialect has row locks (serialises per-job decisions across
    #: dispatchers); ``""`` on SQLite, where the write transaction is already exclusive.
    for_update: str

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run a statement; return the number of rows it changed."""

    def one(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        """First row of a query as a dict, or None."""

    def all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Every row of a query as dicts."""

    def scalar(self, sql: str, params: Params = ()) -> Any:
        """First column of the first row, or None."""


@runtime_checkable
class Store(Protocol):
    """A database the kernel runs on: the built-in SQLite store, or a plugin such as PostgreSQL."""

    #: ``"sqlite"`` or ``"postgresql"``; informational only, kernel logic must not branch on it.
    dialect: str
    #: Where the data lives, for messages (a path or a URL with the password removed).
    location: str

    def initialize(self) -> None:
        """Fail-closed initialisation: schema, migrations; raise ``DB_INIT_FAILED`` on any problem."""

    def transaction(self) -> AbstractContextManager[Tx]:
        """A write transaction, exclusive enough that claims made in it cannot be double-granted."""

    def read(self) -> AbstractContextManager[Tx]:
        """A read-only snapshot."""

    def notify_change(self) -> None:
        """Tell sleeping dispatchers that jobs or the queue changed (after a commit)."""

    def wait_for_change(self, timeout_s: float) -> bool:
        """True once another process changed the database since this thread's previous call.

        Blocks up to ``timeout_s`` waiting for such a change; ``0`` is a non-blocking check.
        """

    def health(self) -> list[dict[str, Any]]:
        """Checks for ``doctor``: each ``{"check", "ok", "detail"}``."""

    def schema_version(self) -> int:
        """The migration version the database is at."""

    def close(self) -> None:
        """Release connections held by this process."""
