"""Runs that end without an attestation still get terminal evidence: a failed completion and an abandoned worker.

Crash recovery already gives a ``kill -9``-ed run an ``interrupted`` row (tests/test_evidence_recovery.py).
Here the dispatcher itself ends the run: its completion transaction fails (``COMPLETION_FAILED``), or
its executor ignores cancellation at shutdown or past its deadline and the worker is abandoned
(``EXECUTOR_ABANDONED`` / ``EXECUTOR_DEADLINE_EXCEEDED``). Each gets, in the transaction that ends
it, an ``interrupted`` row naming why, ``runs.evidence_status = interrupted`` and an
``evidence.interrupted`` event. Real dispatcher threads, the test-only ``testkit`` executor, both stores.
"""

from __future__ import annotations

from typing import Any

from evidence_support import (
    artifacts_dir,  # noqa: F401  (the autouse artifacts-root fixture)
    events_of,
    evidence_row,
)
from kernel_testing import add_job, run_rows, wait_for

from scheduler.base.timeutil import now_ms
from scheduler.core.queue import enqueue_manual
from scheduler.evidence.verify import verify_run


def statuses(store: Any, job_id: str) -> list[str]:
    return [r["status"] for r in run_rows(store, job_id)]


def assert_interrupted(store: Any, run: dict[str, Any], code: str) -> None:
    assert run["evidence_status"] == "interrupted", run
    row = evidence_row(store, run["id"])
    assert row is not None, "the run has its terminal evidence row"
    assert row["status"] == "interrupted" and row["error_code"] == code and row["envelope"] is None, row
    assert row["evidence_ref"] == "audit" and row["artifact_digest"] == run["artifact_digest"]
    events = [d for k, d in events_of(store, run["id"]) if k == "evidence.interrupted"]
    assert len(events) == 1 and events[0]["code"] == code and events[0]["payload_sha256"] == row["payload_sha256"]
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_NOT_VERIFIED" and check.details["record_error_code"] == code


def test_a_failed_completion_gives_an_interrupted_row(store: Any, dispatcher: Any) -> None:
    bad = add_job(store, name="bad", payload_message="sleep:0.5", evidence={}, evidence_ref="audit")
    plain = add_job(store, name="plain", payload_message="sleep:0.5")
    dispatcher()
    enqueue_manual(store, bad["id"])
    enqueue_manual(store, plain["id"])
    wait_for(lambda: statuses(store, bad["id"]) == ["running"] and statuses(store, plain["id"]) == ["running"],
             what="both running")
    # Corrupt both runs so their completion violates a CHECK (finished before it started).
    with store.transaction() as tx:
        tx.execute("UPDATE runs SET started_at = ? WHERE job_id IN (?, ?)", (now_ms() + 3_600_000, bad["id"], plain["id"]))
    for job in (bad, plain):
        wait_for(lambda job=job: statuses(store, job["id"]) == ["error"], what="the run ended")
    run = run_rows(store, bad["id"])[0]
    assert run["error_code"] == "COMPLETION_FAILED", run
    assert_interrupted(store, run, "COMPLETION_FAILED")
    other = run_rows(store, plain["id"])[0]  # a job without evidence: still no row, no evidence status
    assert other["error_code"] == "COMPLETION_FAILED" and other["evidence_status"] is None
    assert evidence_row(store, other["id"]) is None


def test_a_run_abandoned_at_shutdown_gives_an_interrupted_row(store: Any, dispatcher: Any) -> None:
    job = add_job(store, payload_message="ignore-cancel:30", evidence={}, evidence_ref="audit")
    d = dispatcher(grace_s=0.5, kill_grace_s=0.3)
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["running"], what="running")
    d.dispatcher.request_stop()
    d.thread.join(10)
    assert not d.thread.is_alive() and d.error is None, d.error
    run = run_rows(store, job["id"])[0]
    assert run["status"] == "cancelled" and run["error_code"] == "EXECUTOR_ABANDONED", run
    assert_interrupted(store, run, "EXECUTOR_ABANDONED")


def test_a_run_abandoned_past_its_deadline_gives_an_interrupted_row(store: Any, dispatcher: Any) -> None:
    job = add_job(store, payload_message="ignore-cancel:8", run_timeout_ms=500, evidence={}, evidence_ref="audit")
    dispatcher(concurrency=1, kill_grace_s=0.3)
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "timeout"], timeout=10,
                   what="timed out without waiting for the executor")[0]
    assert run["error_code"] == "EXECUTOR_DEADLINE_EXCEEDED", run
    assert_interrupted(store, run, "EXECUTOR_DEADLINE_EXCEEDED")
