"""The claimed run: what a worker and the run pipeline's steps know of a run the dispatcher started.

The claim transaction (``scheduler.core.queue.claim_and_start``) hands back ``ClaimedRun``s
(``StartedRun`` is its name there) whose job is the ``JobRow`` it built at its read; the same
object reaches the worker, so everything downstream (the worker, the steps, the supervision and
the completion of the pass) reads the job as that typed row.
"""

from __future__ import annotations

import attrs

from scheduler.core.outcomes import RunOutcomes
from scheduler.core.rows import JobRow


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
    def of(cls, started: ClaimedRun) -> ClaimedRun:
        """``started`` as the run its worker gets: the claim's own object (its job row as the claim built it; the same
        outcomes object: what the steps record is committed)."""
        return started
