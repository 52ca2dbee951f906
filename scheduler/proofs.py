"""Authorization proofs: the pipeline step verifying a run's proof and claiming it once (to be filled in)."""

from __future__ import annotations

from typing import Any

from scheduler.pipeline import RunOutcomes


def verify(store: Any, started: Any, spec: Any, outcomes: RunOutcomes) -> None:
    """Verify the job's ``authorization_proof`` for this dispatch and claim its id in the replay ledger."""
