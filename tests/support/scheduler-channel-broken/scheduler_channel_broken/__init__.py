"""Deliberately broken channels for testing the channel conformance runner (never use them for real delivery)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any

import attrs
from scheduler_toolkit.settings import SecretRef
from scheduler_toolkit.types import ChannelLimits

from scheduler.api import DeliveryReceipt, PermanentDeliveryError

log = logging.getLogger("scheduler_channel_broken")


@attrs.frozen(kw_only=True)
class BrokenSettings:
    """``[channels.broken]``: where its stand-in service is, and the bearer token."""

    url: str | None = attrs.field(default=None, metadata={"doc": "Service root."})
    token: SecretRef | None = attrs.field(default=None, metadata={"doc": "Bearer token.", "secret": True})
    timeout_s: float = attrs.field(default=2.0, metadata={"doc": "Seconds to wait.", "minimum": 0.01})


class BrokenChannel:
    """Claims files and idempotency keys, sends neither, and turns the service's refusals into receipts."""

    plugin_api = 3
    capabilities = frozenset({"attachments", "idempotency-keys"})
    limits = ChannelLimits(max_chars=500, max_parts=5, supports_attachments=True, max_attachment_bytes=1_000_000)
    settings_class = BrokenSettings

    def __init__(self) -> None:
        self._settings = BrokenSettings()

    def configure(self, settings: BrokenSettings) -> None:
        self._settings = settings

    def send(self, part: Any, route: Any) -> DeliveryReceipt:
        s = self._settings
        token = s.token.resolve() if s.token is not None else ""
        text = part.body[: self.limits.max_chars - 20]  # wrong: a body near the limit loses its end
        request = urllib.request.Request(  # wrong: no idempotency key, no attachments
            f"{s.url}/messages", data=json.dumps({"text": text}).encode(),
            headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=s.timeout_s) as response:  # wrong: timeouts and resets escape
                response.read()
        except urllib.error.HTTPError as exc:
            log.info("the service answered %s to token %s", exc.code, token)  # wrong: the token in a log record
            if exc.code == 401:
                raise PermanentDeliveryError(f"the service refused the token {token}", code="BROKEN_AUTH") from None
            # wrong: every other refusal (429, 500, 400) is swallowed and reported as delivered
        return DeliveryReceipt(receipt_id="delivered", details={"status": "probably"})


class UnadaptedChannel(BrokenChannel):
    """A channel whose distribution ships no service adapter: the engine cannot run any case against it."""
