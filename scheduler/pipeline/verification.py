"""Post-success verification: the pipeline step that owns the ``verify_*`` fields and their artifact section.

The check itself (``verify_shell``, run after a successful command, limited by
``verify_timeout_s``, ``verify_on_failure`` deciding error or warning) is run by the executor,
which declares the ``verify`` capability (governance refuses a job whose executor lacks it).
This step is what the kernel knows of it: the fields, their validation (by their declared
kinds) and the ``verification`` section of the execution artifact.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.base.canonical import hash_text
from scheduler.core.rows import JSONObject
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Normaliser, StepBase


class VerificationStep(StepBase):
    """The ``verify_*`` fields and the ``verification`` section (no hook in the run: the executor runs the check)."""

    name = "verification"
    fields: Mapping[str, Normaliser | None] = {"verify_shell": None, "verify_timeout_s": None, "verify_on_failure": None}
    sections = ("verification",)

    def project(self, spec: JobSpec) -> JSONObject:
        """The check as a digest (never its text), its limit and what a failure does."""
        return {"verification": {
            "shell_sha256": None if spec.verify_shell is None else hash_text(spec.verify_shell),
            "timeout_s": spec.verify_timeout_s,
            "on_failure": spec.verify_on_failure,
        }}
