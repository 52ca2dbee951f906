"""The store interface: what the kernel needs from a database, and nothing dialect-specific.

Kernel logic (jobs, queue, lease, run state, completion) writes portable SQL with
``?`` placeholders and ``ON CONFLICT`` / ``RETURNING`` clauses that both SQLite
(>= 3.35) and PostgreSQL understand. Rules for that SQL: no SQLite-only syntax
(``INSERT OR IGNORE``, ``IFNULL``, two-argument ``MAX``/``MIN``, ``json_*``, ``GLOB``);
no TEXT column compared with an integer parameter; never continue a transaction
after catching ``CONSTRAINT_VIOLATION`` (PostgreSQL aborts the whole transaction:
use ``ON CONFLICT`` instead); never write inside ``read()`` (PostgreSQL refuses it).
Everything that differs between dialects lives behind this interface: connection
handling, transaction start, row locking for claims, wake-up signalling, schema
initialisation and health checks. Where the kernel needs a decision that depends on
the kind of database (one dispatcher or many, a file beside which to keep the pid file
and artifacts), the store states it as an attribute (``exclusive_dispatch``,
``local_path``): kernel code outside ``scheduler.core.store`` never tests ``dialect`` or the
shape of ``location`` (a test enforces this).

The schema itself is one dialect-neutral definition (``scheduler.core.store.schema``) and
one migration list (``scheduler.core.store.migrations``); a store plugin reaches both, and
everything else it needs, through ``scheduler_toolkit.store`` (its contract, ``Store`` and ``Tx``, is ``scheduler.api.store``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from scheduler.core.rows import JSONObject

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
    """A database the kernel runs on: the built-in SQLite store, or a plugin such as PostgreSQL.

    **Transactions nest per thread.** ``transaction()`` opened while the same thread
    already has a transaction open on this store does not start a new one: it joins the
    outer one and yields a ``Tx`` on it. (Do not open ``transaction()`` inside a plain
    ``read()``: it would join a read-only snapshot.) Nothing is committed when an
    inner block exits; the outermost block commits when it exits normally and rolls back
    everything (inner blocks included) when an exception leaves it. An exception an inner
    block raises and the outer block catches does not undo the inner block's statements
    on its own (there are no savepoints), and on PostgreSQL a failed statement aborts the
    whole transaction: let such errors propagate. ``read()`` outside any transaction is a
    consistent read-only snapshot of committed data (several queries see one state);
    ``read()`` inside a ``transaction()`` joins it and therefore sees that transaction's
    own uncommitted writes. Never write inside a ``read()`` that is not nested in a
    ``transaction()``. Transactions are per thread: another thread's ``transaction()`` is
    a separate transaction (on SQLite it waits for the first to finish).

    **Optional: ``verify_identity()``.** A store kept in a local file may offer it: it raises
    ``DB_VANISHED`` when the path no longer names the file it opened (deleted or replaced).
    The dispatcher's lease keeper calls it before every renewal when present (the SQLite
    store has it); a server database (PostgreSQL) has no file to vanish and leaves it out.
    """

    #: ``"sqlite"`` or ``"postgresql"``; informational only (messages, ``doctor``): kernel logic must not branch on it.
    dialect: str
    #: Where the data lives, for messages (a path or a URL with the password removed). Never parsed by the kernel.
    location: str
    #: True when the database allows one dispatcher at a time (SQLite: one writer per file), so dispatchers
    #: share one lease name and a pid file; False when several dispatchers may share it, each with its own lease.
    exclusive_dispatch: bool
    @property
    def local_path(self) -> Path | None:
        """The database file when the store is a local file (the dispatcher's pid file and the default artifacts
        directory live beside it); None for a server database."""

    def initialize(self, *, readonly: bool = False) -> None:
        """Fail-closed initialisation: schema, migrations; raise ``DB_INIT_FAILED`` on any problem.

        Opening an up-to-date database writes nothing (no write transaction, no lock
        beyond a read). Only a missing, empty or older database is written to: created or
        migrated in one transaction. With ``readonly=True`` (commands that only read) that
        write is refused instead: ``DB_INIT_FAILED`` saying the database must be created or
        migrated first. A lock held by another process past the busy timeout is ``DB_BUSY``
        (retryable), never ``DB_INIT_FAILED``. Calling it again on an initialised store is a no-op.
        """

    def transaction(self) -> AbstractContextManager[Tx]:
        """A write transaction, exclusive enough that claims made in it cannot be double-granted (nesting: see the class)."""

    def read(self) -> AbstractContextManager[Tx]:
        """A read-only snapshot; inside ``transaction()`` it joins that transaction (see the class)."""

    def notify_change(self) -> None:
        """Tell sleeping dispatchers that jobs or the queue changed (after a commit)."""

    def wait_for_change(self, timeout_s: float) -> bool:
        """True once another process changed the database since this thread's previous call.

        Blocks up to ``timeout_s`` waiting for such a change; ``0`` is a non-blocking check.
        """

    def health(self) -> list[JSONObject]:
        """Checks for ``doctor``: each ``{"check", "ok", "detail"}``."""

    def schema_version(self) -> int:
        """The migration version the database is at."""

    def close(self) -> None:
        """Release connections held by this process."""
