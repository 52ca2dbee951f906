"""The claimed run: what a worker and the run pipeline's steps know of a run the dispatcher started.

The claim transaction (``scheduler.core.queue.claim_and_start``) hands back ``StartedRun``s
whose job is the ``JobRow`` it built at its read; the dispatcher turns each into a ``ClaimedRun``
once, before the run reaches a worker, so everything downstream (the worker, the steps, the
supervision and the completion of the pass) reads the job as that typed row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from scheduler.core.outcomes import RunOutcomes
from scheduler.core.rows import JobRow

if TYPE_CHECKING:
    from scheduler.core.queue import StartedRun


@attrs.frozen
class ClaimedRun:
    """A claimed dispatch whose run exists in ``running`` under our fence, its job row typed."""

    run_id: str
    dispatch_id: str
    dispatch_kind: str
    job: JobRow
    attempt: int
    scheduled_for: int
    started_at: int
    parent_run_id: str | None
    #: The run this one follows (chain parent, retried or replayed run), for the executor's trigger context.
    source_run_id: str | None = None
    #: What the pipeline's steps decide for this run (filled by its worker, committed with its terminal state).
    outcomes: RunOutcomes = attrs.Factory(RunOutcomes)
    #: When its dispatch row was queued (materialised); ``queued_at - scheduled_for`` past the misfire grace makes the
    #: run a catch-up of a slot already missed then (a past one-shot, a slot after downtime), not a late start.
    queued_at: int | None = None

    @classmethod
    def of(cls, started: ClaimedRun | StartedRun) -> ClaimedRun:
        """``started`` as the run its worker gets (its job row as the claim built it; the same outcomes object: what the
        steps record is committed)."""
        if isinstance(started, ClaimedRun):
            return started
        return cls(run_id=started.run_id, dispatch_id=started.dispatch_id, dispatch_kind=started.dispatch_kind,
                   job=started.job, attempt=started.attempt,
                   scheduled_for=started.scheduled_for, started_at=started.started_at, parent_run_id=started.parent_run_id,
                   source_run_id=started.source_run_id, outcomes=started.outcomes, queued_at=started.queued_at)
