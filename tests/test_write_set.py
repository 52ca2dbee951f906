"""Issue 34, a slimmer write set that keeps every audit fact: what a run writes, and what its readers still find.

Schema 11 drops ``dispatch_run_idx`` (claiming a dispatch wrote an entry in it for every run): the one query
that used it, pruning's "does an open dispatch name this run as its run", asks through ``dispatch_job_idx``
(the run's job, the open statuses) and still keeps such a run. Schema 12 spells SQLite's list-of-choices
CHECKs as equalities joined by OR (SQLite builds an ephemeral index for ``IN (...)`` each time a statement
runs): every value outside a list is still refused by the database. Both stores, real databases, and older
databases migrated with their data. The start and finish events a plain run shows in ``runs events --json``
are pinned field by field against the run row (the shape any other recording of them must keep).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import TERMINAL, RunningDispatcher, add_job, run_rows, wait_for

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.queue import enqueue_manual
from scheduler.core.store import migrations, schema, schema_steps
from scheduler.ops import queries
from scheduler.ops.pruning import prune_runs
from scheduler.plugins.stores import open_store

DAY = 86_400_000


def _run_once(store: Any, dispatcher: Any, tmp_path: Path, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """One finished run of a new manual job per name, through a real dispatcher."""
    jobs = {name: add_job(store, name=name, executor="testkit", payload_message="ok") for name in names}
    for job in jobs.values():
        enqueue_manual(store, job["id"])
    d = dispatcher(artifacts_root=tmp_path / "artifacts")
    try:
        return {name: wait_for(lambda j=job: next((r for r in run_rows(store, j["id"]) if r["status"] in TERMINAL), None),
                               timeout=30, what=f"the run of {name}") for name, job in jobs.items()}
    finally:
        d.stop()


def _indexes(tx: Any, dialect: str) -> set[str]:
    if dialect == "sqlite":
        return {r["name"] for r in tx.all("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'")}
    return {r["indexname"] for r in tx.all("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")}


def _back_to(store: Any, version: int, *statements: str) -> None:
    """Give ``store`` an older version's layout (``statements``) and record that version alone, as such a database has."""
    with store.transaction() as tx:
        for sql in statements:
            tx.execute(sql)
        tx.execute("DELETE FROM schema_migrations")
        tx.execute("INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, 0)", (version, f"v{version}"))


def _reopened(store: Any, store_url: str) -> Any:
    """Close ``store`` and open its database again (the migrations run); the caller closes what is returned."""
    store.close()
    upgraded = open_store(store_url)
    assert upgraded.schema_version() == migrations.SCHEMA_VERSION
    return upgraded


def _versions(tx: Any) -> list[int]:
    """The versions a database records, oldest first."""
    return [r["version"] for r in tx.all("SELECT version FROM schema_migrations ORDER BY version")]


def test_the_schema_has_no_dispatch_run_index_and_keeps_the_lineage_ones() -> None:
    assert "dispatch_run_idx" not in schema.index_names()
    assert {"runs_dispatch_idx", "dispatch_source_run_idx", "dispatch_job_idx"} <= schema.index_names()


def test_prune_keeps_a_run_an_open_dispatch_names_as_its_run(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    """The NOT EXISTS that used dispatch_run_idx, now through dispatch_job_idx: an open dispatch naming the run keeps it."""
    runs = _run_once(store, dispatcher, tmp_path, ("named", "free"))
    with store.transaction() as tx:
        for run in runs.values():
            at = now_ms() - 40 * DAY
            tx.execute("UPDATE runs SET finished_at = ?, started_at = ?, created_at = ? WHERE id = ?", (at, at, at, run["id"]))
        # an approved run's dispatch back in the queue, pending, still naming the run it will start
        tx.execute("INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, run_id)"
                   " VALUES ('open-one', ?, 'manual', 'pending', ?, ?, ?, ?)",
                   (runs["named"]["job_id"], now_ms() + DAY, now_ms(), now_ms(), runs["named"]["id"]))
    report = prune_runs(store, older_than_ms=30 * DAY)
    assert report.pruned == [runs["free"]["id"]]
    with store.read() as tx:
        assert {r["id"] for r in tx.all("SELECT id FROM runs")} == {runs["named"]["id"]}
    with store.transaction() as tx:
        tx.execute("UPDATE job_dispatch_queue SET status = 'cancelled' WHERE id = 'open-one'")
    assert prune_runs(store, older_than_ms=30 * DAY).pruned == [runs["named"]["id"]], "a settled dispatch keeps nothing"


def test_migration_11_drops_dispatch_run_idx_and_keeps_every_row(store_url: str, dispatcher: Any, store: Any,
                                                                  tmp_path: Path) -> None:
    """A version 10 database with a finished run migrates to 11: the index is gone, the run and its audit trail read the same."""
    (step,) = next(m for m in migrations.MIGRATIONS if m.version == 11).steps
    runs = _run_once(store, dispatcher, tmp_path, ("before",))
    run = runs["before"]
    shown, events = queries.get_run(store, run["id"]), queries.run_events(store, run["id"])
    _back_to(store, 10, step.sql)  # the index migration 11 records
    with store.read() as tx:
        assert "dispatch_run_idx" in _indexes(tx, store.dialect), "the version 10 layout was restored"
    upgraded = _reopened(store, store_url)
    try:
        with upgraded.read() as tx:
            assert "dispatch_run_idx" not in _indexes(tx, upgraded.dialect)
            assert {"runs_dispatch_idx", "dispatch_source_run_idx"} <= _indexes(tx, upgraded.dialect)
            versions = _versions(tx)
        assert versions[:2] == [10, 11] and versions[-1] == migrations.SCHEMA_VERSION
        assert queries.get_run(upgraded, run["id"]) == shown and queries.run_events(upgraded, run["id"]) == events
    finally:
        upgraded.close()


#: Tables a run writes, with the row key the refusal test updates (each has list-of-choices columns).
_RUN_TABLES = {"runs": "id", "job_dispatch_queue": "id", "jobs": "id"}


def _choices(table: str) -> list[schema.Column]:
    return [c for c in schema.table(table).columns if c.choices]


def _assert_every_choice_is_enforced(store: Any, rows: dict[str, str]) -> None:
    """Each list-of-choices column of the tables a run writes refuses a value outside its list, and keeps the row."""
    for table, key in rows.items():
        for column in _choices(table):
            with pytest.raises(SchedulerError) as err, store.transaction() as tx:
                tx.execute(f"UPDATE {table} SET {column.name} = 'bogus' WHERE id = ?", (key,))
            assert err.value.code == "CONSTRAINT_VIOLATION", (table, column.name, err.value.code)
            with store.read() as tx:
                assert tx.scalar(f"SELECT {column.name} FROM {table} WHERE id = ?", (key,)) != "bogus"


def _in_spelled(create_sql: str, table: str) -> str:
    """``create_sql`` with each list-of-choices CHECK spelled ``IN (...)``, as schema 11 and older stored it."""
    for column in _choices(table):
        create_sql = create_sql.replace(f"CHECK ({column.check_expression('sqlite')})", f"CHECK ({column.check_expression()})")
    return create_sql


def test_sqlite_spells_choices_as_or_and_postgresql_keeps_in() -> None:
    status = schema.table("runs").column("status")
    assert status.check_expression("sqlite") == " OR ".join(f"status = '{v}'" for v in status.choices)
    assert status.check_expression("postgresql") == status.check_expression() == (
        "status IN (" + ", ".join(f"'{v}'" for v in status.choices) + ")")
    trust = schema.table("runs").column("trust_level")
    assert trust.check_expression("sqlite").startswith("trust_level IS NULL OR trust_level = 'untrusted' OR ")
    tables = {t.name: next(s for s in schema.statements("sqlite") if s.startswith(f"CREATE TABLE IF NOT EXISTS {t.name} ("))
              for t in schema.TABLES}
    for table, create in tables.items():
        for column in _choices(table):
            assert f"CHECK ({column.check_expression('sqlite')})" in create and f"{column.name} IN (" not in create


def test_every_choice_of_a_runs_tables_is_refused_at_the_database(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    run = _run_once(store, dispatcher, tmp_path, ("refused",))["refused"]
    _assert_every_choice_is_enforced(store, {"runs": run["id"], "job_dispatch_queue": run["dispatch_id"], "jobs": run["job_id"]})


def test_migration_12_respells_an_older_sqlite_file_and_keeps_every_row_and_refusal(db_path: Path, tmp_path: Path) -> None:
    """A version 11 file (IN spellings) with a finished run migrates to 12: OR spellings, same rows, same refusals."""
    store = open_store(str(db_path))
    run = _run_once(store, lambda **config: RunningDispatcher(store, **config), tmp_path, ("older",))["older"]
    shown, events = queries.get_run(store, run["id"]), queries.run_events(store, run["id"])
    with store.transaction() as tx:  # back to version 11: the spelling migration 12 records
        version = tx.scalar("PRAGMA schema_version")
        tx.execute("PRAGMA writable_schema = ON")
        for step in next(m for m in migrations.MIGRATIONS if m.version == 12).steps:
            assert isinstance(step, schema_steps.RespellChoices)
            create = tx.scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (step.table,))
            tx.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (_in_spelled(create, step.table), step.table))
        tx.execute(f"PRAGMA schema_version = {int(version) + 1}")
        tx.execute("PRAGMA writable_schema = OFF")
        tx.execute("DELETE FROM schema_migrations")
        tx.execute("INSERT INTO schema_migrations(version, name, applied_at) VALUES (11, 'v11', 0)")
    with store.read() as tx:
        runs_sql = tx.scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
    assert "status IN ('pending', 'running'" in runs_sql, "the version 11 spelling was restored"
    _assert_every_choice_is_enforced(store, {"runs": run["id"]})
    store.close()
    upgraded = open_store(str(db_path))
    try:
        assert upgraded.schema_version() == migrations.SCHEMA_VERSION
        with upgraded.read() as tx:
            stored = {t: tx.scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (t,)) for t in _RUN_TABLES}
            assert tx.scalar("PRAGMA integrity_check") == "ok"
        for table, text in stored.items():
            for column in _choices(table):
                assert f"CHECK ({column.check_expression('sqlite')})" in text, (table, column.name)
                assert f"CHECK ({column.check_expression()})" not in text, (table, column.name)
        assert queries.get_run(upgraded, run["id"]) == shown and queries.run_events(upgraded, run["id"]) == events
        _assert_every_choice_is_enforced(upgraded, {"runs": run["id"], "job_dispatch_queue": run["dispatch_id"],
                                                    "jobs": run["job_id"]})
    finally:
        upgraded.close()


def test_runs_events_json_of_a_plain_run_field_by_field(store: Any, dispatcher: Any, tmp_path: Path, cli: Any) -> None:
    """What ``runs events --json`` shows for a plain run: start and finish, each field as the run row holds it.

    This is the shape any other way of recording a run's start and finish must reproduce exactly
    (ids in order, the ISO times of started_at and terminal_at, the owner as actor, the data keys).
    """
    run = _run_once(store, dispatcher, tmp_path, ("plain",))["plain"]
    result = cli("--json", "runs", "events", run["id"])
    assert result.code == 0, result.err
    started, finished = result.json["events"]
    assert finished["id"] > started["id"]
    common = {"job_id": run["job_id"], "run_id": run["id"], "dispatch_id": run["dispatch_id"],
              "actor": run["dispatcher_owner"], "artifact_digest": run["artifact_digest"]}
    assert started == {"id": started["id"], "at": to_iso(run["started_at"]), "kind": "run.started", **common,
                       "data": {"attempt": run["attempt"], "kind": run["dispatch_kind"], "token": run["dispatcher_token"]},
                       "principal": None, "trust_level": None}
    assert finished == {"id": finished["id"], "at": to_iso(run["terminal_at"]), "kind": "run.finished", **common,
                        "data": {"error_code": run["error_code"], "status": run["status"], "token": run["dispatcher_token"]},
                        "principal": run["principal"], "trust_level": run["trust_level"]}
    assert run["status"] == "ok" and run["principal"] and run["trust_level"] and run["artifact_digest"]
    assert queries.run_events(store, run["id"]) == result.json["events"]


def test_a_version_1_file_ends_with_every_choice_respelled(tmp_path: Path) -> None:
    """The whole history (the committed version 1 fixture, migrations 2 to 12): no IN spelling of a choices CHECK is left."""
    path = tmp_path / "v1.db"
    shutil.copyfile(Path(__file__).parent / "fixtures" / "scheduler_v1.db", path)
    upgraded = open_store(str(path))
    try:
        with upgraded.read() as tx:
            stored = {r["name"]: r["sql"] for r in tx.all("SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
            assert tx.scalar("PRAGMA integrity_check") == "ok"
    finally:
        upgraded.close()
    left = [(t.name, c.name) for t in schema.TABLES if t.name in stored for c in _choices(t.name)
            if f"CHECK ({c.check_expression('sqlite')})" not in stored[t.name]]
    assert left == []


# -- schema 13: a run's events write one index entry each ------------------------------------------------------------

#: What ``queue show`` read before schema 13 (through runtime_events_job_idx): the reference its answer must equal.
_EVENTS_NAMING = "SELECT * FROM runtime_events WHERE job_id = ? AND dispatch_id = ? ORDER BY id"


def test_the_schema_indexes_no_run_event_by_job(store: Any) -> None:
    assert "runtime_events_job_idx" not in schema.index_names()
    with store.read() as tx:
        found = _indexes(tx, store.dialect)
    assert {"runtime_events_run_idx", "runtime_events_dispatch_idx", "runtime_events_jobless_idx"} <= found
    assert "runtime_events_job_idx" not in found


def test_queue_show_lists_every_event_naming_the_dispatch(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    """A dispatch's events in ``queue show`` are exactly the events naming it (its runs' and its own), oldest first."""
    run = _run_once(store, dispatcher, tmp_path, ("shown",))["shown"]
    with store.transaction() as tx:  # an event naming the dispatch and no run, and one of another job naming it
        tx.execute("INSERT INTO runtime_events(at, kind, job_id, dispatch_id, data) VALUES (?, 'dispatch.note', ?, ?, NULL)",
                   (now_ms(), run["job_id"], run["dispatch_id"]))
        other = add_job(store, name="other", executor="testkit", payload_message="ok")
        tx.execute("INSERT INTO runtime_events(at, kind, job_id, dispatch_id, data) VALUES (?, 'dispatch.note', ?, ?, NULL)",
                   (now_ms(), other["id"], run["dispatch_id"]))
    shown = queries.get_dispatch(store, run["dispatch_id"])
    with store.read() as tx:
        expected = [queries.event_to_json(e) for e in tx.all(_EVENTS_NAMING, (run["job_id"], run["dispatch_id"]))]
    assert [e["kind"] for e in shown["events"]] == ["dispatch.manual", "run.started", "run.finished", "dispatch.note"]
    assert shown["events"] == expected


def test_the_event_reads_use_indexes(db_path: Path) -> None:
    """SQLite answers queue show's and status's event reads from indexes, never a scan of runtime_events."""
    store = open_store(str(db_path))
    try:
        with store.read() as tx:
            plans = {
                "queue show": tx.all("EXPLAIN QUERY PLAN " + queries._DISPATCH_EVENTS_SQL, ("d", "d", "j", "d", "j")),
                "status": tx.all("EXPLAIN QUERY PLAN SELECT at, actor, data FROM runtime_events WHERE job_id IS NULL"
                                 " AND kind = ? ORDER BY at DESC, id DESC LIMIT 1", ("db.disk_full",)),
            }
    finally:
        store.close()
    for what, plan in plans.items():
        details = [str(step["detail"]) for step in plan]
        assert not [d for d in details if d.startswith("SCAN runtime_events") or d == "SCAN runs"], (what, details)
        assert any("runtime_events_" in d for d in details), (what, details)


def test_migration_13_drops_the_job_index_and_reads_the_same(store_url: str, dispatcher: Any, store: Any,
                                                               tmp_path: Path) -> None:
    """A version 12 database (with runtime_events_job_idx, without the partial indexes) migrates to 13 and reads the same."""
    (step,) = next(m for m in migrations.MIGRATIONS if m.version == 13).steps
    run = _run_once(store, dispatcher, tmp_path, ("before13",))["before13"]
    shown, events = queries.get_dispatch(store, run["dispatch_id"]), queries.run_events(store, run["id"])
    _back_to(store, 12, step.sql, "DROP INDEX runtime_events_dispatch_idx", "DROP INDEX runtime_events_jobless_idx")
    with store.read() as tx:
        assert "runtime_events_job_idx" in _indexes(tx, store.dialect), "the version 12 layout was restored"
    upgraded = _reopened(store, store_url)
    try:
        with upgraded.read() as tx:
            found = _indexes(tx, upgraded.dialect)
            versions = _versions(tx)
        assert "runtime_events_job_idx" not in found
        assert {"runtime_events_dispatch_idx", "runtime_events_jobless_idx"} <= found
        assert versions[:2] == [12, 13]
        assert queries.get_dispatch(upgraded, run["dispatch_id"]) == shown
        assert queries.run_events(upgraded, run["id"]) == events
    finally:
        upgraded.close()
