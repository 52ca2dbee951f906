"""Governance: the pipeline step that refuses what the job's executor cannot enforce (to be filled in)."""

from __future__ import annotations

from typing import Any

from scheduler.pipeline import RunOutcomes


def evaluate(spec: Any, executor: Any, outcomes: RunOutcomes) -> None:
    """Deny (``SCHEDULER_GOVERNANCE_DENIED``) a run whose constraints its executor does not enforce."""
