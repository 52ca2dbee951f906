"""The dispatcher's duties as core starts them with the lease: the delivery consumer and the retention duty."""

from __future__ import annotations

import attrs

from scheduler.core.duty import DutyContext
from scheduler.delivery.outbox import DeliveryWorker, parts_enqueued
from scheduler.ops.retention import RetentionDuty


@attrs.define(eq=False)
class Delivery:
    """The outbox consumer (``scheduler.delivery.outbox.DeliveryWorker``), woken when a pass may have enqueued parts."""

    worker: DeliveryWorker

    def start(self) -> None:
        """Start consuming the outbox."""
        self.worker.start()

    def stop(self) -> None:
        """Stop after the part being sent (a claim left behind expires and is taken over)."""
        self.worker.stop()

    def after_pass(self, idle: bool) -> None:
        """An idle pass follows a change another process committed (a part, perhaps); after a busy pass, only
        completions and approval gates that enqueued parts wake the consumer."""
        if idle:
            self.worker.wake()
        elif parts_enqueued.is_set():
            parts_enqueued.clear()
            self.worker.wake()


@attrs.define(eq=False)
class Retention:
    """The retention duty (``scheduler.ops.retention.RetentionDuty``): it keeps its own interval."""

    duty: RetentionDuty

    def start(self) -> None:
        """Start the retention thread."""
        self.duty.start()

    def stop(self) -> None:
        """Stop after its current batch (each batch is its own transaction)."""
        self.duty.stop()

    def after_pass(self, idle: bool) -> None:
        """Nothing: retention runs on its own interval, not the loop's."""


def delivery(context: DutyContext) -> Delivery:
    """The delivery consumer of the dispatcher ``context`` describes."""
    return Delivery(DeliveryWorker(context.store, context.owner, artifacts_root=context.artifacts_root, say=context.say))


def retention(context: DutyContext) -> Retention:
    """The retention duty, fenced by the singleton lease (the dispatcher's own on SQLite, ``maintenance`` when shared)."""
    return Retention(RetentionDuty(context.store, context.owner, context.singleton_fence,
                                   artifacts_root=context.artifacts_root, say=context.say))
