"""Evidence: the pipeline step attesting a run's evidence payload (to be filled in)."""

from __future__ import annotations

from typing import Any

from scheduler.execution import ExecutionResult
from scheduler.pipeline import RunOutcomes


def attest_run(store: Any, started: Any, spec: Any, result: ExecutionResult, outcomes: RunOutcomes) -> ExecutionResult:
    """Attest the run's evidence when its job declares it; the row goes into ``outcomes.evidence``."""
    return result


def insert_record(tx: Any, run: dict[str, Any], record: dict[str, Any], *, now: int) -> None:
    """Insert the run's evidence row inside its completion transaction."""
    raise NotImplementedError
