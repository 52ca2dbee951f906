"""scheduler-channel-webhook: the ``webhook`` delivery channel of the scheduler.

Delivers each outbox part as a JSON POST signed per the Standard Webhooks
specification (``webhook-id`` = the part's idempotency key). See ``README.md``.
"""

from __future__ import annotations

from scheduler_channel_webhook.channel import WebhookChannel, WebhookOptions, WebhookSettings, __version__

__all__ = ["WebhookChannel", "WebhookOptions", "WebhookSettings", "__version__"]
