"""The broken channel's service adapter: an honest stand-in (the channel is what is broken)."""

from __future__ import annotations

import base64
import secrets

from scheduler.testing import HttpRequest, HttpStandIn, ReceivedFile, ReceivedMessage, ServiceRequest


class _Service(HttpStandIn):
    def __init__(self, request: ServiceRequest) -> None:
        super().__init__()
        token = secrets.token_urlsafe(24)
        variable = f"SCHEDULER_CONFORMANCE_BROKEN_TOKEN_{secrets.token_hex(4).upper()}"
        self.secrets = {variable: token}
        self.settings = {"url": self.url, "token": {"credential": f"env:{variable}"}, "timeout_s": request.timeout_s}

    def message_of(self, request: HttpRequest) -> ReceivedMessage:
        data = request.json()
        files = tuple(ReceivedFile(name=f["name"], content=base64.b64decode(f["content_base64"])) for f in data.get("files", ()))
        return ReceivedMessage(text=data["text"], idempotency_key=request.headers.get("idempotency-key"), files=files)


class BrokenService:
    def conformance_service(self, request: ServiceRequest) -> _Service:
        return _Service(request)
