"""A test-only third-party pipeline step (see README.md): records what the pipeline asked of it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from scheduler_toolkit.canonical import hash_text
from scheduler_toolkit.steps import Run, StepBase

#: The command (a ``testkit`` executor script) of the jobs this step takes part in.
MARKER_COMMAND = "echo:step-testkit"


class MarkerStep(StepBase):
    """Runs after authorization in runs of ``MARKER_COMMAND`` jobs; records each hook as a runtime event."""

    name = "testkit-marker"
    runs_after = "authorization"

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Only jobs whose command is ``MARKER_COMMAND`` (every other job's plan leaves this step out)."""
        return sections["command"]["payload_sha256"] == hash_text(MARKER_COMMAND)

    def before(self, run: Run) -> None:
        """Record that the step ran before execution."""
        run.outcomes.record("steptestkit.before", {"identity": run.outcomes.columns.get("principal")})

    @contextmanager
    def around(self, run: Run) -> Iterator[None]:
        """Record entering and leaving the execution."""
        run.outcomes.record("steptestkit.around", {"phase": "enter"})
        try:
            yield
        finally:
            run.outcomes.record("steptestkit.around", {"phase": "exit"})

    def after(self, run: Run, result: Any) -> Any:
        """Record the result's status; the result is unchanged."""
        run.outcomes.record("steptestkit.after", {"status": result.status, "executed": run.executed})
        return result
