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
