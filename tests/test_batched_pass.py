"""Issue 18, second round: a dispatcher pass writes its runs and events in multi-row statements, on both stores.

``events.batched`` gathers the fully known events of a pass into one INSERT without
reordering them (an event that needs lookups flushes the gathered ones first) and drops
them with a transaction that rolls back; ``claim_and_start`` claims its new runs in one
UPDATE and inserts them in one INSERT, with the same rows, bindings and events as one
by one, and never a run without its claim.
"""

from __future__ import annotations

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core import lease as leases
from scheduler.core.events import append_event, batched
from scheduler.core.queue import claim_and_start, enqueue_manual
from scheduler.core.rows import DispatchRow, JobRow
from scheduler.core.transitions import NewRun, claim_and_start_many, committing
from scheduler.testing import add_job


def _events(store, kinds):
    marks = ", ".join("?" for _ in kinds)
    with store.read() as tx:
        return tx.all(f"SELECT id, kind, run_id, artifact_digest, data, principal, trust_level FROM runtime_events"
                      f" WHERE kind IN ({marks}) ORDER BY id", list(kinds))


def test_batched_events_keep_their_order_and_need_one_statement(store):
    job = add_job(store, payload_message="ok")
    digest = job["artifact_digest"]
    with store.transaction() as tx, batched(tx):
        append_event(tx, "t.fast1", job_id=job["id"], artifact_digest=digest, principal=None, trust_level=None, data={"n": 1})
        append_event(tx, "t.fast2", job_id=job["id"], artifact_digest=digest, principal=None, trust_level=None)
        with store.read() as inner:  # nothing is written until the block ends or a lookup event comes
            assert inner.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind LIKE 't.fast%'") == 0
        append_event(tx, "t.lookup", job_id=job["id"])  # needs lookups: the gathered rows go in first
        append_event(tx, "t.fast3", job_id=job["id"], artifact_digest=digest, principal="user:x", trust_level="high")
    rows = _events(store, ["t.fast1", "t.fast2", "t.lookup", "t.fast3"])
    assert [r["kind"] for r in rows] == ["t.fast1", "t.fast2", "t.lookup", "t.fast3"]
    assert all(r["artifact_digest"] == digest for r in rows)  # the lookup event found the job's artifact
    assert rows[0]["data"] == '{"n": 1}' and rows[1]["data"] is None
    assert (rows[3]["principal"], rows[3]["trust_level"]) == ("user:x", "high")


def test_batched_events_vanish_with_a_rolled_back_transaction(store):
    job = add_job(store, payload_message="ok")
    with pytest.raises(RuntimeError), store.transaction() as tx, batched(tx):
        append_event(tx, "t.gone", job_id=job["id"], artifact_digest=job["artifact_digest"], principal=None, trust_level=None)
        raise RuntimeError("boom")
    assert _events(store, ["t.gone"]) == []
    # and a later plain append is not caught by a stale batch
    with store.transaction() as tx:
        append_event(tx, "t.after", job_id=job["id"], artifact_digest=job["artifact_digest"], principal=None, trust_level=None)
    assert len(_events(store, ["t.after"])) == 1


def test_a_claim_pass_starts_several_runs_with_their_claims_bindings_and_events(store):
    jobs = [add_job(store, payload_message="ok", overlap_policy="allow") for _ in range(5)]
    for job in jobs:
        enqueue_manual(store, job["id"])
    enqueue_manual(store, jobs[0]["id"])  # two dispatches of one job (overlap allowed): both start
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    started = claim_and_start(store, lease, limit=10)
    assert len(started) == 6
    with store.read() as tx:
        for s in started:
            run = tx.one("SELECT * FROM runs WHERE id = ?", (s.run_id,))
            d = tx.one("SELECT * FROM job_dispatch_queue WHERE id = ?", (s.dispatch_id,))
            assert run["status"] == "running" and run["dispatcher_owner"] == "D" and run["dispatcher_token"] == lease.token
            assert (d["status"], d["run_id"], d["claim_owner"], d["claim_fence"], d["attempts"]) == (
                "claimed", s.run_id, "D", lease.token, 1)
            assert (run["artifact_digest"], run["source_artifact_digest"]) == (d["artifact_digest"], d["source_artifact_digest"])
            assert run["job_id"] == s.job.id and run["executor"] == "testkit" and run["attempt"] == 1
        tokens = tx.all("SELECT claim_token FROM job_dispatch_queue WHERE status = 'claimed'")
    assert len({t["claim_token"] for t in tokens}) == 6  # each claim its own token
    events = _events(store, ["run.started"])
    assert sorted(e["run_id"] for e in events) == sorted(s.run_id for s in started)
    assert all(e["artifact_digest"] == next(s.job.artifact_digest for s in started if s.run_id == e["run_id"]) for e in events)


def test_a_dispatch_no_longer_pending_gets_no_run(store):
    """Never a run without its claim: the batched claim's RETURNING decides which runs are inserted."""
    a, b = add_job(store, payload_message="ok"), add_job(store, payload_message="ok")
    da, db = enqueue_manual(store, a["id"]), enqueue_manual(store, b["id"])
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    now = now_ms()
    with committing(store) as tx:
        rows = {r["id"]: r for r in tx.all("SELECT * FROM job_dispatch_queue WHERE id IN (?, ?)", (da["id"], db["id"]))}
        tx.execute("UPDATE job_dispatch_queue SET status = 'cancelled' WHERE id = ?", (db["id"],))
        new = [NewRun(run_id=f"run-{k}", claim_token=f"tok-{k}", job=JobRow.from_row(j), dispatch=DispatchRow.from_row(rows[d["id"]]),
                      attempt=1, executor="testkit", parent_run_id=None, retry_of_run_id=None, replay_of_run_id=None)
               for k, (j, d) in enumerate(((a, da), (b, db)))]
        got = claim_and_start_many(tx, lease, new, expires_at=now + 60_000, now=now)
    assert [r.run_id for r in got] == ["run-0"]
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM runs WHERE id = 'run-1'") == 0
        assert tx.scalar("SELECT status FROM job_dispatch_queue WHERE id = ?", (db["id"],)) == "cancelled"
        assert tx.scalar("SELECT run_id FROM job_dispatch_queue WHERE id = ?", (da["id"],)) == "run-0"


def test_a_failing_pass_leaves_no_claim_run_or_event(store):
    job = add_job(store, payload_message="ok")
    enqueue_manual(store, job["id"])
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    with pytest.raises(SchedulerError), committing(store) as tx, batched(tx):
        assert len(claim_and_start(store, lease, limit=4, check_lease=False)) == 1
        raise SchedulerError("DB_BUSY", "simulated failure after the claims")
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM runs") == 0
        assert tx.scalar("SELECT status FROM job_dispatch_queue WHERE job_id = ?", (job["id"],)) == "pending"
    assert _events(store, ["run.started"]) == []


def test_completions_of_one_pass_finish_their_dispatches_in_one_update(store):
    """``batched_finishes``: ok and failed runs' dispatch rows go done with their own last error, or not at all on rollback."""
    from scheduler.core.completion import complete_run
    from scheduler.core.execution import ExecutionResult
    from scheduler.core.transitions import batched_finishes
    from scheduler.pipeline.participants import default_completion_participants

    participants = default_completion_participants()
    jobs = [add_job(store, payload_message="ok") for _ in range(3)]
    for job in jobs:
        enqueue_manual(store, job["id"])
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    started = claim_and_start(store, lease, limit=3)
    results = [ExecutionResult(status="ok"), ExecutionResult(status="error", error_code="X_FAILED"), ExecutionResult(status="ok")]
    with pytest.raises(RuntimeError), committing(store) as tx, batched(tx), batched_finishes(tx):
        for s, r in zip(started, results, strict=True):
            complete_run(store, lease, s.run_id, r, participants=participants, check_lease=False, outcomes=s.outcomes)
        raise RuntimeError("rolled back")
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE status = 'claimed'") == 3
    with committing(store) as tx, batched(tx), batched_finishes(tx):
        for s, r in zip(started, results, strict=True):
            complete_run(store, lease, s.run_id, r, participants=participants, check_lease=False, outcomes=s.outcomes)
        with store.read() as inner:  # deferred to the end of the block
            assert inner.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE status = 'done'") == 0
    with store.read() as tx:
        rows = {r["id"]: r for r in tx.all("SELECT id, status, last_error FROM job_dispatch_queue")}
    assert [(rows[s.dispatch_id]["status"], rows[s.dispatch_id]["last_error"]) for s in started] == [
        ("done", None), ("done", "X_FAILED"), ("done", None)]
    assert [e["kind"] for e in _events(store, ["run.started", "run.finished"])].count("run.finished") == 3


def test_a_pass_says_every_run_start_and_end_in_one_write(store):
    """The per-run lines are gathered per pass (one ``say`` call), each run's start line before its end line."""
    from scheduler.testing import RunningDispatcher, wait_for

    jobs = [add_job(store, payload_message="ok", overlap_policy="allow") for _ in range(6)]
    for job in jobs:
        enqueue_manual(store, job["id"])
    d = RunningDispatcher(store, concurrency=4)
    try:
        wait_for(lambda: d.dispatcher.stats["finished"] == 6, timeout=20, what="six runs finished")
    finally:
        d.stop()
    with store.read() as tx:
        runs = tx.all("SELECT id, job_id FROM runs WHERE status = 'ok'")
    assert len(runs) == 6
    text = "\n".join(d.messages)
    lines = text.splitlines()
    for run in runs:
        start = [i for i, line in enumerate(lines) if f"run {run['id'][-8:]}" in line and " start " in line]
        end = [i for i, line in enumerate(lines) if f"run {run['id'][-8:]} in " in line and " ok " in line]
        assert len(start) == 1 and len(end) == 1 and start[0] < end[0], (run["id"], lines)
    # fewer say() calls than lines: a pass's lines travel together
    run_lines = [m for m in d.messages if " start " in m or " ok " in m]
    assert len(run_lines) < 12 and sum(m.count("\n") + 1 for m in run_lines) == 12


def test_one_shot_jobs_due_together_are_materialised_together_as_one_by_one(store):
    """Due one-shots become their deterministic ``at`` dispatches (bound to the job's artifact), once; a misfired one
    still takes the per-job path (its ``skip`` policy records a skipped run)."""
    from scheduler.base.timeutil import to_iso
    from scheduler.core.queue import materialize_due, slot_dispatch_id

    base = now_ms() + 10_000  # specs refuse a past schedule_at: materialise "later" instead
    due = [add_job(store, schedule_kind="at", schedule_at=to_iso(base + 61_000 + i), payload_message="ok") for i in range(3)]
    late = add_job(store, schedule_kind="at", schedule_at=to_iso(base), payload_message="ok", misfire_policy="skip")
    later = add_job(store, schedule_kind="at", schedule_at=to_iso(base + 3_600_000), payload_message="ok")
    now = base + 62_000  # the three are a second late (within the 60 s grace), ``late`` is a misfire
    assert materialize_due(store, now=now) == 3
    assert materialize_due(store, now=now) == 0  # nothing twice
    with store.read() as tx:
        for job in due:
            slot = tx.scalar("SELECT schedule_at FROM jobs WHERE id = ?", (job["id"],))
            d = tx.one("SELECT * FROM job_dispatch_queue WHERE job_id = ?", (job["id"],))
            assert d["id"] == slot_dispatch_id(job["id"], "at", slot) and (d["kind"], d["status"], d["due_at"]) == ("at", "pending", slot)
            assert d["artifact_digest"] == job["artifact_digest"] and d["source_artifact_digest"] is None
            assert tx.scalar("SELECT next_run_at FROM jobs WHERE id = ?", (job["id"],)) is None
        assert tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE job_id = ?", (late["id"],)) == 0
        assert tx.scalar("SELECT status FROM runs WHERE job_id = ?", (late["id"],)) == "skipped"
        assert tx.scalar("SELECT next_run_at FROM jobs WHERE id = ?", (later["id"],)) is not None


def test_a_pass_that_fills_every_worker_sleeps_until_a_run_ends(store, tmp_path):
    """After a pass starts runs on every worker, the loop does not come straight back for a pass that could claim
    nothing (it would only take the CPU from the runs it started): it sleeps until a run's end wakes it. With a worker
    left over it comes straight back, since more may be due."""
    from scheduler.core.dispatcher import MAX_SLEEP_S, DispatcherConfig
    from scheduler.runtime import dispatcher as Dispatcher

    jobs = [add_job(store, payload_message="sleep:2", overlap_policy="allow") for _ in range(2)]
    for job in jobs:
        enqueue_manual(store, job["id"])
    d = Dispatcher(store, DispatcherConfig(concurrency=2, artifacts_root=tmp_path / "a", lease_ttl_ms=5_000))
    d.start()
    try:
        pause = d._tick()
        assert d.stats["started"] == 2
        assert 0 < pause <= MAX_SLEEP_S  # both workers busy, nothing else due: wait for a run to end
    finally:
        d.request_stop()
        d._stop.set()
        d._hurry.set()
        d._shutdown()
    third = add_job(store, payload_message="ok")
    enqueue_manual(store, third["id"])
    wide = Dispatcher(store, DispatcherConfig(concurrency=4, artifacts_root=tmp_path / "b", lease_ttl_ms=5_000))
    wide.start()
    try:
        assert wide._tick() == 0.0 and wide.stats["started"] == 1  # three workers still free: straight back
    finally:
        wide._hurry.set()
        wide.request_stop()
        wide._shutdown()


def test_a_pass_after_one_that_found_less_work_than_workers_gathers_a_window(store, tmp_path, monkeypatch):
    """A time-capped commit group: after a pass that started fewer runs than it had free workers (work arriving one
    run at a time), the next pass waits until ``GROUP_WINDOW_S`` after it, so it commits the window's finished runs
    and due work together; after a pass that filled its workers (a backlog) the next pass does not wait."""
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.dispatcher import passes as passes_module
    from scheduler.runtime import dispatcher as Dispatcher

    window = 30.0  # longer than this test's passes take on a loaded machine (the real one is GROUP_WINDOW_S)
    monkeypatch.setattr(passes_module, "GROUP_WINDOW_S", window)
    slept: list[float] = []
    for _ in range(3):
        enqueue_manual(store, add_job(store, payload_message="sleep:2", overlap_policy="allow")["id"])
    d = Dispatcher(store, DispatcherConfig(concurrency=2, artifacts_root=tmp_path / "a", lease_ttl_ms=5_000))
    monkeypatch.setattr(d._pass, "pause", slept.append)
    d.start()
    try:
        d._tick()  # fills both workers: a backlog
        d._tick()
        assert d.stats["started"] == 2 and slept == []
    finally:
        d.request_stop()
        d._stop.set()
        d._hurry.set()
        d._shutdown()
    enqueue_manual(store, add_job(store, payload_message="ok")["id"])
    wide = Dispatcher(store, DispatcherConfig(concurrency=4, artifacts_root=tmp_path / "b", lease_ttl_ms=5_000))
    monkeypatch.setattr(wide._pass, "pause", slept.append)
    wide.start()
    try:
        wide._tick()  # two runs (the leftover and the new one) for four workers
        assert wide.stats["started"] == 2 and slept == []
        wide._tick()
        assert len(slept) == 1 and window - 5 < slept[0] <= window  # until the window after the last pass
    finally:
        wide._hurry.set()
        wide.request_stop()
        wide._shutdown()


def _counting_scenario(store, tag):
    """Jobs whose runs one pass ends: an auto-pausing failure, an ok run, a failure that retries, and two runs of one
    ``allow`` job (the second fails); each role's runs started under one lease."""
    roles = {
        "pauses": add_job(store, name=f"{tag}-pauses", payload_message="x", max_consecutive_failures=1),
        "ok": add_job(store, name=f"{tag}-ok", payload_message="x"),
        "retries": add_job(store, name=f"{tag}-retries", payload_message="x", max_retries=1),
        "twice": add_job(store, name=f"{tag}-twice", payload_message="x", overlap_policy="allow",
                         max_consecutive_failures=1),
    }
    for role in ("pauses", "ok", "retries", "twice", "twice"):
        enqueue_manual(store, roles[role]["id"])
    return roles


def test_a_pass_counts_its_runs_on_their_jobs_as_one_by_one(store):
    """``complete_runs_in`` (one ``count_job_runs`` for the jobs the pass ends once) writes the job counters, the
    auto-pause, the retry and the events that completing the runs one by one writes, on both stores."""
    from scheduler.core.completion import complete_run_in, complete_runs_in
    from scheduler.core.execution import ExecutionResult
    from scheduler.pipeline.participants import default_completion_participants

    participants = default_completion_participants()
    lease = leases.acquire(store, "dispatcher", "D", 10_000)
    outcome = {"pauses": ExecutionResult(status="error", error_code="X_FAILED", error_message="bad"),
               "ok": ExecutionResult(status="ok"), "retries": ExecutionResult(status="timeout", error_code="T"),
               "twice": ExecutionResult(status="ok")}
    second = ExecutionResult(status="error", error_code="Y_FAILED")
    seen = {}
    for tag in ("batched", "single"):
        roles = _counting_scenario(store, tag)
        role_of = {job["id"]: role for role, job in roles.items()}
        started = claim_and_start(store, lease, limit=6)
        assert len(started) == 5
        items, twice = [], 0
        for s in started:
            role = role_of[s.job.id]
            twice += role == "twice"
            items.append((s.run_id, second if role == "twice" and twice == 2 else outcome[role], s.outcomes))
        now = now_ms()
        with committing(store) as tx:
            if tag == "batched":
                ended = complete_runs_in(tx, lease, items, participants=participants, now=now)
            else:
                ended = [complete_run_in(tx, lease, run_id, r, participants=participants, now=now, outcomes=o)
                         for run_id, r, o in items]
        assert [run.id for run in ended] == [run_id for run_id, _r, _o in items]
        with store.read() as tx:
            jobs = {role_of[r["id"]]: (r["run_count"], r["last_status"], r["last_error"], r["consecutive_failures"],
                                       r["enabled"])
                    for r in tx.all("SELECT * FROM jobs WHERE id IN (?, ?, ?, ?)", list(role_of))}
            events: dict[str, list[str]] = {}  # per job in order (the claim orders jobs due together by random id)
            for e in tx.all("SELECT job_id, kind FROM runtime_events WHERE job_id IN (?, ?, ?, ?) AND at >= ? ORDER BY id",
                            [*role_of, now]):
                events.setdefault(role_of[e["job_id"]], []).append(e["kind"])
            queue = sorted((role_of[d["job_id"]], d["kind"], d["status"]) for d in tx.all(
                "SELECT job_id, kind, status FROM job_dispatch_queue WHERE job_id IN (?, ?, ?, ?)", list(role_of)))
        seen[tag] = (jobs, events, queue)
    assert seen["batched"] == seen["single"]
    jobs, events, queue = seen["batched"]
    assert jobs["pauses"][1:] == ("error", "bad", 1, 0) and jobs["ok"][:2] == (1, "ok")
    assert jobs["twice"][0] == 2 and jobs["twice"][1] == "error" and jobs["twice"][4] == 0  # counted in order
    assert events["pauses"] == ["run.finished", "job.auto_paused"]
    assert events["twice"] == ["run.finished", "run.finished", "job.auto_paused"]
    assert ("retries", "retry", "pending") in queue
