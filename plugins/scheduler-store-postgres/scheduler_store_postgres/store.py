"""The PostgreSQL store: several dispatchers on several hosts sharing one database.

* Connections come from a small ``psycopg_pool.ConnectionPool`` (min 1, max 8 by
  default) whose ``configure`` callback points ``search_path`` at the store's schema
  and installs the SQLite-compatible loaders; rows are dicts.
* ``transaction()`` is one READ COMMITTED transaction on one pooled connection;
  nested use in the same thread joins it. Its ``BEGIN`` travels with the first
  statement (one round trip less per transaction; a block that runs no statement
  costs no round trip at all), then ``COMMIT``. Claims lock rows with ``FOR UPDATE SKIP
  LOCKED`` (``Tx.skip_locked``), so concurrent dispatchers never get the same row
  and never wait on each other.
* Statements a process runs repeatedly become server-side prepared statements (see
  ``PREPARE_AFTER``); the rest, and any the server cannot type, are bound on the client.
* ``read()`` is a REPEATABLE READ READ ONLY transaction: a consistent snapshot across
  several queries, as a SQLite read transaction is.
* Wake-ups use LISTEN/NOTIFY on ``scheduler_wakeup_<schema>`` (see ``notify``).
* ``initialize()`` fails closed with ``DB_INIT_FAILED`` naming the phase and the
  (password-redacted) URL. An up-to-date schema is recognised by a read-only look (the
  recorded version, the schema fingerprint, tables and triggers present): no lock, no
  DDL. Otherwise the kernel's schema and migrations (``scheduler_toolkit.store``: one
  definition and one migration list for every store) run in one transaction under a
  transaction-scoped advisory lock that serialises concurrent initialisers.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Self

import psycopg
from psycopg import pq, sql
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool
from scheduler_toolkit.store import (
    MIGRATIONS,
    NAMED_STATEMENTS,
    SCHEMA_VERSION,
    Migration,
    Params,
    StepHook,
    UpgradeFailed,
    schema_fingerprint,
    schema_tables,
    schema_triggers,
    statement_init_failed,
    statement_probes,
    upgrade,
)
from scheduler_toolkit.timeutil import now_ms

from scheduler.api import SchedulerError
from scheduler_store_postgres.notify import Listener, channel_name
from scheduler_store_postgres.schema import PgSchemaConnection
from scheduler_store_postgres.sqlcompat import (
    error_message,
    numbered_placeholders,
    prepare,
    register_loaders,
    server_signature,
    translate_error,
)
from scheduler_store_postgres.url import DEFAULT_CONNECT_TIMEOUT_S, ConnSpec, parse_url

log = logging.getLogger(__name__)

#: Seconds ``initialize`` waits for a lock held by another initialiser or by open transactions.
INIT_LOCK_TIMEOUT = "60s"
#: ``CREATE OR REPLACE TRIGGER`` needs PostgreSQL 14.
MIN_SERVER_VERSION = 140000
#: How ``transaction()`` and ``read()`` open their transactions (sent with the block's first statement).
_BEGIN_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
#: Seconds a thread waits for a free pooled connection before ``DB_UNAVAILABLE``.
POOL_TIMEOUT_S = 30.0
_FINGERPRINT_PREFIX = "scheduler-store-postgres schema sha256="
_TCP_KEEPALIVES = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}


class PgTx:
    """One open transaction on a pooled connection; kernel SQL with ``?`` placeholders."""

    #: Claims: lock the rows taken, skip rows another dispatcher holds.
    skip_locked = " FOR UPDATE SKIP LOCKED"
    #: Per-row decisions (a job's overlap policy): lock and wait, serialising dispatchers on that row.
    for_update = " FOR UPDATE"

    def __init__(self, conn: psycopg.Connection[Any], begin: str | None = None, *, prepare: bool = True) -> None:
        self._conn = conn
        #: Whether repeated statements may run as server-side prepared statements (the URL's ``?prepare=``).
        self._prepare = prepare
        #: The first statement error seen: PostgreSQL aborts the whole transaction on it.
        self.failure: SchedulerError | None = None
        #: ``BEGIN ...`` still to send: it goes out with the first statement, in the same round trip.
        self._begin = begin

    @property
    def begun(self) -> bool:
        """True once the server holds an open transaction for this block (the first statement was sent)."""
        return self._conn.info.transaction_status != pq.TransactionStatus.IDLE

    def _run(self, sql_text: str, params: Params, *, rows: bool = True) -> psycopg.Cursor[Any]:
        query, args = prepare(sql_text, params)
        begin, self._begin = self._begin, None
        key = None if begin is not None or not self._prepare else _server_key(query, args)
        server = key is not None and self._server_bound(key)
        cur: psycopg.Cursor[Any]
        if server:
            # A server-side prepared statement: parsed and planned once per connection, then only bound and run.
            cur = self._conn.cursor(row_factory=dict_row if rows else tuple_row)
        else:
            if begin is not None:
                # One round trip for both: client-side binding sends a simple query, which may hold several statements.
                query = f"{begin}; {query}"
            # Client-side binding: values are merged as literals, so untyped uses such as
            # ``? IS NULL`` work as on SQLite (server-side binding cannot type a bare NULL).
            cur = psycopg.ClientCursor(self._conn, row_factory=dict_row if rows else tuple_row)
        try:
            if server:
                cur.execute(query, args, prepare=True)
            else:
                cur.execute(query, args)
            if begin is not None:
                cur.nextset()  # past BEGIN's result to the statement's
        except psycopg.Error as exc:
            cur.close()
            translated = translate_error(exc)
            if self.failure is None:
                self.failure = translated or SchedulerError("DB_ERROR", error_message(exc))
            if translated is not None:
                raise translated from None
            raise
        return cur

    def _server_bound(self, key: tuple[str, tuple[int, ...]]) -> bool:
        """Whether to run this statement prepared on the server (see ``PREPARE_AFTER``); probes it once when due."""
        known = _PREPARED.get(key)
        if known is not None:
            return known
        seen = _SEEN.get(key, 0) + 1
        if seen <= PREPARE_AFTER:
            if len(_SEEN) >= _SEEN_MAX:
                _SEEN.clear()
            _SEEN[key] = seen
            return False
        verdict = self._probe(key)
        if verdict is not None:
            _PREPARED[key] = verdict
            _SEEN.pop(key, None)
        return bool(verdict)

    def _probe(self, key: tuple[str, tuple[int, ...]]) -> bool | None:
        """Whether the server can parse the statement with these parameter types (None: cannot tell now).

        A statement whose parameters the server cannot type (``? IS NULL``) stays bound on
        the client. The probe parses the unnamed statement inside a savepoint: a failed
        parse must not abort the caller's transaction.
        """
        conn = self._conn
        if conn.info.transaction_status != pq.TransactionStatus.INTRANS:
            return None
        query, oids = key
        command = numbered_placeholders(query, bool(oids)).encode()
        pgconn = conn.pgconn
        try:
            with conn.lock:
                if pgconn.exec_(b"SAVEPOINT scheduler_prepare_probe").status != pq.ExecStatus.COMMAND_OK:
                    return None
                parsed = pgconn.prepare(b"", command, list(oids) or None).status == pq.ExecStatus.COMMAND_OK
                end = b"" if parsed else b"ROLLBACK TO SAVEPOINT scheduler_prepare_probe; "
                if pgconn.exec_(end + b"RELEASE SAVEPOINT scheduler_prepare_probe").status != pq.ExecStatus.COMMAND_OK:
                    return None
        except psycopg.Error as exc:  # a broken connection: the statement itself will report it
            log.debug("prepare probe failed: %s", exc)
            return None
        return parsed

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run a statement; return the number of rows it changed (or returned)."""
        with self._run(sql, params) as cur:
            return cur.rowcount

    def one(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        """First row of a query as a dict, or None."""
        with self._run(sql, params) as cur:
            return cur.fetchone() if _has_rows(cur) else None  # dict_row: a fresh dict per row

    def all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Every row of a query as dicts."""
        with self._run(sql, params) as cur:
            return cur.fetchall() if _has_rows(cur) else []

    def scalar(self, sql: str, params: Params = ()) -> Any:
        """First column of the first row, or None."""
        with self._run(sql, params, rows=False) as cur:
            row = cur.fetchone() if _has_rows(cur) else None
            return row[0] if row is not None else None


#: Executions of one statement (query text and parameter types) bound on the client, in this process, before it is
#: probed and then prepared on the server: a short-lived CLI process never pays a probe; a dispatcher's hot
#: statements are parsed and planned once per connection instead of on every execution.
PREPARE_AFTER = 2
#: Statements still counting towards ``PREPARE_AFTER``; cleared when it reaches ``_SEEN_MAX`` (one-off texts).
_SEEN: dict[tuple[str, tuple[int, ...]], int] = {}
_SEEN_MAX = 4096
#: Probed statements: True runs prepared on the server, False stays bound on the client.
_PREPARED: dict[tuple[str, tuple[int, ...]], bool] = {}


def _server_key(query: str, args: list[Any] | None) -> tuple[str, tuple[int, ...]] | None:
    """The statement's key for ``_PREPARED`` (None: its parameter values rule out server-side binding)."""
    oids = server_signature(args)
    return None if oids is None else (query, oids)


def _has_rows(cur: psycopg.Cursor[Any]) -> bool:
    """Whether the statement produced a result set (cheaper than building ``cur.description``)."""
    res = cur.pgresult
    return res is not None and res.status == pq.ExecStatus.TUPLES_OK


def _rollback(conn: psycopg.Connection[Any]) -> None:
    """End an open transaction after a failure; a broken connection is left to the pool, which discards it."""
    if conn.closed or conn.info.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error as exc:
        log.debug("rollback failed (the pool discards the connection): %s", exc)


def _fail(phase: str, location: str, exc: BaseException | str) -> SchedulerError:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return SchedulerError(
        "DB_INIT_FAILED",
        f"database initialisation failed during {phase} of {location}: {text}",
        details={"phase": phase, "path": location},
    )


def _lock_key(schema: str) -> int:
    """A stable signed 64-bit advisory lock key for initialising one schema."""
    digest = hashlib.sha256(f"scheduler-store-postgres:init:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresStore:
    """The PostgreSQL store (``scheduler.stores`` driver ``postgres``)."""

    dialect = "postgresql"
    plugin_api = 3
    capabilities = frozenset({"skip-locked", "listen-notify", "multi-host"})
    #: Several dispatchers share the database, each with its own lease (``Store.exclusive_dispatch``).
    exclusive_dispatch = False
    #: A server database: no file beside which to keep a pid file or artifacts (``Store.local_path``).
    local_path = None

    def __init__(self, url: str) -> None:
        self.url = url
        self._spec: ConnSpec = parse_url(url)
        self.location = self._spec.location
        #: The schema holding the scheduler's objects (resolved by ``initialize`` when the URL names none).
        self.schema: str | None = self._spec.schema
        self.channel: str | None = None
        self._pool: ConnectionPool[Any] | None = None
        self._listener: Listener | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._initialized = False
        #: Test hooks: the migration list and a hook called before each step (see ``scheduler_toolkit.store``).
        self.migrations: tuple[Migration, ...] = MIGRATIONS
        self.migration_step_hook: StepHook | None = None
        #: The named statements ``initialize`` proves this database can run (a test hook: the kernel's by default).
        self.statements: Mapping[str, Any] = NAMED_STATEMENTS

    def __repr__(self) -> str:
        return f"PostgresStore({self.location!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- connections ---------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"row_factory": dict_row}
        if "connect_timeout" not in self._spec.keys:
            kwargs["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
        if "application_name" not in self._spec.keys:
            kwargs["application_name"] = "scheduler"
        return kwargs

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Per-connection setup: ``search_path`` to the store's schema, SQLite-compatible loaders."""
        register_loaders(conn)
        if self._spec.schema is not None:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self._spec.schema)))
            conn.commit()

    def _direct_connect(self, *, autocommit: bool = False, keepalives: bool = False) -> psycopg.Connection[Any]:
        """A connection outside the pool (initialisation and the LISTEN connection)."""
        kwargs = self._connect_kwargs()
        if keepalives:
            kwargs.update({k: v for k, v in _TCP_KEEPALIVES.items() if k not in self._spec.keys})
        conn = psycopg.connect(self._spec.conninfo, autocommit=autocommit, **kwargs)
        try:
            if autocommit:
                register_loaders(conn)
            else:
                self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _require_pool(self) -> ConnectionPool[Any]:
        pool = self._pool
        if pool is None or not self._initialized:
            raise SchedulerError("DB_INIT_FAILED", f"store {self.location} used before initialize()")
        return pool

    # -- initialisation ------------------------------------------------------------------------

    def initialize(self, *, readonly: bool = False) -> None:
        """Connect, bring the schema up to date and open the pool, failing closed with ``DB_INIT_FAILED``.

        Phases in the error details: ``open`` (cannot connect or open the pool),
        ``schema`` (creating or checking objects failed, or the schema holds foreign
        tables), ``migration`` (a migration failed, or the database is newer than this
        code). An up-to-date schema is only read. Creating or migrating happens in one
        transaction under an advisory lock, so hosts starting together neither race nor
        see a half-built schema; a lock not granted within ``INIT_LOCK_TIMEOUT`` is
        ``DB_BUSY``. ``readonly=True`` never migrates nor repairs (an older schema is
        refused, saying so); an empty schema is still created, as on first use.

        A writable open then plans every named statement the kernel runs (``EXPLAIN``, in one
        round trip): one PostgreSQL cannot run is ``DB_INIT_FAILED`` (phase ``statements``,
        naming it) now rather than at first use. A read-only open skips that: every named
        statement writes, and such a process writes nothing.
        """
        if self._initialized:
            return
        location = self.location
        try:
            conn = self._direct_connect()
        except psycopg.Error as exc:
            raise _fail("open", location, exc) from None
        if conn.info.server_version < MIN_SERVER_VERSION:
            version = conn.info.server_version
            conn.close()
            raise _fail("open", location, f"PostgreSQL {version // 10000} is too old; the store needs 14 or later")
        try:
            self._apply_schema(conn, readonly=readonly)
            if not readonly:
                self._prove_statements(conn)
        finally:
            conn.close()
        pool: ConnectionPool[Any] = ConnectionPool(
            self._spec.conninfo,
            min_size=self._spec.pool_min,
            max_size=self._spec.pool_max,
            kwargs=self._connect_kwargs(),
            configure=self._configure,
            open=False,
            timeout=POOL_TIMEOUT_S,
            name=f"scheduler-store-postgres {location}",
        )
        try:
            pool.open(wait=self._spec.pool_min > 0, timeout=float(DEFAULT_CONNECT_TIMEOUT_S) + 5.0)
        except Exception as exc:  # noqa: BLE001 - fail closed: any pool failure is DB_INIT_FAILED
            pool.close(timeout=1.0)
            raise _fail("open", location, f"connection pool did not open: {exc}") from None
        assert self.schema is not None
        self.channel = channel_name(self.schema)
        self._pool = pool
        self._listener = Listener(lambda: self._direct_connect(autocommit=True, keepalives=True), self.channel)
        self._initialized = True

    def _apply_schema(self, conn: psycopg.Connection[Any], *, readonly: bool = False) -> None:
        """Up to date: nothing (a read-only look). Fresh or older: the kernel's upgrade, in one locked transaction."""
        location = self.location
        phase = "schema"
        try:
            with conn.transaction():
                schema, version, current = self._inspect(conn)
            if current:
                self.schema = schema
                return
            if readonly and version is not None:
                if version < SCHEMA_VERSION:
                    raise SchedulerError(
                        "DB_INIT_FAILED",
                        f"database initialisation failed during migration of {location}: the schema is at version "
                        f"{version}, this scheduler needs {SCHEMA_VERSION}, and this command only reads, so it does not "
                        "migrate; run `scheduler doctor` (or any command that changes something) once to migrate it",
                        details={"phase": "migration", "path": location, "readonly": True, "version": version,
                                 "expected_version": SCHEMA_VERSION},
                    )
                self.schema = schema  # current version, some object missing or changed: read it as it is
                return
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(INIT_LOCK_TIMEOUT)))
                key_schema = self._spec.schema or "<search_path>"
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(key_schema),))
                if self._spec.schema is not None:
                    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._spec.schema)))
                # Looked at again under the lock: another host may have initialised meanwhile.
                schema, version, current = self._inspect(conn)
                if schema is None:
                    raise _fail("schema", location, "no schema to create objects in (search_path names none that exists)")
                self.schema = schema
                if current:
                    return
                phase = "migration" if version is not None else "schema"
                upgrade(PgSchemaConnection(conn), version, now_ms(), step_hook=self.migration_step_hook,
                        migrations=self.migrations)
                conn.execute(
                    sql.SQL("COMMENT ON TABLE schema_migrations IS {}").format(
                        sql.Literal(_FINGERPRINT_PREFIX + schema_fingerprint(self.dialect))
                    )
                )
        except SchedulerError:
            raise
        except UpgradeFailed as exc:
            raise _fail(exc.phase, location, exc.cause) from None
        except psycopg.errors.LockNotAvailable as exc:
            raise SchedulerError(
                "DB_BUSY",
                f"database {location} is busy: a lock needed to initialise the schema was not granted within "
                f"{INIT_LOCK_TIMEOUT} ({error_message(exc)}); another process holds it, try again",
                details={"path": location, "phase": phase},
            ) from None
        except Exception as exc:  # noqa: BLE001 - fail closed: any schema failure is DB_INIT_FAILED
            raise _fail(phase, location, exc) from None

    def _prove_statements(self, conn: psycopg.Connection[Any]) -> None:
        """Plan every named statement (``EXPLAIN``, nothing runs) in one round trip; ``DB_INIT_FAILED`` naming the first the
        server refuses (found by planning them one by one), ``DB_BUSY`` for a lock not granted within ``INIT_LOCK_TIMEOUT``."""
        probes = statement_probes(self.statements)
        cur = psycopg.ClientCursor(conn)
        # Bound on the client as the store binds any statement it has not prepared: every parameter NULL.
        texts = [cur.mogrify(*prepare(probe.sql, probe.params)) for probe in probes]
        lock_timeout = sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(INIT_LOCK_TIMEOUT))
        try:
            try:
                with conn.transaction():
                    conn.execute(lock_timeout)
                    cur.execute("; ".join(texts))
                return
            except psycopg.errors.LockNotAvailable:
                raise
            except psycopg.Error as exc:
                first = exc
            for probe, text in zip(probes, texts, strict=True):
                try:
                    with conn.transaction():
                        conn.execute(lock_timeout)
                        cur.execute(text)
                except psycopg.errors.LockNotAvailable:
                    raise
                except psycopg.Error as exc:
                    raise statement_init_failed(probe.name, self.location, error_message(exc)) from None
        except psycopg.errors.LockNotAvailable as exc:
            raise SchedulerError(
                "DB_BUSY",
                f"database {self.location} is busy: a lock needed to check the named statements was not granted within "
                f"{INIT_LOCK_TIMEOUT} ({error_message(exc)}); another process holds it, try again",
                details={"path": self.location, "phase": "statements"},
            ) from None
        finally:
            cur.close()
        raise _fail("statements", self.location, first)

    def _inspect(self, conn: psycopg.Connection[Any]) -> tuple[str | None, int | None, bool]:
        """``(schema, recorded version, up to date)`` from catalog reads only, in the caller's transaction.

        ``schema`` is None when the URL names a schema that does not exist yet (or the
        search path names none); ``version`` is None for an empty schema. A schema holding
        foreign tables, or a newer version, is refused.
        """
        location = self.location
        if self._spec.schema is not None:
            if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self._spec.schema,)).fetchone() is None:
                return None, None, False
            schema = self._spec.schema
        else:
            schema = conn.execute("SELECT current_schema() AS s").fetchone()["s"]  # type: ignore[index]
            if schema is None:
                return None, None, False
        tables = {r["tablename"] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}
        if "schema_migrations" not in tables:
            if tables:
                raise _fail(
                    "schema",
                    location,
                    f"schema {schema!r} has tables but is not a scheduler database (no schema_migrations); "
                    "name an empty or new schema with ?schema=NAME",
                )
            return schema, None, False
        version = int(conn.execute("SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations").fetchone()["v"])  # type: ignore[index]
        if version > SCHEMA_VERSION:
            raise _fail("migration", location, f"database schema version {version} is newer than this scheduler ({SCHEMA_VERSION})")
        return schema, version, version == SCHEMA_VERSION and self._schema_current(conn, schema, tables)

    def _schema_current(self, conn: psycopg.Connection[Any], schema: str, tables: set[str]) -> bool:
        """Whether an up-to-date database can skip re-applying the schema.

        Re-applying takes table locks (``CREATE INDEX IF NOT EXISTS`` and ``CREATE OR
        REPLACE TRIGGER`` lock the table even when nothing changes), which would make
        every CLI start queue behind busy dispatchers. So when the recorded schema
        fingerprint matches the kernel's schema and every table and trigger is present,
        the catalog check alone suffices.
        """
        if not schema_tables() <= tables:
            return False
        comment = conn.execute(
            "SELECT obj_description(c.oid, 'pg_class') AS d FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = 'schema_migrations'",
            (schema,),
        ).fetchone()
        if not comment or comment["d"] != _FINGERPRINT_PREFIX + schema_fingerprint(self.dialect):
            return False
        return not self._missing_triggers(conn, schema)

    @staticmethod
    def _missing_triggers(conn: psycopg.Connection[Any], schema: str) -> list[str]:
        present = {
            (r["tgname"], r["relname"])
            for r in conn.execute(
                "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal"
                " AND t.tgenabled <> 'D'",
                (schema,),
            )
        }
        return sorted(f"{table}.{name}" for name, table in schema_triggers("postgresql") - present)

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[PgTx]:
        local = self._local
        if getattr(local, "depth", 0):
            local.depth += 1
            try:
                yield local.tx
            finally:
                local.depth -= 1
            return
        pool = self._require_pool()
        try:
            with pool.connection() as conn:
                # The transaction is ours to frame: BEGIN rides with the first statement (one round trip
                # less per transaction) and a block that ran no statement costs none at all.
                conn.autocommit = True
                try:
                    tx = PgTx(conn, _BEGIN_WRITE if write else _BEGIN_READ, prepare=self._spec.prepare)
                    local.tx, local.depth, local.write = tx, 1, write
                    try:
                        yield tx
                    except BaseException:
                        _rollback(conn)
                        raise
                    finally:
                        local.tx, local.depth, local.write = None, 0, False
                    if conn.info.transaction_status == pq.TransactionStatus.INERROR:
                        # The block swallowed a statement error; COMMIT would silently roll back.
                        _rollback(conn)
                        first = tx.failure or SchedulerError("DB_ERROR", "unknown statement error")
                        raise SchedulerError(
                            first.code,
                            f"transaction rolled back: a statement in it failed ({first.message}); "
                            "PostgreSQL cannot continue a transaction after an error",
                            details=first.details,
                        )
                    if tx.begun:
                        conn.execute("COMMIT")
                finally:
                    if not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE:
                        conn.autocommit = False  # as the pool's other users (health checks) expect it
        except psycopg.Error as exc:
            translated = translate_error(exc)
            if translated is not None:
                raise translated from None
            raise

    @contextmanager
    def transaction(self) -> Iterator[PgTx]:
        """A READ COMMITTED write transaction on one pooled connection; nested use joins the outer one.

        Commits when the block ends, rolls back if it raises. Note that PostgreSQL
        aborts the whole transaction on any failed statement (SQLite only undoes the
        statement): after a ``CONSTRAINT_VIOLATION`` the transaction cannot continue.
        """
        with self._tx(write=True) as tx:
            yield tx

    @contextmanager
    def read(self) -> Iterator[PgTx]:
        """A consistent read-only snapshot (REPEATABLE READ READ ONLY); nested use joins the outer transaction."""
        with self._tx(write=False) as tx:
            yield tx

    # -- wake-ups ------------------------------------------------------------------------------

    def notify_change(self) -> None:
        """Wake every dispatcher listening on this schema's channel.

        Called after a commit: the NOTIFY runs on its own short autocommit use of a
        pooled connection. Called inside this thread's open write transaction, it joins
        it instead, so the notification is delivered exactly when (and only if) that
        transaction commits. A failure is logged, never raised: the change it announces
        is already committed, and dispatchers also wake on their own timers.
        """
        pool = self._pool
        if pool is None:  # closed or never initialised: nothing to announce through
            return
        local = self._local
        if getattr(local, "depth", 0) and getattr(local, "write", False):
            local.tx.execute("SELECT pg_notify(?, '')", (self.channel,))
            return
        try:
            with pool.connection() as conn:
                conn.autocommit = True
                try:
                    conn.execute("SELECT pg_notify(%s, '')", (self.channel,))
                finally:
                    if not conn.closed:
                        conn.autocommit = False
        except psycopg.Error as exc:
            log.warning("notify_change on %s failed: %s", self.location, exc)

    def wait_for_change(self, timeout_s: float) -> bool:
        """Sleep until another session NOTIFYs this schema's channel (True) or ``timeout_s`` passes (False)."""
        self._require_pool()
        assert self._listener is not None
        return self._listener.wait(timeout_s)

    # -- diagnostics ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The migration version recorded in ``schema_migrations``."""
        with self.read() as tx:
            return int(tx.scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))

    def health(self) -> list[dict[str, Any]]:
        """Checks for ``doctor``: connection, tables, constraint validity, guard triggers, writability.

        Each check is ``{"check", "ok", "detail"}``; a check that errors reports
        ``ok: False`` with the error rather than raising.
        """
        pool = self._require_pool()
        schema = self.schema or "public"
        checks: list[dict[str, Any]] = []

        def run(name: str, fn: Any) -> None:
            try:
                with pool.connection() as conn:
                    ok, detail = fn(conn)
                    conn.rollback()
            except Exception as exc:  # noqa: BLE001 - a failing check is reported, never raised
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            checks.append({"check": name, "ok": bool(ok), "detail": detail})

        def connection(conn: psycopg.Connection[Any]) -> tuple[bool, str]:
            row = conn.execute("SELECT current_setting('server_version') AS v, current_database() AS d").fetchone()
            return True, f"PostgreSQL {row['v']} database {row['d']} schema {schema}"  # type: ignore[index]

        def tables(conn: psycopg.Connection[Any]) -> tuple[bool, str]:
            present = {r["tablename"] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}
            expected = schema_tables()
            missing = sorted(expected - present)
            return not missing, "missing: " + ", ".join(missing) if missing else f"{len(expected)} present"

        def constraints(conn: psycopg.Connection[Any]) -> tuple[bool, str]:
            rows = conn.execute(
                "SELECT c.conname FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
                " WHERE n.nspname = %s AND NOT c.convalidated ORDER BY 1",
                (schema,),
            ).fetchall()
            names = [r["conname"] for r in rows]
            return not names, f"{len(names)} not validated" + (": " + ", ".join(names[:5]) if names else "")

        def triggers(conn: psycopg.Connection[Any]) -> tuple[bool, str]:
            missing = self._missing_triggers(conn, schema)
            expected = len(schema_triggers("postgresql"))
            return not missing, "missing or disabled: " + ", ".join(missing) if missing else f"{expected} guard triggers enabled"

        def writable(conn: psycopg.Connection[Any]) -> tuple[bool, str]:
            if conn.execute("SELECT pg_is_in_recovery() AS r").fetchone()["r"]:  # type: ignore[index]
                return False, "server is a read-only standby"
            conn.execute("CREATE TEMP TABLE scheduler_health_probe (x INTEGER) ON COMMIT DROP")
            denied = conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relkind = 'r'"
                " AND NOT has_table_privilege(c.oid, 'SELECT,INSERT,UPDATE,DELETE') ORDER BY 1",
                (schema,),
            ).fetchall()
            if denied:
                return False, "no write privilege on: " + ", ".join(r["relname"] for r in denied[:5])
            user = conn.execute("SELECT current_user AS u").fetchone()["u"]  # type: ignore[index]
            return True, f"writable as {user}"

        run("connection", connection)
        if not checks[0]["ok"]:
            return checks
        run("tables", tables)
        run("constraints", constraints)
        run("triggers", triggers)
        run("writable", writable)
        return checks

    def close(self) -> None:
        """Close the pool and the LISTEN connection; the store can be initialised again afterwards."""
        with self._lock:
            pool, self._pool = self._pool, None
            listener, self._listener = self._listener, None
            self._initialized = False
        if listener is not None:
            listener.close()
        if pool is not None:
            pool.close(timeout=5.0)
        self._local = threading.local()
