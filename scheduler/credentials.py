"""Credentials: the pipeline step presenting a job's credential bindings to its run (to be filled in)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from scheduler.pipeline import RunOutcomes


@contextmanager
def presented(store: Any, started: Any, spec: Any, executor: Any, outcomes: RunOutcomes) -> Iterator[tuple[Any, ...]]:
    """Materialise the job's credentials for the run, and clean them up on every path."""
    yield ()
