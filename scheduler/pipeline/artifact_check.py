"""The artifact check: the first thing every run does, and the artifact kinds beyond native it can prove.

Before any other step, the job as claimed must still project to the execution artifact it is
bound to, and the run plan is derived from that artifact (``scheduler.core.artifact.bind_plan``,
which the dispatcher calls first: ``EXECUTION_ARTIFACT_*``, ``HANDOFF_ARTIFACT_*``,
``PIPELINE_*`` refusals). A native artifact is the kernel's own projection; a job bound to a
compiled handoff v4 artifact is proven by this step (``check_binding``): its stored artifact is
loaded and validated against the row and the spec exactly (``scheduler.artifacts.handoff``).
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.artifacts.handoff import HANDOFF_VERSION, check_bound_job
from scheduler.core.spec import JobSpec
from scheduler.core.steps import StepBase
from scheduler.core.store.base import Tx


class ArtifactCheckStep(StepBase):
    """Proves jobs bound to handoff v4 artifacts (native ones the kernel recomputes itself)."""

    name = "artifact"

    def check_binding(self, tx: Tx, row: Mapping[str, object], spec: JobSpec) -> bool:
        """A handoff v4 job agrees exactly with its stored artifact (raises ``HANDOFF_ARTIFACT_*`` / ``EXECUTION_ARTIFACT_*``)."""
        if row.get("handoff_version") != HANDOFF_VERSION:
            return False
        check_bound_job(tx, dict(row), spec)
        return True
