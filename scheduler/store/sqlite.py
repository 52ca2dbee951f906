"""The built-in embedded store: one SQLite file in WAL mode.

Each thread gets its own connection (SQLite connections are not shareable across
threads). Write transactions use ``BEGIN IMMEDIATE`` so a claim made inside one is
exclusive across processes; that is why ``skip_locked`` is empty here. Other
processes' commits are noticed through ``PRAGMA data_version``, which is how an
idle dispatcher wakes within milliseconds of a CLI ``jobs add`` without a socket.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from scheduler import PLUGIN_API_VERSION
from scheduler.errors import SchedulerError
from scheduler.settings import current_settings
from scheduler.store import migrations
from scheduler.store.base import Params
from scheduler.timeutil import now_ms

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 10_000
#: How often an idle dispatcher looks at ``data_version`` (well inside the 250 ms wake-up promise).
CHANGE_POLL_S = 0.02
#: How often the background thread folds the WAL back into the database (PASSIVE: never blocks writers).
CHECKPOINT_INTERVAL_S = 1.0
_SQLITE_HEADER = b"SQLite format 3\x00"


class _SQLiteTx:
    """A transaction on one SQLite connection."""

    skip_locked = ""
    for_update = ""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _run(self, sql: str, params: Params) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
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


def _fail(phase: str, path: str, exc: BaseException | str) -> SchedulerError:
    return SchedulerError(
        "DB_INIT_FAILED",
        f"database initialisation failed during {phase} of {path}: {exc}",
        details={"phase": phase, "path": path},
    )


class SQLiteStore:
    """The embedded SQLite store (``scheduler.stores`` driver ``sqlite``)."""

    #: Declared like any store plugin, so ``plugins list`` / ``doctor`` check it the same way.
    plugin_api = PLUGIN_API_VERSION
    capabilities = frozenset({"wal", "data-version-wakeup", "single-host"})
    dialect = "sqlite"

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str | None = None) -> None:
        self.path = Path(path).expanduser()
        self.location = str(self.path)
        self._synchronous = (synchronous or current_settings().storage.sqlite_synchronous).upper()
        self._local = threading.local()
        self._all_conns: list[sqlite3.Connection] = []
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
        conn = sqlite3.connect(self.location, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        # Checkpoints run on a background thread (see _checkpointer), never inside a commit that
        # other threads of this process are queued behind.
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if not self._initialized:
                raise SchedulerError("DB_INIT_FAILED", f"store {self.location} used before initialize()")
            conn = self._connect()
            self._local.conn = conn
            self._local.depth = 0
            with self._lock:
                self._all_conns.append(conn)
        return conn

    # -- initialisation ------------------------------------------------------------------------

    def initialize(self) -> None:
        """Open, configure and bring the schema up to date, failing closed with ``DB_INIT_FAILED``."""
        if self._initialized:
            return
        path = self.location
        try:
            if self.path.parent and not self.path.parent.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
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
            # (not even the journal mode) is written to it.
            self._check_existing(conn)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise _fail("open", path, f"cannot enable WAL (journal_mode={mode})")
        except SchedulerError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            raise _fail("open", path, exc) from None
        try:
            self._apply_schema(conn)
        except SchedulerError:
            conn.close()
            raise
        except Exception as exc:
            conn.close()
            raise _fail("schema", path, exc) from None
        self._local.conn = conn
        self._local.depth = 0
        with self._lock:
            self._all_conns.append(conn)
        self._initialized = True

    def _check_existing(self, conn: sqlite3.Connection) -> int | None:
        """The recorded schema version (None for an empty file); refuse foreign and newer databases."""
        path = self.location
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "schema_migrations" in tables:
            version = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0]
            if version > migrations.SCHEMA_VERSION:
                raise _fail("migration", path, f"database schema version {version} is newer than this scheduler ({migrations.SCHEMA_VERSION})")
            return int(version)
        if tables - {"sqlite_sequence"}:
            raise _fail("schema", path, "database has tables but is not a scheduler database (no schema_migrations)")
        return None

    def _apply_schema(self, conn: sqlite3.Connection) -> None:
        """Fresh: schema in one transaction. Existing: migrations, then schema again. All or nothing."""
        conn.execute("BEGIN IMMEDIATE")
        phase = "schema"
        try:
            # Checked again under the write lock: another process may have initialised meanwhile.
            version = self._check_existing(conn)
            now = now_ms()
            if version is not None and version < migrations.SCHEMA_VERSION:
                phase = "migration"
                migrations.migrate(conn, version, now, self.migration_step_hook)
                phase = "schema"
            for statement in migrations.schema_statements():
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?) ON CONFLICT(version) DO NOTHING",
                (migrations.SCHEMA_VERSION, "current schema.sql", now),
            )
            conn.execute("COMMIT")
        except SchedulerError:
            conn.execute("ROLLBACK")
            raise
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _fail(phase, self.location, exc) from None

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[_SQLiteTx]:
        """``BEGIN IMMEDIATE`` write transaction; nested use joins the outer one."""
        conn = self._conn()
        if self._local.depth:
            self._local.depth += 1
            try:
                yield _SQLiteTx(conn)
            finally:
                self._local.depth -= 1
            return
        with self._write_lock:
            conn.execute("BEGIN IMMEDIATE")
            self._local.depth = 1
            try:
                yield _SQLiteTx(conn)
            except BaseException:
                self._local.depth = 0
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self._local.depth = 0
            conn.execute("COMMIT")
        self._wrote = True
        if self._checkpoint_thread is None:
            self._start_checkpointer()

    @contextmanager
    def read(self) -> Iterator[_SQLiteTx]:
        """A read snapshot (deferred transaction)."""
        conn = self._conn()
        if self._local.depth:
            yield _SQLiteTx(conn)
            return
        conn.execute("BEGIN")
        self._local.depth = 1
        try:
            yield _SQLiteTx(conn)
        finally:
            self._local.depth = 0
            if conn.in_transaction:
                conn.execute("COMMIT")

    # -- wake-ups ------------------------------------------------------------------------------

    def notify_change(self) -> None:
        """Nothing to do: other connections see the commit through ``data_version``."""

    def wait_for_change(self, timeout_s: float) -> bool:
        """True as soon as another connection has committed since this thread last asked.

        Polls ``PRAGMA data_version`` (it changes when any other connection commits);
        with ``timeout_s=0`` it is a single non-blocking check.
        """
        conn = self._conn()
        seen = getattr(self._local, "seen_version", None)
        current = conn.execute("PRAGMA data_version").fetchone()[0]
        self._local.seen_version = current
        if seen is not None and current != seen:
            return True
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(CHANGE_POLL_S, remaining))
            current = conn.execute("PRAGMA data_version").fetchone()[0]
            if current != self._local.seen_version:
                self._local.seen_version = current
                return True

    # -- diagnostics ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        with self.read() as tx:
            return int(tx.scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))

    def health(self) -> list[dict[str, Any]]:
        """Integrity, foreign keys, expected tables and a writable directory."""
        checks: list[dict[str, Any]] = []
        conn = self._conn()
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
            self._checkpoint_thread = threading.Thread(target=self._checkpointer, name="sqlite-checkpoint", daemon=True)
        self._checkpoint_thread.start()

    def _checkpointer(self) -> None:
        """Fold the WAL into the database every second after writes, off every commit path."""
        conn = self._connect()
        try:
            while not self._closing.wait(CHECKPOINT_INTERVAL_S):
                if self._wrote:
                    self._wrote = False
                    try:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    except sqlite3.Error as exc:  # busy or closed: the next round tries again
                        log.debug("checkpoint skipped: %s", exc)
        finally:
            conn.close()

    def checkpoint(self) -> None:
        """Fold the WAL into the database now (PASSIVE: readers and writers are not blocked)."""
        self._conn().execute("PRAGMA wal_checkpoint(PASSIVE)")

    def close(self) -> None:
        if self._initialized and self._wrote:
            try:
                self.checkpoint()
            except (sqlite3.Error, SchedulerError):
                pass
        self._closing.set()
        if self._checkpoint_thread is not None:
            self._checkpoint_thread.join(timeout=5)
        self._checkpoint_thread = None
        self._closing = threading.Event()
        with self._lock:
            conns, self._all_conns = self._all_conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()
        self._initialized = False
