"""The OpenClaw channel against a real loopback stand-in for the Gateway's ``/tools/invoke`` endpoint."""

from __future__ import annotations

import itertools
import time
from typing import Any

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

TOKEN = "gw-token-SecretValue-0123456789"
INVOKE = "/tools/invoke"


def part(body: str = "[Job completed] backup", **extra: Any) -> DeliveryPart:
    return DeliveryPart(idempotency_key="run-1:delivery:part:1/1", index=1, count=1, body=body, run_id="run-1", job_id="job-1",
                        **extra)


def route(target: str | None = "telegram:123456", **options: Any) -> DeliveryRoute:
    from scheduler_channel_openclaw import OpenClawOptions

    return DeliveryRoute(channel="openclaw", target=target, options=build_options(OpenClawOptions, options, "delivery_options"))


class FakeGateway:
    """Answers like the Gateway: bearer check, then ``{"ok": true, "result": {...}}`` for the message tool."""

    def __init__(self, server: Any) -> None:
        self.ids = itertools.count(500)
        self.sent: list[dict[str, Any]] = []
        server.default(INVOKE, self.invoke)

    def invoke(self, request: Any) -> dict[str, Any]:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return {"status": 401, "json": {"ok": False, "error": {"type": "unauthorized", "message": "Unauthorized"}}}
        body = request.json()
        if body.get("tool") != "message":
            return {"status": 404, "json": {"ok": False, "error": {"type": "not_found", "message": "Tool not available"}}}
        self.sent.append(body["args"])
        message_id = next(self.ids)
        return {"json": {"ok": True, "result": {"content": [{"type": "text", "text": "sent"}],
                                                "details": {"ok": True, "messageId": str(message_id)}}}}


@pytest.fixture
def gateway(server: Any) -> FakeGateway:
    return FakeGateway(server)


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("TEST_GATEWAY_TOKEN", TOKEN)
    return {"credential": "env:TEST_GATEWAY_TOKEN"}


@pytest.fixture
def channel(load_channel: Any, token_env: dict[str, str], server: Any) -> Any:
    return load_channel("openclaw", gateway_url=server.url, token=token_env, timeout_s=0.5, connect_timeout_s=0.5)


def test_loaded_through_the_entry_point(channel: Any) -> None:
    assert isinstance(channel, Channel) and channel.plugin_api == PLUGIN_API_VERSION
    assert channel.capabilities == {"threads"}
    assert not channel.limits.supports_attachments and channel.limits.max_chars == 3500


def test_the_default_gateway_is_local(load_channel: Any) -> None:
    from scheduler_channel_openclaw import OpenClawSettings

    assert OpenClawSettings().gateway_url == "http://127.0.0.1:18789"
    assert load_channel("openclaw") is not None


def test_a_part_is_one_message_tool_call(channel: Any, server: Any, gateway: FakeGateway) -> None:
    receipt = channel.send(part(), route())
    (request,) = server.to(INVOKE)
    assert request.method == "POST"
    assert request.json() == {"tool": "message", "args": {"action": "send", "channel": "telegram", "target": "123456",
                                                          "message": "[Job completed] backup"}}
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["idempotency-key"] == "run-1:delivery:part:1/1"
    assert request.headers["x-openclaw-message-channel"] == "telegram"
    assert receipt.receipt_id == "500" and receipt.details == {"channel": "telegram", "target": "123456"}


@pytest.mark.parametrize(("target", "options", "channel_name", "destination"), [
    ("telegram/123456", {}, "telegram", "123456"),
    ("slack:channel:C0123", {}, "slack", "channel:C0123"),
    ("signal:+15555550123", {}, "signal", "+15555550123"),
    ("channel:C0123", {"channel": "slack"}, "slack", "channel:C0123"),
    ("@ops", {"channel": "telegram"}, "telegram", "@ops"),
    ("+15555550123", {}, None, "+15555550123"),
])
def test_targets(channel: Any, gateway: FakeGateway, target: str, options: dict[str, Any], channel_name: str | None,
                 destination: str) -> None:
    channel.send(part(), route(target, **options))
    (args,) = gateway.sent
    assert args.get("channel") == channel_name and args["target"] == destination


def test_default_channel_account_and_session(load_channel: Any, token_env: dict[str, str], server: Any,
                                             gateway: FakeGateway) -> None:
    channel = load_channel("openclaw", gateway_url=server.url + "/", token=token_env, default_channel="discord",
                           account_id="work", session_key="agent:ops:main")
    channel.send(part(), route("channel:42", thread_id="777", reply_to="99", silent=True))
    (request,) = server.to(INVOKE)
    assert request.json() == {"tool": "message", "sessionKey": "agent:ops:main",
                              "args": {"action": "send", "channel": "discord", "target": "channel:42",
                                       "message": "[Job completed] backup", "accountId": "work", "threadId": "777",
                                       "replyTo": "99", "silent": True}}
    assert request.headers["x-openclaw-account-id"] == "work"


def test_bad_targets_are_permanent(channel: Any, server: Any) -> None:
    for target, options, code in ((None, {}, "OPENCLAW_TARGET_MISSING"), ("  ", {}, "OPENCLAW_TARGET_MISSING"),
                                  ("telegram:123", {"channel": "slack"}, "OPENCLAW_TARGET_INVALID")):
        with pytest.raises(PermanentDeliveryError) as caught:
            channel.send(part(), route(target, **options))
        assert caught.value.code == code
    assert not server.requests


def test_attachments_and_empty_parts_are_refused(channel: Any, server: Any) -> None:
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(attachments=({"name": "a", "content": b"x"},)), route())
    assert caught.value.code == "OPENCLAW_ATTACHMENTS_UNSUPPORTED"
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part("\n"), route())
    assert caught.value.code == "OPENCLAW_EMPTY"
    assert not server.requests


def test_in_band_tool_failures_are_failed_attempts(channel: Any, server: Any) -> None:
    server.queue(INVOKE, {"json": {"ok": True, "result": {"isError": True,
                                                          "content": [{"type": "text", "text": "telegram is not connected"}]}}})
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "OPENCLAW_TOOL_ERROR" and "telegram is not connected" in caught.value.message
    server.queue(INVOKE, {"status": 400, "json": {"ok": False, "error": {"type": "tool_error", "message": "send failed"}}})
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "OPENCLAW_TOOL_ERROR" and "send failed" in caught.value.message


@pytest.mark.parametrize(("reply", "code"), [
    ({"status": 400, "json": {"ok": False, "error": {"type": "invalid_request", "message": "args.target required"}}},
     "OPENCLAW_REJECTED"),
    ({"status": 401, "json": {"ok": False, "error": {"type": "unauthorized"}}}, "OPENCLAW_AUTH_FAILED"),
    ({"status": 404, "json": {"ok": False, "error": {"type": "not_found", "message": "Tool not available: message"}}},
     "OPENCLAW_TOOL_UNAVAILABLE"),
    ({"status": 405, "body": b"Method Not Allowed"}, "OPENCLAW_REJECTED"),
    ({"status": 413, "body": b"Payload Too Large"}, "OPENCLAW_REJECTED"),
])
def test_refusals_are_permanent(channel: Any, server: Any, reply: dict[str, Any], code: str) -> None:
    server.queue(INVOKE, reply)
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == code


@pytest.mark.parametrize(("reply", "code", "retry_after"), [
    ({"status": 429, "headers": {"Retry-After": "60"}, "json": {"ok": False, "error": {"type": "rate_limited"}}},
     "OPENCLAW_RATE_LIMITED", 60),
    ({"status": 500, "body": b"boom"}, "OPENCLAW_SERVER_ERROR", None),
    ({"status": 529, "json": {"ok": False, "error": {"type": "draining", "message": "gateway is draining"}}},
     "OPENCLAW_SERVER_ERROR", None),
    ({"status": 200, "body": b"<html>proxy</html>"}, "OPENCLAW_SERVER_ERROR", None),
    ({"action": "hang", "seconds": 3}, "OPENCLAW_TIMEOUT", None),
    ({"json": {"ok": True, "result": {}}, "action": "reset"}, "OPENCLAW_CONNECTION_FAILED", None),
])
def test_faults_are_transient(channel: Any, server: Any, reply: dict[str, Any], code: str, retry_after: float | None) -> None:
    server.queue(INVOKE, reply)
    started = time.monotonic()
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == code and caught.value.retry_after_s == retry_after
    assert time.monotonic() - started < 2


def test_a_gateway_that_is_down_is_transient(load_channel: Any) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel = load_channel("openclaw", gateway_url=f"http://127.0.0.1:{port}")
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "OPENCLAW_CONNECTION_FAILED"


def test_no_token_sends_no_authorization(load_channel: Any, server: Any, gateway: FakeGateway) -> None:
    channel = load_channel("openclaw", gateway_url=server.url)
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "OPENCLAW_AUTH_FAILED"
    assert "authorization" not in server.to(INVOKE)[0].headers


def test_the_token_never_reaches_a_message(channel: Any, server: Any, load_channel: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    server.queue(INVOKE, {"status": 400, "json": {"ok": False, "error": {"type": "tool_error",
                                                                          "message": f"bad header Bearer {TOKEN}"}}})
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert TOKEN not in str(caught.value) and "<redacted>" in str(caught.value)
    monkeypatch.delenv("NO_GATEWAY_TOKEN", raising=False)
    monkeypatch.setenv("SPACEY_TOKEN", "has a space")
    for ref, code in (("env:NO_GATEWAY_TOKEN", "SECRET_UNRESOLVED"), ("env:SPACEY_TOKEN", "OPENCLAW_TOKEN_INVALID")):
        bad = load_channel("openclaw", gateway_url=server.url, token={"credential": ref})
        with pytest.raises(PermanentDeliveryError) as caught:
            bad.send(part(), route())
        assert caught.value.code == code and "has a space" not in caught.value.message


def test_settings_and_options_are_validated(load_channel: Any) -> None:
    from scheduler_channel_openclaw import OpenClawOptions

    for settings in ({"token": TOKEN}, {"gateway_url": "localhost:18789"}, {"default_channel": "Tele gram"}):
        with pytest.raises(SchedulerError) as caught:
            load_channel("openclaw", **settings)
        assert caught.value.code == "CONFIG_INVALID" and TOKEN not in str(caught.value.to_json())
    with pytest.raises(SchedulerError) as caught:
        build_options(OpenClawOptions, {"channel": "Not A Channel"}, "delivery_options")
    assert caught.value.code == "VALIDATION_FAILED"
