"""Evidence: the pipeline step that owns the ``evidence`` / ``evidence_ref`` fields and attests each run's evidence.

After execution and after the credentials are cleaned up, a job declaring ``evidence`` gets its
run's payload attested by the declared provider (``scheduler.evidence.attest``); the row commits
with the terminal state. An escalated run is not finished (it waits for an approval): no evidence
yet. The declaration's validation is ``scheduler.evidence.declaration``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from scheduler.core.artifact import redact_secrets, section_problems
from scheduler.core.execution import ExecutionResult
from scheduler.core.rows import JSONObject
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Normaliser, Problem, Problems, Run, StepBase
from scheduler.evidence.attest import attest_run
from scheduler.evidence.declaration import check_evidence_ref, normalise, provider_problems
from scheduler.plugins.options import provider_for

log = logging.getLogger(__name__)


def _normalise_ref(value: object, field: str) -> tuple[str | None, list[Problem]]:
    found = check_evidence_ref(value, field)
    return (None if found or not isinstance(value, str) else value), found


class EvidenceStep(StepBase):
    """Attest the run's evidence (the last step: after the credentials are cleaned)."""

    name = "evidence"
    fields: Mapping[str, Normaliser | None] = {"evidence": normalise, "evidence_ref": _normalise_ref}
    sections = ("evidence",)

    def project(self, spec: JobSpec) -> JSONObject:
        """The normalised declaration with its ``evidence_ref`` (secrets redacted), null when none."""
        return {"evidence": redact_secrets({**spec.evidence, "ref": spec.evidence_ref}) if spec.evidence else None}

    def check(self, values: Mapping[str, Any], problems: Problems) -> None:
        """``evidence_ref`` labels evidence rows: not without evidence."""
        if values.get("evidence_ref") is not None and values.get("evidence") is None and not problems.has("evidence"):
            problems.add("evidence_ref", "is only valid with evidence", "CONFLICT")

    def check_installed(self, spec: JobSpec) -> tuple[JSONObject, list[Problem]]:
        """The declaration against its provider: methods it performs, its ``provider_config``."""
        if not spec.evidence:
            return {}, []
        evidence, found = provider_problems(spec.evidence, provider_for)
        return ({} if evidence is None else {"evidence": evidence}), found

    def check_section(self, name: str, value: object, sections: Mapping[str, Any]) -> list[Problem]:
        """A compiled declaration must be one ``jobs add`` accepts, with its ``ref`` (a label, or null)."""
        if value is None:
            return []
        if not isinstance(value, dict):
            return section_problems(normalise(value, "evidence")[1])
        found = section_problems(normalise({k: v for k, v in value.items() if k != "ref"}, "evidence")[1])
        if "ref" not in value:
            found.append({"field": "evidence.ref", "code": "REQUIRED", "error": "is required: the job's evidence_ref label, or null"})
        elif value["ref"] is not None:
            found += section_problems(check_evidence_ref(value["ref"], "evidence.ref"))
        return found

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Jobs that declare evidence."""
        return sections.get("evidence") is not None

    def after(self, run: Run, result: ExecutionResult) -> ExecutionResult:
        """Attest the run (never for an escalated run); a crash while attesting fails the run, never leaves it open."""
        if run.outcomes.escalate is not None:
            return result
        try:
            return attest_run(run.store, run.started, run.spec, result, run.outcomes)
        except Exception as exc:  # attestation must never leave a run unfinished
            log.exception("evidence attestation of run %s crashed", run.started.run_id)
            return ExecutionResult(status="error", error_code="EVIDENCE_ATTESTATION_FAILED",
                                   error_message=f"evidence attestation crashed: {type(exc).__name__}: {exc}")
