"""The OpenClaw channel's conformance service adapter (entry point ``scheduler.conformance_adapters:openclaw``).

For each conformance case it starts a loopback stand-in of an OpenClaw Gateway's
``POST /tools/invoke`` endpoint and points the channel at it (``[channels.openclaw]``
``gateway_url`` and a fresh Gateway token read from the environment; the route's target
is ``telegram:123456``). The stand-in checks the bearer token, reads the ``message`` tool's
``send`` arguments, and gives the case's answer as the Gateway does: ``{"ok": true,
"result": {...}}``; 429 with ``Retry-After``; 500; no answer; a reset; 400 with an
``invalid_request`` error; 401. The part's key travels as ``Idempotency-Key`` but the
channel does not promise the Gateway honours it, so the case that needs it is skipped.
Only the conformance engine imports this module.
"""

from __future__ import annotations

import itertools
import secrets

from scheduler.testing import HttpReply, HttpRequest, HttpStandIn, ReceivedMessage, ServiceAnswer, ServiceRequest

TARGET = "telegram:123456"
_message_ids = itertools.count(1)


class _Gateway(HttpStandIn):
    """The Gateway's tool endpoint with the ``message`` tool."""

    def __init__(self, request: ServiceRequest) -> None:
        super().__init__()
        self.token = secrets.token_urlsafe(32)
        variable = f"SCHEDULER_CONFORMANCE_OPENCLAW_TOKEN_{secrets.token_hex(4).upper()}"
        self.secrets = {variable: self.token}
        self.settings = {"gateway_url": self.url, "token": {"credential": f"env:{variable}"},
                         "timeout_s": request.timeout_s, "connect_timeout_s": request.timeout_s}
        self.target = TARGET

    def message_of(self, request: HttpRequest) -> ReceivedMessage | None:
        if request.path != "/tools/invoke":
            raise ValueError(f"the stand-in serves /tools/invoke, not {request.path}")
        if request.headers.get("authorization") != f"Bearer {self.token}":
            raise ValueError("/tools/invoke was called without the configured Gateway token")
        call = request.json()
        args = call.get("args") or {}
        if call.get("tool") != "message" or args.get("action") != "send":
            raise ValueError(f"not a message send: tool {call.get('tool')!r}, action {args.get('action')!r}")
        if f"{args.get('channel')}:{args.get('target')}" != TARGET:
            raise ValueError(f"sent to {args.get('channel')!r} / {args.get('target')!r}, not the route's {TARGET}")
        return ReceivedMessage(text=str(args.get("message") or ""), idempotency_key=request.headers.get("idempotency-key"))

    def accepted_reply(self, request: HttpRequest) -> HttpReply:
        return HttpReply(json={"ok": True, "result": {"content": [{"type": "text", "text": "sent"}],
                                                      "details": {"messageId": f"m-{next(_message_ids)}"}}})

    def reply_for(self, answer: ServiceAnswer, request: HttpRequest) -> HttpReply:
        kind = answer.kind
        if kind == "rate_limit":
            headers = {"retry-after": str(answer.retry_after_s)} if answer.retry_after_s is not None else {}
            return HttpReply(status=429, headers=headers,
                             json={"ok": False, "error": {"type": "rate_limited", "message": "too many requests"}})
        if kind == "server_error":
            return HttpReply(status=500, json={"ok": False, "error": {"type": "internal_error", "message": "gateway failure"}})
        if kind == "reject":
            return HttpReply(status=400, json={"ok": False, "error": {"type": "invalid_request", "message": "unknown target"}})
        if kind == "auth_reject":
            return HttpReply(status=401, json={"ok": False, "error": {"type": "unauthorized", "message": "invalid token"}})
        return super().reply_for(answer, request)


class OpenClawService:
    """Starts a ``_Gateway`` per case."""

    def conformance_service(self, request: ServiceRequest) -> _Gateway:
        return _Gateway(request)


__all__ = ["OpenClawService"]
