"""Typed rows: one field per schema column, built from what each store returns (SQLite and PostgreSQL)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from kernel_testing import add_job, run_job_once, wait_for

from scheduler.core.claimed import ClaimedRun
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.queue import StartedRun, enqueue_manual
from scheduler.core.rows import ApprovalRow, CompletionDebtRow, DispatchRow, JobRow, OutboxPartRow, Row, RunRow
from scheduler.core.store.schema import table

ROWS: dict[type[Row], str] = {JobRow: "jobs", RunRow: "runs", DispatchRow: "job_dispatch_queue", ApprovalRow: "approvals",
                              OutboxPartRow: "delivery_outbox",
                              CompletionDebtRow: "completion_debts"}
_PYTHON = {"text": "str", "int": "int", "bigint": "int", "flag": "int", "blob": "bytes"}
_TYPES = {"str": str, "int": int, "bytes": bytes}


@pytest.mark.parametrize("cls", list(ROWS), ids=lambda c: c.__name__)
def test_fields_are_the_schema_columns_in_order_with_their_types(cls: type[Row]) -> None:
    columns = table(ROWS[cls]).columns
    fields = attrs.fields(cls)
    assert [f.name for f in fields] == [c.name for c in columns]
    for f, c in zip(fields, columns, strict=True):
        nullable = not (c.not_null or c.primary_key)
        assert f.type == _PYTHON[c.type] + (" | None" if nullable else ""), f"{cls.__name__}.{f.name}"


def _check(cls: type[Row], row: dict[str, Any]) -> None:
    """``cls.from_row(row)`` holds every column the store returned, typed as declared, and gives the same mapping back."""
    typed = cls.from_row(row)
    assert typed.to_dict() == row, f"{cls.__name__}: the store's columns are not the schema's"
    for f in attrs.fields(cls):
        value = getattr(typed, f.name)
        assert (value is None and f.type.endswith(" | None")) or isinstance(value, _TYPES[f.type.split(" ")[0]]), \
            f"{cls.__name__}.{f.name} = {value!r} is not {f.type}"
        assert typed.get(f.name) == row[f.name]


def _all(store: Any, sql: str, *params: Any) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all(sql, params)


def test_every_row_class_reads_what_the_store_returns(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    """A finished run with a message queued to a closed loopback port, a gated run waiting for its approval:
    each of their rows, ``SELECT *`` on this store, is exactly its class's fields."""
    delivered = add_job(store, payload_message="ok", delivery_mode="always", delivery_channel="webhook",
                        delivery_to="http://127.0.0.1:9/hook")
    gated = add_job(store, payload_message=f"touch:{tmp_path / 'ran'}", approval_required=True)
    run_job_once(store, dispatcher, delivered)
    enqueue_manual(store, gated["id"])
    d = dispatcher()
    try:
        wait_for(lambda: _all(store, "SELECT id FROM approvals WHERE job_id = ?", gated["id"]), what="the approval gate")
    finally:
        d.stop()
    seen = {cls: _all(store, f"SELECT * FROM {name}") for cls, name in ROWS.items()}
    assert all(seen.values()), {cls.__name__: len(rows) for cls, rows in seen.items()}
    for cls, rows in seen.items():
        for row in rows:
            _check(cls, row)
    (job,) = [JobRow.from_row(r) for r in seen[JobRow] if r["id"] == delivered["id"]]
    assert job.name == delivered["name"] and job.enabled == 1 and job.artifact_digest == delivered["artifact_digest"]
    assert {RunRow.from_row(r).status for r in seen[RunRow]} == {"ok", "awaiting_approval"}


def test_a_partial_read_leaves_the_columns_it_did_not_select_none_and_ignores_other_keys() -> None:
    run = RunRow.from_row({"id": "r-1", "job_id": "j-1", "status": "ok", "duration_ms": 12, "not_a_column": 1})
    assert (run.id, run.status, run.duration_ms) == ("r-1", "ok", 12)
    assert run.created_at is None and run.error_code is None
    assert run.get("not_a_column", "absent") == "absent" and run.get("to_dict") is None
    assert "not_a_column" not in run.to_dict() and list(run.to_dict())[:3] == ["id", "job_id", "dispatch_id"]


def test_rows_are_frozen() -> None:
    job = JobRow.from_row({"id": "j-1", "name": "n"})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        job.name = "other"  # type: ignore[misc]
    assert job == JobRow.from_row({"id": "j-1", "name": "n"}) and job != JobRow.from_row({"id": "j-2", "name": "n"})


def test_a_claimed_run_keeps_the_job_row_the_claim_built_and_the_outcomes_the_steps_fill() -> None:
    outcomes = RunOutcomes()
    job = JobRow.from_row({"id": "j-1", "name": "n", "run_timeout_ms": 5})
    started = StartedRun(run_id="r-1", dispatch_id="d-1", dispatch_kind="manual", job=job, attempt=2, scheduled_for=10, started_at=11, parent_run_id=None,
                         source_run_id="r-0", outcomes=outcomes)
    claimed = ClaimedRun.of(started)
    assert claimed.job is job and claimed.job.run_timeout_ms == 5 and claimed.outcomes is outcomes
    assert (claimed.run_id, claimed.dispatch_id, claimed.attempt, claimed.source_run_id) == ("r-1", "d-1", 2, "r-0")
    assert ClaimedRun.of(claimed) is claimed


def test_building_a_job_row_stays_cheap() -> None:
    """The dispatcher builds one per claimed run: well under the 100 microseconds a bare run costs it."""
    row = {f.name: None for f in attrs.fields(JobRow)}
    start = time.perf_counter()
    for _ in range(2000):
        JobRow.from_row(row)
    assert (time.perf_counter() - start) / 2000 < 100e-6
