"""The retention duty: the dispatcher's thread that applies the retention rules every ``interval``.

The rules (``[retention]``, a job's ``retention`` field, ``runs prune`` flags) are
``scheduler.ops.retention_rules``; one pass applying them is ``scheduler.ops.pruning.prune``.
``RetentionDuty`` runs a pass under the dispatcher's own lease on SQLite (one dispatcher
per file) and under the singleton ``maintenance`` lease on PostgreSQL. The last pass is
read from ``prune_cutoffs`` (every pass writes its row first), so across dispatchers,
takeovers and restarts the duty runs once per interval. It is a thread of its own: the
loop that claims and completes runs never waits for it, and a job without retention costs
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scheduler.core.duty import DutyThread
from scheduler.ops.pruning import PassNotDue, prune
from scheduler.ops.retention_rules import interval_ms, settings_rules

log = logging.getLogger(__name__)


class RetentionDuty(DutyThread):
    """The dispatcher's retention thread: a pass every ``interval`` while ``lease()`` gives a lease to fence with.

    ``lease`` returns the lease the pass's transactions assert (the dispatcher's own on
    SQLite, the ``maintenance`` lease on PostgreSQL) or None when this dispatcher does not
    hold it: then nothing is done. A pass that loses the lease stops at its next batch;
    what it committed stays committed (every batch is whole).
    """

    thread_name = "retention"
    first_delay = 0.5  # first check soon after start: a dispatcher restarted after a long stop catches up

    def __init__(self, store: Any, owner: str, lease: Callable[[], Any], *, artifacts_root: Any,
                 say: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.store = store
        self.owner = owner
        self._lease = lease
        self.artifacts_root = artifacts_root
        self.say = say or (lambda _msg: None)
        #: Reports of the passes this duty ran (newest last, at most 20): for tests and ``status``.
        self.passes: list[Any] = []

    def pass_failed(self, exc: Exception) -> float:
        """A failed pass is logged and retried in 30 s (``wake()`` checks at once: a lease taken, settings reloaded)."""
        log.warning("retention pass failed: %s", getattr(exc, "message", exc))
        return 30.0

    def run_once(self) -> float:
        """Run a pass when one is due and this dispatcher holds the lease; seconds until the next check."""
        every = interval_ms()
        check = min(every / 1000, 30.0)
        lease = self._lease()
        if lease is None:
            return check
        rules = settings_rules()
        if not rules.has_global_run_rule and rules.delivered_outbox_age_ms is None and rules.event_age_ms is None:
            with self.store.read() as tx:
                if tx.scalar("SELECT COUNT(*) FROM jobs WHERE retention IS NOT NULL") == 0:
                    return check  # nothing configured: no pass, no cutoff row, no event
        try:
            report = prune(self.store, rules, artifacts_root=self.artifacts_root, lease=lease, actor=self.owner,
                           min_interval_ms=every, stop=self._stop)
        except PassNotDue as wait:
            return max(0.05, min(check, wait.remaining_ms / 1000))
        self.passes = [*self.passes[-19:], report]
        if report.total:
            self.say(f"retention: {report.summary()}")
        return check
