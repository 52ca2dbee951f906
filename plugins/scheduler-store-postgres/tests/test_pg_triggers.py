"""Every guard trigger refuses what the SQLite schema refuses, with CONSTRAINT_VIOLATION and the same code."""

from __future__ import annotations

from typing import Any

import pytest
from scheduler_store_postgres import PostgresStore

from scheduler.api import SchedulerError

pytestmark = pytest.mark.postgres

DIGEST = "sha256:" + "a" * 64


def _refused(store: PostgresStore, statement: str, params: tuple[Any, ...] = ()) -> SchedulerError:
    with pytest.raises(SchedulerError) as err, store.transaction() as tx:
        tx.execute(statement, params)
    assert err.value.code == "CONSTRAINT_VIOLATION"
    return err.value


def _write(store: PostgresStore, statement: str, params: tuple[Any, ...] = ()) -> int:
    with store.transaction() as tx:
        return tx.execute(statement, params)


def test_execution_artifacts_are_immutable_and_kept_while_referenced(store: PostgresStore) -> None:
    _write(store, "INSERT INTO execution_artifacts VALUES (?, 'native', NULL, '{}', 2, 1)", (DIGEST,))
    assert _refused(store, "UPDATE execution_artifacts SET payload = '{\"x\":1}'").message.startswith("ARTIFACT_IMMUTABLE:")
    _write(store, "INSERT INTO runtime_events(at, kind, artifact_digest) VALUES (1, 'bound', ?)", (DIGEST,))
    _refused(store, "DELETE FROM execution_artifacts WHERE digest = ?", (DIGEST,))  # an event references it
    with pytest.raises(Exception, match="foreign key"), store.transaction() as tx:  # PostgreSQL refuses it itself
        tx.execute("TRUNCATE execution_artifacts")
    with store.read() as tx:
        assert tx.one("SELECT payload FROM execution_artifacts") == {"payload": "{}"}
    _refused(store, "INSERT INTO execution_artifacts VALUES ('sha256:short', 'native', NULL, '{}', 2, 1)")


def test_runtime_events_are_append_only(store: PostgresStore) -> None:
    with store.transaction() as tx:
        first = tx.scalar("INSERT INTO runtime_events(at, kind) VALUES (?, ?) RETURNING id", (1, "a"))
        second = tx.scalar("INSERT INTO runtime_events(at, kind) VALUES (?, ?) RETURNING id", (2, "b"))
    assert isinstance(first, int) and second > first
    assert _refused(store, "UPDATE runtime_events SET kind = 'c'").message.startswith("EVENTS_APPEND_ONLY:")
    assert _refused(store, "DELETE FROM runtime_events").message.startswith("EVENTS_APPEND_ONLY:")
    assert _refused(store, "TRUNCATE runtime_events").message.startswith("EVENTS_APPEND_ONLY:")


def test_evidence_records_cannot_be_updated(store: PostgresStore) -> None:
    _write(
        store,
        "INSERT INTO evidence_records(id, run_id, provider, methods, payload_sha256, canonical_payload, created_at)"
        " VALUES ('e1', 'r1', 'checksum', '[]', ?, '{}', 1)",
        ("a" * 64,),
    )
    assert _refused(store, "UPDATE evidence_records SET verified = 1").message.startswith("EVIDENCE_IMMUTABLE:")


def test_lease_tokens_never_decrease_and_rows_stay(store: PostgresStore) -> None:
    _write(store, "INSERT INTO dispatcher_leases(name, owner, token) VALUES ('dispatcher', 'a', 5)")
    assert _write(store, "UPDATE dispatcher_leases SET token = 6, owner = 'b' WHERE name = 'dispatcher'") == 1
    assert _write(store, "UPDATE dispatcher_leases SET owner = NULL WHERE name = 'dispatcher'") == 1
    assert _refused(store, "UPDATE dispatcher_leases SET token = 2").message.startswith("LEASE_TOKEN_REGRESSION:")
    assert _refused(store, "DELETE FROM dispatcher_leases").message.startswith("LEASE_IMMUTABLE:")
    assert _refused(store, "TRUNCATE dispatcher_leases").message.startswith("LEASE_IMMUTABLE:")
    with store.read() as tx:
        assert tx.scalar("SELECT token FROM dispatcher_leases") == 6


def test_terminal_run_status_is_final(store: PostgresStore, job: str) -> None:
    _write(store, "INSERT INTO runs(id, job_id, status, created_at) VALUES ('r1', ?, 'running', 1)", (job,))
    assert _write(store, "UPDATE runs SET status = 'ok', finished_at = 2 WHERE id = 'r1'") == 1
    assert _write(store, "UPDATE runs SET summary = 'audit note' WHERE id = 'r1'") == 1  # audit fields still allowed
    assert _write(store, "UPDATE runs SET status = 'ok' WHERE id = 'r1'") == 1  # same status is no change
    assert _refused(store, "UPDATE runs SET status = 'running' WHERE id = 'r1'").message.startswith("RUN_TERMINAL:")


def test_delivered_outbox_part_is_final(store: PostgresStore) -> None:
    _write(
        store,
        "INSERT INTO delivery_outbox(id, channel, idempotency_key, group_key, body, status, due_at, created_at, updated_at)"
        " VALUES ('o1', 'webhook', 'k1', 'g1', 'hello', 'claimed', 1, 1, 1)",
    )
    assert _write(store, "UPDATE delivery_outbox SET status = 'delivered', delivered_at = 2 WHERE id = 'o1'") == 1
    assert _refused(store, "UPDATE delivery_outbox SET last_error = NULL WHERE id = 'o1'").message.startswith("OUTBOX_DELIVERED:")
    assert _refused(store, "UPDATE delivery_outbox SET status = 'pending' WHERE id = 'o1'").message.startswith(
        "OUTBOX_DELIVERED:"
    )


def test_unique_check_and_foreign_key_violations(store: PostgresStore, job: str) -> None:
    dup = _refused(
        store,
        "INSERT INTO jobs(id, name, schedule_kind, payload_message, created_at, updated_at) VALUES ('j2', 'job one', 'manual', 'x', 1, 1)",
    )
    assert "jobs_name_key" in dup.message
    _refused(store, "UPDATE jobs SET enabled = 2")
    _refused(store, "INSERT INTO runs(id, job_id, status, created_at) VALUES ('r', 'no-such-job', 'running', 1)")
    _refused(store, "INSERT INTO runs(id, job_id, status, created_at) VALUES ('r', ?, 'bogus', 1)", (job,))
    _refused(
        store,
        "INSERT INTO jobs(id, name, schedule_kind, payload_message, created_at, updated_at) VALUES ('c', 'c', 'cron', 'x', 1, 1)",
    )


def test_cascades_follow_sqlite(store: PostgresStore, job: str) -> None:
    with store.transaction() as tx:
        tx.execute("INSERT INTO runs(id, job_id, status, created_at) VALUES ('r1', ?, 'ok', 1)", (job,))
        tx.execute(
            "INSERT INTO delivery_outbox(id, run_id, channel, idempotency_key, group_key, body, due_at, created_at, updated_at)"
            " VALUES ('o1', 'r1', 'webhook', 'k', 'g', 'b', 1, 1, 1)"
        )
        tx.execute("DELETE FROM jobs WHERE id = ?", (job,))
        assert tx.scalar("SELECT COUNT(*) FROM runs") == 0
        assert tx.one("SELECT run_id FROM delivery_outbox") == {"run_id": None}
