"""Identity and trust: the pipeline step resolving who a run acts as (to be filled in)."""

from __future__ import annotations

from typing import Any

from scheduler.pipeline import RunOutcomes


def resolve(store: Any, started: Any, spec: Any, outcomes: RunOutcomes) -> None:
    """Resolve the run's identity and trust level into ``outcomes`` (raises on a delegation failure)."""
