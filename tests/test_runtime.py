"""The dispatcher runtime in-process (both stores): queue, overlap, retries, chains, cancellation,
auto-pause, misfires, fencing. Driven by the test-only ``testkit`` executor."""

from __future__ import annotations

import json
import time

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core import lease as leases
from scheduler.core.cancel import cancel_job, cancel_run
from scheduler.core.completion import complete_run
from scheduler.core.execution import ExecutionResult
from scheduler.core.jobs import set_enabled, update_job
from scheduler.core.queue import claim_and_start, enqueue_manual, materialize_due, release_expired_claims
from scheduler.core.runs import StaleFence
from scheduler.pipeline.participants import default_completion_participants

PARTICIPANTS = default_completion_participants()


def statuses(store, job_id):
    return [r["status"] for r in run_rows(store, job_id)]


def test_manual_run_executes_and_records_everything(store, dispatcher):
    job = add_job(store, payload_message="echo:hello")
    d = dispatcher()
    enqueue_manual(store, job["id"])
    runs = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], what="ok run")
    run = runs[0]
    assert run["dispatcher_owner"] == d.dispatcher.owner and run["dispatcher_token"] == d.dispatcher.lease.token
    assert run["started_at"] and run["finished_at"] >= run["started_at"] and run["scheduled_for"]
    assert run["stdout_excerpt"] == "hello" and run["dispatch_kind"] == "manual"
    with store.read() as tx:
        j = tx.one("SELECT * FROM jobs WHERE id = ?", (job["id"],))
        dispatch = tx.one("SELECT * FROM job_dispatch_queue WHERE id = ?", (run["dispatch_id"],))
        kinds = [e["kind"] for e in tx.all("SELECT kind FROM runtime_events WHERE run_id = ? ORDER BY id", (run["id"],))]
    assert j["run_count"] == 1 and j["last_status"] == "ok"
    assert dispatch["status"] == "done" and dispatch["attempts"] == 1
    assert kinds[0] == "run.started" and kinds[-1] == "run.finished"


def test_schedule_slot_materialised_once(store):
    job = add_job(store, schedule_kind="every", schedule_every="1s", payload_message="ok")
    due = job["next_run_at"] + 10
    assert materialize_due(store, now=due) == 1
    # a second materialisation of the same slot (another dispatcher, a crash replay) is a no-op
    with store.transaction() as tx:
        tx.execute("UPDATE jobs SET next_run_at = ? WHERE id = ?", (job["next_run_at"], job["id"]))
    assert materialize_due(store, now=due) == 0
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE job_id = ?", (job["id"],)) == 1
        nxt = tx.scalar("SELECT next_run_at FROM jobs WHERE id = ?", (job["id"],))
    assert nxt == job["next_run_at"] + 1000  # anchored to the previous slot


def test_interval_never_bursts_after_downtime(store):
    job = add_job(store, schedule_kind="every", schedule_every="1s", payload_message="ok")
    later = job["next_run_at"] + 3_600_000 + 250  # an hour of missed slots
    materialize_due(store, now=later)
    with store.read() as tx:
        rows = tx.all("SELECT * FROM job_dispatch_queue WHERE job_id = ?", (job["id"],))
        nxt = tx.scalar("SELECT next_run_at FROM jobs WHERE id = ?", (job["id"],))
        events = tx.all("SELECT * FROM runtime_events WHERE job_id = ? AND kind = 'slot.misfire_coalesced'", (job["id"],))
    assert len(rows) == 1  # coalesced into one run, not 3600
    assert nxt > later and (nxt - job["next_run_at"]) % 1000 == 0  # still on the anchored grid
    assert events and '"missed": 3601' in events[0]["data"]


def test_misfire_skip_records_a_skipped_run(store):
    job = add_job(store, schedule_kind="cron", schedule_cron="* * * * *", payload_message="ok", misfire_policy="skip")
    materialize_due(store, now=job["next_run_at"] + 10 * 60_000)
    runs = run_rows(store, job["id"])
    assert [r["status"] for r in runs] == ["skipped"]
    assert runs[0]["skip_reason"].startswith("misfire: 11 slot(s)")
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE job_id = ?", (job["id"],)) == 0


def test_disabled_job_pending_non_manual_dispatches_cancelled_before_execution(store):
    job = add_job(store, schedule_kind="every", schedule_every="1s", payload_message="ok")
    materialize_due(store, now=job["next_run_at"])
    enqueue_manual(store, job["id"])
    with store.transaction() as tx:  # disable behind the kernel's back: the claim must still refuse it
        tx.execute("UPDATE jobs SET enabled = 0 WHERE id = ?", (job["id"],))
    lease = leases.acquire(store, "dispatcher", "T", 5000)
    started = claim_and_start(store, lease, limit=10, now=job["next_run_at"])
    assert [s.dispatch_kind for s in started] == ["manual"]  # manual still runs
    with store.read() as tx:
        sched = tx.one("SELECT * FROM job_dispatch_queue WHERE job_id = ? AND kind = 'schedule'", (job["id"],))
    assert sched["status"] == "cancelled" and sched["cancel_reason"] == "job disabled"


def test_manual_run_refused_when_disabled_or_running_under_skip(store, dispatcher):
    job = add_job(store, payload_message="sleep:5")
    dispatcher()
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["running"], what="running")
    with pytest.raises(SchedulerError) as info:
        enqueue_manual(store, job["id"])
    assert info.value.code == "JOB_ALREADY_RUNNING"
    cancel_job(store, job["id"], reason="test")
    wait_for(lambda: statuses(store, job["id"]) == ["cancelled"], what="cancelled")
    set_enabled(store, job["id"], False)
    with pytest.raises(SchedulerError) as info:
        enqueue_manual(store, job["id"])
    assert info.value.code == "JOB_DISABLED"


def test_overlap_skip_records_skipped_run(store):
    job = add_job(store, payload_message="ok", overlap_policy="skip")
    lease = leases.acquire(store, "dispatcher", "T", 10_000)
    enqueue_manual(store, job["id"])
    assert len(claim_and_start(store, lease, limit=4)) == 1  # now running (never completed here)
    materialize_like_slot(store, job["id"])
    assert claim_and_start(store, lease, limit=4) == []
    runs = run_rows(store, job["id"])
    assert sorted(r["status"] for r in runs) == ["running", "skipped"]
    assert [r["skip_reason"] for r in runs if r["status"] == "skipped"] == ["overlap: job already running"]


def materialize_like_slot(store, job_id, slot=None):
    from scheduler.core.queue import insert_dispatch, slot_dispatch_id

    slot = slot or now_ms() - 1
    with store.transaction() as tx:
        insert_dispatch(tx, id=slot_dispatch_id(job_id, "schedule", slot), job_id=job_id, kind="schedule", due_at=slot, now=slot)


def test_overlap_queue_waits_then_runs_and_is_bounded(store):
    job = add_job(store, payload_message="ok", overlap_policy="queue", queue_limit=2)
    lease = leases.acquire(store, "dispatcher", "T", 10_000)
    enqueue_manual(store, job["id"])
    first = claim_and_start(store, lease, limit=4)
    for i in range(3):
        materialize_like_slot(store, job["id"], slot=now_ms() - 10 + i)
    assert claim_and_start(store, lease, limit=4) == []  # all wait behind the running one... except over the limit
    runs = run_rows(store, job["id"])
    assert [r["skip_reason"] for r in runs if r["status"] == "skipped"] == ["overlap: queue limit 2 reached"]
    complete_run(store, lease, first[0].run_id, ExecutionResult(status="ok"), participants=PARTICIPANTS)
    nxt = claim_and_start(store, lease, limit=4)
    assert len(nxt) == 1 and nxt[0].dispatch_kind == "schedule"  # one at a time


def test_overlap_allow_runs_in_parallel(store, dispatcher):
    job = add_job(store, payload_message="sleep:0.6", overlap_policy="allow")
    dispatcher(concurrency=4)
    enqueue_manual(store, job["id"])
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]).count("running") == 2, what="two parallel runs")
    wait_for(lambda: statuses(store, job["id"]) == ["ok", "ok"], what="both ok")


def test_retries_with_backoff_then_success(store, dispatcher):
    job = add_job(store, payload_message="flaky:3;echo:finally", max_retries=3, retry_backoff_ms=100)
    dispatcher()
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["error", "error", "ok"], what="two failures then ok")
    runs = run_rows(store, job["id"])
    assert [r["attempt"] for r in runs] == [1, 2, 3]
    assert runs[1]["retry_of_run_id"] == runs[0]["id"] and runs[2]["retry_of_run_id"] == runs[1]["id"]
    # exponential backoff: 100 ms then 200 ms between finish and next start
    assert runs[1]["started_at"] - runs[0]["finished_at"] >= 100
    assert runs[2]["started_at"] - runs[1]["finished_at"] >= 200
    with store.read() as tx:
        j = tx.one("SELECT * FROM jobs WHERE id = ?", (job["id"],))
    assert j["consecutive_failures"] == 0 and j["last_status"] == "ok"


def test_retries_exhausted_stop(store, dispatcher):
    job = add_job(store, payload_message="fail", max_retries=1, retry_backoff_ms=0, max_consecutive_failures=0)
    dispatcher()
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["error", "error"], what="two failures")
    time.sleep(0.3)
    assert statuses(store, job["id"]) == ["error", "error"]


def test_chains_success_failure_complete_and_conditions(store, dispatcher):
    parent = add_job(store, name="parent", payload_message="echo:build 42 ok")
    on_ok = add_job(store, name="on-ok", schedule_kind="chain", parent_id="parent", payload_message="ok")
    on_fail = add_job(store, name="on-fail", schedule_kind="chain", parent_id="parent", trigger_on="failure", payload_message="ok")
    always = add_job(store, name="always", schedule_kind="chain", parent_id="parent", trigger_on="complete", payload_message="ok")
    regex_hit = add_job(store, name="regex-hit", schedule_kind="chain", parent_id="parent", trigger_condition=r"regex:build \d+ ok",
                        payload_message="ok")
    miss = add_job(store, name="contains-miss", schedule_kind="chain", parent_id="parent", trigger_condition="contains:FAILED",
                   payload_message="ok")
    delayed = add_job(store, name="delayed", schedule_kind="chain", parent_id="on-ok", trigger_delay_s=1, payload_message="ok")
    dispatcher()
    enqueue_manual(store, parent["id"])
    wait_for(lambda: statuses(store, delayed["id"]) == ["ok"], what="grandchild after delay")
    assert statuses(store, on_ok["id"]) == ["ok"] and statuses(store, always["id"]) == ["ok"]
    assert statuses(store, regex_hit["id"]) == ["ok"]
    assert statuses(store, on_fail["id"]) == [] and statuses(store, miss["id"]) == []
    parent_run = run_rows(store, parent["id"])[0]
    child_run = run_rows(store, on_ok["id"])[0]
    grandchild = run_rows(store, delayed["id"])[0]
    assert child_run["parent_run_id"] == parent_run["id"] and child_run["dispatch_kind"] == "chain"
    assert grandchild["started_at"] - child_run["finished_at"] >= 1000


def test_failure_chain_runs_only_after_last_retry(store, dispatcher):
    parent = add_job(store, name="p", payload_message="fail", max_retries=1, retry_backoff_ms=0, max_consecutive_failures=0)
    child = add_job(store, name="c", schedule_kind="chain", parent_id="p", trigger_on="failure", payload_message="ok")
    dispatcher()
    enqueue_manual(store, parent["id"])
    wait_for(lambda: statuses(store, child["id"]) == ["ok"], what="failure child")
    assert statuses(store, parent["id"]) == ["error", "error"]
    assert run_rows(store, child["id"])[0]["parent_run_id"] == run_rows(store, parent["id"])[1]["id"]


def test_chain_cycles_depth_and_fanout_rejected_at_creation(store):
    from scheduler.core.jobs import MAX_CHAIN_DEPTH, update_job

    a = add_job(store, name="a", payload_message="ok")
    b = add_job(store, name="b", schedule_kind="chain", parent_id="a", payload_message="ok")
    with pytest.raises(SchedulerError) as info:
        update_job(store, "a", {"schedule_kind": "chain", "parent_id": "b"})
    assert info.value.code == "CHAIN_CYCLE"
    prev = "b"
    for i in range(MAX_CHAIN_DEPTH - 1):
        prev = add_job(store, name=f"d{i}", schedule_kind="chain", parent_id=prev, payload_message="ok")["name"]
    with pytest.raises(SchedulerError) as info:
        add_job(store, name="too-deep", schedule_kind="chain", parent_id=prev, payload_message="ok")
    assert info.value.code == "CHAIN_TOO_DEEP"
    from scheduler.core.jobs import MAX_CHAIN_FANOUT

    for i in range(MAX_CHAIN_FANOUT - 1):
        add_job(store, name=f"f{i}", schedule_kind="chain", parent_id="a", payload_message="ok")
    with pytest.raises(SchedulerError) as info:
        add_job(store, name="one-too-many", schedule_kind="chain", parent_id="a", payload_message="ok")
    assert info.value.code == "CHAIN_FANOUT_EXCEEDED"
    assert b["parent_id"] == a["id"]


def test_cancel_running_run_wins_over_success_and_blocks_children(store, dispatcher):
    parent = add_job(store, name="p", payload_message="ignore-cancel:0.5;echo:done")
    child = add_job(store, name="c", schedule_kind="chain", parent_id="p", trigger_on="complete", payload_message="ok")
    dispatcher()
    enqueue_manual(store, parent["id"])
    run = wait_for(lambda: [r for r in run_rows(store, parent["id"]) if r["status"] == "running"], what="running")[0]
    result = cancel_run(store, run["id"], reason="operator said so")
    assert result["outcome"] == "requested"
    done = wait_for(lambda: [r for r in run_rows(store, parent["id"]) if r["status"] == "cancelled"], what="cancelled")[0]
    assert done["cancel_reason"] == "operator said so" and "uid:" in done["cancel_requested_by"]
    assert done["cancel_requested_at"] <= done["finished_at"]
    time.sleep(0.3)
    assert statuses(store, child["id"]) == []  # cancellation won: no child side effect


def test_cancel_running_run_stops_executor(store, dispatcher):
    job = add_job(store, payload_message="sleep:30")
    dispatcher()
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running"], what="running")[0]
    t0 = time.monotonic()
    cancel_run(store, run["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["cancelled"], timeout=5, what="cancelled")
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("status", ["pending", "awaiting_approval", "approved"])
def test_cancel_waiting_runs_directly(store, status):
    job = add_job(store, payload_message="ok")
    with store.transaction() as tx:
        tx.execute("INSERT INTO runs(id, job_id, status, created_at) VALUES ('r1', ?, ?, ?)", (job["id"], status, now_ms()))
    assert cancel_run(store, "r1", reason="nope")["outcome"] == "cancelled"
    run = run_rows(store, job["id"])[0]
    assert run["status"] == "cancelled" and run["cancel_reason"] == "nope" and run["terminal_at"]
    with pytest.raises(SchedulerError) as info:
        cancel_run(store, "r1")
    assert info.value.code == "RUN_ALREADY_FINISHED"


def test_cancel_job_cancels_pending_dispatches(store):
    job = add_job(store, payload_message="ok")
    enqueue_manual(store, job["id"])
    result = cancel_job(store, job["id"], reason="stop")
    assert result["dispatches"] == 1
    with store.read() as tx:
        assert tx.scalar("SELECT status FROM job_dispatch_queue WHERE job_id = ?", (job["id"],)) == "cancelled"


def test_auto_pause_after_consecutive_failures_and_enable_resumes(store, dispatcher):
    job = add_job(store, schedule_kind="every", schedule_every="1s", payload_message="fail", max_consecutive_failures=2)
    dispatcher()
    wait_for(lambda: statuses(store, job["id"]).count("error") >= 2, timeout=10, what="two failures")
    with store.read() as tx:
        j = tx.one("SELECT * FROM jobs WHERE id = ?", (job["id"],))
    assert j["enabled"] == 0 and j["paused_at"] and "2 consecutive failures" in j["paused_reason"]
    time.sleep(1.5)
    assert statuses(store, job["id"]).count("error") == 2  # paused: no more runs
    from scheduler.core.jobs import job_to_json
    from scheduler.core.rows import JobRow

    assert job_to_json(JobRow.from_row(j))["state"] == "auto-paused"
    before = now_ms()
    enabled = set_enabled(store, job["id"], True)
    assert enabled.enabled == 1 and enabled.consecutive_failures == 0 and enabled.paused_at is None
    assert enabled.next_run_at is not None and enabled.next_run_at > before  # recomputed from now, not the stale slot


def test_success_resets_consecutive_failures(store, dispatcher):
    job = add_job(store, payload_message="flaky:2", max_retries=0, max_consecutive_failures=3)
    dispatcher()
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["error"], what="error")
    with store.read() as tx:
        assert tx.scalar("SELECT consecutive_failures FROM jobs WHERE id = ?", (job["id"],)) == 1
    update_job(store, job["id"], {"payload_message": "ok"})  # binds a new artifact; a raw UPDATE would fail the artifact check
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["error", "ok"], what="ok")
    with store.read() as tx:
        assert tx.scalar("SELECT consecutive_failures FROM jobs WHERE id = ?", (job["id"],)) == 0


def test_stale_fence_commits_nothing(store):
    job = add_job(store, payload_message="ok", max_retries=2)
    child = add_job(store, name="child", schedule_kind="chain", parent_id=job["id"], trigger_on="complete", payload_message="ok")
    old = leases.acquire(store, "dispatcher", "OLD", 1000, now=now_ms() - 5000)  # already expired
    enqueue_manual(store, job["id"])
    with pytest.raises(leases.LeaseLost):
        claim_and_start(store, old, limit=1)
    fresh = leases.acquire(store, "dispatcher", "OLD", 10_000)
    started = claim_and_start(store, fresh, limit=1)
    new = leases.acquire(store, "dispatcher", "NEW", 10_000, now=now_ms() + 20_000)  # takeover after expiry
    assert new.token > fresh.token
    with pytest.raises(leases.LeaseLost):
        complete_run(store, fresh, started[0].run_id, ExecutionResult(status="error", error_code="X"), participants=PARTICIPANTS)
    run = run_rows(store, job["id"])[0]
    assert run["status"] == "running" and run["error_code"] is None
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE kind IN ('retry', 'chain')") == 0
    assert statuses(store, child["id"]) == []
    # and a live lease of another owner cannot finish the run either (compare-and-swap on owner + token)
    with pytest.raises(StaleFence):
        complete_run(store, new, started[0].run_id, ExecutionResult(status="ok"), participants=PARTICIPANTS,
                     now=now_ms() + 20_001)


def test_expired_claim_without_run_returns_to_pending(store):
    job = add_job(store, payload_message="ok")
    d = enqueue_manual(store, job["id"])
    with store.transaction() as tx:
        tx.execute(
            "UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = 'ghost', claim_token = 'x', claim_expires_at = ?,"
            " attempts = 1, last_error = 'EXECUTOR_CRASHED: the first attempt' WHERE id = ?", (now_ms() - 1, d["id"]))
    assert release_expired_claims(store) == 1
    with store.read() as tx:
        row = tx.one("SELECT * FROM job_dispatch_queue WHERE id = ?", (d["id"],))
        (event,) = tx.all("SELECT data FROM runtime_events WHERE kind = 'dispatch.claim_released' AND dispatch_id = ?", (d["id"],))
    # issue 29 piece 1: the earlier error stays on the row (it was overwritten with "claim expired") and the expiry is an event
    assert row["status"] == "pending" and row["attempts"] == 1 and row["last_error"] == "EXECUTOR_CRASHED: the first attempt"
    assert json.loads(event["data"]) == {"reason": "claim expired", "attempts": 1, "last_error": "EXECUTOR_CRASHED: the first attempt"}


def test_executor_missing_is_a_coded_error(store, dispatcher):
    job = add_job(store, payload_message="ok", executor="no-such-executor")
    dispatcher()
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "error"], what="error")[0]
    assert run["error_code"] == "EXECUTOR_NOT_AVAILABLE"


def test_executor_exception_is_contained(store, dispatcher):
    job = add_job(store, payload_message="crash")
    dispatcher()
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "error"], what="error")[0]
    assert run["error_code"] == "EXECUTOR_CRASHED" and "testkit crash" in run["error_message"]


def test_delivery_and_watchdog_rows_enqueued_in_completion(store, dispatcher):
    job = add_job(store, payload_message="echo:report", delivery_mode="always", delivery_channel="webhook", delivery_to="http://127.0.0.1:9/ops")  # webhook targets are URLs (issue 30); loopback only
    dispatcher()
    enqueue_manual(store, job["id"])
    wait_for(lambda: statuses(store, job["id"]) == ["ok"], what="ok")
    with store.read() as tx:
        rows = tx.all("SELECT * FROM delivery_outbox WHERE job_id = ?", (job["id"],))
    assert len(rows) == 1 and rows[0]["channel"] == "webhook" and "report" in rows[0]["body"]
    assert rows[0]["idempotency_key"].endswith(":part:1/1")


def test_wakeup_on_cli_change_is_fast(store, dispatcher):
    job = add_job(store, payload_message="ok")
    dispatcher()
    time.sleep(0.3)  # let it go idle (sleeping up to a second)
    t0 = now_ms()
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: run_rows(store, job["id"]), what="run created")[0]
    assert run["started_at"] - t0 < 250, f"started {run['started_at'] - t0} ms after the change"


def test_due_job_starts_within_milliseconds(store, dispatcher):
    dispatcher()
    at = now_ms() + 700
    from scheduler.base.timeutil import to_iso

    job = add_job(store, schedule_kind="at", schedule_at=to_iso(at), payload_message="ok")
    run = wait_for(lambda: run_rows(store, job["id"]), what="run")[0]
    assert run["scheduled_for"] == at
    assert 0 <= run["started_at"] - at < 100


def test_missing_next_run_is_recomputed_and_stored_never_fired_now(store, dispatcher):
    from scheduler.core.jobs import repair_missing_next_runs

    job = add_job(store, schedule_kind="cron", schedule_cron="0 0 1 1 *", payload_message="ok")
    with store.transaction() as tx:  # lost, e.g. by direct SQL
        tx.execute("UPDATE jobs SET next_run_at = NULL WHERE id = ?", (job["id"],))
    before = now_ms()
    assert repair_missing_next_runs(store) == 1
    with store.read() as tx:
        nxt = tx.scalar("SELECT next_run_at FROM jobs WHERE id = ?", (job["id"],))
        events = tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE job_id = ? AND kind = 'job.next_run_repaired'", (job["id"],))
    assert nxt == job["next_run_at"] and nxt > before and events == 1
    # and a dispatcher does the same on its own, without running the job
    with store.transaction() as tx:
        tx.execute("UPDATE jobs SET next_run_at = NULL WHERE id = ?", (job["id"],))
    dispatcher(lease_ttl_ms=600)
    wait_for(lambda: store_value(store, "SELECT next_run_at FROM jobs WHERE id = ?", job["id"]) == nxt, what="repaired")
    assert run_rows(store, job["id"]) == []


def store_value(store, sql, *params):
    with store.read() as tx:
        return tx.scalar(sql, params)


def test_fenced_bookkeeping_after_takeover_raises(store):
    from scheduler.core.dispatcher import DbRunControl, DispatcherConfig
    from scheduler.runtime import dispatcher as Dispatcher

    job = add_job(store, payload_message="ok")
    d = Dispatcher(store, DispatcherConfig(lease_ttl_ms=1000))
    d.lease = leases.acquire(store, d.lease_name, d.owner, 1000)
    enqueue_manual(store, job["id"])
    started = claim_and_start(store, d.lease, limit=1)
    control = DbRunControl(d, started[0].run_id, job["id"])
    control.record_handle({"pid": 12345, "pgid": 12345, "start_time": "ticks:1"})
    assert json.loads(run_rows(store, job["id"])[0]["executor_handle"])["pid"] == 12345
    leases.acquire(store, d.lease_name, "someone-else", 1000, now=now_ms() + 5000)  # takeover after expiry
    with pytest.raises(leases.LeaseLost):
        control.record_handle({"pid": 999, "pgid": 999, "start_time": "ticks:2"})
    assert json.loads(run_rows(store, job["id"])[0]["executor_handle"])["pid"] == 12345  # nothing written by the stale owner


def test_a_completion_that_fails_does_not_hold_back_the_others_or_stay_running(store, dispatcher):
    bad = add_job(store, name="bad", payload_message="sleep:0.4")
    good = add_job(store, name="good", payload_message="sleep:0.4")
    dispatcher()
    enqueue_manual(store, bad["id"])
    enqueue_manual(store, good["id"])
    wait_for(lambda: statuses(store, bad["id"]) == ["running"] and statuses(store, good["id"]) == ["running"], what="both running")
    # Corrupt one run so its completion violates a CHECK (finished before it started): the group commit fails.
    with store.transaction() as tx:
        tx.execute("UPDATE runs SET started_at = ? WHERE job_id = ?", (now_ms() + 3_600_000, bad["id"]))
    wait_for(lambda: statuses(store, good["id"]) == ["ok"], what="the good run completed anyway")
    wait_for(lambda: statuses(store, bad["id"]) == ["error"], what="the bad run ended")
    run = run_rows(store, bad["id"])[0]
    assert run["error_code"] == "COMPLETION_FAILED" and "CONSTRAINT_VIOLATION" not in (run["status"] or "")
    with store.read() as tx:
        assert tx.scalar("SELECT status FROM job_dispatch_queue WHERE id = ?", (run["dispatch_id"],)) == "failed"
