"""The webhook channel's conformance service adapter (entry point ``scheduler.conformance_adapters:webhook``).

For each conformance case it starts a loopback stand-in of a Standard Webhooks receiver:
an HTTP endpoint that verifies the signature of every POST with the ``standardwebhooks``
package (a request that does not verify is a problem of the case), reads the delivered
part out of the JSON payload (``data.body``, the ``webhook-id`` header as the idempotency
key, ``data.attachments[].content_base64``) and answers as the case says: 200, 429 with
``Retry-After``, 500, nothing, a reset, 400 or 401. The channel is pointed at it through
``[channels.webhook]`` ``url`` and a fresh signing secret read from the environment. Only
the conformance engine imports this module.
"""

from __future__ import annotations

import base64
import os
import secrets
from typing import Any

from scheduler.testing import HttpRequest, HttpStandIn, ReceivedFile, ReceivedMessage, ServiceRequest


class _Receiver(HttpStandIn):
    """A Standard Webhooks receiver on loopback."""

    def __init__(self, request: ServiceRequest) -> None:
        super().__init__()
        self.signing_secret = "whsec_" + base64.b64encode(os.urandom(32)).decode("ascii")
        variable = f"SCHEDULER_CONFORMANCE_WEBHOOK_SECRET_{secrets.token_hex(4).upper()}"
        self.secrets = {variable: self.signing_secret}
        self.settings = {"url": f"{self.url}/hooks/conformance", "secret": {"credential": f"env:{variable}"},
                         "timeout_s": request.timeout_s, "connect_timeout_s": request.timeout_s}

    def message_of(self, request: HttpRequest) -> ReceivedMessage | None:
        if request.method != "POST" or request.path != "/hooks/conformance":
            raise ValueError("the webhook was not posted to the configured URL")
        from standardwebhooks.webhooks import Webhook

        Webhook(self.signing_secret).verify(request.body, dict(request.headers))  # raises when the signature is wrong
        data: dict[str, Any] = request.json()["data"]
        files = tuple(ReceivedFile(name=a["name"], content=base64.b64decode(a.get("content_base64") or ""))
                      for a in data.get("attachments") or ())
        return ReceivedMessage(text=data["body"], idempotency_key=request.headers.get("webhook-id"), files=files)


class WebhookService:
    """Starts a ``_Receiver`` per case."""

    def conformance_service(self, request: ServiceRequest) -> _Receiver:
        return _Receiver(request)


__all__ = ["WebhookService"]
