"""The Telegram channel against a real loopback stand-in for the Bot API."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from email.parser import BytesParser
from email.policy import HTTP
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

TOKEN = "123456789:AAF0aTestTokenValue_abcdefghijklmno"
CHAT = "-1001234567890"


def path(method: str, prefix: str = "") -> str:
    return f"{prefix}/bot{TOKEN}/{method}"


def part(body: str = "backup done", key: str = "run-1:delivery:part:1/1", **extra: Any) -> DeliveryPart:
    return DeliveryPart(idempotency_key=key, index=1, count=1, body=body, run_id="run-1", job_id="job-1", **extra)


def route(target: str | None = CHAT, **options: Any) -> DeliveryRoute:
    from scheduler_channel_telegram import TelegramOptions

    return DeliveryRoute(channel="telegram", target=target, options=build_options(TelegramOptions, options, "delivery_options"))


def attachment(name: str, data: bytes, mime: str = "text/plain") -> dict[str, Any]:
    return {"name": name, "mime_type": mime, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "content": data}


def form(request: Any) -> dict[str, Any]:
    """A multipart/form-data body as {field: text} and {field: (filename, content_type, bytes)} for files."""
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode() + request.body)
    out: dict[str, Any] = {}
    for item in message.iter_parts():
        name = item.get_param("name", header="content-disposition")
        filename = item.get_filename()
        payload = item.get_payload(decode=True)
        out[name] = (filename, item.get_content_type(), payload) if filename else payload.decode()
    return out


class BotApi:
    """Answers like the Bot API: ``{"ok": true, "result": Message}`` with increasing message ids."""

    def __init__(self) -> None:
        self.ids = itertools.count(100)

    def message(self, request: Any) -> dict[str, Any]:
        return {"json": {"ok": True, "result": {"message_id": next(self.ids), "chat": {"id": int(CHAT)}, "date": int(time.time())}}}

    def group(self, request: Any) -> dict[str, Any]:
        media = json.loads(form(request)["media"])
        return {"json": {"ok": True, "result": [{"message_id": next(self.ids)} for _ in media]}}


@pytest.fixture
def api(server: Any) -> BotApi:
    bot = BotApi()
    for method in ("sendMessage", "sendDocument"):
        server.default(path(method), bot.message)
    server.default(path("sendMediaGroup"), bot.group)
    return bot


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TEST_TELEGRAM_TOKEN", TOKEN)
    return "env:TEST_TELEGRAM_TOKEN"


@pytest.fixture
def channel(load_channel: Any, token_env: str, server: Any) -> Any:
    return load_channel("telegram", token={"credential": token_env}, api_base=server.url, timeout_s=0.5, connect_timeout_s=0.5)


def test_loaded_through_the_entry_point_with_telegrams_limits(channel: Any) -> None:
    assert isinstance(channel, Channel) and channel.plugin_api == PLUGIN_API_VERSION
    assert channel.capabilities == {"attachments", "threads"}
    assert channel.limits.max_chars == 4096
    assert channel.limits.supports_attachments and channel.limits.max_attachment_bytes == 50 * 1024 * 1024


def test_a_text_part_is_one_send_message(channel: Any, server: Any, api: BotApi) -> None:
    receipt = channel.send(part(), route())
    (request,) = server.to(path("sendMessage"))
    assert request.json() == {"chat_id": CHAT, "text": "backup done"}
    assert receipt.receipt_id == "100" and receipt.details == {"chat_id": CHAT, "message_ids": [100]}


def test_options_map_to_bot_api_fields(channel: Any, server: Any, api: BotApi) -> None:
    channel.send(part("<b>done</b>"), route("@ops_alerts", parse_mode="HTML", disable_notification=True, protect_content=True,
                                            message_thread_id=42, link_preview=False))
    assert server.to(path("sendMessage"))[0].json() == {
        "chat_id": "@ops_alerts", "text": "<b>done</b>", "parse_mode": "HTML", "disable_notification": True,
        "protect_content": True, "message_thread_id": 42, "link_preview_options": {"is_disabled": True}}


def test_the_default_chat_and_a_missing_or_bad_target(load_channel: Any, token_env: str, server: Any, api: BotApi) -> None:
    channel = load_channel("telegram", token={"credential": token_env}, api_base=server.url, default_chat_id="@ops_alerts")
    channel.send(part(), route(None))
    assert server.to(path("sendMessage"))[0].json()["chat_id"] == "@ops_alerts"
    bare = load_channel("telegram", token={"credential": token_env}, api_base=server.url)
    with pytest.raises(PermanentDeliveryError) as caught:
        bare.send(part(), route(None))
    assert caught.value.code == "TELEGRAM_TARGET_MISSING"
    with pytest.raises(PermanentDeliveryError) as caught:
        bare.send(part(), route("../getUpdates"))
    assert caught.value.code == "TELEGRAM_TARGET_INVALID"


def test_an_api_base_with_a_path_prefix(load_channel: Any, token_env: str, server: Any) -> None:
    server.default(path("sendMessage", "/tg"), {"json": {"ok": True, "result": {"message_id": 7}}})
    channel = load_channel("telegram", token={"credential": token_env}, api_base=server.url + "/tg/")
    assert channel.send(part(), route()).receipt_id == "7"


def test_429_with_retry_after_in_the_answer(channel: Any, server: Any) -> None:
    server.queue(path("sendMessage"), {"status": 429, "json": {"ok": False, "error_code": 429,
                                                                "description": "Too Many Requests: retry after 13",
                                                                "parameters": {"retry_after": 13}}})
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "TELEGRAM_RATE_LIMITED" and caught.value.retry_after_s == 13
    assert "retry after 13" in caught.value.message


def test_429_with_only_a_retry_after_header(channel: Any, server: Any) -> None:
    server.queue(path("sendMessage"), {"status": 429, "headers": {"Retry-After": "4"}, "body": b"<html>slow</html>"})
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "TELEGRAM_RATE_LIMITED" and caught.value.retry_after_s == 4


@pytest.mark.parametrize("reply", [
    {"status": 500, "json": {"ok": False, "error_code": 500, "description": "Internal Server Error"}},
    {"status": 502, "body": b"<html>Bad Gateway</html>"},
    {"status": 200, "body": b"not json"},
])
def test_server_errors_are_transient(channel: Any, server: Any, reply: dict[str, Any]) -> None:
    server.queue(path("sendMessage"), reply)
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "TELEGRAM_SERVER_ERROR"


def test_a_hang_past_the_timeout_and_a_reset_are_transient(channel: Any, server: Any) -> None:
    server.queue(path("sendMessage"), {"action": "hang", "seconds": 3})
    started = time.monotonic()
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "TELEGRAM_TIMEOUT" and time.monotonic() - started < 2
    server.queue(path("sendMessage"), {"json": {"ok": True, "result": {"message_id": 1, "text": "x" * 100}}, "action": "reset"})
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "TELEGRAM_CONNECTION_FAILED"


@pytest.mark.parametrize(("status", "answer", "code"), [
    (401, {"ok": False, "error_code": 401, "description": "Unauthorized"}, "TELEGRAM_AUTH_FAILED"),
    (404, {"ok": False, "error_code": 404, "description": "Not Found"}, "TELEGRAM_AUTH_FAILED"),
    (403, {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked by the user"}, "TELEGRAM_FORBIDDEN"),
    (400, {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"}, "TELEGRAM_REJECTED"),
    (400, {"ok": False, "error_code": 400, "description": "Bad Request: group chat was upgraded to a supergroup chat",
           "parameters": {"migrate_to_chat_id": -1009876543210}}, "TELEGRAM_CHAT_MIGRATED"),
])
def test_refusals_are_permanent(channel: Any, server: Any, status: int, answer: dict[str, Any], code: str) -> None:
    server.queue(path("sendMessage"), {"status": status, "json": answer})
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == code
    if code == "TELEGRAM_CHAT_MIGRATED":
        assert "-1009876543210" in caught.value.message


def test_the_token_never_reaches_messages_or_logs(channel: Any, server: Any, api: BotApi,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    errors = []
    for reply in ({"status": 400, "json": {"ok": False, "error_code": 400, "description": "Bad Request"}},
                  {"status": 500, "body": b"boom"}, {"action": "hang", "seconds": 2}, {"action": "reset"}):
        server.queue(path("sendMessage"), reply)
        with pytest.raises((TransientDeliveryError, PermanentDeliveryError)) as caught:
            channel.send(part(), route())
        errors.append(caught.value)
    channel.send(part(), route())
    secret = TOKEN.split(":", 1)[1]
    for error in errors:
        assert secret not in str(error) and error.__cause__ is None
    assert "HTTP Request" in caplog.text or "sendMessage" in caplog.text  # httpx did log the requests ...
    assert secret not in caplog.text  # ... with the token redacted


def test_an_echoed_token_is_redacted_from_the_description(channel: Any, server: Any) -> None:
    server.queue(path("sendMessage"), {"status": 400, "json": {"ok": False, "error_code": 400,
                                                                "description": f"Bad Request: token {TOKEN} weird"}})
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert TOKEN not in str(caught.value) and "<redacted>" in str(caught.value)


def test_token_problems_are_permanent_and_send_nothing(load_channel: Any, server: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIRD_TOKEN", "not/a/token")
    monkeypatch.delenv("NO_TOKEN", raising=False)
    for settings, code in (({}, "TELEGRAM_NOT_CONFIGURED"), ({"token": {"credential": "env:NO_TOKEN"}}, "SECRET_UNRESOLVED"),
                           ({"token": {"credential": "env:WEIRD_TOKEN"}}, "TELEGRAM_TOKEN_INVALID")):
        channel = load_channel("telegram", api_base=server.url, **settings)
        with pytest.raises(PermanentDeliveryError) as caught:
            channel.send(part(), route())
        assert caught.value.code == code and "not/a/token" not in caught.value.message
    assert not server.requests


def test_settings_are_validated_at_load(load_channel: Any) -> None:
    for settings in ({"token": TOKEN}, {"api_base": "ftp://x"}, {"default_chat_id": "not a chat"}):
        with pytest.raises(SchedulerError) as caught:
            load_channel("telegram", **settings)
        assert caught.value.code == "CONFIG_INVALID" and TOKEN not in str(caught.value.to_json())


def test_a_part_over_4096_utf16_units_is_refused_before_sending(channel: Any, server: Any) -> None:
    channel.send(part("x" * 4096), route())  # exactly the limit goes out
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part("😀" * 2049), route())  # 2049 characters, 4098 UTF-16 units
    assert caught.value.code == "TELEGRAM_MESSAGE_TOO_LONG"
    assert len(server.to(path("sendMessage"))) == 1


def test_one_attachment_with_a_short_text_is_one_send_document(channel: Any, server: Any, api: BotApi) -> None:
    receipt = channel.send(part("report attached", attachments=(attachment("report.csv", b"a,b\n1,2\n", "text/csv"),)),
                           route(message_thread_id=5, parse_mode="MarkdownV2"))
    assert not server.to(path("sendMessage"))
    (request,) = server.to(path("sendDocument"))
    fields = form(request)
    assert fields["chat_id"] == CHAT and fields["caption"] == "report attached" and fields["message_thread_id"] == "5"
    assert fields["parse_mode"] == "MarkdownV2"
    assert fields["document"] == ("report.csv", "text/csv", b"a,b\n1,2\n")
    assert receipt.details["message_ids"] == [100]


def test_a_long_text_goes_first_then_the_document(channel: Any, server: Any, api: BotApi) -> None:
    receipt = channel.send(part("y" * 2000, attachments=(attachment("a.txt", b"hi"),)), route())
    assert server.to(path("sendMessage"))[0].json()["text"] == "y" * 2000
    fields = form(server.to(path("sendDocument"))[0])
    assert "caption" not in fields and fields["document"][2] == b"hi"
    assert [r.path.rsplit("/", 1)[1] for r in server.requests] == ["sendMessage", "sendDocument"]
    assert receipt.details["message_ids"] == [100, 101]


def test_several_attachments_are_media_groups_of_ten(channel: Any, server: Any, api: BotApi) -> None:
    files = tuple(attachment(f"f{i}.txt", f"file {i}".encode()) for i in range(12))
    receipt = channel.send(part("twelve files", attachments=files), route())
    first, second = server.to(path("sendMediaGroup"))
    media = json.loads(form(first)["media"])
    assert len(media) == 10 and media[0]["caption"] == "twelve files" and "caption" not in media[1]
    assert all(m["type"] == "document" and m["media"] == f"attach://file{i}" for i, m in enumerate(media))
    assert form(first)["file9"] == ("f9.txt", "text/plain", b"file 9")
    tail = form(second)
    assert len(json.loads(tail["media"])) == 2 and tail["file1"][2] == b"file 11"
    assert len(receipt.details["message_ids"]) == 12


def test_bad_attachments_are_permanent(load_channel: Any, token_env: str, server: Any) -> None:
    channel = load_channel("telegram", token={"credential": token_env}, api_base=server.url, max_attachment_bytes=4)
    assert channel.limits.max_attachment_bytes == 4
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(attachments=(attachment("big.txt", b"12345"),)), route())
    assert caught.value.code == "TELEGRAM_ATTACHMENT_TOO_LARGE"
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(attachments=({**attachment("x", b"12"), "sha256": "f" * 64},)), route())
    assert caught.value.code == "TELEGRAM_ATTACHMENT_INVALID"
    assert not server.requests


def test_an_empty_part_is_refused(channel: Any, server: Any) -> None:
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part("  \n"), route())
    assert caught.value.code == "TELEGRAM_EMPTY" and not server.requests
