"""Initialisation, migrations, fail-closed errors, health, and drift against the SQLite schema."""

from __future__ import annotations

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
from scheduler_store_postgres import PostgresStore, migrations
from scheduler_store_postgres import store as store_module

from scheduler.errors import SchedulerError
from scheduler.store import migrations as kernel_migrations
from scheduler.store.sqlite import SQLiteStore

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
    store = SQLiteStore(tmp_path / "kernel.db")
    store.initialize()
    store.close()
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


# -- drift: the two schema files must describe the same database -----------------------------


def test_schema_file_table_set_matches_kernel_schema() -> None:
    kernel = {s.split()[5] for s in kernel_migrations.schema_statements() if s.upper().startswith("CREATE TABLE IF NOT EXISTS")}
    assert migrations.expected_tables() == kernel


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
    assert lite_indexes == migrations.expected_indexes()
    partial = dict(_q(admin, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s", (store.schema,)))
    assert "WHERE" in partial["jobs_due_idx"] and "WHERE" in partial["dispatch_pending_due_idx"]


def test_trigger_messages_match_sqlite() -> None:
    lite = set(re.findall(r"RAISE\(ABORT, '([A-Z_]+):", kernel_migrations.schema_text()))
    pg = set(re.findall(r"scheduler_refuse\('([A-Z_]+):", migrations.schema_text()))
    assert lite == pg


# -- initialisation -------------------------------------------------------------------------


def test_initialize_fresh_then_again_is_idempotent(make_store: MakeStore, admin: psycopg.Connection[Any], pg_schema: str) -> None:
    first = make_store()
    assert first.schema == pg_schema
    assert first.schema_version() == migrations.SCHEMA_VERSION == kernel_migrations.SCHEMA_VERSION
    tables = _pg_tables(admin, pg_schema)
    assert tables == migrations.expected_tables()
    first.initialize()  # no-op on an initialised instance
    second = make_store()
    third = make_store()
    assert _pg_tables(admin, pg_schema) == tables
    assert second.schema_version() == third.schema_version() == migrations.SCHEMA_VERSION
    rows = _q(admin, sql.SQL("SELECT version FROM {}.schema_migrations").format(sql.Identifier(pg_schema)).as_string(admin))
    assert rows == [(migrations.SCHEMA_VERSION,)]


def test_initialize_creates_missing_schema(make_store: MakeStore, pg_base_url: str, admin: psycopg.Connection[Any]) -> None:
    name = f"t_new_{uuid.uuid4().hex[:10]}"
    try:
        store = make_store(f"{pg_base_url}?schema={name}")
        assert store.schema == name
        assert _pg_tables(admin, name) == migrations.expected_tables()
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
        assert all(s.schema_version() == migrations.SCHEMA_VERSION for s in stores)
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


def _make_v1(admin: psycopg.Connection[Any], schema: str) -> None:
    ident = sql.Identifier(schema)
    for column in ("misfire_policy", "dst_gap_policy", "dst_fold_policy", "max_consecutive_failures"):
        admin.execute(sql.SQL("ALTER TABLE {}.jobs DROP COLUMN {}").format(ident, sql.Identifier(column)))
    admin.execute(sql.SQL("DELETE FROM {}.schema_migrations").format(ident))
    admin.execute(sql.SQL("INSERT INTO {}.schema_migrations VALUES (1, 'initial', 0)").format(ident))


def test_migration_v1_to_v2(store: PostgresStore, make_store: MakeStore, admin: psycopg.Connection[Any]) -> None:
    schema = store.schema or ""
    _make_v1(admin, schema)
    assert "misfire_policy" not in _pg_columns(admin, schema, "jobs")
    upgraded = make_store()
    assert upgraded.schema_version() == 2
    columns = _pg_columns(admin, schema, "jobs")
    assert columns["misfire_policy"] == (True, "'coalesce'::text")
    assert columns["max_consecutive_failures"] == (True, "3")
    versions = [
        r[0]
        for r in _q(
            admin, sql.SQL("SELECT version FROM {}.schema_migrations ORDER BY 1").format(sql.Identifier(schema)).as_string(admin)
        )
    ]
    assert versions == [1, 2]
    # the migrated column carries its CHECK
    with pytest.raises(SchedulerError) as err, upgraded.transaction() as tx:
        tx.execute(
            "INSERT INTO jobs(id, name, schedule_kind, payload_message, created_at, updated_at, misfire_policy)"
            " VALUES ('x', 'x', 'manual', 'm', 1, 1, 'bogus')"
        )
    assert err.value.code == "CONSTRAINT_VIOLATION"


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


def test_kernel_schema_version_mismatch_fails_closed(make_store: MakeStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_migrations, "SCHEMA_VERSION", migrations.SCHEMA_VERSION + 1)
    with pytest.raises(SchedulerError) as err:
        make_store()
    assert err.value.code == "DB_INIT_FAILED" and err.value.details["phase"] == "schema"


def test_use_before_initialize_fails_closed(make_store: MakeStore) -> None:
    store = make_store(initialize=False)
    with pytest.raises(SchedulerError) as err, store.transaction():
        pass
    assert err.value.code == "DB_INIT_FAILED"


def test_close_then_initialize_again(store: PostgresStore) -> None:
    store.close()
    store.close()  # idempotent
    store.initialize()
    assert store.schema_version() == migrations.SCHEMA_VERSION


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
