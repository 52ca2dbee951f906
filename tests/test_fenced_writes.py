"""scheduler.core.fenced_writes: the workers' RunControl writes committed in groups, failures kept per write (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import threading

import pytest
from kernel_testing import add_job, run_rows

from scheduler.base.timeutil import now_ms
from scheduler.core import lease as leases
from scheduler.core.dispatcher import DbRunControl, DispatcherConfig
from scheduler.core.queue import claim_and_start, enqueue_manual
from scheduler.core.runs import StaleFence
from scheduler.runtime import dispatcher as Dispatcher


def _running(store, count: int):
    """A dispatcher holding its lease and ``count`` running runs it claimed, one job each."""
    d = Dispatcher(store, DispatcherConfig(lease_ttl_ms=10_000, concurrency=count))
    d.lease = leases.acquire(store, d.lease_name, d.owner, 10_000)
    jobs = [add_job(store, name=f"fw-{i}", payload_message="ok") for i in range(count)]
    for job in jobs:
        enqueue_manual(store, job["id"])
    started = claim_and_start(store, d.lease, limit=count)
    assert len(started) == count
    return d, started


def _events(store, run_id: str, kind: str) -> list[dict]:
    with store.read() as tx:
        return tx.all("SELECT data, actor FROM runtime_events WHERE run_id = ? AND kind = ? ORDER BY id", (run_id, kind))


def test_concurrent_handles_share_commits_and_each_is_durable_on_return(store):
    d, started = _running(store, 8)
    barrier = threading.Barrier(len(started))
    seen: dict[str, int | None] = {}

    def worker(s) -> None:
        control = DbRunControl(d, s.run_id, s.job.id)
        barrier.wait()
        control.record_handle({"pid": 4000 + s.attempt, "pgid": 4000, "start_time": "ticks:7", "run": s.run_id})
        with store.read() as tx:  # durable before record_handle returned: another connection sees it
            row = tx.one("SELECT executor_handle, process_state FROM runs WHERE id = ?", (s.run_id,))
        seen[s.run_id] = json.loads(row["executor_handle"])["run"] == s.run_id and row["process_state"] == "running"

    threads = [threading.Thread(target=worker, args=(s,)) for s in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {s.run_id: True for s in started}
    writer = d.fenced_writes
    assert writer.writes == len(started)
    assert 1 <= writer.commits < len(started)  # grouped: eight writes queued together never take eight commits
    for s in started:
        events = _events(store, s.run_id, "run.handle_recorded")
        assert len(events) == 1 and events[0]["actor"] == d.owner


def test_a_stale_run_fails_only_its_own_write(store):
    d, started = _running(store, 3)
    stale, *fine = started
    with store.transaction() as tx:  # the stale run is no longer ours (e.g. recovered by another dispatcher)
        tx.execute("UPDATE runs SET dispatcher_token = dispatcher_token + 100 WHERE id = ?", (stale.run_id,))
    errors: dict[str, BaseException | None] = {}
    barrier = threading.Barrier(len(started))

    def worker(s) -> None:
        control = DbRunControl(d, s.run_id, s.job.id)
        barrier.wait()
        try:
            control.record_handle({"pid": 1, "pgid": 1, "start_time": "ticks:1"})
            errors[s.run_id] = None
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors[s.run_id] = exc

    threads = [threading.Thread(target=worker, args=(s,)) for s in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(errors[stale.run_id], StaleFence)
    assert all(errors[s.run_id] is None for s in fine)
    rows = {r["id"]: r for r in (run_rows(store, s.job.id)[0] for s in started)}
    assert rows[stale.run_id]["executor_handle"] is None and _events(store, stale.run_id, "run.handle_recorded") == []
    for s in fine:
        assert json.loads(rows[s.run_id]["executor_handle"])["pid"] == 1


def test_a_lost_lease_fails_fenced_writes_but_keeps_plain_events(store):
    d, started = _running(store, 1)
    s = started[0]
    control = DbRunControl(d, s.run_id, s.job.id)
    leases.acquire(store, d.lease_name, "someone-else", 1000, now=now_ms() + 20_000)  # taken over after expiry
    with pytest.raises(leases.LeaseLost):
        control.record_handle({"pid": 2, "pgid": 2, "start_time": "ticks:2"})
    assert run_rows(store, s.job.id)[0]["executor_handle"] is None
    control.event("probe.noted", {"n": 1})  # an audit event is not fenced: it still commits
    assert [json.loads(e["data"]) for e in _events(store, s.run_id, "probe.noted")] == [{"n": 1}]


def test_the_writer_thread_ends_when_idle_and_comes_back(store, monkeypatch):
    import scheduler.core.fenced_writes as fw

    monkeypatch.setattr(fw, "IDLE_EXIT_S", 0.05)
    d, started = _running(store, 1)
    s = started[0]
    control = DbRunControl(d, s.run_id, s.job.id)
    control.event("probe.one", None)
    deadline = now_ms() + 5000
    while any(t.name == "fenced-writes" and t.is_alive() for t in threading.enumerate()) and now_ms() < deadline:
        threading.Event().wait(0.02)
    assert not d.fenced_writes._running
    control.record_handle({"pid": 3, "pgid": 3, "start_time": "ticks:3"})
    assert json.loads(run_rows(store, s.job.id)[0]["executor_handle"])["pid"] == 3


def test_writes_queued_while_the_writer_waits_for_the_write_lock_join_its_group(db_path):
    """SQLite: the writer takes the queue only once its transaction has begun, so writes that arrive while it
    waits for the write lock (held by the loop's own transactions) share its commit instead of waiting for another."""
    from scheduler.plugins.stores import open_store

    store = open_store(str(db_path))
    try:
        d, started = _running(store, 4)
        first, *rest = started

        def record(s) -> None:
            DbRunControl(d, s.run_id, s.job.id).record_handle({"pid": 5, "pgid": 5, "start_time": "ticks:5"})

        threads = [threading.Thread(target=record, args=(first,))]
        with store.transaction():  # holds the write lock, as the dispatcher loop's claim and completion do
            threads[0].start()
            threading.Event().wait(0.3)  # the writer has started and waits for the lock
            threads += [threading.Thread(target=record, args=(s,)) for s in rest]
            for t in threads[1:]:
                t.start()
            threading.Event().wait(0.3)
        for t in threads:
            t.join(30)
        assert (d.fenced_writes.writes, d.fenced_writes.commits) == (4, 1)
        for s in started:
            assert json.loads(run_rows(store, s.job.id)[0]["executor_handle"])["pid"] == 5
    finally:
        store.close()


def _record_in_thread(d, s, handle: dict, outcome: dict) -> threading.Thread:
    """``record_handle`` on a thread of its own; ``outcome[run_id]`` is None once it returned, else what it raised."""
    def worker() -> None:
        try:
            DbRunControl(d, s.run_id, s.job.id).record_handle(handle)
            outcome[s.run_id] = None
        except BaseException as exc:  # noqa: BLE001 - asserted by the caller
            outcome[s.run_id] = exc

    thread = threading.Thread(target=worker)
    thread.start()
    return thread


def _queued(writer, count: int) -> None:
    """Wait until ``count`` writes are queued (the writer thread leaves them alone while a pass is open)."""
    deadline = now_ms() + 10_000
    while len(writer._queue) < count:
        assert now_ms() < deadline, "writes never queued"
        threading.Event().wait(0.005)


def test_handles_recorded_while_a_pass_is_open_ride_its_commit(store):
    """Issue 34: a process identity queued while the dispatcher's pass holds the write lock is committed by that pass
    (one commit, not the pass's and then one of its own); its writer returns only once the pass committed."""
    d, started = _running(store, 3)
    stale, *fine = started
    with store.transaction() as tx:  # the stale run is no longer ours: its write fails alone, inside the pass too
        tx.execute("UPDATE runs SET dispatcher_token = dispatcher_token + 100 WHERE id = ?", (stale.run_id,))
    writer, outcome = d.fenced_writes, {}
    writer.pass_opens()
    threads = [_record_in_thread(d, s, {"pid": 7, "pgid": 7, "start_time": "ticks:7"}, outcome) for s in started]
    _queued(writer, len(started))
    taken: list = []
    with store.transaction() as tx:
        writer.join(tx, d.lease, taken)
        assert outcome == {}  # nobody returns before the pass commits
    writer.pass_closes()
    writer.acknowledge(taken)
    for t in threads:
        t.join(10)
    assert isinstance(outcome[stale.run_id], StaleFence) and all(outcome[s.run_id] is None for s in fine)
    assert (writer.commits, writer.writes, writer.joined) == (0, 2, 2)  # the writer thread committed nothing
    for s in fine:
        assert json.loads(run_rows(store, s.job.id)[0]["executor_handle"])["pid"] == 7
        assert [e["actor"] for e in _events(store, s.run_id, "run.handle_recorded")] == [d.owner]
    assert run_rows(store, stale.job.id)[0]["executor_handle"] is None and _events(store, stale.run_id, "run.handle_recorded") == []


def test_a_pass_that_fails_gives_its_handles_back_to_the_writer_thread(store):
    """The pass took the writes and then rolled back: nothing of them was written, so the writer thread commits them
    on its own (never joined again) and each writer returns once that commit is durable."""
    d, started = _running(store, 2)
    writer, outcome = d.fenced_writes, {}
    writer.pass_opens()
    threads = [_record_in_thread(d, s, {"pid": 9, "pgid": 9, "start_time": "ticks:9"}, outcome) for s in started]
    _queued(writer, len(started))
    taken: list = []
    with pytest.raises(RuntimeError), store.transaction() as tx:
        writer.join(tx, d.lease, taken)
        raise RuntimeError("the pass failed after taking the writes")
    assert len(taken) == 2 and outcome == {}
    writer.give_back(taken)
    assert all(item.solo for item in taken)
    late: list = []
    with store.transaction() as tx:  # a later pass does not take them again
        writer.join(tx, d.lease, late)
    assert late == []
    writer.pass_closes()
    for t in threads:
        t.join(10)
    assert outcome == {s.run_id: None for s in started}
    assert writer.joined == 0 and writer.writes == 2 and writer.commits >= 1
    for s in started:
        assert json.loads(run_rows(store, s.job.id)[0]["executor_handle"])["pid"] == 9
        assert len(_events(store, s.run_id, "run.handle_recorded")) == 1


def test_event_only_writes_are_never_taken_by_a_pass(store):
    """An executor's own event (no bookkeeping values) stays with the writer thread, even while a pass is open:
    a statement failing inside the pass's transaction would take the whole pass down on PostgreSQL."""
    d, (s,) = _running(store, 1)
    writer, done = d.fenced_writes, threading.Event()
    writer.pass_opens()
    try:
        thread = threading.Thread(target=lambda: (DbRunControl(d, s.run_id, s.job.id).event("testkit.note", {"n": 1}),
                                                  done.set()))
        thread.start()
        assert done.wait(10)  # committed by the writer thread while the pass is still open
        taken: list = []
        with store.transaction() as tx:
            writer.join(tx, d.lease, taken)
        assert taken == [] and writer.joined == 0 and writer.commits == 1
        assert len(_events(store, s.run_id, "testkit.note")) == 1
    finally:
        writer.pass_closes()
