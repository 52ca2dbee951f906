"""The built-in embedded store: one SQLite file in WAL mode.

Each thread gets its own connection (SQLite connections are not shareable across
threads). Write transactions use ``BEGIN IMMEDIATE`` so a claim made inside one is
exclusive across processes; that is why ``skip_locked`` is empty here. Other
processes' commits are noticed through ``PRAGMA data_version``, which is how an
idle dispatcher wakes within milliseconds of a CLI ``jobs add`` without a socket.

Connections and threads: a connection is only ever used by the thread that opened it,
and only ever closed when no statement runs on it. ``close()`` closes idle connections
(its own, and those of threads between statements or no longer alive) and leaves a
connection in use to its thread, which closes it when its statement or transaction
ends: closing a connection under a thread blocked in ``execute`` crashed the process.
A lock held by another connection past the busy timeout is ``DB_BUSY`` (retryable),
never a raw ``sqlite3.OperationalError``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from scheduler import PLUGIN_API_VERSION
from scheduler.core import filemodes
from scheduler.base.errors import SchedulerError
from scheduler.settings import current_settings
from scheduler.core.store import default_artifacts_root, migrations, schema
from scheduler.core.store.base import Params
from scheduler.base.timeutil import now_ms

log = logging.getLogger(__name__)

#: How long a connection waits for another connection's lock before ``DB_BUSY``.
BUSY_TIMEOUT_MS = 10_000
#: The override variable of ``[storage] sqlite_busy_timeout_ms`` (default ``BUSY_TIMEOUT_MS``).
BUSY_TIMEOUT_ENV = "SCHEDULER_STORAGE_SQLITE_BUSY_TIMEOUT_MS"
#: How often an idle dispatcher looks at ``data_version`` (well inside the 250 ms wake-up promise).
CHANGE_POLL_S = 0.02
#: How often the background thread folds the WAL back into the database (PASSIVE beside the writers, then the few
#: frames appended meanwhile with this process's writers held back, so the WAL starts over: see ``_checkpointer``).
CHECKPOINT_INTERVAL_S = 0.25
_SQLITE_HEADER = b"SQLite format 3\x00"


def default_busy_timeout_ms() -> int:
    """The busy timeout of new connections: the ``[storage] sqlite_busy_timeout_ms`` setting.

    Overridden by ``SCHEDULER_STORAGE_SQLITE_BUSY_TIMEOUT_MS`` (tests shorten it); the
    settings loader validates it (``CONFIG_INVALID``).
    """
    return int(current_settings().storage.sqlite_busy_timeout_ms)


def _is_busy(exc: BaseException) -> bool:
    """Whether a sqlite3 error means another connection holds a lock (SQLITE_BUSY / SQLITE_LOCKED)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (and their extended codes)
    return "is locked" in str(exc)


def _busy_error(location: str, timeout_ms: int, what: str) -> SchedulerError:
    """``DB_BUSY``: the database stayed locked by another connection; retrying later may succeed."""
    return SchedulerError(
        "DB_BUSY",
        f"database {location} is busy: {what} (waited {timeout_ms} ms); try again later",
        details={"path": location, "busy_timeout_ms": timeout_ms},
    )


def _execute(conn: sqlite3.Connection, sql: str, params: Params, location: str, timeout_ms: int) -> sqlite3.Cursor:
    """Run one statement; a lock held past the busy timeout is ``DB_BUSY`` (retryable), not a raw error."""
    try:
        return conn.execute(sql, params)
    except sqlite3.OperationalError as exc:
        if _is_busy(exc):
            raise _busy_error(location, timeout_ms, f"database is locked ({exc})") from None
        raise


class _SQLiteTx:
    """A transaction on one SQLite connection."""

    skip_locked = ""
    for_update = ""

    def __init__(self, conn: sqlite3.Connection, location: str = "", timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self._conn = conn
        self._location = location
        self._timeout_ms = timeout_ms

    def _run(self, sql: str, params: Params) -> sqlite3.Cursor:
        try:
            return _execute(self._conn, sql, params, self._location, self._timeout_ms)
        except sqlite3.IntegrityError as exc:
            raise SchedulerError("CONSTRAINT_VIOLATION", str(exc)) from None

    def execute(self, sql: str, params: Params = ()) -> int:
        return self._run(sql, params).rowcount

    def one(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        cur = self._run(sql, params)
        row = cur.fetchone()
        return dict(zip([d[0] for d in cur.description], row)) if row is not None else None

    def all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        cur = self._run(sql, params)
        rows = cur.fetchall()
        if not rows:
            return []
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in rows]

    def scalar(self, sql: str, params: Params = ()) -> Any:
        row = self._run(sql, params).fetchone()
        return row[0] if row is not None else None


class _Slot:
    """One thread's connection, and whether a statement or transaction is using it right now.

    ``users`` counts the active uses (nested ones included); ``close()`` only closes a
    slot with no user and otherwise marks it ``doomed``, so its thread closes it when
    the last use ends. ``guard`` makes "start using" and "close" mutually exclusive.
    """

    __slots__ = ("conn", "thread", "guard", "users", "depth", "doomed", "closed", "seen_version")

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


def _fail(phase: str, path: str, exc: BaseException | str) -> SchedulerError:
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
        return _execute(self._conn, sql, params, self._location, self._timeout_ms)

    def execute(self, sql: str, params: Params = ()) -> None:
        """Run one statement."""
        self._run(sql, params)

    def all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Every row of a query, as dicts."""
        cur = self._run(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def columns(self, table: str) -> list[str]:
        """The column names of ``table``."""
        return [r[1] for r in self._run(f"PRAGMA table_info({table})", ())]


@lru_cache(maxsize=1)
def _expected_objects() -> frozenset[tuple[str, str]]:
    """``(type, name)`` of every table, index and trigger the schema creates."""
    return frozenset(
        {("table", n) for n in schema.table_names()}
        | {("index", n) for n in schema.index_names()}
        | {("trigger", n) for n, _table in schema.trigger_names("sqlite")}
    )


def _needs_migration(path: str, version: int) -> SchedulerError:
    """A read-only open of a database that only a migration (a write) would make usable."""
    return SchedulerError(
        "DB_INIT_FAILED",
        f"database initialisation failed during migration of {path}: the database is at schema version {version}, "
        f"this scheduler needs {migrations.SCHEMA_VERSION}, and this command only reads, so it does not migrate; "
        "run `scheduler doctor` (or any command that changes something) once to migrate it",
        details={"phase": "migration", "path": path, "readonly": True, "version": version,
                 "expected_version": migrations.SCHEMA_VERSION},
    )


class SQLiteStore:
    """The embedded SQLite store (``scheduler.stores`` driver ``sqlite``)."""

    #: Declared like any store plugin, so ``plugins list`` / ``doctor`` check it the same way.
    plugin_api = PLUGIN_API_VERSION
    capabilities = frozenset({"wal", "data-version-wakeup", "single-host"})
    dialect = "sqlite"
    #: One writer per file: dispatchers on one database take turns (``Store.exclusive_dispatch``).
    exclusive_dispatch = True

    @property
    def local_path(self) -> Path:
        """The database file (``Store.local_path``): the pid file and the default artifacts live beside it."""
        return self.path

    def __init__(
        self, path: str | os.PathLike[str], *, synchronous: str | None = None, busy_timeout_ms: int | None = None
    ) -> None:
        self.path = Path(path).expanduser()
        self.location = str(self.path)
        storage = current_settings().storage
        self._synchronous = (synchronous or storage.sqlite_synchronous).upper()
        self._cache_kib = storage.sqlite_cache_mb * 1024
        self._busy_timeout_ms = busy_timeout_ms if busy_timeout_ms is not None else default_busy_timeout_ms()
        self._local = threading.local()
        #: Every open connection of this store, one per thread (see ``_Slot``).
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        #: Serialises this process's write transactions. Threads then queue on a Python lock
        #: (woken the moment the writer commits) instead of SQLite's busy handler, which
        #: sleeps in growing steps and made a busy dispatcher's runs start hundreds of ms late.
        self._write_lock = threading.Lock()
        self._wrote = False
        self._checkpoint_thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._initialized = False
        #: Test hook passed to migrations (see ``migrations.StepHook``).
        self.migration_step_hook: migrations.StepHook | None = None

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if not self.path.exists():
            # Created here with the configured permissions (0600 by default) rather than by
            # SQLite (0644 under the usual umask); SQLite gives -wal and -shm the same mode.
            try:
                fd, _created = filemodes.create_file(self.path)
            except OSError as exc:
                raise _fail("open", self.location, exc) from None
            os.close(fd)
        timeout_ms = self._busy_timeout_ms
        conn = sqlite3.connect(self.location, timeout=timeout_ms / 1000, isolation_level=None, check_same_thread=False)
        try:
            for pragma in (
                f"PRAGMA busy_timeout = {timeout_ms}",
                "PRAGMA foreign_keys = ON",
                f"PRAGMA synchronous = {self._synchronous}",
                f"PRAGMA cache_size = -{self._cache_kib}",  # negative: KiB, not pages
                # Checkpoints run on a background thread (see _checkpointer), never inside a commit
                # that other threads of this process are queued behind.
                "PRAGMA wal_autocheckpoint = 0",
            ):
                self._exec(conn, pragma, "cannot configure a new connection")
        except BaseException:
            conn.close()
            raise
        return conn

    def _adopt(self, conn: sqlite3.Connection) -> _Slot:
        """Make ``conn`` this thread's connection; close those of threads that have ended."""
        slot = _Slot(conn)
        self._local.slot = slot
        with self._lock:
            dead = [s for s in self._slots if not s.thread.is_alive()]
            self._slots = [s for s in self._slots if s.thread.is_alive() and not s.closed]
            self._slots.append(slot)
        for old in dead:
            old.retire()  # a thread that has ended cannot be inside a statement: closed at once
        return slot

    def _slot(self) -> _Slot:
        """This thread's connection slot, opening a connection on first use (or after ``close()``)."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is not None and (slot.depth or not slot.retired):
            return slot
        if not self._initialized:
            raise SchedulerError("DB_INIT_FAILED", f"store {self.location} used before initialize() or after close()")
        return self._adopt(self._connect())

    @contextmanager
    def _using(self, slot: _Slot) -> Iterator[sqlite3.Connection]:
        """Mark ``slot`` in use for the block, so ``close()`` from another thread leaves it open till the end."""
        with slot.guard:
            if slot.closed:
                raise SchedulerError("DB_INIT_FAILED", f"store {self.location} used after close()")
            slot.users += 1
        try:
            yield slot.conn
        finally:
            with slot.guard:
                slot.users -= 1
                if slot.doomed and not slot.users:
                    slot._close_now()  # close() ran meanwhile: the owning thread closes its own connection

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (for callers that hold it inside ``_using`` or own the store alone)."""
        return self._slot().conn

    def _exec(self, conn: sqlite3.Connection, sql: str, what: str) -> sqlite3.Cursor:
        """Run a control statement (BEGIN, COMMIT, a PRAGMA), a lock past the busy timeout as ``DB_BUSY``."""
        try:
            return conn.execute(sql)
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise _busy_error(self.location, self._busy_timeout_ms, f"{what}: {exc}") from None
            raise

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error as exc:  # the connection is unusable; the error that led here matters more
                log.debug("rollback failed: %s", exc)

    # -- initialisation ------------------------------------------------------------------------

    def initialize(self, *, readonly: bool = False) -> None:
        """Open, configure and bring the schema up to date, failing closed with ``DB_INIT_FAILED``.

        An up-to-date database is only read (its version and object names): no write
        transaction, so a command starting while another process holds the write lock is
        not blocked. A new or empty file gets the schema, an older database the migrations,
        in one ``BEGIN IMMEDIATE`` transaction. ``readonly=True`` (commands that only read)
        never migrates nor repairs: an older database is refused with ``DB_INIT_FAILED``
        saying it must be migrated first (a database that does not exist yet is still
        created, as on first use). A lock held past the busy timeout is ``DB_BUSY``.
        """
        if self._initialized:
            return
        path = self.location
        try:
            if self.path.parent and not self.path.parent.exists():
                filemodes.ensure_dir(self.path.parent)
            if self.path.exists():
                if self.path.is_dir():
                    raise _fail("open", path, "path is a directory")
                with open(self.path, "rb") as fh:
                    head = fh.read(16)
                if head and head != _SQLITE_HEADER:
                    raise _fail("open", path, "file is not a SQLite database")
        except SchedulerError:
            raise
        except OSError as exc:
            raise _fail("open", path, exc) from None
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise _fail("open", path, exc) from None
        try:
            # Read-only look first: a foreign or newer database is refused before anything
            # (not even the journal mode) is written to it, and a current one is left alone.
            version, complete = self._inspect(conn)
            current = version == migrations.SCHEMA_VERSION and complete
            if readonly and version is not None and version < migrations.SCHEMA_VERSION:
                raise _needs_migration(path, version)
            if not readonly or version is None:
                mode = self._exec(conn, "PRAGMA journal_mode", "cannot read the journal mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    mode = self._exec(conn, "PRAGMA journal_mode = WAL", "cannot enable WAL").fetchone()[0]
                    if str(mode).lower() != "wal":
                        raise _fail("open", path, f"cannot enable WAL (journal_mode={mode})")
                if not current:
                    self._upgrade(conn)
        except SchedulerError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            if _is_busy(exc):
                raise _busy_error(path, self._busy_timeout_ms, f"opening the database: {exc}") from None
            raise _fail("open", path, exc) from None
        except BaseException:
            conn.close()
            raise
        self._adopt(conn)
        self._initialized = True

    def _inspect(self, conn: sqlite3.Connection) -> tuple[int | None, bool]:
        """``(recorded version or None for an empty file, every schema object present)``; reads only.

        Refuses a foreign database (tables but no ``schema_migrations``) and a newer one.
        """
        path = self.location
        objects = {(r[0], r[1]) for r in conn.execute(
            "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index', 'trigger')")}
        tables = {name for kind, name in objects if kind == "table"}
        if "schema_migrations" in tables:
            version = int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0])
            if version > migrations.SCHEMA_VERSION:
                raise _fail("migration", path, f"database schema version {version} is newer than this scheduler ({migrations.SCHEMA_VERSION})")
            return version, _expected_objects() <= objects
        if tables - {"sqlite_sequence"}:
            raise _fail("schema", path, "database has tables but is not a scheduler database (no schema_migrations)")
        return None, False

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        """Fresh: schema. Older: migrations, then the schema. Incomplete: the schema again. One transaction, all or nothing."""
        self._exec(conn, "BEGIN IMMEDIATE", "cannot start the schema transaction")
        try:
            # Checked again under the write lock: another process may have initialised meanwhile.
            version, complete = self._inspect(conn)
            if version != migrations.SCHEMA_VERSION or not complete:
                adapter = SQLiteSchemaConnection(conn, self.location, self._busy_timeout_ms)
                migrations.upgrade(adapter, version, now_ms(), step_hook=self.migration_step_hook)
            self._exec(conn, "COMMIT", "cannot commit the schema")
        except migrations.UpgradeFailed as exc:
            self._rollback(conn)
            raise _fail(exc.phase, self.location, exc.cause) from None
        except BaseException:
            self._rollback(conn)
            raise

    # -- transactions --------------------------------------------------------------------------

    def _tx(self, conn: sqlite3.Connection) -> _SQLiteTx:
        return _SQLiteTx(conn, self.location, self._busy_timeout_ms)

    @contextmanager
    def transaction(self) -> Iterator[_SQLiteTx]:
        """``BEGIN IMMEDIATE`` write transaction; nested use joins the outer one.

        A lock held elsewhere past the busy timeout (by another process, or by another
        thread of this one) raises ``DB_BUSY`` and leaves nothing half-written.
        """
        slot = self._slot()
        if slot.depth:
            slot.depth += 1
            try:
                yield self._tx(slot.conn)
            finally:
                slot.depth -= 1
            return
        with self._using(slot) as conn:
            if not self._write_lock.acquire(timeout=self._busy_timeout_ms / 1000):
                raise _busy_error(self.location, self._busy_timeout_ms, "another thread of this process holds the write lock")
            try:
                self._exec(conn, "BEGIN IMMEDIATE", "cannot start a write transaction")
                slot.depth = 1
                try:
                    yield self._tx(conn)
                except BaseException:
                    slot.depth = 0
                    self._rollback(conn)
                    raise
                slot.depth = 0
                try:
                    self._exec(conn, "COMMIT", "cannot commit")
                except BaseException:
                    self._rollback(conn)
                    raise
            finally:
                self._write_lock.release()
        self._wrote = True
        if self._checkpoint_thread is None and self._initialized:
            self._start_checkpointer()

    @contextmanager
    def read(self) -> Iterator[_SQLiteTx]:
        """A read snapshot (deferred transaction); inside a transaction it joins that one."""
        slot = self._slot()
        if slot.depth:
            yield self._tx(slot.conn)
            return
        with self._using(slot) as conn:
            self._exec(conn, "BEGIN", "cannot start a read transaction")
            slot.depth = 1
            try:
                yield self._tx(conn)
            finally:
                slot.depth = 0
                if conn.in_transaction:
                    try:
                        self._exec(conn, "COMMIT", "cannot end a read transaction")
                    except BaseException:
                        self._rollback(conn)
                        raise

    # -- wake-ups ------------------------------------------------------------------------------

    def notify_change(self) -> None:
        """Nothing to do: other connections see the commit through ``data_version``."""

    def wait_for_change(self, timeout_s: float) -> bool:
        """True as soon as another connection has committed since this thread last asked.

        Polls ``PRAGMA data_version`` (it changes when any other connection commits);
        with ``timeout_s=0`` it is a single non-blocking check.
        """
        slot = self._slot()
        seen = slot.seen_version
        current = self._data_version(slot)
        slot.seen_version = current
        if seen is not None and current != seen:
            return True
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(CHANGE_POLL_S, remaining))
            current = self._data_version(slot)
            if current != slot.seen_version:
                slot.seen_version = current
                return True

    def _data_version(self, slot: _Slot) -> int:
        """``PRAGMA data_version`` on this thread's connection (in use only for the statement itself)."""
        with self._using(slot) as conn:
            return int(self._exec(conn, "PRAGMA data_version", "cannot read data_version").fetchone()[0])

    # -- diagnostics ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        with self.read() as tx:
            return int(tx.scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))

    def health(self) -> list[dict[str, Any]]:
        """Integrity, foreign keys, expected tables, a writable directory, and no world access to the files."""
        slot = self._slot()
        with self._using(slot) as conn:
            checks = self._health_checks(conn)
        checks.append(self._file_modes_check())
        return checks

    def _file_modes_check(self) -> dict[str, Any]:
        """A warning (never a failure) when others may read or write the database, its WAL/SHM or the artifacts.

        A warning because the operator may have opened them up on purpose; new files
        are created private (or group-only) anyway, see ``scheduler.core.filemodes``.
        """
        root = default_artifacts_root(self.location)
        candidates = [self.path, Path(f"{self.location}-wal"), Path(f"{self.location}-shm"), root, root / "runs"]
        exposed = [f"{p} ({mode})" for p in candidates if (mode := filemodes.world_access(p)) is not None]
        if exposed:
            return {
                "check": "file_modes", "ok": True, "warning": True,
                "detail": "warning: readable or writable by every user: " + ", ".join(exposed)
                + f" (chmod o-rwx them; new files follow {filemodes.FILE_MODE_ENV}={filemodes.file_mode_setting()})",
            }
        return {"check": "file_modes", "ok": True, "warning": False,
                "detail": f"no world access ({filemodes.file_mode_setting()} mode)"}

    def _health_checks(self, conn: sqlite3.Connection) -> list[dict[str, Any]]:
        checks: list[dict[str, Any]] = []
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        checks.append({"check": "integrity", "ok": integrity == ["ok"], "detail": "; ".join(integrity[:5])})
        fk = conn.execute("PRAGMA foreign_key_check").fetchall()
        checks.append({"check": "foreign_keys", "ok": not fk, "detail": f"{len(fk)} violation(s)"})
        expected = {
            s.split()[5] for s in migrations.schema_statements() if s.upper().startswith("CREATE TABLE IF NOT EXISTS")
        }
        present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = sorted(expected - present)
        checks.append({"check": "tables", "ok": not missing, "detail": "missing: " + ", ".join(missing) if missing else f"{len(expected)} present"})
        writable = os.access(self.path.parent, os.W_OK) and (not self.path.exists() or os.access(self.path, os.W_OK))
        checks.append({"check": "writable", "ok": writable, "detail": str(self.path.parent)})
        return checks

    def _start_checkpointer(self) -> None:
        with self._lock:
            if self._checkpoint_thread is not None:
                return
            self._checkpoint_thread = threading.Thread(
                target=self._checkpointer, args=(self._closing,), name="sqlite-checkpoint", daemon=True
            )
        self._checkpoint_thread.start()

    def _checkpointer(self, closing: threading.Event) -> None:
        """Fold the WAL into the database every second after writes, off every commit path.

        Its connection is its own: opened and closed on this thread only.
        """
        try:
            conn = self._connect()
        except (sqlite3.Error, OSError, SchedulerError) as exc:
            log.debug("checkpointer not started: %s", exc)
            return
        try:
            while not closing.wait(CHECKPOINT_INTERVAL_S):
                if self._wrote:
                    self._wrote = False
                    try:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # the bulk, beside the writers
                        # The frames appended meanwhile, with this process's writers held back for that short while:
                        # the checkpoint then reaches the end of the WAL, so the next write starts the WAL over
                        # instead of growing it (a WAL that only grows makes every page lookup of every
                        # connection slower, and a busy dispatcher's never stopped growing).
                        if self._write_lock.acquire(timeout=CHECKPOINT_INTERVAL_S):
                            try:
                                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                            finally:
                                self._write_lock.release()
                    except sqlite3.Error as exc:  # busy: the next round tries again
                        log.debug("checkpoint skipped: %s", exc)
        finally:
            conn.close()

    def checkpoint(self) -> None:
        """Fold the WAL into the database now (PASSIVE: readers and writers are not blocked)."""
        slot = self._slot()
        with self._using(slot) as conn:
            self._exec(conn, "PRAGMA wal_checkpoint(PASSIVE)", "cannot checkpoint")

    def close(self) -> None:
        """Close the store's connections, never one another thread is using at that moment.

        Idle connections (this thread's, those of threads between statements, those of
        threads that have ended) are closed now. A connection in use, such as a lease
        renewal blocked on a lock held by another process, is marked and closed by its own
        thread as soon as its statement or transaction ends; new uses are refused
        (``DB_INIT_FAILED``: used after close) until ``initialize()`` is called again.
        """
        if self._initialized and self._wrote:
            try:
                self.checkpoint()
            except (sqlite3.Error, SchedulerError):
                pass
        self._initialized = False
        with self._lock:
            closing, self._closing = self._closing, threading.Event()
            checkpointer, self._checkpoint_thread = self._checkpoint_thread, None
            slots, self._slots = self._slots, []
        closing.set()
        if checkpointer is not None and checkpointer is not threading.current_thread():
            checkpointer.join(timeout=5)
        for slot in slots:
            slot.retire()


def open_sqlite(path: str | os.PathLike[str], *, initialize: bool = True, readonly: bool = False) -> SQLiteStore:
    """The built-in store on the SQLite file ``path``, initialised unless ``initialize=False`` (see ``initialize``).

    Core's own opener; opening any store by path or URL (plugin stores too) is
    ``scheduler.plugins.stores.open_store``.
    """
    store = SQLiteStore(path)
    if initialize:
        store.initialize(readonly=readonly)
    return store
