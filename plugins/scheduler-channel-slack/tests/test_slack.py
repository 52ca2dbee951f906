"""The Slack channel against a real loopback stand-in for the Web API, its upload host and an incoming webhook."""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from typing import Any
from urllib.parse import parse_qs

import pytest
from scheduler_toolkit.options import build_options

from scheduler.api import (
    PLUGIN_API_VERSION,
    Channel,
    DeliveryPart,
    DeliveryRoute,
    PermanentDeliveryError,
    SchedulerError,
    TransientDeliveryError,
)

TOKEN = "xoxb-1111-2222-SecretBotTokenValue"
HOOK_PATH = "/services/T0000/B0000/HookSecretPart123"
CHANNEL = "C0123456789"


def api(method: str) -> str:
    return f"/api/{method}"


def part(body: str = "backup done", **extra: Any) -> DeliveryPart:
    return DeliveryPart(idempotency_key="run-1:delivery:part:1/1", index=1, count=1, body=body, run_id="run-1",
                        job_id="job-1", **extra)


def route(target: str | None = CHANNEL, **options: Any) -> DeliveryRoute:
    from scheduler_channel_slack import SlackOptions

    return DeliveryRoute(channel="slack", target=target, options=build_options(SlackOptions, options, "delivery_options"))


def attachment(name: str, data: bytes, mime: str = "text/plain") -> dict[str, Any]:
    return {"name": name, "mime_type": mime, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "content": data}


def form(request: Any) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(request.body.decode(), keep_blank_values=True).items()}


class FakeSlack:
    """Answers like Slack: bearer-token check, ``ts`` per message, pre-signed upload URLs per file."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.counter = itertools.count(1)
        server.default(api("chat.postMessage"), self.post_message)
        server.default(api("files.getUploadURLExternal"), self.upload_url)
        server.default(api("files.completeUploadExternal"), self.complete)

    def _authorised(self, request: Any) -> bool:
        return request.headers.get("authorization") == f"Bearer {TOKEN}"

    def post_message(self, request: Any) -> dict[str, Any]:
        if not self._authorised(request):
            return {"json": {"ok": False, "error": "invalid_auth"}}
        body = request.json()
        return {"json": {"ok": True, "channel": body["channel"], "ts": f"1712345678.{next(self.counter):06d}"}}

    def upload_url(self, request: Any) -> dict[str, Any]:
        if not self._authorised(request):
            return {"json": {"ok": False, "error": "invalid_auth"}}
        file_id = f"F{next(self.counter):04d}"
        self.server.default(f"/upload/v1/{file_id}", {"body": b"OK"})
        return {"json": {"ok": True, "upload_url": f"{self.server.url}/upload/v1/{file_id}", "file_id": file_id}}

    def complete(self, request: Any) -> dict[str, Any]:
        import json

        files = json.loads(form(request)["files"])
        return {"json": {"ok": True, "files": [{"id": f["id"], "title": f["title"]} for f in files]}}


@pytest.fixture
def slack(server: Any) -> FakeSlack:
    return FakeSlack(server)


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch, server: Any) -> dict[str, Any]:
    monkeypatch.setenv("TEST_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("TEST_SLACK_HOOK", server.url + HOOK_PATH)
    return {"token": {"credential": "env:TEST_SLACK_TOKEN"}, "webhook_url": {"credential": "env:TEST_SLACK_HOOK"}}


@pytest.fixture
def channel(load_channel: Any, secrets: dict[str, Any], server: Any) -> Any:
    return load_channel("slack", token=secrets["token"], api_base=server.url + "/api", timeout_s=0.5, connect_timeout_s=0.5)


@pytest.fixture
def hook_channel(load_channel: Any, secrets: dict[str, Any]) -> Any:
    return load_channel("slack", webhook_url=secrets["webhook_url"], timeout_s=0.5, connect_timeout_s=0.5)


# -- API mode ------------------------------------------------------------------------------------


def test_api_mode_loaded_through_the_entry_point(channel: Any) -> None:
    assert isinstance(channel, Channel) and channel.plugin_api == PLUGIN_API_VERSION
    assert channel.mode == "api"
    assert channel.capabilities == {"attachments", "threads"}
    assert channel.limits.max_chars == 4000 and channel.limits.supports_attachments


def test_a_part_is_one_chat_post_message(channel: Any, server: Any, slack: FakeSlack) -> None:
    receipt = channel.send(part(), route())
    (request,) = server.to(api("chat.postMessage"))
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["content-type"] == "application/json; charset=utf-8"
    assert request.json() == {"channel": CHANNEL, "text": "backup done", "mrkdwn": True, "unfurl_links": False,
                              "unfurl_media": True}
    assert receipt.receipt_id == "1712345678.000001"
    assert receipt.details == {"mode": "api", "channel": CHANNEL, "ts": "1712345678.000001"}


def test_thread_replies(channel: Any, server: Any, slack: FakeSlack) -> None:
    channel.send(part(), route(thread_ts="1712000000.000200", reply_broadcast=True, mrkdwn=False))
    body = server.to(api("chat.postMessage"))[0].json()
    assert body["thread_ts"] == "1712000000.000200" and body["reply_broadcast"] is True and body["mrkdwn"] is False
    from scheduler_channel_slack import SlackOptions

    with pytest.raises(SchedulerError) as caught:
        build_options(SlackOptions, {"thread_ts": "yesterday"}, "delivery_options")
    assert caught.value.code == "VALIDATION_FAILED"


def test_the_default_channel_and_bad_targets(load_channel: Any, secrets: dict[str, Any], server: Any, slack: FakeSlack) -> None:
    channel = load_channel("slack", token=secrets["token"], api_base=server.url + "/api", default_channel="C999")
    channel.send(part(), route(None))
    assert server.to(api("chat.postMessage"))[0].json()["channel"] == "C999"
    bare = load_channel("slack", token=secrets["token"], api_base=server.url + "/api")
    for target, code in ((None, "SLACK_TARGET_MISSING"), ("general chat", "SLACK_TARGET_INVALID")):
        with pytest.raises(PermanentDeliveryError) as caught:
            bare.send(part(), route(target))
        assert caught.value.code == code


def test_http_429_with_retry_after(channel: Any, server: Any) -> None:
    server.queue(api("chat.postMessage"), {"status": 429, "headers": {"Retry-After": "30"}, "body": b""})
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "SLACK_RATE_LIMITED" and caught.value.retry_after_s == 30


@pytest.mark.parametrize(("error", "kind", "code"), [
    ("ratelimited", TransientDeliveryError, "SLACK_RATE_LIMITED"),
    ("internal_error", TransientDeliveryError, "SLACK_SERVER_ERROR"),
    ("service_unavailable", TransientDeliveryError, "SLACK_SERVER_ERROR"),
    ("invalid_auth", PermanentDeliveryError, "SLACK_AUTH_FAILED"),
    ("token_revoked", PermanentDeliveryError, "SLACK_AUTH_FAILED"),
    ("missing_scope", PermanentDeliveryError, "SLACK_AUTH_FAILED"),
    ("channel_not_found", PermanentDeliveryError, "SLACK_CHANNEL_UNAVAILABLE"),
    ("not_in_channel", PermanentDeliveryError, "SLACK_CHANNEL_UNAVAILABLE"),
    ("is_archived", PermanentDeliveryError, "SLACK_CHANNEL_UNAVAILABLE"),
    ("msg_too_long", PermanentDeliveryError, "SLACK_REJECTED"),
    ("something_new", PermanentDeliveryError, "SLACK_REJECTED"),
])
def test_ok_false_errors_are_classified(channel: Any, server: Any, error: str, kind: type, code: str) -> None:
    server.queue(api("chat.postMessage"), {"json": {"ok": False, "error": error}, "headers": {"Retry-After": "3"}})
    with pytest.raises(kind) as caught:
        channel.send(part(), route())
    assert caught.value.code == code and error in caught.value.message
    if code == "SLACK_RATE_LIMITED":
        assert caught.value.retry_after_s == 3


@pytest.mark.parametrize(("reply", "code"), [
    ({"status": 500, "body": b"oops"}, "SLACK_SERVER_ERROR"),
    ({"status": 503, "headers": {"Retry-After": "9"}}, "SLACK_SERVER_ERROR"),
    ({"status": 200, "body": b"<html>maintenance</html>"}, "SLACK_SERVER_ERROR"),
    ({"action": "hang", "seconds": 3}, "SLACK_TIMEOUT"),
    ({"json": {"ok": True, "ts": "1.2", "channel": CHANNEL}, "action": "reset"}, "SLACK_CONNECTION_FAILED"),
])
def test_transport_faults_are_transient(channel: Any, server: Any, reply: dict[str, Any], code: str) -> None:
    server.queue(api("chat.postMessage"), reply)
    started = time.monotonic()
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == code and time.monotonic() - started < 2
    if reply.get("headers"):
        assert caught.value.retry_after_s == 9


@pytest.mark.parametrize(("status", "code"), [(401, "SLACK_AUTH_FAILED"), (403, "SLACK_AUTH_FAILED"), (400, "SLACK_REJECTED"),
                                              (404, "SLACK_REJECTED")])
def test_http_refusals_are_permanent(channel: Any, server: Any, status: int, code: str) -> None:
    server.queue(api("chat.postMessage"), {"status": status})
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == code


def test_files_use_the_external_upload_flow(channel: Any, server: Any, slack: FakeSlack) -> None:
    files = (attachment("report.csv", b"a,b\n1,2\n", "text/csv"), attachment("log.txt", b"all good"))
    receipt = channel.send(part("nightly report", attachments=files), route(thread_ts="1712000000.000200"))
    assert not server.to(api("chat.postMessage"))
    tickets = server.to(api("files.getUploadURLExternal"))
    assert [form(t) for t in tickets] == [{"filename": "report.csv", "length": "8"}, {"filename": "log.txt", "length": "8"}]
    assert all(t.headers["authorization"] == f"Bearer {TOKEN}" for t in tickets)
    up1, up2 = server.to("/upload/v1/F0001"), server.to("/upload/v1/F0002")
    assert up1[0].body == b"a,b\n1,2\n" and up2[0].body == b"all good"
    assert "authorization" not in up1[0].headers  # the pre-signed URL never gets the token
    (done,) = server.to(api("files.completeUploadExternal"))
    fields = form(done)
    import json

    assert json.loads(fields["files"]) == [{"id": "F0001", "title": "report.csv"}, {"id": "F0002", "title": "log.txt"}]
    assert fields["channel_id"] == CHANNEL and fields["initial_comment"] == "nightly report"
    assert fields["thread_ts"] == "1712000000.000200"
    assert receipt.receipt_id == "F0001" and receipt.details["file_ids"] == ["F0001", "F0002"]
    order = [r.path for r in server.requests]
    assert order.index(api("files.completeUploadExternal")) == len(order) - 1  # shared only after every upload


def test_a_failed_upload_shares_nothing_and_the_retry_completes(channel: Any, server: Any, slack: FakeSlack) -> None:
    def failing_ticket(request: Any) -> dict[str, Any]:
        answer = slack.upload_url(request)
        file_id = answer["json"]["file_id"]
        server.queue(f"/upload/v1/{file_id}", {"status": 500})
        return answer

    server.queue(api("files.getUploadURLExternal"), failing_ticket)
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part("x", attachments=(attachment("a.txt", b"hi"),)), route())
    assert caught.value.code == "SLACK_SERVER_ERROR"
    assert not server.to(api("files.completeUploadExternal"))
    channel.send(part("x", attachments=(attachment("a.txt", b"hi"),)), route())
    assert len(server.to(api("files.completeUploadExternal"))) == 1


def test_an_upload_ticket_without_a_url_is_transient(channel: Any, server: Any) -> None:
    server.queue(api("files.getUploadURLExternal"), {"json": {"ok": True}})
    with pytest.raises(TransientDeliveryError):
        channel.send(part(attachments=(attachment("a.txt", b"hi"),)), route())


def test_bad_attachments_are_permanent(load_channel: Any, secrets: dict[str, Any], server: Any) -> None:
    channel = load_channel("slack", token=secrets["token"], api_base=server.url + "/api", max_attachment_bytes=3)
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(attachments=(attachment("a.txt", b"1234"),)), route())
    assert caught.value.code == "SLACK_ATTACHMENT_TOO_LARGE" and not server.requests


def test_api_mode_without_a_usable_token(load_channel: Any, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPACEY", "xoxb-has a space")
    monkeypatch.delenv("MISSING", raising=False)
    for settings, code in (({"mode": "api"}, "SLACK_NOT_CONFIGURED"), ({"token": {"credential": "env:MISSING"}}, "SECRET_UNRESOLVED"),
                           ({"token": {"credential": "env:SPACEY"}}, "SLACK_TOKEN_INVALID")):
        channel = load_channel("slack", api_base=server.url + "/api", **settings)
        with pytest.raises(PermanentDeliveryError) as caught:
            channel.send(part(), route())
        assert caught.value.code == code and "has a space" not in caught.value.message
    assert not server.requests


def test_settings_are_validated_at_load(load_channel: Any) -> None:
    for settings in ({"token": TOKEN}, {"mode": "socket"}, {"api_base": "slack.com"}, {"max_chars": 50000}):
        with pytest.raises(SchedulerError) as caught:
            load_channel("slack", **settings)
        assert caught.value.code == "CONFIG_INVALID" and TOKEN not in str(caught.value.to_json())


# -- webhook mode ----------------------------------------------------------------------------------


def test_webhook_mode_posts_the_text(hook_channel: Any, server: Any) -> None:
    server.default(HOOK_PATH, {"body": b"ok"})
    assert hook_channel.mode == "webhook"
    assert hook_channel.capabilities == frozenset()
    assert not hook_channel.limits.supports_attachments and hook_channel.limits.max_attachment_bytes == 0
    receipt = hook_channel.send(part(), route(None, unfurl_links=True))
    (request,) = server.to(HOOK_PATH)
    assert request.json() == {"text": "backup done", "mrkdwn": True, "unfurl_links": True, "unfurl_media": True}
    assert "authorization" not in request.headers
    assert receipt.receipt_id is None and receipt.details == {"mode": "webhook", "status_code": 200}


def test_auto_prefers_the_api_when_both_are_set(load_channel: Any, secrets: dict[str, Any]) -> None:
    assert load_channel("slack", **secrets).mode == "api"
    assert load_channel("slack", mode="webhook", **secrets).mode == "webhook"


@pytest.mark.parametrize(("reply", "kind", "code"), [
    ({"status": 404, "body": b"channel_not_found"}, PermanentDeliveryError, "SLACK_CHANNEL_UNAVAILABLE"),
    ({"status": 404, "body": b"no_service"}, PermanentDeliveryError, "SLACK_CHANNEL_UNAVAILABLE"),
    ({"status": 410, "body": b"channel_is_archived"}, PermanentDeliveryError, "SLACK_CHANNEL_UNAVAILABLE"),
    ({"status": 403, "body": b"action_prohibited"}, PermanentDeliveryError, "SLACK_CHANNEL_UNAVAILABLE"),
    ({"status": 403, "body": b"invalid_token"}, PermanentDeliveryError, "SLACK_AUTH_FAILED"),
    ({"status": 400, "body": b"invalid_payload"}, PermanentDeliveryError, "SLACK_REJECTED"),
    ({"status": 429, "headers": {"Retry-After": "12"}}, TransientDeliveryError, "SLACK_RATE_LIMITED"),
    ({"status": 500, "body": b"rollup_error"}, TransientDeliveryError, "SLACK_SERVER_ERROR"),
    ({"action": "hang", "seconds": 3}, TransientDeliveryError, "SLACK_TIMEOUT"),
    ({"body": b"ok", "action": "reset"}, TransientDeliveryError, "SLACK_CONNECTION_FAILED"),
])
def test_webhook_answers_are_classified(hook_channel: Any, server: Any, reply: dict[str, Any], kind: type, code: str) -> None:
    server.queue(HOOK_PATH, reply)
    with pytest.raises(kind) as caught:
        hook_channel.send(part(), route(None))
    assert caught.value.code == code
    if code == "SLACK_RATE_LIMITED":
        assert caught.value.retry_after_s == 12


def test_webhook_mode_refuses_files_and_needs_its_url(hook_channel: Any, load_channel: Any, server: Any) -> None:
    with pytest.raises(PermanentDeliveryError) as caught:
        hook_channel.send(part(attachments=(attachment("a.txt", b"hi"),)), route(None))
    assert caught.value.code == "SLACK_ATTACHMENTS_UNSUPPORTED"
    with pytest.raises(PermanentDeliveryError) as caught:
        load_channel("slack", mode="webhook").send(part(), route(None))
    assert caught.value.code == "SLACK_NOT_CONFIGURED"
    assert not server.requests


def test_secrets_never_reach_messages_or_logs(channel: Any, hook_channel: Any, server: Any, slack: FakeSlack,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    errors = []
    for target_channel, path in ((channel, api("chat.postMessage")), (hook_channel, HOOK_PATH)):
        for reply in ({"status": 500}, {"status": 404, "body": b"channel_not_found"}, {"action": "hang", "seconds": 2},
                      {"action": "reset"}, {"status": 403, "json": {"ok": False, "error": "invalid_auth"}}):
            server.queue(path, reply)
            with pytest.raises((TransientDeliveryError, PermanentDeliveryError)) as caught:
                target_channel.send(part(), route(CHANNEL if target_channel is channel else None))
            errors.append(caught.value)
    server.default(HOOK_PATH, {"body": b"ok"})
    hook_channel.send(part(), route(None))
    channel.send(part(attachments=(attachment("a.txt", b"hi"),)), route())
    assert "HTTP Request" in caplog.text
    for text in [str(e) for e in errors] + [caplog.text]:
        assert "SecretBotTokenValue" not in text and "HookSecretPart123" not in text
    assert "/upload/v1/F" not in caplog.text  # pre-signed upload URLs are credentials too
