"""Delivery as a participant in the completion transaction: the outbox behind ``scheduler.core.participants.Outbox``."""

from __future__ import annotations

from scheduler.core.participants import Attachment, Run
from scheduler.core.store.base import Tx
from scheduler.delivery.outbox import enqueue, output_attachments


class DeliveryOutbox:
    """Completion's ``Outbox``: messages split into outbox parts by their channel's limits (``scheduler.delivery.outbox``)."""

    def enqueue(self, tx: Tx, run: Run, channel: str, target: str | None, body: str, group: str, now: int, *,
                attachments: tuple[Attachment, ...] = ()) -> int:
        """Enqueue one message about ``run`` as parts ``<group>:part:i/N`` (idempotent on ``group``)."""
        return enqueue(tx, run, channel, target, body, group, now, attachments=attachments)

    def attachments(self, run: Run, channel: str, body: str) -> tuple[Attachment, ...]:
        """The run's complete stdout as an attachment when the message cannot carry it and the channel takes files."""
        return output_attachments(run, channel, body)

