"""Storage: fail-closed initialisation, the packaged schema, migrations, and the guard triggers.

Real SQLite files in ``tmp_path`` throughout; the trigger tests take the ``store``
fixture so they also run on PostgreSQL where that store is installed and reachable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.core.store import migrations, schema, schema_steps
from scheduler.core.store.sqlite import SQLiteStore
from scheduler.core.store.sqlite_statements import BUSY_TIMEOUT_MS, SQLiteSchemaConnection
from scheduler.plugins.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
V1_FIXTURE = FIXTURES / "scheduler_v1.db"

#: Every table the runtime contract names (issue 2, "Storage").
CONTRACT_TABLES = {
    "jobs", "runs", "job_dispatch_queue", "dispatcher_leases", "approvals", "delivery_outbox",
    "delivery_attachments", "completion_debts", "evidence_records", "execution_artifacts", "runtime_events",
    "provider_sessions", "credential_presentations", "authorization_proof_replay", "messages", "schema_migrations",
}
#: What migration 2 adds to a version-1 database.
V2_COLUMNS = {s.column.name: s for m in migrations.MIGRATIONS if m.version == 2 for s in m.steps}
#: Columns migration 3 adds and drops.
V3_ADDED = {s.column.name for m in migrations.MIGRATIONS if m.version == 3 for s in m.steps if isinstance(s, schema_steps.AddColumn)}
V3_DROPPED = {s.column.name for m in migrations.MIGRATIONS if m.version == 3 for s in m.steps if isinstance(s, schema_steps.DropColumn)}
#: Every column some migration dropped (v3's executor fields, v4's old digest columns).
DROPPED = {s.column.name for m in migrations.MIGRATIONS for s in m.steps if isinstance(s, schema_steps.DropColumn)}
ALL_VERSIONS = [{"version": v} for v in range(1, migrations.SCHEMA_VERSION + 1)]


# --- helpers ----------------------------------------------------------------------------------


def sidecars(path: Path) -> list[str]:
    """``-wal``/``-shm``/``-journal`` files that exist beside ``path``."""
    return [s for s in ("-wal", "-shm", "-journal") if Path(str(path) + s).exists()]


def init_error(path: Path | str) -> SchedulerError:
    """Initialise a SQLite store at ``path`` and return the ``SchedulerError`` it must raise."""
    store = SQLiteStore(path)
    with pytest.raises(SchedulerError) as info:
        store.initialize()
    assert info.value.code == "DB_INIT_FAILED", info.value
    return info.value


def assert_names(err: SchedulerError, phase: str, path: Path | str) -> None:
    """A DB_INIT_FAILED error names its phase and the database path, in details and message."""
    assert err.details == {"phase": phase, "path": str(path)}
    assert str(path) in err.message and phase in err.message


def logical_dump(path: Path) -> list[str]:
    """The database's schema and rows as SQL text (what "unchanged" means for a live WAL file)."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def version_of(path: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    finally:
        conn.close()


def columns(path: Path, table: str) -> dict[str, tuple]:
    conn = sqlite3.connect(path)
    try:
        return {r[1]: tuple(r[2:]) for r in conn.execute(f"PRAGMA table_info({table})")}
    finally:
        conn.close()


def shape(path: Path) -> dict[str, Any]:
    """Tables with their columns (name, type, notnull, default, pk), index and trigger names."""
    conn = sqlite3.connect(path)
    try:
        out: dict[str, Any] = {}
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"):
            out[name] = sorted(tuple(r[1:]) for r in conn.execute(f"PRAGMA table_info({name})"))
        out["#indexes"] = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"))
        out["#triggers"] = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"))
        return out
    finally:
        conn.close()


@pytest.fixture
def v1_db(tmp_path: Path) -> Path:
    """A private copy of the committed version-1 fixture database."""
    target = tmp_path / "v1.db"
    shutil.copyfile(V1_FIXTURE, target)
    return target


# --- fresh initialisation --------------------------------------------------------------------


def test_fresh_init_creates_every_contract_table(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    store.initialize()
    store.close()
    conn = sqlite3.connect(db_path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables >= CONTRACT_TABLES, CONTRACT_TABLES - tables
    assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [(migrations.SCHEMA_VERSION,)]
    conn.close()


def test_fresh_init_creates_missing_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "scheduler.db"
    store = open_store(path)
    assert store.schema_version() == migrations.SCHEMA_VERSION
    store.close()
    assert path.is_file()


def test_connections_have_wal_foreign_keys_and_busy_timeout(db_path: Path) -> None:
    store = open_store(db_path)
    seen: dict[str, Any] = {}

    def pragmas(label: str) -> None:
        with store.read() as tx:
            seen[label] = (tx.scalar("PRAGMA journal_mode"), tx.scalar("PRAGMA foreign_keys"), tx.scalar("PRAGMA busy_timeout"))

    pragmas("main")
    worker = threading.Thread(target=pragmas, args=("worker",))  # each thread gets its own connection
    worker.start()
    worker.join()
    store.close()
    assert BUSY_TIMEOUT_MS >= 1000
    assert seen == {"main": ("wal", 1, BUSY_TIMEOUT_MS), "worker": ("wal", 1, BUSY_TIMEOUT_MS)}
    # WAL is persistent in the file itself, not a per-connection setting.
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_a_new_database_gets_the_small_page_size_and_an_existing_one_keeps_its_own(db_path: Path, v1_db: Path) -> None:
    """Issue 34: a database this store creates has ``NEW_DATABASE_PAGE_SIZE`` pages (half SQLite's default: a commit
    writes half the bytes to the WAL); one it opens, migrated or not, keeps the page size it was made with."""
    from scheduler.core.store.sqlite_upkeep import NEW_DATABASE_PAGE_SIZE

    assert NEW_DATABASE_PAGE_SIZE == 2048
    for path in (db_path, v1_db):
        store = open_store(path)
        store.close()
    sizes = {}
    for path in (db_path, v1_db):
        conn = sqlite3.connect(path)
        sizes[path.name] = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.close()
    assert sizes == {db_path.name: 2048, v1_db.name: 1024}  # the v1 fixture was made with 1,024-byte pages


def test_foreign_keys_are_enforced_through_the_store(db_path: Path) -> None:
    store = open_store(db_path)
    with pytest.raises(SchedulerError) as info, store.transaction() as tx:
        tx.execute("INSERT INTO runs(id, job_id, status, created_at) VALUES ('r1', 'no-such-job', 'pending', 1)")
    assert info.value.code == "CONSTRAINT_VIOLATION"
    store.close()


def test_concurrent_fresh_initialisation_is_safe(db_path: Path) -> None:
    """Several processes starting at once on a new file: every one ends up with the full schema."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def start() -> None:
        try:
            store = SQLiteStore(db_path)
            barrier.wait()
            store.initialize()
            assert store.schema_version() == migrations.SCHEMA_VERSION
            store.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert version_of(db_path) == [(migrations.SCHEMA_VERSION, "current schema.sql")]


def test_reopening_a_current_database_changes_nothing(db_path: Path) -> None:
    open_store(db_path).close()
    before = logical_dump(db_path)
    for _ in range(2):
        open_store(db_path).close()
    assert logical_dump(db_path) == before


# --- the packaged schema ----------------------------------------------------------------------


def test_packaged_schema_is_byte_identical_to_top_level_schema(tmp_path: Path) -> None:
    """Build the kernel wheel and compare ``scheduler/schema.sql`` inside it with ``schema.sql``.

    The source tree is copied first (symlinks kept as symlinks, exactly as in git) so the
    build does not write ``build/`` or egg-info into the checkout other tests run from.
    """
    import importlib.util

    if importlib.util.find_spec("wheel") is None and importlib.util.find_spec("setuptools.command.bdist_wheel") is None:
        pytest.skip("the build backend cannot make wheels here: pip install 'setuptools>=70.1' into the test environment")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "schema.sql", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "scheduler", src / "scheduler", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for link in (ROOT / "scheduler").rglob("*"):  # whatever the package's symlinks point at, outside it
        if link.is_symlink():
            target = link.resolve()
            rel = target.relative_to(ROOT)
            if not (src / rel).exists():
                if target.is_dir():
                    shutil.copytree(target, src / rel)
                else:
                    (src / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(target, src / rel)
    out = tmp_path / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("scheduler_kernel-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith("schema.sql")]
        assert names == ["scheduler/schema.sql"], names  # one copy, never duplicated
        packaged = zf.read("scheduler/schema.sql")
    assert packaged == (ROOT / "schema.sql").read_bytes()


def test_schema_module_reads_the_same_text_as_the_file() -> None:
    assert migrations.schema_text().encode("utf-8") == (ROOT / "schema.sql").read_bytes()
    declared = re.search(r"Schema version: (\d+)", migrations.schema_text())
    assert declared and int(declared.group(1)) == migrations.SCHEMA_VERSION


def test_schema_sql_is_generated_from_the_one_definition() -> None:
    """``schema.sql`` is ``render("sqlite")`` of ``scheduler.core.store.schema``: edit the module, then regenerate."""
    generated = schema.render("sqlite")
    committed = (ROOT / "schema.sql").read_text(encoding="utf-8")
    assert committed == generated, "schema.sql is stale: run `python -m scheduler.core.store.schema --write` and commit it"
    assert tuple(st.removesuffix(";") for st in migrations.schema_statements("sqlite")) == schema.statements("sqlite")


def test_every_dialect_renders_the_same_objects_and_guard_messages() -> None:
    sqlite_text, pg_text = schema.render("sqlite"), schema.render("postgresql")
    for name in schema.table_names() | schema.index_names():
        assert re.search(rf"\b{name}\b", sqlite_text) and re.search(rf"\b{name}\b", pg_text), name
    lite = re.findall(r"RAISE\(ABORT, '([A-Z_]+: [^']+)'\)", sqlite_text)
    pg = re.findall(r"scheduler_refuse\('([A-Z_]+: [^']+)'\)", pg_text)
    assert lite and set(lite) == set(pg)
    # PostgreSQL refuses TRUNCATE wherever a rule refuses DELETE (TRUNCATE skips row triggers).
    deletes = {t.name for t in schema.TABLES if any(g.event == "DELETE" for g in t.guards)}
    assert {t for name, t in schema.trigger_names("postgresql") if name.endswith("_no_truncate")} == deletes
    assert "BIGINT" not in sqlite_text and "AUTOINCREMENT" not in pg_text and "BYTEA" in pg_text


def test_one_migration_list_ends_at_the_schema_version() -> None:
    versions = [m.version for m in migrations.MIGRATIONS]
    assert versions == sorted(set(versions)) and versions[-1] == migrations.SCHEMA_VERSION == schema.SCHEMA_VERSION
    for m in migrations.MIGRATIONS:  # every step renders for every dialect
        for step in m.steps:
            for col in (getattr(step, "column", None), getattr(step, "before", None)):
                if isinstance(col, schema.Column):
                    assert all(col.definition(d) for d in schema.DIALECTS)
                elif isinstance(col, schema.Table):  # a dropped layout, kept for the record
                    assert all(schema.statements_for((col,), d) for d in schema.DIALECTS)


# --- fail-closed initialisation ---------------------------------------------------------------


def test_random_bytes_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "random.db"
    content = os.urandom(8192)
    path.write_bytes(content)
    err = init_error(path)
    assert_names(err, "open", path)
    assert path.read_bytes() == content
    assert sidecars(path) == []


def test_corrupt_file_with_sqlite_header_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    content = b"SQLite format 3\x00" + os.urandom(8192 - 16)
    path.write_bytes(content)
    err = init_error(path)
    assert err.details["path"] == str(path)
    assert path.read_bytes() == content


def test_path_whose_parent_is_a_file(tmp_path: Path) -> None:
    parent = tmp_path / "not-a-dir"
    parent.write_text("hello")
    for path in (parent / "scheduler.db", parent / "deeper" / "scheduler.db"):
        err = init_error(path)
        assert_names(err, "open", path)
    assert parent.read_text() == "hello"


def test_directory_path(tmp_path: Path) -> None:
    path = tmp_path / "adir"
    path.mkdir()
    err = init_error(path)
    assert_names(err, "open", path)
    assert list(path.iterdir()) == []


def test_foreign_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """A SQLite file of some other program (tables, no schema_migrations): refused, not converted to WAL."""
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes(body) VALUES ('keep me')")
    conn.commit()
    conn.close()
    content = path.read_bytes()
    err = init_error(path)
    assert_names(err, "schema", path)
    assert "schema_migrations" in err.message
    assert path.read_bytes() == content
    assert sidecars(path) == []


def test_newer_schema_version_is_refused_and_left_untouched(db_path: Path) -> None:
    open_store(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, 'from the future', 1)",
                 (migrations.SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    content = db_path.read_bytes()
    err = init_error(db_path)
    assert_names(err, "migration", db_path)
    assert str(migrations.SCHEMA_VERSION + 1) in err.message
    assert db_path.read_bytes() == content


def test_nothing_runs_against_a_store_whose_init_failed(tmp_path: Path) -> None:
    path = tmp_path / "random.db"
    path.write_bytes(os.urandom(4096))
    store = SQLiteStore(path)
    with pytest.raises(SchedulerError):
        store.initialize()
    for use in (store.transaction, store.read):
        with pytest.raises(SchedulerError) as info, use() as tx:
            tx.scalar("SELECT 1")
        assert info.value.code == "DB_INIT_FAILED"


# --- migrations -------------------------------------------------------------------------------


def test_v1_fixture_is_what_the_generator_describes(v1_db: Path, tmp_path: Path) -> None:
    """The committed fixture really is version 1 and has exactly the layout the generator derives from the history."""
    from fixtures.make_v1_fixture import build

    assert sidecars(V1_FIXTURE) == []
    assert version_of(v1_db) == [(1, "current schema.sql")]
    assert set(V2_COLUMNS) and not set(V2_COLUMNS) & set(columns(v1_db, "jobs"))
    assert set(columns(v1_db, "jobs")) | set(columns(v1_db, "runs")) >= V3_DROPPED
    assert V1_FIXTURE.stat().st_size < 128 * 1024
    rebuilt = tmp_path / "rebuilt.db"
    build(rebuilt)
    assert shape(rebuilt) == shape(v1_db)


def test_v1_database_migrates_and_a_second_open_is_harmless(v1_db: Path, tmp_path: Path) -> None:
    from scheduler.core.artifact import check_job, load_artifact

    conn = sqlite3.connect(v1_db)
    conn.row_factory = sqlite3.Row
    jobs_before = [dict(r) for r in conn.execute("SELECT * FROM jobs ORDER BY id")]
    runs_before = [dict(r) for r in conn.execute("SELECT * FROM runs")]
    events_before = conn.execute("SELECT COUNT(*) FROM runtime_events").fetchone()[0]
    conn.close()
    assert len(jobs_before) == 2

    for attempt in range(2):
        store = open_store(v1_db)
        assert store.schema_version() == migrations.SCHEMA_VERSION
        with store.read() as tx:
            rows = tx.all("SELECT * FROM jobs ORDER BY id")
            runs = tx.all("SELECT * FROM runs")
            assert tx.all("SELECT version FROM schema_migrations ORDER BY version") == ALL_VERSIONS
            assert tx.scalar("SELECT COUNT(*) FROM runtime_events") == events_before
            # v4 bound every job to its native execution artifact, which it still matches exactly
            for row in rows:
                assert load_artifact(tx, row["artifact_digest"]).payload["job_id"] == row["id"]
                assert check_job(tx, row) == row["artifact_digest"]
        store.close()
        assert len(rows) == 2
        for row, old in zip(rows, jobs_before, strict=True):
            # every value of a column that still exists is preserved ...
            assert {k: v for k, v in row.items() if k in old} == {k: v for k, v in old.items() if k not in DROPPED}
            # ... columns added since are at their declared defaults (no executor field was set in the fixture)
            assert {k: row[k] for k in V2_COLUMNS} == {
                "misfire_policy": "coalesce", "dst_gap_policy": "shift", "dst_fold_policy": "once", "max_consecutive_failures": 3,
            }
            assert (row["executor_options"], row["delivery_options"], row["constraints"]) == ("{}", "{}", "{}")
            assert not DROPPED & set(row)
        assert [{k: v for k, v in r.items() if k in runs_before[0]} for r in runs] == [
            {k: v for k, v in r.items() if k not in DROPPED} for r in runs_before]

        if attempt == 0:
            after_first = logical_dump(v1_db)
    assert logical_dump(v1_db) == after_first  # the second open changed nothing
    conn = sqlite3.connect(v1_db)
    assert conn.execute("SELECT COUNT(*) FROM schema_migrations WHERE version = 2").fetchone()[0] == 1
    conn.close()

    # The migrated file has exactly the shape of a freshly created one.
    fresh = tmp_path / "fresh.db"
    open_store(fresh).close()
    assert shape(v1_db) == shape(fresh)


def test_v3_moves_executor_fields_into_options_and_process_identity_into_the_handle(v1_db: Path) -> None:
    """A v2 shell job's env policy and working directory, an agent job's context, a run's pid/pgid: moved, not lost."""
    conn = sqlite3.connect(v1_db)
    conn.execute("UPDATE jobs SET shell_env_policy = 'inherit', working_dir = '/srv/backup', stdin_text = 'y\n'"
                 " WHERE name = 'nightly-backup'")
    conn.execute("UPDATE jobs SET context_mode = 'session', heartbeat_file = 'HEARTBEAT.md',"
                 " working_dir = '/ignored/for/agents' WHERE name = 'poll-inbox'")
    conn.execute("UPDATE runs SET pid = 4321, pgid = 4321, process_start_time = 'ticks:99', process_state = 'running'")
    conn.commit()
    conn.close()

    store = open_store(v1_db)
    try:
        with store.read() as tx:
            options = {r["name"]: json.loads(r["executor_options"]) for r in tx.all("SELECT name, executor_options FROM jobs")}
            handle = tx.scalar("SELECT executor_handle FROM runs")
        assert options == {
            "nightly-backup": {"env_policy": "inherit", "working_dir": "/srv/backup", "stdin_text": "y\n"},
            "poll-inbox": {"context_mode": "session", "heartbeat_file": "HEARTBEAT.md"},
        }
        assert json.loads(handle) == {"pid": 4321, "pgid": 4321, "start_time": "ticks:99", "host": "host-a"}
        # the widened CHECK: a finished run may now record that its process exited
        with store.transaction() as tx:
            assert tx.execute("UPDATE runs SET process_state = 'exited'") == 1
        with pytest.raises(SchedulerError) as info, store.transaction() as tx:
            tx.execute("UPDATE runs SET process_state = 'vanished'")
        assert info.value.code == "CONSTRAINT_VIOLATION"
        with store.read() as tx:
            assert tx.scalar("PRAGMA integrity_check") == "ok"
    finally:
        store.close()
    conn = sqlite3.connect(v1_db)
    (runs_sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'runs'").fetchone()
    conn.close()
    assert "'exited'" in runs_sql and "pid" not in re.findall(r"\b\w+\b", runs_sql)


def test_widen_check_rewrites_only_the_column_and_keeps_comments() -> None:
    create = ("CREATE TABLE runs (\n    id TEXT PRIMARY KEY,\n    -- process (shell)\n"
              "    process_state   TEXT    CHECK (process_state IS NULL OR process_state IN ('a', 'b')),\n"
              "    note TEXT DEFAULT 'x, (y)',\n    CHECK (id <> '')\n)")
    new = schema_steps.replace_column_definition(create, "process_state", "process_state TEXT CHECK (process_state IN ('a', 'b', 'c'))")
    assert new == create.replace("process_state   TEXT    CHECK (process_state IS NULL OR process_state IN ('a', 'b'))",
                                 "process_state TEXT CHECK (process_state IN ('a', 'b', 'c'))")
    assert schema_steps.replace_column_definition(new, "process_state", "process_state  TEXT CHECK (process_state IN ('a', 'b', 'c'))") == new
    with pytest.raises(ValueError):
        schema_steps.replace_column_definition(create, "pid", "pid INTEGER")


def test_migration_steps_are_idempotent(v1_db: Path) -> None:
    """Running every migration over a database that already has them is a no-op."""
    open_store(v1_db).close()
    before = logical_dump(v1_db)
    conn = sqlite3.connect(v1_db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    assert migrations.migrate(SQLiteSchemaConnection(conn), 1, 123) == list(range(2, migrations.SCHEMA_VERSION + 1))
    conn.execute("COMMIT")
    conn.close()
    assert logical_dump(v1_db) == before


def test_migrated_jobs_are_usable_through_the_cli(v1_db: Path) -> None:
    from scheduler.core.jobs import job_to_json, list_jobs, update_job

    store = open_store(v1_db)
    updated = update_job(store, "nightly-backup", {"dst_gap_policy": "skip"})
    assert updated.dst_gap_policy == "skip" and updated.schedule_cron == "30 2 * * *"
    with store.read() as tx:
        views = {v["name"]: v for v in map(job_to_json, list_jobs(tx))}
    store.close()
    assert views["poll-inbox"]["state"] == "disabled" and views["poll-inbox"]["schedule_every"] == "15m"


def test_interrupted_migration_leaves_the_database_unchanged(v1_db: Path) -> None:
    before = logical_dump(v1_db)
    calls: list[tuple[int, int]] = []

    def hook(version: int, step: int) -> None:
        calls.append((version, step))
        if (version, step) == (3, 8):  # migration 2 and half of migration 3 already ran inside the transaction
            raise RuntimeError("power cut")

    store = SQLiteStore(v1_db)
    store.migration_step_hook = hook
    with pytest.raises(SchedulerError) as info:
        store.initialize()
    assert calls == [(2, 0), (2, 1), (2, 2), (2, 3), *((3, i) for i in range(9))]
    assert info.value.code == "DB_INIT_FAILED"
    assert_names(info.value, "migration", v1_db)
    assert "power cut" in info.value.message
    assert logical_dump(v1_db) == before
    assert version_of(v1_db) == [(1, "current schema.sql")]
    assert not set(V2_COLUMNS) & set(columns(v1_db, "jobs"))

    later = open_store(v1_db)
    assert later.schema_version() == migrations.SCHEMA_VERSION
    later.close()
    assert set(V2_COLUMNS) <= set(columns(v1_db, "jobs"))


_KILL_SCRIPT = """
import pathlib, sys, time
from scheduler.core.store.sqlite import SQLiteStore
store = SQLiteStore(sys.argv[1])
marker = pathlib.Path(sys.argv[2])
def hook(version, step):
    if (version, step) == (3, 6):  # the v3 data move is done, the old columns are about to go
        marker.write_text("in migration")
        time.sleep(30)
store.migration_step_hook = hook
store.initialize()
print("finished")  # never reached: killed while sleeping
"""


def test_migration_killed_with_sigkill_is_redone_by_a_later_open(v1_db: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(v1_db), str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the migration never reached step (3, 6)"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        out, _err = proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL and b"finished" not in out
    # The half-done migration was never committed ...
    assert version_of(v1_db) == [(1, "current schema.sql")]
    assert not set(V2_COLUMNS) & set(columns(v1_db, "jobs"))
    assert not V3_ADDED & (set(columns(v1_db, "jobs")) | set(columns(v1_db, "runs")))
    # ... and the next open migrates cleanly.
    store = open_store(v1_db)
    assert store.schema_version() == migrations.SCHEMA_VERSION
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM jobs") == 2
        assert tx.scalar("PRAGMA integrity_check") == "ok"
    store.close()


# --- opening without writing; locks are DB_BUSY ----------------------------------------------


def _hold_exclusive(path: Path) -> sqlite3.Connection:
    """Another connection holding SQLite's write lock (``BEGIN EXCLUSIVE``) until closed."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def test_opening_a_current_database_starts_no_write_transaction(db_path: Path) -> None:
    """With the write lock held elsewhere, an up-to-date database still opens at once and reads work."""
    open_store(db_path).close()
    holder = _hold_exclusive(db_path)
    try:
        for readonly in (True, False):
            started = time.monotonic()
            store = SQLiteStore(db_path, busy_timeout_ms=30_000)
            store.initialize(readonly=readonly)
            with store.read() as tx:
                assert tx.scalar("SELECT COUNT(*) FROM jobs") == 0
            store.close()
            assert time.monotonic() - started < 5  # not the 30 s busy timeout
    finally:
        holder.rollback()
        holder.close()


def test_a_lock_during_a_needed_migration_is_db_busy_not_db_init_failed(v1_db: Path) -> None:
    open_store(v1_db, initialize=False)  # nothing happens without initialise
    holder = _hold_exclusive(v1_db)
    try:
        store = SQLiteStore(v1_db, busy_timeout_ms=200)
        with pytest.raises(SchedulerError) as info:
            store.initialize()
        assert info.value.code == "DB_BUSY" and info.value.retryable
        assert str(v1_db) in info.value.message
    finally:
        holder.rollback()
        holder.close()
    assert version_of(v1_db) == [(1, "current schema.sql")]
    store.initialize()  # the lock is gone: the same store now migrates
    assert store.schema_version() == migrations.SCHEMA_VERSION
    store.close()


def test_readonly_open_of_an_older_database_says_it_needs_migrating_and_writes_nothing(v1_db: Path) -> None:
    before = v1_db.read_bytes()
    store = SQLiteStore(v1_db)
    with pytest.raises(SchedulerError) as info:
        store.initialize(readonly=True)
    err = info.value
    assert err.code == "DB_INIT_FAILED"
    assert err.details == {"phase": "migration", "path": str(v1_db), "readonly": True, "version": 1,
                           "expected_version": migrations.SCHEMA_VERSION}
    assert "only reads" in err.message and "migrate" in err.message and "scheduler doctor" in err.message
    assert v1_db.read_bytes() == before and version_of(v1_db) == [(1, "current schema.sql")]
    open_store(v1_db).close()  # a writing open migrates ...
    store = open_store(v1_db, readonly=True)  # ... after which reading needs nothing
    assert store.schema_version() == migrations.SCHEMA_VERSION
    store.close()


def test_readonly_open_creates_a_missing_database_but_never_repairs_an_existing_one(tmp_path: Path) -> None:
    fresh = tmp_path / "new.db"
    open_store(fresh, readonly=True).close()  # first use: created, as any command would
    assert version_of(fresh) == [(migrations.SCHEMA_VERSION, "current schema.sql")]
    conn = sqlite3.connect(fresh)
    conn.execute("DROP TRIGGER runs_terminal_is_final")
    conn.commit()
    conn.close()
    before = logical_dump(fresh)
    with pytest.raises(SchedulerError) as refused:  # issue 29, defect 5: nor answers from the damaged schema
        open_store(fresh, readonly=True).close()
    assert refused.value.code == "DB_INIT_FAILED" and refused.value.details["phase"] == "schema"
    assert refused.value.details["missing"] == ["trigger runs_terminal_is_final"]
    assert logical_dump(fresh) == before  # reading does not repair ...
    open_store(fresh).close()
    assert "runs_terminal_is_final" in shape(fresh)["#triggers"]  # ... a writing open does


_HOLD_SCRIPT = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_cli_reads_while_another_process_holds_the_write_lock(db_path: Path) -> None:
    """Issue 9, defect 6: ``jobs list`` works during another process's long write; a write command is DB_BUSY."""
    from kernel_testing import scheduler_cmd

    env = {**os.environ, "SCHEDULER_STORAGE_SQLITE_BUSY_TIMEOUT_MS": "500", "SCHEDULER_DISABLE_PLUGINS": ""}
    add = [*scheduler_cmd(), "--db", str(db_path), "--json", "jobs", "add",
           json.dumps({"name": "a", "schedule_kind": "manual", "payload_message": "true"})]
    assert subprocess.run(add, env=env, capture_output=True, timeout=60).returncode == 0
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_SCRIPT, str(db_path), "25"], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        started = time.monotonic()
        listed = subprocess.run([*scheduler_cmd(), "--db", str(db_path), "--json", "jobs", "list"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert [j["name"] for j in json.loads(listed.stdout)["jobs"]] == ["a"]
        assert time.monotonic() - started < 10
        add[-1] = add[-1].replace('"a"', '"b"')
        busy = subprocess.run(add, env=env, capture_output=True, text=True, timeout=60)
        doc = json.loads(busy.stdout)
        assert busy.returncode != 0 and doc["code"] == "DB_BUSY", doc
    finally:
        holder.kill()
        holder.wait(10)


# --- no dialect branches outside the stores -----------------------------------------------------


def _dialect_branches(path: Path) -> list[str]:
    """Comparisons in a Python file that test a store's ``dialect`` or look for ``"://"`` in a string."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op in operands:
            if isinstance(op, ast.Constant) and isinstance(op.value, str) and "://" in op.value and any(
                    isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
                found.append(f"{path}:{node.lineno}: '://' test")
            if (isinstance(op, ast.Attribute) and op.attr == "dialect") or (isinstance(op, ast.Name) and op.id == "dialect"):
                found.append(f"{path}:{node.lineno}: dialect test")
    return found


def test_kernel_code_outside_the_stores_never_branches_on_the_dialect() -> None:
    """Store differences are Store attributes (``exclusive_dispatch``, ``local_path``), not tests of dialect or URL."""
    allowed = (ROOT / "scheduler" / "core" / "store",)
    files = [p for tree in ("scheduler", "bench") for p in (ROOT / tree).rglob("*.py")
             if not any(p.is_relative_to(a) for a in allowed)]
    assert len(files) > 20
    offenders = [hit for p in files for hit in _dialect_branches(p)]
    assert offenders == []


def test_the_dialect_check_sees_a_branch(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("def f(store, url):\n    if store.dialect == 'sqlite':\n        pass\n"
                      "    return '://' not in url\n")
    assert [h.split(": ", 1)[1] for h in _dialect_branches(sample)] == ["dialect test", "'://' test"]


def test_sqlite_store_states_what_the_kernel_would_otherwise_guess(db_path: Path) -> None:
    from scheduler.core.store import local_path_of
    from scheduler.core.store.base import Store

    store = SQLiteStore(db_path)
    assert isinstance(store, Store)
    assert store.exclusive_dispatch is True and store.local_path == db_path
    assert local_path_of(str(db_path)) == db_path and local_path_of("sqlite://" + str(db_path)) == db_path
    assert local_path_of("postgresql://u:p@h/db?schema=s") is None


# --- guard triggers (both stores) ---------------------------------------------------------------


def refused(store: Any, sql: str, params: tuple = (), tag: str = "") -> None:
    """The statement fails with CONSTRAINT_VIOLATION (naming the guard) and its transaction rolls back."""
    with pytest.raises(SchedulerError) as info, store.transaction() as tx:
        tx.execute(sql, params)
    assert info.value.code == "CONSTRAINT_VIOLATION", info.value
    assert tag in info.value.message


def make_job(store: Any, name: str = "guarded") -> str:
    from scheduler.core.jobs import create_jobs
    from scheduler.core.spec import validate_spec

    return create_jobs(store, [validate_spec({"name": name, "schedule_kind": "manual", "payload_message": "true"})])[0].id


def test_runtime_events_are_append_only(store: Any) -> None:
    with store.transaction() as tx:
        tx.execute("INSERT INTO runtime_events(at, kind, actor) VALUES (1, 'test.event', 'me')")
        event_id = tx.scalar("SELECT MAX(id) FROM runtime_events")
    refused(store, "UPDATE runtime_events SET kind = 'forged' WHERE id = ?", (event_id,), "EVENTS_APPEND_ONLY")
    refused(store, "DELETE FROM runtime_events WHERE id = ?", (event_id,), "EVENTS_APPEND_ONLY")
    with store.read() as tx:
        assert tx.scalar("SELECT kind FROM runtime_events WHERE id = ?", (event_id,)) == "test.event"


def test_evidence_records_cannot_be_updated(store: Any) -> None:
    with store.transaction() as tx:
        tx.execute(
            "INSERT INTO evidence_records(id, run_id, provider, methods, payload_sha256, canonical_payload, created_at)"
            " VALUES ('ev1', 'run1', 'checksum', '[\"sha256\"]', ?, '{}', 1)", ("cd" * 32,))
    refused(store, "UPDATE evidence_records SET verified = 1 WHERE id = 'ev1'", (), "EVIDENCE_IMMUTABLE")
    with store.read() as tx:
        assert tx.scalar("SELECT verified FROM evidence_records WHERE id = 'ev1'") == 0


def test_lease_tokens_never_decrease_and_rows_are_never_deleted(store: Any) -> None:
    with store.transaction() as tx:
        tx.execute("INSERT INTO dispatcher_leases(name, owner, token, expires_at) VALUES ('dispatcher', 'a', 5, 10)")
    refused(store, "UPDATE dispatcher_leases SET token = 4 WHERE name = 'dispatcher'", (), "LEASE_TOKEN_REGRESSION")
    refused(store, "DELETE FROM dispatcher_leases WHERE name = 'dispatcher'", (), "LEASE_IMMUTABLE")
    with store.transaction() as tx:  # moving forward (or keeping the token) is fine
        assert tx.execute("UPDATE dispatcher_leases SET token = 6, owner = 'b' WHERE name = 'dispatcher'") == 1
        assert tx.execute("UPDATE dispatcher_leases SET owner = NULL WHERE name = 'dispatcher'") == 1
    with store.read() as tx:
        assert tx.scalar("SELECT token FROM dispatcher_leases WHERE name = 'dispatcher'") == 6


@pytest.mark.parametrize("terminal", ["ok", "error", "timeout", "cancelled", "crashed", "skipped"])
def test_terminal_run_status_never_changes(store: Any, terminal: str) -> None:
    job_id = make_job(store)
    with store.transaction() as tx:
        tx.execute("INSERT INTO runs(id, job_id, status, created_at) VALUES ('r1', ?, ?, 1)", (job_id, terminal))
    for other in ("running", "pending", "ok" if terminal != "ok" else "error"):
        refused(store, "UPDATE runs SET status = ? WHERE id = 'r1'", (other,), "RUN_TERMINAL")
    with store.transaction() as tx:  # audit fields may still be added
        assert tx.execute("UPDATE runs SET summary = 'audited' WHERE id = 'r1'") == 1
    with store.read() as tx:
        assert tx.one("SELECT status, summary FROM runs WHERE id = 'r1'") == {"status": terminal, "summary": "audited"}


def test_non_terminal_run_status_may_change(store: Any) -> None:
    job_id = make_job(store)
    with store.transaction() as tx:
        tx.execute("INSERT INTO runs(id, job_id, status, created_at) VALUES ('r1', ?, 'pending', 1)", (job_id,))
        assert tx.execute("UPDATE runs SET status = 'running' WHERE id = 'r1'") == 1
        assert tx.execute("UPDATE runs SET status = 'ok' WHERE id = 'r1'") == 1


def test_delivered_outbox_part_is_never_resent(store: Any) -> None:
    with store.transaction() as tx:
        tx.execute(
            "INSERT INTO delivery_outbox(id, channel, idempotency_key, group_key, body, status, due_at, delivered_at, created_at, updated_at)"
            " VALUES ('o1', 'webhook', 'k1', 'g1', 'hello', 'delivered', 1, 2, 1, 2)")
    for other in ("pending", "claimed", "failed", "cancelled"):
        refused(store, "UPDATE delivery_outbox SET status = ? WHERE id = 'o1'", (other,), "OUTBOX_DELIVERED")
    # final means final: the body, target and attempts of a delivered part cannot be rewritten either
    refused(store, "UPDATE delivery_outbox SET body = 'changed' WHERE id = 'o1'", (), "OUTBOX_DELIVERED")
    refused(store, "UPDATE delivery_outbox SET attempts = attempts + 1 WHERE id = 'o1'", (), "OUTBOX_DELIVERED")
    with store.read() as tx:
        row = tx.one("SELECT status, body, attempts FROM delivery_outbox WHERE id = 'o1'")
    assert row == {"status": "delivered", "body": "hello", "attempts": 0}


# --- the Store contract (both stores) ----------------------------------------------------------


def test_nested_transactions_join_the_outer_one_and_commit_at_its_exit(store: Any) -> None:
    """The nesting contract of ``Store``: inner blocks join, the outermost exit commits, an escaping error undoes all."""
    from scheduler.core.store.base import Store

    assert isinstance(store, Store) and isinstance(store.exclusive_dispatch, bool)
    seen_outside: list[int] = []

    def count_from_another_thread() -> None:
        with store.read() as tx:
            seen_outside.append(tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind = 'nest'"))

    with store.transaction() as outer:
        outer.execute("INSERT INTO runtime_events(at, kind) VALUES (1, 'nest')")
        with store.transaction() as inner:
            inner.execute("INSERT INTO runtime_events(at, kind) VALUES (2, 'nest')")
        with store.read() as snap:  # read() inside a transaction joins it: its own writes are visible
            assert snap.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind = 'nest'") == 2
        t = threading.Thread(target=count_from_another_thread)
        t.start()
        t.join(10)
    assert seen_outside == [0]  # the inner exit committed nothing
    with pytest.raises(RuntimeError), store.transaction() as outer:
        outer.execute("INSERT INTO runtime_events(at, kind) VALUES (3, 'nest')")
        with store.transaction() as inner:
            inner.execute("INSERT INTO runtime_events(at, kind) VALUES (4, 'nest')")
        raise RuntimeError("undo both")
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind = 'nest'") == 2


def test_the_store_plugin_api_is_complete() -> None:
    """A store plugin's contract is ``scheduler.api.store`` (Store, Tx); what it builds the schema from is the toolkit's."""
    import scheduler_toolkit.store as toolkit_store

    import scheduler.api.store as api_store

    assert set(api_store.__all__) == {"Store", "Tx"}
    for name in toolkit_store.__all__:
        assert getattr(toolkit_store, name) is not None, name
    assert toolkit_store.schema_statements("postgresql") == schema.statements("postgresql")
    assert toolkit_store.schema_fingerprint("sqlite") == schema.fingerprint("sqlite")  # the shipped file is the render
    assert toolkit_store.MIGRATIONS is migrations.MIGRATIONS


# --- column conventions -----------------------------------------------------------------------


def test_credential_presentations_has_no_column_for_a_value(db_path: Path) -> None:
    open_store(db_path).close()
    names = set(columns(db_path, "credential_presentations"))
    assert {"binding_name", "provider", "medium"} <= names
    forbidden = re.compile(r"value|secret|token|password|passwd|credential|plaintext|content|data|payload", re.IGNORECASE)
    assert [n for n in names if forbidden.search(n)] == []


def test_time_columns_are_declared_integer(db_path: Path) -> None:
    open_store(db_path).close()
    conn = sqlite3.connect(db_path)
    offenders = []
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"):
        for row in conn.execute(f"PRAGMA table_info({table})"):
            name, decl = row[1], row[2]
            if (name == "at" or name.endswith(("_at", "_ms", "_for"))) and decl.upper() != "INTEGER":
                offenders.append(f"{table}.{name} {decl}")
    conn.close()
    assert offenders == []


def test_times_are_stored_as_integer_epoch_milliseconds(db_path: Path) -> None:
    from scheduler.core.jobs import create_jobs
    from scheduler.core.spec import validate_spec

    store = open_store(db_path)
    before = int(time.time() * 1000)
    create_jobs(store, [validate_spec({"name": "t", "schedule_kind": "every", "schedule_every": "1h", "payload_message": "true"})])
    after = int(time.time() * 1000)
    store.close()
    conn = sqlite3.connect(db_path)
    row = conn.execute("SELECT typeof(created_at), typeof(updated_at), typeof(next_run_at), typeof(schedule_anchor_at),"
                       " created_at, next_run_at FROM jobs").fetchone()
    assert row[:4] == ("integer",) * 4
    assert before <= row[4] <= after  # milliseconds, not seconds
    assert row[5] - row[4] == 3_600_000
    event_at = conn.execute("SELECT typeof(at), at FROM runtime_events").fetchone()
    assert event_at[0] == "integer" and before <= event_at[1] <= after
    conn.close()


def test_the_wal_starts_over_while_a_writer_never_stops(tmp_path: Path) -> None:
    """A dispatcher under load commits without pause. The background checkpoint still brings the WAL to its end (the
    last frames under the process's write lock), so the next write starts the WAL over: it stays a fraction of what
    was written instead of growing with it (every page lookup of every connection searches the whole WAL)."""
    from scheduler.core.store import sqlite_upkeep as sqlite_store

    store = open_store(str(tmp_path / "w.db"))
    wal = tmp_path / "w.db-wal"
    blob = "x" * 3000
    written = 0
    biggest = 0
    # Long enough that one checkpoint round delayed by a loaded machine (the other test worker fsyncing) does not
    # decide the ratio: 12 rounds.
    end = time.monotonic() + 12 * sqlite_store.CHECKPOINT_INTERVAL_S + 1.0
    try:
        while time.monotonic() < end:
            with store.transaction() as tx:
                for _ in range(8):
                    tx.execute("INSERT INTO runtime_events(at, kind, data) VALUES (?, 'test.fill', ?)", (0, blob))
            written += 8 * len(blob)
            biggest = max(biggest, wal.stat().st_size if wal.exists() else 0)
    finally:
        store.close()
    assert written > 4 * 1024 * 1024, f"only {written} bytes written: too few for the WAL to have to start over"
    assert biggest < written / 2, f"the WAL grew to {biggest} bytes for {written} bytes written"


def test_a_connection_caches_every_statement_the_dispatcher_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatcher's connection runs ~140 distinct texts; past Python's default 128 the LRU cache re-prepares each pass."""
    import sqlite3

    from scheduler.core.state import STATEMENTS
    from scheduler.core.store.sqlite_upkeep import STATEMENT_CACHE_SIZE

    assert 3 * len(STATEMENTS) <= STATEMENT_CACHE_SIZE  # each statement in a few renderings (row counts, flags) at once
    asked: list[object] = []
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        asked.append(kwargs.get("cached_statements"))
        return real(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    store = open_store(str(tmp_path / "cache.db"))
    try:
        with store.transaction() as tx:
            tx.execute("SELECT 1")
    finally:
        store.close()
    assert asked and set(asked) == {STATEMENT_CACHE_SIZE}  # every connection the store opened
