"""The Slack channel's conformance service adapter (entry point ``scheduler.conformance_adapters:slack``).

For each conformance case it starts a loopback stand-in of the Slack Web API and points
the channel at it in API mode (``[channels.slack]`` ``api_base`` and a fresh bot token read
from the environment). The stand-in checks the bearer token on every call and speaks
Slack's answers: ``chat.postMessage`` and ``files.completeUploadExternal`` are the calls
that make a message visible, so they get the case's answer (success; HTTP 429 with
``Retry-After``; HTTP 500; no answer; a reset; ``ok: false`` with ``channel_not_found``
for a rejection and ``invalid_auth`` for refused credentials, both with HTTP 200 as Slack
does); ``files.getUploadURLExternal`` and the upload itself always succeed, and their
files are attached to the message that shares them. Slack has no idempotency keys, so
none is read. Webhook mode is not exercised here (the channel's own tests cover it).
Only the conformance engine imports this module.
"""

from __future__ import annotations

import json
import secrets
import threading
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

CHANNEL_ID = "C0CONFORM1"


class _SlackApi(HttpStandIn):
    """The Web API methods the channel calls, plus the pre-signed upload URLs."""

    def __init__(self, request: ServiceRequest) -> None:
        super().__init__()
        self.token = f"xoxb-{secrets.token_hex(6)}-{secrets.token_hex(6)}-{secrets.token_urlsafe(18)}"
        variable = f"SCHEDULER_CONFORMANCE_SLACK_TOKEN_{secrets.token_hex(4).upper()}"
        self.secrets = {variable: self.token}
        self.settings = {"mode": "api", "token": {"credential": f"env:{variable}"}, "api_base": f"{self.url}/api",
                         "timeout_s": request.timeout_s, "upload_timeout_s": request.timeout_s,
                         "connect_timeout_s": request.timeout_s}
        self.target = CHANNEL_ID
        self._uploads: dict[str, dict[str, Any]] = {}
        self._uploads_lock = threading.Lock()
        self._ts = 0

    def _next_ts(self) -> str:
        self._ts += 1
        return f"1712345678.{self._ts:06d}"

    def handle(self, request: HttpRequest) -> HttpReply:
        answer = self.answer
        if request.path.startswith("/upload/v1/"):
            file_id = request.path.rsplit("/", 1)[-1]
            with self._uploads_lock:
                if file_id not in self._uploads:
                    raise ValueError(f"an upload to an URL that was never handed out ({file_id})")
                self._uploads[file_id]["content"] = request.body
            return HttpReply(status=200, body=f"OK - {len(request.body)}".encode())
        if request.headers.get("authorization") != f"Bearer {self.token}":
            raise ValueError(f"{request.path} was called without the configured bot token")
        method = request.path.removeprefix("/api/")
        if method == "files.getUploadURLExternal":
            fields, _files = request.form()
            file_id = f"F{secrets.token_hex(5).upper()}"
            with self._uploads_lock:
                self._uploads[file_id] = {"name": fields.get("filename", ""), "length": int(fields.get("length", -1))}
            return HttpReply(json={"ok": True, "upload_url": f"{self.url}/upload/v1/{file_id}", "file_id": file_id})
        if method == "chat.postMessage":
            body = request.json()
            if body.get("channel") != CHANNEL_ID:
                raise ValueError(f"chat.postMessage to {body.get('channel')!r}, not the route's {CHANNEL_ID}")
            self.record(ReceivedMessage(text=str(body.get("text") or ""), accepted=answer.accepts))
            return self.reply_for(answer, request)
        if method == "files.completeUploadExternal":
            fields, _files = request.form()
            shared = json.loads(fields.get("files") or "[]")
            received = []
            with self._uploads_lock:
                for item in shared:
                    upload = self._uploads.get(item.get("id"))
                    if upload is None or "content" not in upload:
                        raise ValueError(f"files.completeUploadExternal shares {item.get('id')!r}, which was never uploaded")
                    received.append(ReceivedFile(name=upload["name"], content=upload["content"]))
            self.record(ReceivedMessage(text=fields.get("initial_comment", ""), files=tuple(received),
                                        accepted=answer.accepts))
            return self.reply_for(answer, request)
        raise ValueError(f"the stand-in does not implement {method}")

    def accepted_reply(self, request: HttpRequest) -> HttpReply:
        if request.path.endswith("files.completeUploadExternal"):
            fields, _files = request.form()
            return HttpReply(json={"ok": True, "files": [{"id": f["id"], "title": f.get("title")}
                                                          for f in json.loads(fields.get("files") or "[]")]})
        return HttpReply(json={"ok": True, "channel": CHANNEL_ID, "ts": self._next_ts()})

    def reply_for(self, answer: ServiceAnswer, request: HttpRequest) -> HttpReply:
        if answer.kind == "reject":
            return HttpReply(json={"ok": False, "error": "channel_not_found"})
        if answer.kind == "auth_reject":
            return HttpReply(json={"ok": False, "error": "invalid_auth"})
        return super().reply_for(answer, request)


class SlackService:
    """Starts a ``_SlackApi`` per case."""

    def conformance_service(self, request: ServiceRequest) -> _SlackApi:
        return _SlackApi(request)


__all__ = ["SlackService"]
