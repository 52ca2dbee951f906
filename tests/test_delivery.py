"""The delivery outbox and its consumer, with the real webhook channel against a loopback receiver.

Every test runs on SQLite and PostgreSQL. The receiver verifies each Standard Webhooks
signature and records the ``webhook-id`` of every request, so "never shown twice" is
checked the way a real receiver would check it.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core.queue import enqueue_manual
from scheduler.delivery.outbox import backoff_ms, enqueue, retry_failed, split_body
from scheduler.plugins.protocols import ChannelLimits
from scheduler.settings import reload_settings
from scheduler.testing.http import LoopbackHTTPServer, Recorded, Reply

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


@pytest.fixture
def receiver() -> Iterator[LoopbackHTTPServer]:
    srv = LoopbackHTTPServer()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def delivery_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The webhook channel signs with a known secret and cuts parts at 100 characters (its least); retries are quick."""
    config = tmp_path / "scheduler.toml"
    config.write_text('[channels.webhook]\nsecret = {credential = "env:TEST_WEBHOOK_SECRET"}\nmax_chars = 100\ntimeout_s = 2\n'
                      "[delivery]\nretry_base_ms = 30\nretry_max_ms = 200\nclaim_ttl_ms = 600\n")
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    reload_settings()


def verified(receiver: LoopbackHTTPServer) -> list[Recorded]:
    """Every request the receiver got, each with a valid signature (any invalid one fails the test)."""
    from standardwebhooks import Webhook

    hook = Webhook(SECRET)
    for r in receiver.to("/hook"):
        hook.verify(r.body, {"webhook-id": r.headers["webhook-id"], "webhook-timestamp": r.headers["webhook-timestamp"],
                             "webhook-signature": r.headers["webhook-signature"]})
    return receiver.to("/hook")


def parts(store: Any, job_id: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT * FROM delivery_outbox WHERE job_id = ? ORDER BY group_key, part_index", (job_id,))


def webhook_job(store: Any, receiver: LoopbackHTTPServer, payload: str, **spec: Any) -> dict[str, Any]:
    return add_job(store, payload_message=payload, delivery_mode="always", delivery_channel="webhook",
                   delivery_to=f"{receiver.url}/hook", **spec)


def test_split_body_is_deterministic_keeps_lines_and_bounds_parts() -> None:
    limits = ChannelLimits(max_chars=10, max_parts=3)
    assert split_body("short", limits) == ["short"]
    assert split_body("line one\nline two\nline three", limits) == ["line one\n", "line two\n", "line three"]
    assert split_body("x" * 25, limits) == ["x" * 10, "x" * 10, "x" * 5]
    cut = split_body("y" * 300, ChannelLimits(max_chars=120, max_parts=1), run_id="r-1")
    assert len(cut) == 1 and len(cut[0]) <= 120 and cut[0].startswith("y") and "scheduler runs output r-1" in cut[0]
    assert split_body("", limits) == [""]
    emoji = "\U0001F600" * 7  # 7 characters, 14 UTF-16 units: Telegram counts units, so 10 is the real limit
    split = split_body(emoji, limits)
    assert "".join(split) == emoji and all(len(p.encode("utf-16-le")) // 2 <= 10 for p in split) and len(split) == 2


def test_backoff_doubles_with_jitter_and_honours_retry_after() -> None:
    import random

    rng = random.Random(7)
    delays = [backoff_ms(n, base_ms=1000, max_ms=10_000, retry_after_s=None, rng=rng) for n in (1, 2, 3, 4, 5)]
    assert 800 <= delays[0] <= 1200 and 1600 <= delays[1] <= 2400 and 3200 <= delays[2] <= 4800
    assert all(d <= 12_000 for d in delays[3:])
    assert backoff_ms(9, base_ms=1000, max_ms=10_000, retry_after_s=42) == 42_000


def test_a_result_reaches_the_webhook_in_order_once_each(store: Any, dispatcher: Any, receiver: LoopbackHTTPServer) -> None:
    text = " ".join(f"word{i:02d}" for i in range(60))
    job = webhook_job(store, receiver, f"echo:{text}")
    enqueue_manual(store, job["id"])
    dispatcher()
    wait_for(lambda: (rows := parts(store, job["id"])) and all(r["status"] == "delivered" for r in rows), what="all parts delivered")
    rows = parts(store, job["id"])
    got = verified(receiver)
    assert len(rows) > 3 and len(got) == len(rows)
    assert [r.headers["webhook-id"] for r in got] == [r["idempotency_key"] for r in rows]  # in order, each once
    assert all(r["idempotency_key"].endswith(f":part:{r['part_index']}/{len(rows)}") for r in rows)
    assert all(r["receipt_id"] == r["idempotency_key"] for r in rows)
    bodies = "".join(r.json()["data"]["body"] for r in got)
    assert text in bodies


def test_transient_failures_are_retried_with_retry_after_then_delivered(store: Any, dispatcher: Any,
                                                                          receiver: LoopbackHTTPServer) -> None:
    receiver.queue("/hook", Reply(status=500), Reply(status=429, headers={"retry-after": "1"}), Reply(action="reset"))
    job = webhook_job(store, receiver, "echo:hi")
    enqueue_manual(store, job["id"])
    started = time.monotonic()
    dispatcher()
    (row,) = wait_for(lambda: [r for r in parts(store, job["id"]) if r["status"] == "delivered"], timeout=20, what="delivered")
    assert row["attempts"] == 4 and time.monotonic() - started >= 1.0  # the Retry-After second was waited
    assert len({r.headers["webhook-id"] for r in verified(receiver)}) == 1 and len(receiver.to("/hook")) == 4
    with store.read() as tx:
        kinds = [e["kind"] for e in tx.all("SELECT kind FROM runtime_events WHERE kind LIKE 'delivery.%' AND job_id = ?", (job["id"],))]
    assert kinds.count("delivery.retry_scheduled") == 3 and kinds.count("delivery.delivered") == 1


def test_permanent_failure_and_exhausted_attempts_are_failed_visibly_and_retry_rearms(
        store: Any, dispatcher: Any, receiver: LoopbackHTTPServer, cli: Any) -> None:
    receiver.queue("/hook", Reply(status=400, json={"error": "bad"}))
    job = webhook_job(store, receiver, "echo:" + "z" * 250)  # several parts: the first fails, the rest fail with it
    enqueue_manual(store, job["id"])
    d = dispatcher()
    wait_for(lambda: (rows := parts(store, job["id"])) and all(r["status"] == "failed" for r in rows), what="failed")
    rows = parts(store, job["id"])
    assert rows[0]["attempts"] == 1 and all(r["error_code"] == "EARLIER_PART_FAILED" for r in rows[1:])
    assert len(receiver.to("/hook")) == 1
    listed = cli("--json", "deliveries", "list", "--status", "failed").json["deliveries"]
    assert {p["id"] for p in listed} == {r["id"] for r in rows}
    report = cli("--json", "doctor").json
    checks = report["checks"] if report.get("ok") else report["details"]
    (check,) = [c for c in checks if c["check"] == "deliveries"]
    assert check["warning"] and "failed" in check["detail"]
    out = cli("--json", "deliveries", "retry", rows[-1]["id"])  # any failed part re-arms the whole message
    assert out.code == 0 and out.json["delivery"]["status"] == "pending"
    wait_for(lambda: all(r["status"] == "delivered" for r in parts(store, job["id"])), what="re-armed parts delivered")
    assert len(verified(receiver)) == 1 + len(rows)
    d.stop()
    receiver.default("/hook", Reply(status=503))
    other = webhook_job(store, receiver, "echo:x")
    enqueue_manual(store, other["id"])
    dispatcher()
    (failed,) = wait_for(lambda: [r for r in parts(store, other["id"]) if r["status"] == "failed"], timeout=20, what="exhausted")
    assert failed["attempts"] == failed["max_attempts"] == 5 and failed["error_code"]
    shown = cli("--json", "deliveries", "show", failed["id"]).json["delivery"]
    assert shown["body"].startswith("[Job completed]") and shown["status"] == "failed"


def test_not_failed_parts_cannot_be_rearmed(store: Any) -> None:
    job = add_job(store, payload_message="ok")
    with store.transaction() as tx:
        enqueue(tx, {"id": None, "job_id": job["id"]}, "webhook", "http://127.0.0.1:9/x", "hello", "g1", now_ms())
    (row,) = parts(store, job["id"])
    with pytest.raises(SchedulerError) as err:
        retry_failed(store, row["id"], actor="me")
    assert err.value.code == "DELIVERY_NOT_FAILED"
    with store.transaction() as tx:  # enqueueing the same message again adds nothing
        assert enqueue(tx, {"id": None, "job_id": job["id"]}, "webhook", None, "hello", "g1", now_ms()) == 0


def test_a_delivered_part_is_final(store: Any, dispatcher: Any, receiver: LoopbackHTTPServer) -> None:
    job = webhook_job(store, receiver, "echo:x")
    enqueue_manual(store, job["id"])
    dispatcher()
    (row,) = wait_for(lambda: [r for r in parts(store, job["id"]) if r["status"] == "delivered"], what="delivered")
    for sql in ("UPDATE delivery_outbox SET status = 'pending' WHERE id = ?", "UPDATE delivery_outbox SET body = 'x' WHERE id = ?"):
        with pytest.raises(SchedulerError) as err, store.transaction() as tx:
            tx.execute(sql, (row["id"],))
        assert "OUTBOX_DELIVERED" in err.value.message


def test_a_claim_left_by_a_dead_dispatcher_is_taken_over_and_resent_with_the_same_key(
        store: Any, dispatcher: Any, receiver: LoopbackHTTPServer) -> None:
    job = add_job(store, payload_message="ok")
    with store.transaction() as tx:
        enqueue(tx, {"id": None, "job_id": job["id"]}, "webhook", f"{receiver.url}/hook", "orphaned", "g-dead", now_ms())
        tx.execute("UPDATE delivery_outbox SET status = 'claimed', claim_owner = 'dead:1:x', claim_token = 't',"
                   " claim_expires_at = ?, attempts = 1 WHERE job_id = ?", (now_ms() + 300, job["id"]))
    dispatcher()
    (row,) = wait_for(lambda: [r for r in parts(store, job["id"]) if r["status"] == "delivered"], what="taken over")
    assert row["attempts"] == 2 and [r.headers["webhook-id"] for r in verified(receiver)] == ["g-dead:part:1/1"]
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind = 'delivery.claim_taken_over'") == 1


def test_deliveries_test_sends_one_message_now(cli: Any, receiver: LoopbackHTTPServer) -> None:
    out = cli("--json", "deliveries", "test", "webhook", f"{receiver.url}/hook", "--message", "ping")
    assert out.code == 0 and out.json["delivered"] is True
    (got,) = verified(receiver)
    assert got.json()["data"]["body"] == "ping"
    receiver.queue("/hook", Reply(status=401))
    refused = cli("--json", "deliveries", "test", "webhook", f"{receiver.url}/hook")
    assert refused.code != 0 and refused.json["details"]["transient"] is False
    missing = cli("--json", "deliveries", "test", "no-such-channel")
    assert missing.code != 0 and missing.json["code"] == "CHANNEL_NOT_AVAILABLE"


def test_large_offloaded_output_travels_as_a_checked_attachment(store: Any, dispatcher: Any, receiver: LoopbackHTTPServer,
                                                                tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("line\n" * 40_000)  # 200 KB: offloaded to the artifact store
    job = add_job(store, executor="shell", payload_message=f"cat {big}", delivery_mode="always", delivery_channel="webhook",
                  delivery_to=f"{receiver.url}/hook")
    enqueue_manual(store, job["id"])
    dispatcher()
    wait_for(lambda: (rows := parts(store, job["id"])) and all(r["status"] == "delivered" for r in rows), timeout=20,
             what="delivered with attachment")
    (run,) = run_rows(store, job["id"])
    last = verified(receiver)[-1].json()["data"]
    (attachment,) = last["attachments"]
    content = base64.b64decode(attachment["content_base64"])
    assert content == big.read_bytes() and attachment["sha256"] == run["stdout_sha256"] and run["stdout_artifact"]


def test_notifications_go_to_the_settings_routes_unless_the_job_opts_out(store: Any, dispatcher: Any, receiver: LoopbackHTTPServer,
                                                                         tmp_path: Path) -> None:
    config = Path(os.environ["SCHEDULER_CONFIG"])
    config.write_text(config.read_text() + f'[notifications]\nroutes = ["webhook:{receiver.url}/ops"]\n'
                      'events = ["completed", "failed", "paused"]\n')
    reload_settings()
    failing = add_job(store, name="breaks", payload_message="fail", max_consecutive_failures=1)
    quiet = add_job(store, name="quiet", payload_message="fail", notify=False)
    fine = add_job(store, name="fine", payload_message="ok")
    for job in (failing, quiet, fine):
        enqueue_manual(store, job["id"])
    dispatcher()
    wait_for(lambda: len(receiver.to("/ops")) == 3, what="three notifications")
    time.sleep(0.3)
    bodies = sorted(r.json()["data"]["body"].splitlines()[0] for r in receiver.to("/ops"))
    assert bodies == ["[Job completed] fine", "[Job failed] breaks", "[Job paused] breaks: auto-paused after 1 consecutive failures"]
    paused = next(r.json()["data"]["body"] for r in receiver.to("/ops") if r.json()["data"]["body"].startswith("[Job paused]"))
    assert paused.splitlines()[1] == "Resume: scheduler jobs resume breaks"  # the command the job-state vocabulary names
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM delivery_outbox WHERE job_id = ?", (quiet["id"],)) == 0


def test_notification_settings_are_checked() -> None:
    from scheduler.settings import load_settings

    for bad in ('routes = ["NOT A ROUTE"]', 'events = ["failed", "exploded"]'):
        with pytest.raises(SchedulerError) as err:
            load_settings({"SCHEDULER_CONFIG": _write_config(f"[notifications]\n{bad}\n")})
        assert err.value.code == "CONFIG_INVALID"


def _write_config(text: str) -> str:
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".toml")
    os.write(fd, text.encode())
    os.close(fd)
    return path


@pytest.mark.postgres
def test_two_consumers_on_postgres_share_the_outbox_and_send_each_part_once(pg_url: str, receiver: LoopbackHTTPServer) -> None:
    from scheduler.delivery.outbox import DeliveryWorker
    from scheduler.plugins.stores import open_store

    stores = [open_store(pg_url) for _ in range(2)]
    job = add_job(stores[0], payload_message="ok")
    with stores[0].transaction() as tx:
        for i in range(40):
            enqueue(tx, {"id": None, "job_id": job["id"]}, "webhook", f"{receiver.url}/hook", f"message {i}", f"g{i}", now_ms())
    workers = [DeliveryWorker(s, f"owner-{n}") for n, s in enumerate(stores)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: all(r["status"] == "delivered" for r in parts(stores[0], job["id"])), timeout=30, what="40 delivered")
    finally:
        for w in workers:
            w.stop()
    ids = [r.headers["webhook-id"] for r in verified(receiver)]
    assert len(ids) == 40 and len(set(ids)) == 40  # every part once: SKIP LOCKED claims never overlap
    assert all(w.stats["delivered"] > 0 for w in workers), [w.stats for w in workers]  # both took a share
    for s in stores:
        s.close()


def test_a_part_is_found_by_the_id_end_its_listing_shows_and_a_shared_piece_is_refused(store: Any, cli: Any) -> None:
    """``deliveries list`` shows each part id's last 28 characters; ``deliveries show`` and ``retry`` take them back.

    A part id starts with its message's group, which starts with its run's id: runs made within a minute share their
    first characters (time-ordered ids), so a shared prefix must be refused as ambiguous, not reported as missing.
    """
    job = add_job(store, payload_message="ok")
    with store.transaction() as tx:
        for group in ("01a2427e-9dbc-73d8-86fb-175105c6ef0b:delivery", "01a2427e-cc6a-786b-9277-8d08dc993e4a:delivery"):
            enqueue(tx, {"id": None, "job_id": job["id"]}, "webhook", "http://127.0.0.1:9/x", "hello", group, now_ms())
    ids = sorted(r["id"] for r in parts(store, job["id"]))
    listed = [line.split()[0] for line in cli("deliveries", "list").out.splitlines()[1:]]
    assert sorted(listed) == sorted(part_id[-28:] for part_id in ids)
    for part_id in ids:
        assert cli("--json", "deliveries", "show", part_id[-28:]).json["delivery"]["id"] == part_id  # as listed
        assert cli("--json", "deliveries", "show", part_id[:24]).json["delivery"]["id"] == part_id  # a unique prefix
    shared = cli("--json", "deliveries", "show", "01a2427e-")
    assert shared.code != 0 and shared.json["code"] == "INVALID_ARGUMENT" and "ambiguous" in shared.json["error"]
    assert cli("--json", "deliveries", "show", "delivery:part:1/1").json["code"] == "INVALID_ARGUMENT"  # both end so
    missing = cli("--json", "deliveries", "show", "01a2427f-")
    assert missing.code != 0 and missing.json["code"] == "NOT_FOUND"
