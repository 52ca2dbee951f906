"""Handoff v4 as core's submitted artifact kind (``scheduler.core.submissions.SubmittedKind``).

Core's job storage takes a handoff v4 submission out of a spec object and keeps a bound job
from drifting away from its artifact through this adapter; the composition root
(``scheduler.runtime``) installs it. What a submission is and how it is proven stays in
``scheduler.artifacts.handoff``.
"""

from __future__ import annotations

from typing import Any

import attrs

from scheduler.artifacts.handoff import HANDOFF_VERSION, SUBMISSION_FIELDS, Submission, job_binding_digest, split_submission
from scheduler.core.spec import JobSpec


@attrs.frozen
class HandoffKind:
    """Handoff v4 submissions: the four ``SUBMISSION_FIELDS`` of a spec object, bound by ``job_binding_digest``."""

    version: int = HANDOFF_VERSION
    fields: tuple[str, ...] = SUBMISSION_FIELDS

    def split(self, obj: dict[str, Any]) -> tuple[dict[str, Any], Submission | None]:
        """``split_submission``: the spec object without the submission keys, and the shape-checked submission."""
        return split_submission(obj)

    def binding_digest(self, spec: JobSpec) -> str:
        """``job_binding_digest``: what ``scheduler_job_binding.digest`` of the job's artifact must be."""
        return job_binding_digest(spec)


#: The one handoff kind the composition root installs.
HANDOFF_KIND = HandoffKind()
