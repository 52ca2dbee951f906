"""Initialisation, migrations, fail-closed errors, health, and drift against the SQLite schema.

The schema and the migrations are the kernel's (``scheduler_toolkit.store``): one definition
rendered per dialect, one migration list. These tests hold the PostgreSQL database the
store builds to the SQLite one the kernel builds, and run the shared migrations here.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from scheduler_store_postgres import PostgresStore
from scheduler_store_postgres import store as store_module
from scheduler_toolkit.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    schema_indexes,
    schema_sql,
    schema_statements,
    schema_tables,
    schema_triggers,
)

from scheduler.api import SchedulerError
from scheduler.testing import sqlite_store

pytestmark = pytest.mark.postgres

MakeStore = Callable[..., PostgresStore]


def _q(admin: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    return admin.execute(query, params).fetchall()


def _drop(admin: psycopg.Connection[Any], schema: str) -> None:
    admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _pg_tables(admin: psycopg.Connection[Any], schema: str) -> set[str]:
    return {r[0] for r in _q(admin, "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}


def _pg_columns(admin: psycopg.Connection[Any], schema: str, table: str) -> dict[str, tuple[bool, str | None]]:
    rows = _q(
        admin,
        "SELECT column_name, is_nullable, column_default, is_identity FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table),
    )
    return {name: (nullable == "NO", None if identity == "YES" else default) for name, nullable, default, identity in rows}


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A SQLite database built by the kernel's own store from the kernel schema."""
    sqlite_store(tmp_path / "kernel.db").close()
    conn = sqlite3.connect(tmp_path / "kernel.db")
    yield conn
    conn.close()


def _sqlite_tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}


def _norm_default(value: str | None) -> str | None:
    """``'pending'::text`` and ``'pending'`` compare equal; so do ``0`` and ``0``."""
    if value is None:
        return None
    return re.sub(r"::[a-z ]+$", "", value.strip())


# -- drift: both dialects of the one definition must describe the same database --------------


def test_the_store_ships_no_schema_of_its_own() -> None:
    """The PostgreSQL DDL comes from the kernel's definition; no copy lives in this package."""
    from pathlib import Path as _Path

    package = _Path(store_module.__file__).resolve().parent
    assert not list(package.glob("*.sql"))
    statements = schema_statements("postgresql")
    assert statements[0].startswith("CREATE OR REPLACE FUNCTION scheduler_refuse()")
    created = {m.group(1) for st in statements if (m := re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", st))}
    assert created == schema_tables()


def test_tables_columns_and_defaults_match_sqlite(
    store: PostgresStore, admin: psycopg.Connection[Any], sqlite_db: sqlite3.Connection
) -> None:
    schema = store.schema
    assert schema is not None
    assert _pg_tables(admin, schema) == _sqlite_tables(sqlite_db)
    for table in sorted(_sqlite_tables(sqlite_db)):
        lite = {
            row[1]: (bool(row[3]) or bool(row[5]), _norm_default(row[4]))
            for row in sqlite_db.execute(f"PRAGMA table_info({table})")
        }
        pg = {name: (notnull, _norm_default(default)) for name, (notnull, default) in _pg_columns(admin, schema, table).items()}
        assert list(pg) == list(lite), f"column names/order differ in {table}"
        assert pg == lite, f"NOT NULL or DEFAULT differs in {table}"


def test_triggers_and_indexes_cover_sqlite(
    store: PostgresStore, admin: psycopg.Connection[Any], sqlite_db: sqlite3.Connection
) -> None:
    lite_triggers = {(r[0], r[1]) for r in sqlite_db.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'")}
    pg_triggers = {
        (r[0], r[1])
        for r in _q(
            admin,
            "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal",
            (store.schema,),
        )
    }
    assert lite_triggers <= pg_triggers
    extra = {name for name, _ in pg_triggers - lite_triggers}
    assert all(name.endswith("_no_truncate") for name in extra), extra
    lite_indexes = {
        r[0] for r in sqlite_db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'")
    }
    pg_indexes = {r[0] for r in _q(admin, "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (store.schema,))}
    assert lite_indexes <= pg_indexes
    assert lite_indexes == schema_indexes()
    assert pg_triggers == schema_triggers("postgresql")
    partial = dict(_q(admin, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s", (store.schema,)))
    assert "WHERE" in partial["jobs_due_idx"] and "WHERE" in partial["dispatch_pending_due_idx"]


def test_trigger_messages_match_sqlite() -> None:
    lite = set(re.findall(r"RAISE\(ABORT, '([A-Z_]+: [^']+)'", schema_sql("sqlite")))
    pg = set(re.findall(r"scheduler_refuse\('([A-Z_]+: [^']+)'", schema_sql("postgresql")))
    assert lite and lite == pg


# -- initialisation -------------------------------------------------------------------------


def test_initialize_fresh_then_again_is_idempotent(make_store: MakeStore, admin: psycopg.Connection[Any], pg_schema: str) -> None:
    first = make_store()
    assert first.schema == pg_schema
    assert first.schema_version() == SCHEMA_VERSION
    tables = _pg_tables(admin, pg_schema)
    assert tables == schema_tables()
    first.initialize()  # no-op on an initialised instance
    second = make_store()
    third = make_store()
    assert _pg_tables(admin, pg_schema) == tables
    assert second.schema_version() == third.schema_version() == SCHEMA_VERSION
    rows = _q(admin, sql.SQL("SELECT version FROM {}.schema_migrations").format(sql.Identifier(pg_schema)).as_string(admin))
    assert rows == [(SCHEMA_VERSION,)]


def test_initialize_creates_missing_schema(make_store: MakeStore, pg_base_url: str, admin: psycopg.Connection[Any]) -> None:
    name = f"t_new_{uuid.uuid4().hex[:10]}"
    try:
        store = make_store(f"{pg_base_url}?schema={name}")
        assert store.schema == name
        assert _pg_tables(admin, name) == schema_tables()
    finally:
        _drop(admin, name)


def test_concurrent_initialize_does_not_race(make_store: MakeStore, pg_base_url: str, admin: psycopg.Connection[Any]) -> None:
    name = f"t_race_{uuid.uuid4().hex[:10]}"
    url = f"{pg_base_url}?schema={name}"
    stores = [make_store(url, initialize=False) for _ in range(6)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def init(s: PostgresStore) -> None:
        barrier.wait()
        try:
            s.initialize()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=init, args=(s,)) for s in stores]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert all(s.schema_version() == SCHEMA_VERSION for s in stores)
    finally:
        for s in stores:
            s.close()
        _drop(admin, name)


def test_reinitialize_takes_no_table_locks(
    store: PostgresStore, make_store: MakeStore, pg_base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI starting while a dispatcher holds write locks must not queue behind it."""
    monkeypatch.setattr(store_module, "INIT_LOCK_TIMEOUT", "1s")
    busy = psycopg.connect(f"{pg_base_url}", options=f"-csearch_path={store.schema}")
    try:
        busy.execute(
            "INSERT INTO jobs(id, name, schedule_kind, payload_message, created_at, updated_at) VALUES ('b', 'b', 'manual', 'x', 1, 1)"
        )
        busy.execute("SELECT 1 FROM runs FOR UPDATE")  # RowExclusive/RowShare locks held, transaction open
        start = time.monotonic()
        make_store()
        assert time.monotonic() - start < 1.0
    finally:
        busy.rollback()
        busy.close()


def test_reinitialize_restores_a_dropped_trigger(
    store: PostgresStore, make_store: MakeStore, admin: psycopg.Connection[Any]
) -> None:
    ident = sql.Identifier(store.schema or "")
    admin.execute(sql.SQL("DROP TRIGGER runs_terminal_is_final ON {}.runs").format(ident))
    bad = {c["check"]: c for c in store.health()}
    assert not bad["triggers"]["ok"] and "runs.runs_terminal_is_final" in bad["triggers"]["detail"]
    make_store()
    assert all(c["ok"] for c in store.health())


def _versions(admin: psycopg.Connection[Any], schema: str) -> list[int]:
    query = sql.SQL("SELECT version FROM {}.schema_migrations ORDER BY 1").format(sql.Identifier(schema))
    return [r[0] for r in _q(admin, query.as_string(admin))]


def _make_v1(admin: psycopg.Connection[Any], schema: str) -> None:
    ident = sql.Identifier(schema)
    for column in ("misfire_policy", "dst_gap_policy", "dst_fold_policy", "max_consecutive_failures"):
        admin.execute(sql.SQL("ALTER TABLE {}.jobs DROP COLUMN {}").format(ident, sql.Identifier(column)))
    admin.execute(sql.SQL("DELETE FROM {}.schema_migrations").format(ident))
    admin.execute(sql.SQL("INSERT INTO {}.schema_migrations VALUES (1, 'initial', 0)").format(ident))


def _make_v2(admin: psycopg.Connection[Any], schema: str) -> None:
    """Turn a current schema back into what version 2 was, by undoing migration 3's recorded steps.

    Columns it adds go, columns it drops come back with the definitions the steps keep,
    the widened CHECK gets its old values, and the replaced index and trigger return.
    """
    admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    try:
        (m3,) = [m for m in MIGRATIONS if m.version == 3]
        for step in reversed(m3.steps):
            kind = type(step).__name__
            if kind == "AddColumn":
                admin.execute(f"ALTER TABLE {step.table} DROP COLUMN {step.column.name}")
            elif kind == "DropColumn":
                admin.execute(f"ALTER TABLE {step.table} ADD COLUMN {step.column.definition('postgresql')}")
            elif kind == "WidenCheck":
                name = f"{step.table}_{step.column.name}_check"
                admin.execute(f"ALTER TABLE {step.table} DROP CONSTRAINT {name}")
                admin.execute(f"ALTER TABLE {step.table} ADD CONSTRAINT {name} CHECK ({step.before.check_expression()})")
            elif kind == "DropIndex":
                admin.execute(step.sql)
            elif kind == "DropTrigger":
                admin.execute(
                    f"CREATE TRIGGER {step.name} BEFORE UPDATE OF status ON {step.table} FOR EACH ROW"
                    " WHEN (OLD.status = 'delivered' AND NEW.status <> 'delivered')"
                    " EXECUTE FUNCTION scheduler_refuse('OUTBOX_DELIVERED: a delivered part is never re-sent')"
                )
        admin.execute("DELETE FROM schema_migrations")
        admin.execute("INSERT INTO schema_migrations VALUES (1, 'initial', 0), (2, 'policies', 0)")
    finally:
        admin.execute("RESET search_path")


def test_migration_v1_to_current(store: PostgresStore, make_store: MakeStore, admin: psycopg.Connection[Any]) -> None:
    schema = store.schema or ""
    _make_v1(admin, schema)
    assert "misfire_policy" not in _pg_columns(admin, schema, "jobs")
    upgraded = make_store()
    assert upgraded.schema_version() == SCHEMA_VERSION
    columns = _pg_columns(admin, schema, "jobs")
    assert columns["misfire_policy"] == (True, "'coalesce'::text")
    assert columns["max_consecutive_failures"] == (True, "3")
    assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
    # the migrated column carries its CHECK
    with pytest.raises(SchedulerError) as err, upgraded.transaction() as tx:
        tx.execute(
            "INSERT INTO jobs(id, name, schedule_kind, payload_message, created_at, updated_at, misfire_policy)"
            " VALUES ('x', 'x', 'manual', 'm', 1, 1, 'bogus')"
        )
    assert err.value.code == "CONSTRAINT_VIOLATION"


def test_v3_migration_moves_executor_fields_and_process_identity(
    store: PostgresStore, make_store: MakeStore, admin: psycopg.Connection[Any], sqlite_db: sqlite3.Connection
) -> None:
    """From a rebuilt v2 schema: env policy and working directory into executor_options, pid/pgid into executor_handle."""
    schema = store.schema or ""
    store.close()
    _make_v2(admin, schema)
    ident = sql.Identifier(schema)
    assert {"shell_env_policy", "working_dir"} <= set(_pg_columns(admin, schema, "jobs"))
    assert "executor_options" not in _pg_columns(admin, schema, "jobs")
    admin.execute(sql.SQL(
        "INSERT INTO {}.jobs(id, name, schedule_kind, payload_message, created_at, updated_at, shell_env_policy, working_dir)"
        " VALUES ('j1', 'backup', 'manual', 'rsync', 1, 1, 'inherit', '/srv/backup'),"
        " ('j2', 'plain', 'manual', 'true', 1, 1, 'minimal', NULL)").format(ident))
    admin.execute(sql.SQL(
        "INSERT INTO {}.runs(id, job_id, status, created_at, dispatcher_owner, pid, pgid, process_start_time, process_state)"
        " VALUES ('r1', 'j1', 'running', 1, 'host-b:77', 4321, 4321, 'ticks:5', 'running')").format(ident))

    upgraded = make_store()
    assert upgraded.schema_version() == SCHEMA_VERSION
    assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
    with upgraded.read() as tx:
        options = {r["id"]: json.loads(r["executor_options"]) for r in tx.all("SELECT id, executor_options FROM jobs")}
        handle = json.loads(tx.scalar("SELECT executor_handle FROM runs WHERE id = 'r1'"))
    assert options == {"j1": {"env_policy": "inherit", "working_dir": "/srv/backup"}, "j2": {}}
    assert handle == {"pid": 4321, "pgid": 4321, "start_time": "ticks:5", "host": "host-b"}
    with upgraded.transaction() as tx:  # the widened CHECK accepts what completion now writes
        assert tx.execute("UPDATE runs SET process_state = 'exited' WHERE id = 'r1'") == 1
    # the old trigger and index are gone, the current ones are there, and the columns match a fresh SQLite database
    triggers = {r[0] for r in _q(admin, "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                                        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s", (schema,))}
    indexes = {r[0] for r in _q(admin, "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))}
    assert "outbox_delivered_is_final" not in triggers and "outbox_delivered_immutable" in triggers
    assert "dispatch_pending_idx" not in indexes and "dispatch_pending_due_idx" in indexes
    for table in ("jobs", "runs"):
        lite = {row[1]: (bool(row[3]) or bool(row[5]), _norm_default(row[4])) for row in sqlite_db.execute(f"PRAGMA table_info({table})")}
        pg = {name: (notnull, _norm_default(default)) for name, (notnull, default) in _pg_columns(admin, schema, table).items()}
        assert pg == lite, table
    assert all(c["ok"] for c in upgraded.health())


def test_readonly_open_of_an_older_schema_says_so_and_changes_nothing(
    store: PostgresStore, make_store: MakeStore, admin: psycopg.Connection[Any]
) -> None:
    schema = store.schema or ""
    store.close()
    _make_v2(admin, schema)
    reader = make_store(initialize=False)
    with pytest.raises(SchedulerError) as err:
        reader.initialize(readonly=True)
    assert err.value.code == "DB_INIT_FAILED"
    assert err.value.details == {"phase": "migration", "path": reader.location, "readonly": True, "version": 2,
                                 "expected_version": SCHEMA_VERSION}
    assert "only reads" in err.value.message
    assert _versions(admin, schema) == [1, 2] and "executor_options" not in _pg_columns(admin, schema, "jobs")
    make_store()  # a writing open migrates; reading then needs nothing
    make_store(initialize=False).initialize(readonly=True)


def test_opening_a_current_schema_takes_no_lock_even_while_an_initialiser_holds_the_advisory_lock(
    store: PostgresStore, make_store: MakeStore, pg_base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The up-to-date check is a catalog read: it neither waits for the init lock nor takes table locks."""
    monkeypatch.setattr(store_module, "INIT_LOCK_TIMEOUT", "1s")
    holder = psycopg.connect(pg_base_url)
    try:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (store_module._lock_key(store.schema or ""),))
        start = time.monotonic()
        for readonly in (False, True):
            make_store(initialize=False).initialize(readonly=readonly)
        assert time.monotonic() - start < 1.0
    finally:
        holder.rollback()
        holder.close()


def test_a_lock_held_past_the_init_timeout_is_db_busy(
    store: PostgresStore, make_store: MakeStore, admin: psycopg.Connection[Any], pg_base_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schema = store.schema or ""
    store.close()
    _make_v1(admin, schema)  # needs a migration, so the initialiser must take the lock
    monkeypatch.setattr(store_module, "INIT_LOCK_TIMEOUT", "300ms")
    holder = psycopg.connect(pg_base_url)
    try:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (store_module._lock_key(schema),))
        with pytest.raises(SchedulerError) as err:
            make_store()
        assert err.value.code == "DB_BUSY" and err.value.retryable
    finally:
        holder.rollback()
        holder.close()
    assert make_store().schema_version() == SCHEMA_VERSION


def test_failed_migration_rolls_back_everything(
    store: PostgresStore, make_store: MakeStore, admin: psycopg.Connection[Any]
) -> None:
    schema = store.schema or ""
    _make_v1(admin, schema)
    broken = make_store(initialize=False)

    def hook(version: int, step: int) -> None:
        if step == 2:
            raise RuntimeError("disk on fire")

    broken.migration_step_hook = hook
    with pytest.raises(SchedulerError) as err:
        broken.initialize()
    assert err.value.code == "DB_INIT_FAILED"
    assert err.value.details == {"phase": "migration", "path": broken.location}
    assert "disk on fire" in err.value.message
    columns = _pg_columns(admin, schema, "jobs")
    assert "misfire_policy" not in columns and "dst_gap_policy" not in columns  # steps 0 and 1 undone
    assert [
        r[0]
        for r in _q(admin, sql.SQL("SELECT version FROM {}.schema_migrations").format(sql.Identifier(schema)).as_string(admin))
    ] == [1]


def test_newer_schema_version_fails_closed(store: PostgresStore, make_store: MakeStore, admin: psycopg.Connection[Any]) -> None:
    admin.execute(
        sql.SQL("INSERT INTO {}.schema_migrations VALUES (99, 'from the future', 0)").format(sql.Identifier(store.schema or ""))
    )
    with pytest.raises(SchedulerError) as err:
        make_store()
    assert err.value.code == "DB_INIT_FAILED"
    assert err.value.details["phase"] == "migration"
    assert "99" in err.value.message


def test_foreign_schema_is_refused(make_store: MakeStore, admin: psycopg.Connection[Any], pg_schema: str) -> None:
    admin.execute(sql.SQL("CREATE TABLE {}.customers (id int)").format(sql.Identifier(pg_schema)))
    with pytest.raises(SchedulerError) as err:
        make_store()
    assert err.value.code == "DB_INIT_FAILED"
    assert err.value.details["phase"] == "schema"
    assert _pg_tables(admin, pg_schema) == {"customers"}


def test_unreachable_server_fails_in_open_phase_without_leaking_password() -> None:
    store = PostgresStore("postgresql://someone:s3cret@127.0.0.1:1/test?schema=x&connect_timeout=2")
    assert "s3cret" not in store.location
    with pytest.raises(SchedulerError) as err:
        store.initialize()
    assert err.value.code == "DB_INIT_FAILED"
    assert err.value.details == {"phase": "open", "path": store.location}
    assert "s3cret" not in err.value.message and "127.0.0.1" in err.value.message


def test_use_before_initialize_fails_closed(make_store: MakeStore) -> None:
    store = make_store(initialize=False)
    with pytest.raises(SchedulerError) as err, store.transaction():
        pass
    assert err.value.code == "DB_INIT_FAILED"


def test_close_then_initialize_again(store: PostgresStore) -> None:
    store.close()
    store.close()  # idempotent
    store.initialize()
    assert store.schema_version() == SCHEMA_VERSION


# -- health ---------------------------------------------------------------------------------


def test_health_all_ok(store: PostgresStore) -> None:
    checks = store.health()
    assert [c["check"] for c in checks] == ["connection", "tables", "constraints", "triggers", "writable"]
    assert all(c["ok"] for c in checks), checks
    assert all(set(c) == {"check", "ok", "detail"} for c in checks)


def test_health_reports_missing_table_and_unvalidated_constraint(store: PostgresStore, admin: psycopg.Connection[Any]) -> None:
    ident = sql.Identifier(store.schema or "")
    admin.execute(sql.SQL("DROP TABLE {}.messages").format(ident))
    admin.execute(sql.SQL("ALTER TABLE {}.jobs ADD CONSTRAINT late_check CHECK (run_count >= 0) NOT VALID").format(ident))
    checks = {c["check"]: c for c in store.health()}
    assert not checks["tables"]["ok"] and "messages" in checks["tables"]["detail"]
    assert not checks["constraints"]["ok"] and "late_check" in checks["constraints"]["detail"]
    assert checks["writable"]["ok"]
