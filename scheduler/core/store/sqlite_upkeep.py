"""What the SQLite store does besides transactions: recognise its file, check its health, fold its WAL.

Kept apart from ``scheduler.core.store.sqlite`` so the store class holds only connections and
transactions (the hot path); everything here runs at open, in ``doctor``, or on a background
thread.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

from scheduler.base.errors import SchedulerError
from scheduler.core import filemodes, state
from scheduler.core.rows import JSONObject
from scheduler.core.store import default_artifacts_root, migrations, schema
from scheduler.core.store.sqlite_statements import busy_error, init_failed, is_busy

log = logging.getLogger(__name__)

#: How often the background thread folds the WAL back into the database (PASSIVE beside the writers, then the few
#: frames appended meanwhile with this process's writers held back, so the WAL starts over: see ``WalFolder``).
CHECKPOINT_INTERVAL_S = 0.25
#: Prepared statements each connection keeps (Python's default is 128). The dispatcher's connection runs about 140
#: distinct texts in steady state (the named statements, each repeated one rendered per row count of a batch, each
#: sectioned one per combination of flags): past the default, the LRU cache evicts and SQLite re-prepares on every
#: pass, which costs C time no Python profile shows. Each cached statement is a few KiB.
STATEMENT_CACHE_SIZE = 512
#: Page size of a database this store creates (an existing one keeps its own: SQLite fixes it when the first table is
#: written). Issue 34: a pass's commit writes every page it dirtied to the WAL, and most of them are index pages on
#: random ids with one or two changed keys each (about 46 a commit of 4 runs), so half-size pages halve the bytes a
#: commit writes and checksums; in-process A/B, 8 alternating runs of 2,000 no-op jobs: 1,085 -> 1,213 jobs/s and
#: 0.78 -> 0.71 ms CPU per run (1,024 bytes was no better than 2,048: deeper trees cost the reads).
NEW_DATABASE_PAGE_SIZE = 2048
_SQLITE_HEADER = b"SQLite format 3\x00"


@lru_cache(maxsize=1)
def expected_objects() -> frozenset[tuple[str, str]]:
    """``(type, name)`` of every table, index and trigger the schema creates."""
    return frozenset(
        {("table", n) for n in schema.table_names()}
        | {("index", n) for n in schema.index_names()}
        | {("trigger", n) for n, _table in schema.trigger_names("sqlite")}
    )


def needs_migration(path: str, version: int) -> SchedulerError:
    """A read-only open of a database that only a migration (a write) would make usable."""
    return SchedulerError(
        "DB_INIT_FAILED",
        f"database initialisation failed during migration of {path}: the database is at schema version {version}, "
        f"this scheduler needs {migrations.SCHEMA_VERSION}, and this command only reads, so it does not migrate; "
        "run `scheduler doctor` (or any command that changes something) once to migrate it",
        details={"phase": "migration", "path": path, "readonly": True, "version": version,
                 "expected_version": migrations.SCHEMA_VERSION},
    )


def incomplete_schema(conn: sqlite3.Connection, path: str) -> SchedulerError:
    """A read-only open of a current database missing schema objects (a table, index or trigger dropped by hand).

    Such a process never repairs, and answering from a damaged database (``status`` saying
    ``ok`` with ``runtime_events`` gone) would hide the damage: it fails closed instead.
    """
    present = {(r[0], r[1]) for r in conn.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index', 'trigger')")}
    missing = sorted(f"{kind} {name}" for kind, name in expected_objects() - present)
    return SchedulerError(
        "DB_INIT_FAILED",
        f"database initialisation failed during schema check of {path}: missing {', '.join(missing[:10])}"
        f"{' ...' if len(missing) > 10 else ''}; this command only reads, so it does not repair; "
        "run `scheduler doctor` (or any command that changes something) once to recreate them",
        details={"phase": "schema", "path": path, "readonly": True, "missing": missing},
    )


def prove_statements(conn: sqlite3.Connection, location: str, statements: Mapping[str, state.Statement],
                     busy_timeout_ms: int) -> None:
    """Compile every named statement (``EXPLAIN``, nothing runs) on this database: ``DB_INIT_FAILED`` naming the first
    that SQLite cannot run here (a missing column, a typo), ``DB_BUSY`` for a lock held past the busy timeout."""
    for probe in state.probes(statements):
        try:
            conn.execute(probe.sql, probe.params)
        except sqlite3.Error as exc:
            if is_busy(exc):
                raise busy_error(location, busy_timeout_ms, f"checking the named statements: {exc}") from None
            raise state.unrunnable(probe.name, location, exc) from None


def check_file(path: Path) -> None:
    """Refuse a directory or a file that is not SQLite before SQLite opens it; create a missing parent directory."""
    location = str(path)
    try:
        if path.parent and not path.parent.exists():
            filemodes.ensure_dir(path.parent)
        if path.exists():
            if path.is_dir():
                raise init_failed("open", location, "path is a directory")
            with open(path, "rb") as fh:
                head = fh.read(16)
            if head and head != _SQLITE_HEADER:
                raise init_failed("open", location, "file is not a SQLite database")
    except SchedulerError:
        raise
    except OSError as exc:
        raise init_failed("open", location, exc) from None


def open_connection(path: Path, *, busy_timeout_ms: int, synchronous: str, cache_kib: int,
                    create: bool = True) -> sqlite3.Connection:
    """A new connection to ``path`` with the store's pragmas, creating the file with private permissions if ``create``.

    The file is created here with the configured permissions (0600 by default) rather than
    by SQLite (0644 under the usual umask); SQLite gives -wal and -shm the same mode.
    SQLite itself never creates it (``mode=rw``): with ``create=False`` a missing file is an
    error, not a fresh empty database (a dispatcher whose file was deleted must not start
    over on a new one, issue 30). Checkpoints run on a background thread (``WalFolder``),
    never inside a commit that other threads of this process are queued behind, hence
    ``wal_autocheckpoint = 0``.
    """
    location = str(path)
    if create and not path.exists():
        try:
            fd, _created = filemodes.create_file(path)
        except OSError as exc:
            raise init_failed("open", location, exc) from None
        os.close(fd)
    # An empty authority then the absolute path: a path starting with // is not read as a host.
    conn = sqlite3.connect(f"file://{quote(os.path.abspath(location))}?mode=rw", uri=True, timeout=busy_timeout_ms / 1000,
                           isolation_level=None, check_same_thread=False, cached_statements=STATEMENT_CACHE_SIZE)
    try:
        for pragma in (
            f"PRAGMA busy_timeout = {busy_timeout_ms}",
            "PRAGMA foreign_keys = ON",
            f"PRAGMA synchronous = {synchronous}",
            f"PRAGMA cache_size = -{cache_kib}",  # negative: KiB, not pages
            "PRAGMA wal_autocheckpoint = 0",
        ):
            try:
                conn.execute(pragma)
            except sqlite3.OperationalError as exc:
                if is_busy(exc):
                    raise busy_error(location, busy_timeout_ms, f"cannot configure a new connection: {exc}") from None
                raise
    except BaseException:
        conn.close()
        raise
    return conn


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back an open transaction; a connection too broken to roll back is left to the error that led here."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:  # the connection is unusable; the error that led here matters more
            log.debug("rollback failed: %s", exc)


def inspect_schema(conn: sqlite3.Connection, location: str) -> tuple[int | None, bool]:
    """``(recorded version or None for an empty file, every schema object present)``; reads only.

    Refuses a foreign database (tables but no ``schema_migrations``) and a newer one.
    """
    objects = {(r[0], r[1]) for r in conn.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index', 'trigger')")}
    tables = {name for kind, name in objects if kind == "table"}
    if "schema_migrations" in tables:
        version = int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0])
        if version > migrations.SCHEMA_VERSION:
            raise init_failed("migration", location,
                              f"database schema version {version} is newer than this scheduler ({migrations.SCHEMA_VERSION})")
        return version, expected_objects() <= objects
    if tables - {"sqlite_sequence"}:
        raise init_failed("schema", location, "database has tables but is not a scheduler database (no schema_migrations)")
    return None, False


def health_checks(conn: sqlite3.Connection, path: Path) -> list[JSONObject]:
    """Integrity, foreign keys, expected tables and a writable directory, as ``doctor`` rows."""
    checks: list[JSONObject] = []
    integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    checks.append({"check": "integrity", "ok": integrity == ["ok"], "detail": "; ".join(integrity[:5])})
    fk = conn.execute("PRAGMA foreign_key_check").fetchall()
    checks.append({"check": "foreign_keys", "ok": not fk, "detail": f"{len(fk)} violation(s)"})
    expected = {
        s.split()[5] for s in migrations.schema_statements() if s.upper().startswith("CREATE TABLE IF NOT EXISTS")
    }
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    missing = sorted(expected - present)
    checks.append({"check": "tables", "ok": not missing,
                   "detail": "missing: " + ", ".join(missing) if missing else f"{len(expected)} present"})
    writable = os.access(path.parent, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))
    checks.append({"check": "writable", "ok": writable, "detail": str(path.parent)})
    return checks


def file_modes_check(path: Path) -> JSONObject:
    """A warning (never a failure) when others may read or write the database, its WAL/SHM or the artifacts.

    A warning because the operator may have opened them up on purpose; new files
    are created private (or group-only) anyway, see ``scheduler.core.filemodes``.
    """
    location = str(path)
    root = default_artifacts_root(location)
    candidates = [path, Path(f"{location}-wal"), Path(f"{location}-shm"), root, root / "runs"]
    exposed = [f"{p} ({mode})" for p in candidates if (mode := filemodes.world_access(p)) is not None]
    if exposed:
        return {
            "check": "file_modes", "ok": True, "warning": True,
            "detail": "warning: readable or writable by every user: " + ", ".join(exposed)
            + f" (chmod o-rwx them; new files follow {filemodes.FILE_MODE_ENV}={filemodes.file_mode_setting()})",
        }
    return {"check": "file_modes", "ok": True, "warning": False,
            "detail": f"no world access ({filemodes.file_mode_setting()} mode)"}


class WalFolder:
    """The background thread that folds the WAL into the database after writes, off every commit path.

    The store sets ``written`` after each commit and calls ``start()``; every
    ``CHECKPOINT_INTERVAL_S`` the thread checkpoints (PASSIVE) if something was written.
    Its connection is its own: opened and closed on this thread only.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], write_lock: threading.Lock) -> None:
        self._connect = connect
        self._write_lock = write_lock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        #: Set by the store after a commit; cleared by the thread when it folds.
        self.written = False

    @property
    def running(self) -> bool:
        """Whether the thread has been started (and not stopped since)."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread once (later calls do nothing until ``stop``)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, args=(self._closing,), name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (up to 5 s); a later ``start`` begins a new one."""
        with self._lock:
            closing, self._closing = self._closing, threading.Event()
            thread, self._thread = self._thread, None
        closing.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self, closing: threading.Event) -> None:
        try:
            conn = self._connect()
        except (sqlite3.Error, OSError, SchedulerError) as exc:
            log.debug("checkpointer not started: %s", exc)
            return
        try:
            while not closing.wait(CHECKPOINT_INTERVAL_S):
                if self.written:
                    self.written = False
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
