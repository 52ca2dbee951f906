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
from scheduler.core.store.sqlite_statements import (
    Slot,
    SQLiteSchemaConnection,
    SQLiteTx,
    busy_error,
    default_busy_timeout_ms,
    init_failed,
    is_busy,
)
from scheduler.base.timeutil import now_ms

log = logging.getLogger(__name__)

#: How often an idle dispatcher looks at ``data_version`` (well inside the 250 ms wake-up promise).
CHANGE_POLL_S = 0.02
#: How often the background thread folds the WAL back into the database (PASSIVE beside the writers, then the few
#: frames appended meanwhile with this process's writers held back, so the WAL starts over: see ``_checkpointer``).
CHECKPOINT_INTERVAL_S = 0.25
_SQLITE_HEADER = b"SQLite format 3\x00"


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
        #: Every open connection of this store, one per thread (see ``Slot``).
        self._slots: list[Slot] = []
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
                raise init_failed("open", self.location, exc) from None
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
        """Run a control statement (BEGIN, COMMIT, a PRAGMA), a lock past the busy timeout as ``DB_BUSY``."""
        try:
            return conn.execute(sql)
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise busy_error(self.location, self._busy_timeout_ms, f"{what}: {exc}") from None
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
                    raise init_failed("open", path, "path is a directory")
                with open(self.path, "rb") as fh:
                    head = fh.read(16)
                if head and head != _SQLITE_HEADER:
                    raise init_failed("open", path, "file is not a SQLite database")
        except SchedulerError:
            raise
        except OSError as exc:
            raise init_failed("open", path, exc) from None
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise init_failed("open", path, exc) from None
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
                        raise init_failed("open", path, f"cannot enable WAL (journal_mode={mode})")
                if not current:
                    self._upgrade(conn)
        except SchedulerError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            if is_busy(exc):
                raise busy_error(path, self._busy_timeout_ms, f"opening the database: {exc}") from None
            raise init_failed("open", path, exc) from None
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
                raise init_failed("migration", path, f"database schema version {version} is newer than this scheduler ({migrations.SCHEMA_VERSION})")
            return version, _expected_objects() <= objects
        if tables - {"sqlite_sequence"}:
            raise init_failed("schema", path, "database has tables but is not a scheduler database (no schema_migrations)")
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
            raise init_failed(exc.phase, self.location, exc.cause) from None
        except BaseException:
            self._rollback(conn)
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

    def _data_version(self, slot: Slot) -> int:
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
