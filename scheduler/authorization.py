"""authorization_ref: the pipeline step asking the job's authorization provider (to be filled in)."""

from __future__ import annotations

from typing import Any

from scheduler.pipeline import RunOutcomes


def decide(store: Any, started: Any, spec: Any, outcomes: RunOutcomes) -> None:
    """Ask the job's ``authorization_ref`` provider; any failure denies (raises), ``escalate`` opens the approval gate."""
