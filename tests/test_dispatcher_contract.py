"""The dispatcher enforces the executor contract instead of trusting it (both stores, in-process).

An executor that ignores its deadline or a cancellation is cut loose: the run ends
``timeout`` (``EXECUTOR_DEADLINE_EXCEEDED``) or ``cancelled`` (``EXECUTOR_ABANDONED``)
shortly after, its worker is left behind without holding a pool slot, and its late
result is discarded. A graceful stop commits finished runs as they finish and is
bounded by the grace period even with stuck workers. Leases never come back to life
once expired. Driven by the test-only ``testkit`` executor.
"""

from __future__ import annotations

import threading
import time

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.base.timeutil import now_ms
from scheduler.core import lease as leases
from scheduler.core.cancel import cancel_run
from scheduler.core.queue import enqueue_manual


def statuses(store, job_id):
    return [r["status"] for r in run_rows(store, job_id)]


def test_executor_ignoring_its_deadline_ends_timeout_and_frees_its_slot(store, dispatcher):
    stuck = add_job(store, name="stuck", payload_message="ignore-cancel:8", run_timeout_ms=500)
    after = add_job(store, name="after", payload_message="echo:after")
    d = dispatcher(concurrency=1, kill_grace_s=0.3)
    enqueue_manual(store, stuck["id"])
    # deadline 0.5 s, cancellation 0.5 s later, abandoned kill grace + 1 s after that: well before the 8 s sleep ends
    run = wait_for(lambda: [r for r in run_rows(store, stuck["id"]) if r["status"] == "timeout"], timeout=6,
                   what="run ended timeout by the dispatcher")[0]
    assert run["error_code"] == "EXECUTOR_DEADLINE_EXCEEDED"
    assert "abandoned" in run["error_message"] and run["duration_ms"] < 6000
    # the stuck worker does not hold the only slot (concurrency 1)
    enqueue_manual(store, after["id"])
    wait_for(lambda: statuses(store, after["id"]) == ["ok"], timeout=3, what="next run despite the stuck worker")
    # the stuck executor finally returns "ok": its late result is discarded, the run stays timeout
    wait_for(lambda: any("late result" in m for m in d.messages), timeout=10, what="late result discarded")
    again = run_rows(store, stuck["id"])[0]
    assert again["status"] == "timeout" and again["finished_at"] == run["finished_at"]
    with store.read() as tx:
        finished = tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE run_id = ? AND kind = 'run.finished'", (run["id"],))
    assert finished == 1


def test_the_work_of_an_abandoned_worker_is_stopped_through_recover(store, dispatcher):
    """An executor that ignores cancellation still leaves nothing running: its recover() stops the recorded group."""
    import json

    from scheduler.core.processes import group_alive

    job = add_job(store, payload_message="spawn-ignore:30", run_timeout_ms=400)
    dispatcher(kill_grace_s=0.3)
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "timeout"], timeout=6,
                   what="run ended timeout by the dispatcher")[0]
    assert run["error_code"] == "EXECUTOR_DEADLINE_EXCEEDED"
    pgid = json.loads(run["executor_handle"])["pgid"]
    wait_for(lambda: not group_alive(pgid), timeout=5, what="the abandoned run's process group stopped")
    def stop_event() -> dict | None:
        with store.read() as tx:
            return tx.one("SELECT data FROM runtime_events WHERE run_id = ? AND kind = 'run.abandoned_work_stopped'",
                          (run["id"],))

    stopped = wait_for(stop_event, timeout=5, what="audit event")
    assert json.loads(stopped["data"])["state"] == "terminated"


def test_executor_stopping_on_cancellation_after_its_deadline_ends_timeout(store, dispatcher):
    # `spawn` never looks at the deadline but stops its process group when cancelled
    job = add_job(store, payload_message="spawn:30", run_timeout_ms=300)
    dispatcher(kill_grace_s=0.3)
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] not in ("running", "pending")], timeout=5,
                   what="run ended")[0]
    assert run["status"] == "timeout" and run["error_code"] == "EXECUTOR_DEADLINE_EXCEEDED", run
    assert run["duration_ms"] < 5000


def test_cancel_ignored_by_the_executor_is_enforced(store, dispatcher):
    job = add_job(store, payload_message="ignore-cancel:10")
    dispatcher(kill_grace_s=0.3)
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running"], what="running")[0]
    cancel_run(store, run["id"], reason="test")
    asked = now_ms()
    ended = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "cancelled"], timeout=6,
                     what="cancelled without waiting for the executor")[0]
    assert ended["error_code"] == "EXECUTOR_ABANDONED" and ended["finished_at"] - asked < 6000


def test_stop_is_bounded_by_the_grace_period_with_a_stuck_worker(store, dispatcher):
    job = add_job(store, payload_message="ignore-cancel:30")
    d = dispatcher(grace_s=0.5, kill_grace_s=0.3)
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["running"], what="running")
    started = time.monotonic()
    d.dispatcher.request_stop()
    d.thread.join(10)
    took = time.monotonic() - started
    assert not d.thread.is_alive() and d.error is None, d.error
    assert took < 6.0, f"stop took {took:.1f}s"  # grace 0.5 + kill grace 0.3 + 1 s slack, not the 30 s sleep
    run = run_rows(store, job["id"])[0]
    assert run["status"] == "cancelled" and run["error_code"] == "EXECUTOR_ABANDONED"
    with store.read() as tx:
        lease = tx.one("SELECT * FROM dispatcher_leases WHERE name = ?", (d.dispatcher.lease_name,))
    assert lease["owner"] is None  # committed, then released


def test_second_stop_request_skips_the_grace_period(store, dispatcher):
    job = add_job(store, payload_message="sleep:30")  # honours cancellation
    d = dispatcher(grace_s=60, kill_grace_s=0.3)
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["running"], what="running")
    started = time.monotonic()
    d.dispatcher.request_stop()
    time.sleep(0.3)
    assert d.thread.is_alive()  # first request: waiting out the grace period
    d.dispatcher.request_stop()
    d.thread.join(10)
    assert not d.thread.is_alive() and time.monotonic() - started < 6.0  # not the 60 s grace
    assert statuses(store, job["id"]) == ["cancelled"]


def test_finished_runs_commit_during_the_grace_period(store, dispatcher):
    quick = add_job(store, name="quick", payload_message="sleep:0.3", delivery_guarantee="at-least-once")
    slow = add_job(store, name="slow", payload_message="sleep:30")
    d = dispatcher(grace_s=60, kill_grace_s=0.3)
    enqueue_manual(store, quick["id"])
    enqueue_manual(store, slow["id"])
    wait_for(lambda: statuses(store, quick["id"]) == ["running"] and statuses(store, slow["id"]) == ["running"],
             what="both running")
    d.dispatcher.request_stop()
    run = wait_for(lambda: [r for r in run_rows(store, quick["id"]) if r["status"] == "ok"], timeout=3,
                   what="quick run committed while the slow one still runs")[0]
    assert run["duration_ms"] < 2000 and statuses(store, slow["id"]) == ["running"]
    d.dispatcher.request_stop()  # second request: stop now
    d.thread.join(10)
    assert statuses(store, slow["id"]) == ["cancelled"]


def test_expired_lease_is_never_renewed(store):
    a = leases.acquire(store, "dispatcher", "A", 1000, now=1_000)
    with pytest.raises(leases.LeaseLost) as info:
        leases.renew(store, a, now=2_500)  # nobody took it over, but it ran out: renewing would resurrect it
    assert "expired" in info.value.message
    b = leases.acquire(store, "dispatcher", "B", 1000, now=2_600)
    assert b is not None and b.token > a.token


def test_worker_pool_replaces_a_stuck_worker_and_never_blocks_exit():
    from scheduler.core.dispatcher import WorkerPool

    pool = WorkerPool(1, "t")
    release = threading.Event()
    ran: list[int] = []
    pool.submit(lambda: release.wait(10))
    pool.submit(lambda: ran.append(1))  # a second task while the only worker is stuck: a new thread takes it
    wait_for(lambda: ran == [1], timeout=2, what="second task")
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("t-"))
    release.set()
    wait_for(lambda: pool.threads <= 1, timeout=2, what="surplus worker exits")
    pool.close()
