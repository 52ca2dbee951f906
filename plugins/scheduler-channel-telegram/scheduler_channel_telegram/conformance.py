"""The Telegram channel's conformance service adapter (entry point ``scheduler.conformance_adapters:telegram``).

For each conformance case it starts a loopback stand-in of the Bot API and points the
channel at it (``[channels.telegram]`` ``api_base`` and a fresh bot token read from the
environment; the route's target is a chat id). The stand-in serves ``/bot<token>/METHOD``
(a request under any other token is a problem of the case), reads ``sendMessage`` (JSON),
``sendDocument`` and ``sendMediaGroup`` (multipart: the caption and the files) and gives
the case's answer in the Bot API's own form: ``{"ok": true, "result": ...}``; 429 with
``parameters.retry_after``; 500; no answer; a reset; 400 ``Bad Request: chat not found``;
401 ``Unauthorized``. Each Bot API call is one message. The Bot API has no idempotency
keys, so none is read. Only the conformance engine imports this module.
"""

from __future__ import annotations

import itertools
import json
import secrets
from typing import Any

from scheduler.testing import (
    HttpReply,
    HttpRequest,
    HttpStandIn,
    ReceivedFile,
    ReceivedMessage,
    ServiceAnswer,
    ServiceRequest,
)

CHAT_ID = "-1001234567890"
_message_ids = itertools.count(1)


class _BotApi(HttpStandIn):
    """``sendMessage``, ``sendDocument`` and ``sendMediaGroup`` of the Bot API."""

    def __init__(self, request: ServiceRequest) -> None:
        super().__init__()
        self.token = f"{secrets.randbelow(10**9) + 10**9}:{secrets.token_urlsafe(27)}"
        variable = f"SCHEDULER_CONFORMANCE_TELEGRAM_TOKEN_{secrets.token_hex(4).upper()}"
        self.secrets = {variable: self.token}
        self.settings = {"token": {"credential": f"env:{variable}"}, "api_base": self.url, "timeout_s": request.timeout_s,
                         "upload_timeout_s": request.timeout_s, "connect_timeout_s": request.timeout_s}
        self.target = CHAT_ID

    def _method(self, request: HttpRequest) -> str:
        prefix = f"/bot{self.token}/"
        if not request.path.startswith(prefix):
            raise ValueError("a Bot API call without the configured bot token in its path")
        return request.path[len(prefix):]

    def message_of(self, request: HttpRequest) -> ReceivedMessage | None:
        method = self._method(request)
        if method == "sendMessage":
            body = request.json()
            if str(body.get("chat_id")) != CHAT_ID:
                raise ValueError(f"sendMessage to chat {body.get('chat_id')!r}, not the route's {CHAT_ID}")
            return ReceivedMessage(text=str(body.get("text") or ""))
        fields, files = request.form()
        if fields.get("chat_id") != CHAT_ID:
            raise ValueError(f"{method} to chat {fields.get('chat_id')!r}, not the route's {CHAT_ID}")
        if method == "sendDocument":
            name, _ctype, content = files["document"]
            return ReceivedMessage(text=fields.get("caption", ""), files=(ReceivedFile(name=name, content=content),))
        if method == "sendMediaGroup":
            media = json.loads(fields["media"])
            received = []
            for item in media:
                name, _ctype, content = files[item["media"].removeprefix("attach://")]
                received.append(ReceivedFile(name=name, content=content))
            return ReceivedMessage(text=str(media[0].get("caption") or ""), files=tuple(received))
        raise ValueError(f"the stand-in does not implement {method}")

    def accepted_reply(self, request: HttpRequest) -> HttpReply:
        method = self._method(request)
        if method == "sendMediaGroup":
            count = len(json.loads(request.form()[0]["media"]))
            return HttpReply(json={"ok": True, "result": [{"message_id": next(_message_ids)} for _ in range(count)]})
        return HttpReply(json={"ok": True, "result": {"message_id": next(_message_ids), "chat": {"id": int(CHAT_ID)}}})

    def reply_for(self, answer: ServiceAnswer, request: HttpRequest) -> HttpReply:
        kind = answer.kind
        if kind == "rate_limit":
            said: dict[str, Any] = {"ok": False, "error_code": 429, "description": "Too Many Requests"}
            if answer.retry_after_s is not None:
                said["description"] += f": retry after {answer.retry_after_s}"
                said["parameters"] = {"retry_after": answer.retry_after_s}
            return HttpReply(status=429, json=said)
        if kind == "server_error":
            return HttpReply(status=500, json={"ok": False, "error_code": 500, "description": "Internal Server Error"})
        if kind == "reject":
            return HttpReply(status=400, json={"ok": False, "error_code": 400, "description": "Bad Request: chat not found"})
        if kind == "auth_reject":
            return HttpReply(status=401, json={"ok": False, "error_code": 401, "description": "Unauthorized"})
        return super().reply_for(answer, request)


class TelegramService:
    """Starts a ``_BotApi`` per case."""

    def conformance_service(self, request: ServiceRequest) -> _BotApi:
        return _BotApi(request)


__all__ = ["TelegramService"]
