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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from scheduler import PLUGIN_API_VERSION
from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core import state
from scheduler.core.rows import JSONObject
from scheduler.core.store import migrations
from scheduler.core.store.sqlite_statements import (
    Slot,
    SQLiteSchemaConnection,
    SQLiteTx,
    busy_error,
    default_busy_timeout_ms,
    disk_full_error,
    init_failed,
    is_busy,
    is_full,
)
from scheduler.core.store.sqlite_upkeep import (
    NEW_DATABASE_PAGE_SIZE,
    WalFolder,
    check_file,
    file_modes_check,
    health_checks,
    incomplete_schema,
    inspect_schema,
    needs_migration,
    open_connection,
    prove_statements,
    rollback,
)
from scheduler.settings import current_settings

log = logging.getLogger(__name__)

#: How often an idle dispatcher looks at ``data_version`` (well inside the 250 ms wake-up promise).
CHANGE_POLL_S = 0.02


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
        self, path: str | os.PathLike[str], *, synchronous: str | None = None, busy_timeout_ms: int | None = None,
        create: bool = True,
    ) -> None:
        self.path = Path(path).expanduser()
        self.location = str(self.path)
        #: Whether ``initialize`` may create the file when the path names none (``DB_NOT_FOUND`` otherwise). Only
        #: ``initialize`` ever creates it: a connection opened later (another thread, a renewal) never does.
        self.create = create
        #: ``(st_dev, st_ino)`` of the file ``initialize`` opened: ``verify_identity`` compares the path with it.
        self._identity: tuple[int, int] | None = None
        storage = current_settings().storage
        self._synchronous = (synchronous or storage.sqlite_synchronous).upper()
        self._cache_kib = storage.sqlite_cache_mb * 1024
        self._busy_timeout_ms = busy_timeout_ms if busy_timeout_ms is not None else default_busy_timeout_ms()
        self._local = threading.local()
        #: Every open connection of this store, one per thread (see ``Slot``).
        self._slots: list[Slot] = []
        self._lock = threading.Lock()
        #: Serialises this process's write transactions. Threads then queue on a Python lock
        #: (woken the moment the writer commits) instead of SQLite's busy handler, which
        #: sleeps in growing steps and made a busy dispatcher's runs start hundreds of ms late.
        self._write_lock = threading.Lock()
        #: Folds the WAL back after writes, on its own thread (``sqlite_upkeep.WalFolder``).
        self._wal = WalFolder(self._connect, self._write_lock)
        self._initialized = False
        #: Test hook passed to migrations (see ``migrations.StepHook``).
        self.migration_step_hook: migrations.StepHook | None = None
        #: The named statements ``initialize`` proves this database can run (a test hook: the kernel's by default).
        self.statements: Mapping[str, state.Statement] = state.STATEMENTS

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """A new connection configured for this store (``sqlite_upkeep.open_connection``).

        Once initialised, a new connection goes to the file ``initialize`` opened or to nothing: a path
        deleted or replaced since is ``DB_VANISHED``, and no connection ever creates the file again.
        """
        if self._identity is not None:
            self.verify_identity()
        try:
            return open_connection(self.path, busy_timeout_ms=self._busy_timeout_ms, synchronous=self._synchronous,
                                   cache_kib=self._cache_kib, create=self.create and self._identity is None)
        except sqlite3.OperationalError:
            if self._identity is not None and not self.path.exists():
                raise self._vanished("was deleted") from None
            raise

    def _vanished(self, what: str) -> SchedulerError:
        """``DB_VANISHED`` for this store's file (``what``: was deleted, was replaced by another file)."""
        return SchedulerError(
            "DB_VANISHED",
            f"database {self.location} {what} while this process had it open: stopping rather than writing into a"
            " file nobody can open again or starting over on an empty one; restore it (scheduler restore) or"
            " create it on purpose (scheduler jobs add)",
            details={"path": self.location},
        )

    def verify_identity(self) -> None:
        """``DB_VANISHED`` when the path no longer names the file this store opened (deleted, or replaced by another).

        One ``os.stat`` against the device and inode recorded at ``initialize``: cheap enough for every
        lease renewal. SQLite keeps writing into a deleted file through its open descriptor, so without this
        a dispatcher would go on committing runs nobody can read, then a new connection would start over on an
        empty database. Another error from ``stat`` (a permission change) is left to the statements that follow.
        """
        if self._identity is None:
            return
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            raise self._vanished("was deleted") from None
        except OSError:
            return
        if (st.st_dev, st.st_ino) != self._identity:
            raise self._vanished("was replaced by another file")

    def _adopt(self, conn: sqlite3.Connection) -> Slot:
        """Make ``conn`` this thread's connection; close those of threads that have ended."""
        slot = Slot(conn)
        self._local.slot = slot
        with self._lock:
            dead = [s for s in self._slots if not s.thread.is_alive()]
            self._slots = [s for s in self._slots if s.thread.is_alive() and not s.closed]
            self._slots.append(slot)
        for old in dead:
            old.retire()  # a thread that has ended cannot be inside a statement: closed at once
        return slot

    def _slot(self) -> Slot:
        """This thread's connection slot, opening a connection on first use (or after ``close()``)."""
        slot: Slot | None = getattr(self._local, "slot", None)
        if slot is not None and (slot.depth or not slot.retired):
            return slot
        if not self._initialized:
            raise SchedulerError("DB_INIT_FAILED", f"store {self.location} used before initialize() or after close()")
        return self._adopt(self._connect())

    @contextmanager
    def _using(self, slot: Slot) -> Iterator[sqlite3.Connection]:
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
        """Run a control statement (BEGIN, COMMIT, a PRAGMA), a lock past the busy timeout as ``DB_BUSY``, no room
        left as ``DB_DISK_FULL``."""
        try:
            return conn.execute(sql)
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise busy_error(self.location, self._busy_timeout_ms, f"{what}: {exc}") from None
            if is_full(exc):
                raise disk_full_error(self.location, f"{what}: {exc}") from None
            raise

    # -- initialisation ------------------------------------------------------------------------

    def initialize(self, *, readonly: bool = False) -> None:
        """Open, configure and bring the schema up to date, failing closed with ``DB_INIT_FAILED``.

        An up-to-date database is only read (its version and object names): no write
        transaction, so a command starting while another process holds the write lock is
        not blocked. A new or empty file gets the schema, an older database the migrations,
        in one ``BEGIN IMMEDIATE`` transaction. ``readonly=True`` (commands that only read)
        never migrates nor repairs: an older database is refused with ``DB_INIT_FAILED``
        saying it must be migrated first, a current one missing a table, index or trigger
        with ``DB_INIT_FAILED`` (phase ``schema``, naming them) rather than answered from;
        a database that does not exist yet is still created, as on first use, unless the store
        was made with ``create=False`` (``DB_NOT_FOUND``). A lock held
        past the busy timeout is ``DB_BUSY``.

        A writable open then compiles every named statement (``scheduler.core.state``) on
        the database, so one SQLite cannot run is ``DB_INIT_FAILED`` (phase ``statements``,
        naming it) now rather than at first use. A read-only open skips that: every named
        statement writes, and such a process writes nothing.
        """
        if self._initialized:
            return
        path = self.location
        self.verify_identity()  # opened before (initialize after close): the same file or none
        if not self.create and not self.path.exists():
            raise SchedulerError(
                "DB_NOT_FOUND",
                f"no database at {path}: this command does not create one (`scheduler jobs add`, `apply`, `import`"
                " or `schedule add` does); check --db / SCHEDULER_DB",
                details={"path": path},
            )
        check_file(self.path)
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise init_failed("open", path, exc) from None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            conn.close()
            raise init_failed("open", path, exc) from None
        try:
            # Read-only look first: a foreign or newer database is refused before anything
            # (not even the journal mode) is written to it, and a current one is left alone.
            version, complete = inspect_schema(conn, path)
            current = version == migrations.SCHEMA_VERSION and complete
            if readonly and version is not None and version < migrations.SCHEMA_VERSION:
                raise needs_migration(path, version)
            if readonly and version is not None and not complete:
                raise incomplete_schema(conn, path)
            if not readonly or version is None:
                if version is None:  # no schema yet: the page size is still open (NEW_DATABASE_PAGE_SIZE)
                    self._exec(conn, f"PRAGMA page_size = {NEW_DATABASE_PAGE_SIZE}", "cannot set the page size")
                mode = self._exec(conn, "PRAGMA journal_mode", "cannot read the journal mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    mode = self._exec(conn, "PRAGMA journal_mode = WAL", "cannot enable WAL").fetchone()[0]
                    if str(mode).lower() != "wal":
                        raise init_failed("open", path, f"cannot enable WAL (journal_mode={mode})")
                if not current:
                    self._upgrade(conn)
            if not readonly:
                prove_statements(conn, path, self.statements, self._busy_timeout_ms)
        except SchedulerError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            if is_busy(exc):
                raise busy_error(path, self._busy_timeout_ms, f"opening the database: {exc}") from None
            if is_full(exc):
                raise disk_full_error(path, f"opening the database: {exc}") from None
            raise init_failed("open", path, exc) from None
        except BaseException:
            conn.close()
            raise
        self._adopt(conn)
        self._identity = (st.st_dev, st.st_ino)
        self.create = False  # created now if it was missing: from here on, never again
        self._initialized = True

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        """Fresh: schema. Older: migrations, then the schema. Incomplete: the schema again. One transaction, all or nothing."""
        self._exec(conn, "BEGIN IMMEDIATE", "cannot start the schema transaction")
        try:
            # Checked again under the write lock: another process may have initialised meanwhile.
            version, complete = inspect_schema(conn, self.location)
            if version != migrations.SCHEMA_VERSION or not complete:
                adapter = SQLiteSchemaConnection(conn, self.location, self._busy_timeout_ms)
                migrations.upgrade(adapter, version, now_ms(), step_hook=self.migration_step_hook)
            self._exec(conn, "COMMIT", "cannot commit the schema")
        except migrations.UpgradeFailed as exc:
            rollback(conn)
            raise init_failed(exc.phase, self.location, exc.cause) from None
        except BaseException:
            rollback(conn)
            raise

    # -- transactions --------------------------------------------------------------------------

    def _tx(self, conn: sqlite3.Connection) -> SQLiteTx:
        return SQLiteTx(conn, self.location, self._busy_timeout_ms)

    @contextmanager
    def transaction(self) -> Iterator[SQLiteTx]:
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
                raise busy_error(self.location, self._busy_timeout_ms, "another thread of this process holds the write lock")
            try:
                self._exec(conn, "BEGIN IMMEDIATE", "cannot start a write transaction")
                slot.depth = 1
                try:
                    yield self._tx(conn)
                except BaseException:
                    slot.depth = 0
                    rollback(conn)
                    raise
                slot.depth = 0
                try:
                    self._exec(conn, "COMMIT", "cannot commit")
                except BaseException:
                    rollback(conn)
                    raise
            finally:
                self._write_lock.release()
        wal = self._wal
        wal.written = True
        if not wal.running and self._initialized:
            wal.start()

    @contextmanager
    def read(self) -> Iterator[SQLiteTx]:
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
                        rollback(conn)
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

    def _data_version(self, slot: Slot) -> int:
        """``PRAGMA data_version`` on this thread's connection (in use only for the statement itself)."""
        with self._using(slot) as conn:
            return int(self._exec(conn, "PRAGMA data_version", "cannot read data_version").fetchone()[0])

    # -- diagnostics ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        with self.read() as tx:
            return int(tx.scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))

    def health(self) -> list[JSONObject]:
        """Integrity, foreign keys, expected tables, a writable directory, and no world access to the files."""
        slot = self._slot()
        with self._using(slot) as conn:
            checks = health_checks(conn, self.path)
        checks.append(file_modes_check(self.path))
        return checks

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
        if self._initialized and self._wal.written:
            try:
                self.checkpoint()
            except (sqlite3.Error, SchedulerError):
                pass
        self._initialized = False
        with self._lock:
            slots, self._slots = self._slots, []
        self._wal.stop()
        for slot in slots:
            slot.retire()


def open_sqlite(path: str | os.PathLike[str], *, initialize: bool = True, readonly: bool = False,
                create: bool = True) -> SQLiteStore:
    """The built-in store on the SQLite file ``path``, initialised unless ``initialize=False`` (see ``initialize``).

    ``create=False`` refuses a path that names no file (``DB_NOT_FOUND``) instead of creating a database there.

    Core's own opener; opening any store by path or URL (plugin stores too) is
    ``scheduler.plugins.stores.open_store``.
    """
    store = SQLiteStore(path, create=create)
    if initialize:
        store.initialize(readonly=readonly)
    return store
