"""The webhook channel against a real loopback receiver that verifies Standard Webhooks signatures."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from scheduler_toolkit.options import build_options, catalogue
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from scheduler.api import (
    PLUGIN_API_VERSION,
    Channel,
    DeliveryPart,
    DeliveryRoute,
    PermanentDeliveryError,
    SchedulerError,
    TransientDeliveryError,
)

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
HOOK = "/hook"


def part(key: str = "run-1:delivery:part:1/1", body: str = "hello", **extra: Any) -> DeliveryPart:
    return DeliveryPart(idempotency_key=key, index=1, count=1, body=body, run_id="run-1", job_id="job-1", **extra)


def route(target: str | None, **options: Any) -> DeliveryRoute:
    from scheduler_channel_webhook import WebhookOptions

    return DeliveryRoute(channel="webhook", target=target, options=build_options(WebhookOptions, options, "delivery_options"))


class Receiver:
    """A Standard Webhooks receiver: verifies the signature, drops a webhook-id it has seen, counts."""

    def __init__(self, secret: str = SECRET) -> None:
        self.verifier = Webhook(secret)
        self.delivered: dict[str, Any] = {}
        self.duplicates = 0
        self.lock = threading.Lock()

    def handle(self, request: Any, reply_cls: Any) -> Any:
        try:
            payload = self.verifier.verify(request.body, request.headers)
        except WebhookVerificationError as exc:
            return reply_cls(status=401, body=str(exc).encode())
        with self.lock:
            if request.headers["webhook-id"] in self.delivered:
                self.duplicates += 1
            else:
                self.delivered[request.headers["webhook-id"]] = payload
        return reply_cls(status=204)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)
    return "env:TEST_WEBHOOK_SECRET"


@pytest.fixture
def receiver(server: Any) -> Receiver:
    rec = Receiver()
    server.default(HOOK, lambda request: rec.handle(request, server.Reply))
    return rec


@pytest.fixture
def channel(load_channel: Any, secret_env: str) -> Any:
    return load_channel("webhook", secret={"credential": secret_env}, timeout_s=0.5, connect_timeout_s=0.5)


def reply(**kwargs: Any) -> dict[str, Any]:
    """A scripted answer of the loopback server (see conftest ``Reply``)."""
    return dict(kwargs)


def test_loaded_through_the_entry_point_as_the_kernel_does(channel: Any) -> None:
    assert isinstance(channel, Channel)
    assert channel.plugin_api == PLUGIN_API_VERSION
    assert channel.capabilities == {"idempotency-keys", "attachments"}
    assert channel.limits.supports_attachments and channel.limits.max_chars == 100_000
    names = {row["name"] for row in catalogue(channel.options_class)}
    assert names == {"event_type", "headers", "include_attachment_content"}
    secret_row = next(row for row in catalogue(channel.settings_class) if row["name"] == "secret")
    assert secret_row["secret"] is True


def test_a_part_is_a_signed_json_post_the_receiver_verifies(channel: Any, server: Any, receiver: Receiver) -> None:
    receipt = channel.send(part(), route(server.url + HOOK, event_type="backup.done"))
    assert receipt.receipt_id == "run-1:delivery:part:1/1"
    assert receipt.details["status_code"] == 204
    (request,) = server.to(HOOK)
    assert request.headers["webhook-id"] == "run-1:delivery:part:1/1"
    assert request.headers["idempotency-key"] == "run-1:delivery:part:1/1"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-signature"].startswith("v1,")
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 5
    payload = receiver.delivered["run-1:delivery:part:1/1"]
    assert payload["type"] == "backup.done"
    assert payload["timestamp"].endswith("Z")
    assert payload["data"] == {"idempotency_key": "run-1:delivery:part:1/1", "run_id": "run-1", "job_id": "job-1",
                               "part": {"index": 1, "count": 1}, "body": "hello", "attachments": []}


def test_unicode_bodies_are_signed_over_the_exact_bytes(channel: Any, server: Any, receiver: Receiver) -> None:
    channel.send(part(body="Grüße — 完了 ✓\n\"quoted\""), route(server.url + HOOK))
    assert receiver.delivered["run-1:delivery:part:1/1"]["data"]["body"] == "Grüße — 完了 ✓\n\"quoted\""


def test_a_retried_part_keeps_its_webhook_id_so_the_receiver_drops_the_duplicate(channel: Any, server: Any,
                                                                                  receiver: Receiver) -> None:
    server.queue(HOOK, reply(status=500))
    with pytest.raises(TransientDeliveryError):
        channel.send(part(), route(server.url + HOOK))
    channel.send(part(), route(server.url + HOOK))  # the consumer's retry
    channel.send(part(), route(server.url + HOOK))  # a crash between sending and recording: sent again
    ids = [r.headers["webhook-id"] for r in server.to(HOOK)]
    assert ids == ["run-1:delivery:part:1/1"] * 3
    assert list(receiver.delivered) == ["run-1:delivery:part:1/1"] and receiver.duplicates == 1


def test_a_receiver_with_another_secret_refuses_the_signature(channel: Any, server: Any) -> None:
    other = Receiver("whsec_" + base64.b64encode(os.urandom(32)).decode())
    server.default(HOOK, lambda request: other.handle(request, server.Reply))
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_AUTH_FAILED" and not other.delivered


def test_the_configured_url_is_used_when_the_job_names_none(load_channel: Any, secret_env: str, server: Any,
                                                            receiver: Receiver) -> None:
    channel = load_channel("webhook", url=server.url + HOOK, secret={"credential": secret_env})
    channel.send(part(), route(None))
    assert list(receiver.delivered) == ["run-1:delivery:part:1/1"]


def test_no_url_at_all_is_permanent(channel: Any) -> None:
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route(None))
    assert caught.value.code == "WEBHOOK_TARGET_MISSING"
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route("ftp://example.org/x"))
    assert caught.value.code == "WEBHOOK_TARGET_INVALID"


def test_429_with_retry_after_seconds_is_transient_with_the_delay(channel: Any, server: Any) -> None:
    server.queue(HOOK, reply(status=429, headers={"Retry-After": "7"}, body=b"slow down"))
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_RATE_LIMITED"
    assert caught.value.retry_after_s == 7
    assert "slow down" in caught.value.message


def test_retry_after_as_an_http_date(channel: Any, server: Any) -> None:
    when = datetime.now(UTC) + timedelta(seconds=120)
    server.queue(HOOK, reply(status=503, headers={"Retry-After": format_datetime(when, usegmt=True)}))
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_SERVER_ERROR"
    assert 100 < caught.value.retry_after_s <= 121


def test_500_is_transient(channel: Any, server: Any) -> None:
    server.queue(HOOK, reply(status=500))
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_SERVER_ERROR" and caught.value.retry_after_s is None


def test_a_receiver_that_hangs_past_the_timeout_is_transient(channel: Any, server: Any) -> None:
    server.queue(HOOK, reply(action="hang", seconds=3))
    started = time.monotonic()
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_TIMEOUT"
    assert time.monotonic() - started < 2


def test_a_connection_reset_mid_body_is_transient(channel: Any, server: Any, receiver: Receiver) -> None:
    server.queue(HOOK, reply(status=200, body=b"x" * 200, action="reset"))
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_CONNECTION_FAILED"
    channel.send(part(), route(server.url + HOOK))  # the pool recovers: the next attempt goes through
    assert list(receiver.delivered) == ["run-1:delivery:part:1/1"]


def test_a_closed_port_is_transient(channel: Any) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route(f"http://127.0.0.1:{port}/hook"))
    assert caught.value.code == "WEBHOOK_CONNECTION_FAILED"


@pytest.mark.parametrize(("status", "code"), [(400, "WEBHOOK_REJECTED"), (404, "WEBHOOK_REJECTED"), (410, "WEBHOOK_REJECTED"),
                                              (401, "WEBHOOK_AUTH_FAILED"), (403, "WEBHOOK_AUTH_FAILED"),
                                              (301, "WEBHOOK_REDIRECTED")])
def test_other_answers_are_permanent(channel: Any, server: Any, status: int, code: str) -> None:
    server.queue(HOOK, reply(status=status, headers={"Location": server.url + "/elsewhere"}))
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == code
    assert not server.to("/elsewhere")


def test_408_is_transient(channel: Any, server: Any) -> None:
    server.queue(HOOK, reply(status=408))
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_TIMEOUT"


def test_messages_never_carry_the_secret_or_the_url_path(channel: Any, server: Any) -> None:
    url = server.url + HOOK + "?token=abc123"
    raw_key = base64.b64decode(SECRET[len("whsec_"):]).decode()
    for behaviour in (reply(status=500), reply(status=400), reply(action="hang", seconds=2), reply(action="reset")):
        server.queue(HOOK, behaviour)
        with pytest.raises((TransientDeliveryError, PermanentDeliveryError)) as caught:
            channel.send(part(), route(url))
        text = str(caught.value) + repr(caught.value.__cause__) + repr(caught.value.__context__)
        assert SECRET not in text and raw_key not in text and "abc123" not in text


def test_no_secret_configured_is_permanent(load_channel: Any, server: Any) -> None:
    channel = load_channel("webhook")
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_NOT_CONFIGURED"
    assert not server.requests


def test_an_unresolvable_secret_names_the_reference(load_channel: Any, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_SECRET", raising=False)
    channel = load_channel("webhook", secret={"credential": "env:NO_SUCH_SECRET"})
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "SECRET_UNRESOLVED" and "env:NO_SUCH_SECRET" in caught.value.message


def test_a_secret_that_is_not_a_standard_webhooks_key_is_refused(load_channel: Any, server: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAD_SECRET", "hunter2 is not base64!")
    channel = load_channel("webhook", secret={"credential": "env:BAD_SECRET"})
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route(server.url + HOOK))
    assert caught.value.code == "WEBHOOK_SECRET_INVALID" and "hunter2" not in caught.value.message
    assert not server.requests


def test_the_secret_is_read_at_each_send_so_rotation_applies(channel: Any, server: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rotated = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    receiver = Receiver(rotated)
    server.default(HOOK, lambda request: receiver.handle(request, server.Reply))
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", rotated)
    channel.send(part(), route(server.url + HOOK))
    assert list(receiver.delivered) == ["run-1:delivery:part:1/1"]


def test_settings_are_validated_at_load(load_channel: Any) -> None:
    with pytest.raises(SchedulerError) as caught:
        load_channel("webhook", url="not a url")
    assert caught.value.code == "CONFIG_INVALID" and "channels.webhook.url" in caught.value.message
    with pytest.raises(SchedulerError) as caught:
        load_channel("webhook", secret="whsec_literal")
    assert caught.value.code == "CONFIG_INVALID" and "whsec_literal" not in str(caught.value.to_json())
    with pytest.raises(SchedulerError) as caught:
        load_channel("webhook", headers={"webhook-id": "x"})
    assert caught.value.code == "CONFIG_INVALID"


def test_options_are_validated_like_the_kernel_does(channel: Any) -> None:
    from scheduler_channel_webhook import WebhookOptions

    for bad in ({"headers": {"Webhook-Signature": "v1,x"}}, {"event_type": "has spaces"}, {"nope": 1},
                {"headers": {"X-A": "line\r\nbreak"}}):
        with pytest.raises(SchedulerError) as caught:
            build_options(WebhookOptions, bad, "delivery_options")
        assert caught.value.code == "VALIDATION_FAILED"
    # a plain object (not yet validated) is validated by send itself
    with pytest.raises(PermanentDeliveryError) as perm:
        channel.send(part(), DeliveryRoute(channel="webhook", target="http://127.0.0.1:9/x", options={"nope": 1}))
    assert perm.value.code == "WEBHOOK_OPTIONS_INVALID"


def test_extra_headers_from_settings_and_options(load_channel: Any, secret_env: str, server: Any, receiver: Receiver) -> None:
    channel = load_channel("webhook", secret={"credential": secret_env}, headers={"X-Tenant": "ops", "X-Both": "settings"})
    channel.send(part(), route(server.url + HOOK, headers={"X-Job": "nightly", "X-Both": "job"}))
    (request,) = server.to(HOOK)
    assert request.headers["x-tenant"] == "ops" and request.headers["x-job"] == "nightly" and request.headers["x-both"] == "job"
    assert request.headers["user-agent"].startswith("scheduler-channel-webhook/")


def test_attachments_are_embedded_and_checked(channel: Any, server: Any, receiver: Receiver, tmp_path: Any) -> None:
    data = b"\x00binary\xffreport"
    on_disk = tmp_path / "report.csv"
    on_disk.write_bytes(b"a,b\n1,2\n")
    attachments = (
        {"name": "blob.bin", "mime_type": "application/octet-stream", "size_bytes": len(data),
         "sha256": hashlib.sha256(data).hexdigest(), "content": data},
        {"name": "report.csv", "mime_type": "text/csv", "size_bytes": 8,
         "sha256": hashlib.sha256(b"a,b\n1,2\n").hexdigest(), "path": str(on_disk)},
    )
    channel.send(part(attachments=attachments), route(server.url + HOOK))
    sent = receiver.delivered["run-1:delivery:part:1/1"]["data"]["attachments"]
    assert [a["name"] for a in sent] == ["blob.bin", "report.csv"]
    assert base64.b64decode(sent[0]["content_base64"]) == data
    assert base64.b64decode(sent[1]["content_base64"]) == b"a,b\n1,2\n"
    assert sent[1]["sha256"] == hashlib.sha256(b"a,b\n1,2\n").hexdigest()


def test_attachment_metadata_only(channel: Any, server: Any, receiver: Receiver) -> None:
    attachment = {"name": "a.txt", "mime_type": "text/plain", "size_bytes": 2, "sha256": hashlib.sha256(b"hi").hexdigest(),
                  "content": b"hi"}
    channel.send(part(attachments=(attachment,)), route(server.url + HOOK, include_attachment_content=False))
    (sent,) = receiver.delivered["run-1:delivery:part:1/1"]["data"]["attachments"]
    assert "content_base64" not in sent and sent["size_bytes"] == 2


def test_bad_attachments_are_permanent_and_nothing_is_sent(load_channel: Any, secret_env: str, server: Any,
                                                            tmp_path: Any) -> None:
    channel = load_channel("webhook", secret={"credential": secret_env}, max_attachment_bytes=10)
    cases = [
        ({"name": "x", "content": b"abc", "sha256": "0" * 64}, "WEBHOOK_ATTACHMENT_INVALID"),
        ({"name": "x", "content": b"a" * 11}, "WEBHOOK_ATTACHMENT_TOO_LARGE"),
        ({"name": "x", "path": str(tmp_path / "missing")}, "WEBHOOK_ATTACHMENT_INVALID"),
        ({"name": "x"}, "WEBHOOK_ATTACHMENT_INVALID"),
    ]
    for attachment, code in cases:
        with pytest.raises(PermanentDeliveryError) as caught:
            channel.send(part(attachments=(attachment,)), route(server.url + HOOK))
        assert caught.value.code == code
    assert channel.limits.max_attachment_bytes == 10
    assert not server.requests


def test_one_instance_serves_many_threads(channel: Any, server: Any, receiver: Receiver) -> None:
    errors: list[BaseException] = []

    def send(i: int) -> None:
        try:
            channel.send(part(key=f"run-{i}:delivery:part:1/1"), route(server.url + HOOK))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(receiver.delivered) == 16 and receiver.duplicates == 0
