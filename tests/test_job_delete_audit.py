"""Issue 29 piece 4: deleting a job keeps its audit trail.

``scheduler jobs delete`` used to delete the job's approvals with it (its ``job.pending_cancelled``
event said ``approvals: 0``) and its runs without a trace, so the job's retained evidence no
longer verified (``EVIDENCE_RUN_MISSING``). Now its open approvals end ``cancelled`` and stay, the
event counts them, every run leaves a ``run_tombstones`` row (naming its evidence row while that
is retained) and the evidence stays until its retention ends. Through the CLI, a real dispatcher,
both stores.
"""

from __future__ import annotations

import json
from typing import Any

from kernel_testing import wait_for

SPEC = {"name": "gated", "schedule_kind": "manual", "payload_message": "echo hi", "approval_required": True,
        "evidence": {"provider": "checksum", "retention": "7d"}}


def ok(out: Any) -> dict[str, Any]:
    """The JSON answer of a CLI call that succeeded."""
    assert out.code == 0, out
    doc: dict[str, Any] = out.json
    return doc


def approvals_of(cli: Any) -> dict[str, dict[str, Any]]:
    """Every approval ``approvals list`` shows, by id."""
    return {a["id"]: a for a in ok(cli("--json", "approvals", "list"))["approvals"]}


def test_deleting_a_job_cancels_its_approvals_keeps_them_and_tombstones_its_runs(cli: Any, store: Any,
                                                                                dispatcher: Any) -> None:
    job_id = ok(cli("--json", "jobs", "add", json.dumps(SPEC)))["job"]["id"]
    d = dispatcher()
    ok(cli("--json", "jobs", "run", "gated"))
    first = wait_for(lambda: [a for a in approvals_of(cli).values() if a["status"] == "pending"], what="a pending approval")[0]
    ok(cli("--json", "approvals", "approve", first["id"]))
    done = wait_for(lambda: [r for r in ok(cli("--json", "runs", "list", "gated"))["runs"] if r["status"] == "ok"],
                    what="the approved run finished")[0]
    assert ok(cli("--json", "runs", "evidence", done["id"]))["verified"] is True
    ok(cli("--json", "jobs", "run", "gated"))
    second = wait_for(lambda: [a for a in approvals_of(cli).values() if a["status"] == "pending"], what="another pending approval")[0]
    d.stop()
    waiting = second["run_id"]

    assert ok(cli("--json", "jobs", "delete", "gated"))["deleted"] == {"id": job_id, "name": "gated"}

    kept = approvals_of(cli)
    assert kept[first["id"]]["status"] == "dispatched" and kept[second["id"]]["status"] == "cancelled", kept
    shown = ok(cli("--json", "approvals", "show", second["id"]))["approval"]
    assert shown["status"] == "cancelled" and shown["decision_reason"] == "job deleted" and shown["run_id"] == waiting, shown
    with store.read() as tx:
        events = [json.loads(e["data"]) for e in tx.all(
            "SELECT data FROM runtime_events WHERE job_id = ? AND kind = 'job.pending_cancelled'", (job_id,))]
        tombstones = {t["run_id"]: t for t in tx.all("SELECT * FROM run_tombstones WHERE job_id = ?", (job_id,))}
        evidence = tx.one("SELECT id FROM evidence_records WHERE run_id = ?", (done["id"],))
        deleted = [json.loads(e["data"]) for e in tx.all(
            "SELECT data FROM runtime_events WHERE job_id = ? AND kind = 'job.deleted'", (job_id,))]
    assert events == [{"reason": "job deleted", "dispatches": 0, "runs": 1, "approvals": 1}], events
    assert set(tombstones) == {done["id"], waiting}, tombstones
    assert tombstones[done["id"]]["evidence_id"] == evidence["id"] and tombstones[done["id"]]["status"] == "ok"
    assert tombstones[waiting]["evidence_id"] is None and tombstones[waiting]["status"] == "cancelled"
    assert {t["job_name"] for t in tombstones.values()} == {"gated"}
    assert (tombstones[done["id"]]["reason"], tombstones[waiting]["reason"]) == ("job deleted; evidence retained", "job deleted")
    assert deleted == [{"name": "gated", "tombstones": 2, "evidence_retained": 1, "evidence_deleted": 0, "outbox": 0}], deleted
    # The retained evidence still verifies from history alone: the tombstone says the run was deleted with its job.
    check = ok(cli("--json", "runs", "evidence", done["id"]))
    assert check["verified"] is True and check["run_present"] is False, check


def test_migration_10_drops_the_approvals_foreign_keys_of_an_older_database(store_url: str) -> None:
    """A version 9 database (approvals cascading from their job and run) migrates to 10: the keys are gone."""
    from scheduler.core.store import migrations, schema_steps
    from scheduler.core.store.schema import TEXT, Column
    from scheduler.plugins.stores import open_store

    old = (Column("job_id", TEXT, not_null=True, references="jobs(id) ON DELETE CASCADE"),
           Column("run_id", TEXT, references="runs(id) ON DELETE CASCADE"))
    first = open_store(store_url)
    try:
        with first.transaction() as tx:  # back to version 9: the foreign keys migration 10 records
            if first.dialect == "sqlite":
                create = tx.scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'approvals'")
                for column in old:
                    create = schema_steps.replace_column_definition(create, column.name, column.definition("sqlite"))
                version = tx.scalar("PRAGMA schema_version")
                tx.execute("PRAGMA writable_schema = ON")
                tx.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'approvals'", (create,))
                tx.execute(f"PRAGMA schema_version = {int(version) + 1}")
                tx.execute("PRAGMA writable_schema = OFF")
            else:
                for column in old:
                    tx.execute(f"ALTER TABLE approvals ADD CONSTRAINT approvals_{column.name}_fkey FOREIGN KEY"
                               f" ({column.name}) REFERENCES {column.references}")
            tx.execute("DELETE FROM schema_migrations")
            tx.execute("INSERT INTO schema_migrations(version, name, applied_at) VALUES (9, 'v9', 0)")
        with first.read() as tx:
            assert references(tx, first.dialect) == {"job_id", "run_id"}, "the version 9 layout was restored"
    finally:
        first.close()
    upgraded = open_store(store_url)
    try:
        assert upgraded.schema_version() == migrations.SCHEMA_VERSION
        with upgraded.read() as tx:
            assert references(tx, upgraded.dialect) == set()
    finally:
        upgraded.close()


def references(tx: Any, dialect: str) -> set[str]:
    """The approvals columns that reference jobs or runs, as the database itself says."""
    if dialect == "sqlite":
        return {r["from"] for r in tx.all("PRAGMA foreign_key_list(approvals)") if r["table"] in ("jobs", "runs")}
    return {r["attname"] for r in tx.all(
        "SELECT a.attname FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid"
        " AND a.attnum = ANY(c.conkey) WHERE c.conrelid = 'approvals'::regclass AND c.contype = 'f'"
        " AND c.confrelid IN ('jobs'::regclass, 'runs'::regclass)")}


def test_a_job_whose_messages_were_delivered_can_be_deleted(cli: Any, store: Any, dispatcher: Any,
                                                            monkeypatch: Any, tmp_path: Any) -> None:
    """A delivered part is immutable, so the foreign key could not set its run_id NULL: the delete failed
    (``CONSTRAINT_VIOLATION``, ``OUTBOX_DELIVERED``). Its settled parts now go with its runs, as pruning does."""
    import base64

    from scheduler.settings import reload_settings
    from scheduler.testing.http import LoopbackHTTPServer

    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    config = tmp_path / "scheduler.toml"
    config.write_text('[channels.webhook]\nsecret = {credential = "env:TEST_WEBHOOK_SECRET"}\ntimeout_s = 2\n')
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", secret)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    reload_settings()
    receiver = LoopbackHTTPServer()
    try:
        spec = {"name": "told", "schedule_kind": "manual", "payload_message": "echo hi", "delivery_mode": "always",
                "delivery_channel": "webhook", "delivery_to": f"{receiver.url}/hook"}
        job_id = ok(cli("--json", "jobs", "add", json.dumps(spec)))["job"]["id"]
        d = dispatcher()
        ok(cli("--json", "jobs", "run", "told"))

        def delivered() -> list[dict[str, Any]]:
            with store.read() as tx:
                return tx.all("SELECT run_id FROM delivery_outbox WHERE job_id = ? AND status = 'delivered'", (job_id,))

        (part,) = wait_for(delivered, what="the result delivered")
        d.stop()
    finally:
        receiver.close()
    assert ok(cli("--json", "jobs", "delete", "told"))["deleted"]["id"] == job_id
    with store.read() as tx:
        assert tx.all("SELECT id FROM delivery_outbox WHERE job_id = ?", (job_id,)) == []
        (tombstone,) = tx.all("SELECT run_id, reason FROM run_tombstones WHERE job_id = ?", (job_id,))
        (event,) = [json.loads(e["data"]) for e in tx.all(
            "SELECT data FROM runtime_events WHERE job_id = ? AND kind = 'job.deleted'", (job_id,))]
    assert tombstone == {"run_id": part["run_id"], "reason": "job deleted"}
    assert event["tombstones"] == 1 and event["outbox"] == 1, event
