"""Statements on one SQLite connection: the busy timeout and ``DB_BUSY``, the ``Tx`` a store transaction yields, the
schema adapter migrations run through, and the per-thread connection slot ``SQLiteStore`` keeps.

A lock held by another connection past the busy timeout is ``DB_BUSY`` (retryable), never a raw
``sqlite3.OperationalError``; a connection is closed only when no statement runs on it (``Slot``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from itertools import repeat
from operator import itemgetter
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.core.store.base import Params
from scheduler.settings import current_settings

#: The SQLite store's logger (these statements are its own).
log = logging.getLogger("scheduler.core.store.sqlite")

#: How long a connection waits for another connection's lock before ``DB_BUSY``.
BUSY_TIMEOUT_MS = 10_000
#: The override variable of ``[storage] sqlite_busy_timeout_ms`` (default ``BUSY_TIMEOUT_MS``).
BUSY_TIMEOUT_ENV = "SCHEDULER_STORAGE_SQLITE_BUSY_TIMEOUT_MS"

def default_busy_timeout_ms() -> int:
    """The busy timeout of new connections: the ``[storage] sqlite_busy_timeout_ms`` setting.

    Overridden by ``SCHEDULER_STORAGE_SQLITE_BUSY_TIMEOUT_MS`` (tests shorten it); the
    settings loader validates it (``CONFIG_INVALID``).
    """
    return int(current_settings().storage.sqlite_busy_timeout_ms)


def is_busy(exc: BaseException) -> bool:
    """Whether a sqlite3 error means another connection holds a lock (SQLITE_BUSY / SQLITE_LOCKED)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (and their extended codes)
    return "is locked" in str(exc)


def is_full(exc: BaseException) -> bool:
    """Whether a sqlite3 error means the disk (or the database's page limit) is full (SQLITE_FULL)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == 13  # SQLITE_FULL
    return "database or disk is full" in str(exc)


def disk_full_error(location: str, what: str) -> SchedulerError:
    """``DB_DISK_FULL``: a write found no room (the file system, or ``max_page_count``); nothing of it was kept.

    Retryable: the dispatcher waits and tries again (``scheduler status`` shows when it last happened)
    instead of exiting into a restart loop that cannot help.
    """
    return SchedulerError(
        "DB_DISK_FULL",
        f"database {location} is full: {what}; free space on its file system, the dispatcher retries",
        details={"path": location},
    )


def busy_error(location: str, timeout_ms: int, what: str) -> SchedulerError:
    """``DB_BUSY``: the database stayed locked by another connection; retrying later may succeed."""
    return SchedulerError(
        "DB_BUSY",
        f"database {location} is busy: {what} (waited {timeout_ms} ms); try again later",
        details={"path": location, "busy_timeout_ms": timeout_ms},
    )


def execute(conn: sqlite3.Connection, sql: str, params: Params, location: str, timeout_ms: int) -> sqlite3.Cursor:
    """Run one statement; a lock held past the busy timeout is ``DB_BUSY``, no room left ``DB_DISK_FULL`` (both
    retryable), not a raw error."""
    try:
        return conn.execute(sql, params)
    except sqlite3.OperationalError as exc:
        if is_busy(exc):
            raise busy_error(location, timeout_ms, f"database is locked ({exc})") from None
        if is_full(exc):
            raise disk_full_error(location, str(exc)) from None
        raise


#: A column's name in ``cursor.description`` (read in C, per column of every row a read returns).
_NAME = itemgetter(0)


class SQLiteTx:
    """A transaction on one SQLite connection."""

    skip_locked = ""
    for_update = ""

    def __init__(self, conn: sqlite3.Connection, location: str = "", timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self._conn = conn
        self._location = location
        self._timeout_ms = timeout_ms

    def _run(self, sql: str, params: Params) -> sqlite3.Cursor:
        try:
            return execute(self._conn, sql, params, self._location, self._timeout_ms)
        except sqlite3.IntegrityError as exc:
            raise SchedulerError("CONSTRAINT_VIOLATION", str(exc)) from None

    def execute(self, sql: str, params: Params = ()) -> int:
        return self._run(sql, params).rowcount

    def one(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        cur = self._run(sql, params)
        row = cur.fetchone()
        return dict(zip(map(_NAME, cur.description), row, strict=True)) if row is not None else None

    def all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        cur = self._run(sql, params)
        rows = cur.fetchall()
        if not rows:
            return []
        cols = list(map(_NAME, cur.description))
        # dict per row in C (map/zip): the dispatcher's reads return a row per candidate, several per run
        return list(map(dict, map(zip, repeat(cols), rows)))

    def scalar(self, sql: str, params: Params = ()) -> Any:
        row = self._run(sql, params).fetchone()
        return row[0] if row is not None else None


class Slot:
    """One thread's connection, and whether a statement or transaction is using it right now.

    ``users`` counts the active uses (nested ones included); ``close()`` only closes a
    slot with no user and otherwise marks it ``doomed``, so its thread closes it when
    the last use ends. ``guard`` makes "start using" and "close" mutually exclusive.
    """

    __slots__ = ("closed", "conn", "depth", "doomed", "guard", "seen_version", "thread", "users")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.thread = threading.current_thread()
        self.guard = threading.Lock()
        self.users = 0
        #: Transaction nesting of the owning thread (0: none open).
        self.depth = 0
        self.doomed = False
        self.closed = False
        #: The ``PRAGMA data_version`` this thread last saw on this connection (``wait_for_change``).
        self.seen_version: int | None = None

    @property
    def retired(self) -> bool:
        """Closed, or to be closed when its current use ends: no new use may start."""
        return self.closed or self.doomed

    def _close_now(self) -> None:
        self.closed = True
        try:
            self.conn.close()
        except sqlite3.Error as exc:  # pragma: no cover - closing never fails on an idle connection
            log.debug("closing a SQLite connection: %s", exc)

    def retire(self) -> None:
        """Close the connection now if nothing uses it, else let its thread close it when done."""
        with self.guard:
            if self.closed:
                return
            if self.users:
                self.doomed = True
            else:
                self._close_now()


def init_failed(phase: str, path: str, exc: BaseException | str) -> SchedulerError:
    return SchedulerError(
        "DB_INIT_FAILED",
        f"database initialisation failed during {phase} of {path}: {exc}",
        details={"phase": phase, "path": path},
    )


class SQLiteSchemaConnection:
    """``migrations.SchemaConnection`` over a raw SQLite connection (inside its open ``BEGIN IMMEDIATE``)."""

    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection, location: str = "", timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self._conn = conn
        self._location = location
        self._timeout_ms = timeout_ms

    def _run(self, sql: str, params: Params) -> sqlite3.Cursor:
        return execute(self._conn, sql, params, self._location, self._timeout_ms)

    def execute(self, sql: str, params: Params = ()) -> None:
        """Run one statement."""
        self._run(sql, params)

    def all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Every row of a query, as dicts."""
        cur = self._run(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def columns(self, table: str) -> list[str]:
        """The column names of ``table``."""
        return [r[1] for r in self._run(f"PRAGMA table_info({table})", ())]
