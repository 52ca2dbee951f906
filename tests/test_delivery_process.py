"""Delivery through a real ``scheduler run`` process: faults, and ``kill -9`` between sending and recording.

The loopback receiver is an idempotent Standard Webhooks receiver: it verifies each
signature, keeps the ``webhook-id`` values it accepted, answers 200 to a repeat without
accepting it again, and counts the repeats. So the tests can tell "shown once" (what a
channel honouring idempotency keys gives) from "sent twice" (what a key-less channel
would show).
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, wait_for
from test_dispatcher_process import Proc

from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store
from scheduler.testing.http import LoopbackHTTPServer, Recorded, Reply

SECRET = "whsec_" + base64.b64encode(b"fedcba9876543210fedcba9876543210").decode()


class IdempotentReceiver:
    """Accepts each ``webhook-id`` once; counts repeats; can hold a request until released."""

    def __init__(self) -> None:
        self.server = LoopbackHTTPServer()
        self.accepted: list[str] = []
        self.repeats = 0
        self.hold_first = threading.Event()  # set: the next new request is held until ``release`` is set
        self.holding = threading.Event()
        self.release = threading.Event()
        self.faults: list[Reply] = []
        self.server.default("/hook", self._answer)

    def _answer(self, request: Recorded) -> Reply:
        from standardwebhooks import Webhook

        Webhook(SECRET).verify(request.body, {k: request.headers[k] for k in ("webhook-id", "webhook-timestamp", "webhook-signature")})
        if self.faults:
            return self.faults.pop(0)
        key = request.headers["webhook-id"]
        if key in self.accepted:
            self.repeats += 1
            return Reply(json={"duplicate": True})
        self.accepted.append(key)
        if self.hold_first.is_set():
            self.hold_first.clear()
            self.holding.set()
            self.release.wait(30)
        return Reply(json={"ok": True})


@pytest.fixture
def receiver() -> Any:
    r = IdempotentReceiver()
    yield r
    r.release.set()
    r.server.close()


def settings_env(tmp_path: Path, *, claim_ttl_ms: int = 1000, concurrency: int = 8) -> dict[str, str]:
    config = tmp_path / "scheduler.toml"
    config.write_text('[channels.webhook]\nsecret = {credential = "env:TEST_WEBHOOK_SECRET"}\nmax_chars = 100\ntimeout_s = 3\n'
                      f"[delivery]\nretry_base_ms = 50\nretry_max_ms = 300\nclaim_ttl_ms = {claim_ttl_ms}\n"
                      f"concurrency = {concurrency}\n")
    return {"SCHEDULER_CONFIG": str(config), "TEST_WEBHOOK_SECRET": SECRET}


def outbox(store: Any, job_id: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT * FROM delivery_outbox WHERE job_id = ? ORDER BY part_index", (job_id,))


def test_faults_through_scheduler_run_end_delivered_or_visibly_failed(tmp_path: Path, receiver: IdempotentReceiver) -> None:
    db = tmp_path / "scheduler.db"
    store = open_store(db)
    receiver.faults = [Reply(status=500), Reply(status=429, headers={"retry-after": "1"}), Reply(action="reset"),
                       Reply(action="hang", seconds=5)]
    recovers = add_job(store, payload_message="echo:" + "r" * 250, delivery_mode="always", delivery_channel="webhook",
                       delivery_to=f"{receiver.server.url}/hook")
    enqueue_manual(store, recovers["id"])
    proc = Proc(db, log=tmp_path / "dispatcher.log", env=settings_env(tmp_path))
    try:
        proc.wait_ready()
        wait_for(lambda: (rows := outbox(store, recovers["id"])) and all(r["status"] == "delivered" for r in rows), timeout=90,
                 what="delivered after 500, 429, reset and a hang")
        rows = outbox(store, recovers["id"])
        assert receiver.accepted == [r["idempotency_key"] for r in rows] and receiver.repeats == 0
        assert rows[0]["attempts"] == 5  # four faults, then delivered
        receiver.server.default("/hook", Reply(status=410))  # gone for good: a permanent failure, visible
        gone = add_job(store, payload_message="echo:x", delivery_mode="always", delivery_channel="webhook",
                       delivery_to=f"{receiver.server.url}/hook")
        enqueue_manual(store, gone["id"])
        (failed,) = wait_for(lambda: [r for r in outbox(store, gone["id"]) if r["status"] == "failed"], timeout=20, what="failed")
        assert failed["attempts"] == 1 and failed["error_code"]
    finally:
        proc.kill(15)
        proc.p.wait(20)
        proc.close()
        store.close()


def test_kill9_between_sending_and_recording_resends_with_the_same_key(tmp_path: Path, receiver: IdempotentReceiver) -> None:
    db = tmp_path / "scheduler.db"
    store = open_store(db)
    job = add_job(store, payload_message="echo:" + "k" * 250, delivery_mode="always", delivery_channel="webhook",
                  delivery_to=f"{receiver.server.url}/hook")
    receiver.hold_first.set()
    enqueue_manual(store, job["id"])
    env = settings_env(tmp_path)
    first = Proc(db, log=tmp_path / "first.log", env=env)
    try:
        first.wait_ready()
        assert receiver.holding.wait(20), first.output()
        first.kill()  # the receiver has accepted part 1; the dispatcher dies before recording it
        first.p.wait(10)
    finally:
        first.close()
    receiver.release.set()
    claimed = outbox(store, job["id"])
    assert claimed[0]["status"] == "claimed" and len(receiver.accepted) == 1
    second = Proc(db, log=tmp_path / "second.log", env=env)
    try:
        second.wait_ready()
        wait_for(lambda: all(r["status"] == "delivered" for r in outbox(store, job["id"])), timeout=30, what="all delivered")
    finally:
        second.kill(15)
        second.p.wait(20)
        second.close()
    rows = outbox(store, job["id"])
    # every part shown once; part 1 was sent twice with one key, and the receiver dropped the repeat
    assert receiver.accepted == [r["idempotency_key"] for r in rows]
    assert receiver.repeats == 1 and rows[0]["attempts"] == 2
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind = 'delivery.claim_taken_over'") == 1
    store.close()


class SlowReceiver(IdempotentReceiver):
    """An idempotent receiver that takes ``hold_s`` over each new part, counting the new parts it is taking now."""

    def __init__(self, hold_s: float) -> None:
        super().__init__()
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.taking = 0
        self.busy = threading.Event()

    def _answer(self, request: Recorded) -> Reply:
        import time

        key = request.headers["webhook-id"]
        if key in self.accepted:
            return super()._answer(request)
        with self.lock:
            self.taking += 1
            self.busy.set()
        try:
            reply = super()._answer(request)
            time.sleep(self.hold_s)
            return reply
        finally:
            with self.lock:
                self.taking -= 1
                if not self.taking:
                    self.busy.clear()


def test_each_kill9_during_delivery_leaves_at_most_concurrency_parts_sent_and_unrecorded(tmp_path: Path) -> None:
    """Issue 30 defects 5 and 4: the bound docs/delivery.md states, under repeated kill -9 in the middle of sends.

    Several dispatchers are killed one after another, each while the receiver is taking parts from it,
    faster than their claims expire, so the parts they left are sent again together later. A dispatcher
    sends up to ``[delivery] concurrency`` parts at once (3 here, for 6 messages of 3 parts): per dead
    dispatcher at most that many were received and not recorded; in all, the receiver sees at most
    ``concurrency`` repeats per kill, and every part is delivered and accepted once.
    """
    receiver = SlowReceiver(hold_s=0.4)
    db = tmp_path / "scheduler.db"
    store = open_store(db)
    concurrency = 3
    env = settings_env(tmp_path, claim_ttl_ms=4000, concurrency=concurrency)
    kills, unrecorded_at_kill, unrecorded = 4, [], set()
    try:
        jobs = [add_job(store, payload_message="echo:" + f"{i}" * 250, delivery_mode="always", delivery_channel="webhook",
                        delivery_to=f"{receiver.server.url}/hook") for i in range(6)]
        for job in jobs:
            enqueue_manual(store, job["id"])
        for cycle in range(kills):
            proc = Proc(db, log=tmp_path / f"d{cycle}.log", env=env)
            try:
                proc.wait_ready()
                assert receiver.busy.wait(30), proc.output()  # a part of this dispatcher's is being received
                proc.kill()
                proc.p.wait(10)
            finally:
                proc.close()
            with store.read() as tx:
                rows = tx.all("SELECT idempotency_key, claim_owner FROM delivery_outbox WHERE status = 'claimed'")
            accepted = set(receiver.accepted)
            per_owner: dict[str, int] = {}
            for row in rows:
                if row["idempotency_key"] in accepted:
                    per_owner[row["claim_owner"]] = per_owner.get(row["claim_owner"], 0) + 1
                    unrecorded.add((row["claim_owner"], row["idempotency_key"]))
            assert all(n <= concurrency for n in per_owner.values()), per_owner
            unrecorded_at_kill.append(sum(per_owner.values()))
        drain = Proc(db, log=tmp_path / "drain.log", env=env)
        try:
            drain.wait_ready()
            wait_for(lambda: all(r["status"] == "delivered" for j in jobs for r in outbox(store, j["id"])), timeout=90,
                     what="every part delivered")
        finally:
            drain.kill(15)
            drain.p.wait(20)
            drain.close()
        keys = [r["idempotency_key"] for j in jobs for r in outbox(store, j["id"])]
        assert sorted(receiver.accepted) == sorted(keys)  # every part shown once
        assert max(unrecorded_at_kill) >= 2  # the kills did land between sends (in parallel) and their records
        # each part a dead dispatcher sent and did not record comes again once (a later kill sees a dead one's too)
        assert 2 <= receiver.repeats <= len(unrecorded) <= concurrency * kills, (receiver.repeats, unrecorded_at_kill)
    finally:
        receiver.release.set()
        receiver.server.close()
        store.close()


class TimingReceiver(IdempotentReceiver):
    """An idempotent receiver that takes ``latency_s`` over every request, noting when it took each part of which run."""

    def __init__(self, latency_s: float) -> None:
        super().__init__()
        self.latency_s = latency_s
        self.lock = threading.Lock()
        #: (run id, idempotency key, start, end) per request, monotonic seconds
        self.taken: list[tuple[str, str, float, float]] = []

    def _answer(self, request: Recorded) -> Reply:
        import json
        import time

        start = time.monotonic()
        time.sleep(self.latency_s)
        with self.lock:
            reply = super()._answer(request)
        end = time.monotonic()
        with self.lock:
            self.taken.append((json.loads(request.body)["data"]["run_id"], request.headers["webhook-id"], start, end))
        return reply


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _t, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize(("concurrency", "channel_limit", "expected"), [(4, None, 4), (8, 2, 2)])
def test_parts_of_different_runs_go_out_at_once_and_parts_of_one_run_never(
        tmp_path: Path, concurrency: int, channel_limit: int | None, expected: int) -> None:
    """Issue 30 defect 4: the consumer sends in parallel across runs, up to ``[delivery] concurrency`` parts at once
    (``channel_concurrency`` caps one channel), while the parts of one run never overlap and a message's parts go in order.

    Eight runs of a real ``scheduler run`` each have two messages for a receiver that takes 150 ms per request:
    the job's result (3 parts of at most 100 characters) and a ``[notifications]`` message.
    """
    receiver = TimingReceiver(latency_s=0.15)
    db = tmp_path / "scheduler.db"
    store = open_store(db)
    env = settings_env(tmp_path, concurrency=concurrency)
    hook = f"{receiver.server.url}/hook"
    with open(env["SCHEDULER_CONFIG"], "a") as fh:
        fh.write(f'[notifications]\nroutes = ["webhook:{hook}"]\nevents = ["completed"]\n')
    if channel_limit is not None:
        config = Path(env["SCHEDULER_CONFIG"])
        config.write_text(config.read_text().replace("[delivery]\n", f"[delivery]\nchannel_concurrency = {{ webhook = {channel_limit} }}\n"))

    def statuses() -> list[str]:
        with store.read() as tx:
            return [r["status"] for r in tx.all("SELECT status FROM delivery_outbox")]
    try:
        jobs = [add_job(store, payload_message="echo:" + f"{i}" * 250, delivery_mode="always", delivery_channel="webhook",
                        delivery_to=hook) for i in range(8)]
        for job in jobs:
            enqueue_manual(store, job["id"])
        proc = Proc(db, log=tmp_path / "d.log", env=env)
        try:
            proc.wait_ready()
            wait_for(lambda: len(s := statuses()) >= 16 and all(v == "delivered" for v in s), timeout=90,
                     what="every part delivered")
        finally:
            proc.kill(15)
            proc.p.wait(20)
            proc.close()
        with store.read() as tx:
            parts = tx.all("SELECT run_id, group_key, part_index, idempotency_key FROM delivery_outbox")
        assert sorted(receiver.accepted) == sorted(p["idempotency_key"] for p in parts) and receiver.repeats == 0
        assert len({p["group_key"] for p in parts}) == 16 and len(parts) > 16  # two messages a run, some of several parts
        by_key = {key: (start, end) for _run, key, start, end in receiver.taken}
        for run_id in {p["run_id"] for p in parts}:
            mine = sorted((start, end) for run, _key, start, end in receiver.taken if run == run_id)
            assert len(mine) >= 2 and most_at_once(mine) == 1, (run_id, mine)  # one at a time
        for p in parts:
            if p["part_index"] > 1:  # in order: part i starts after part i - 1 was answered
                before = p["idempotency_key"].replace(f":part:{p['part_index']}/", f":part:{p['part_index'] - 1}/")
                assert by_key[p["idempotency_key"]][0] >= by_key[before][1]
        assert most_at_once(list(by_key.values())) == expected  # different runs at once, up to the limit
    finally:
        receiver.release.set()
        receiver.server.close()
        store.close()
