"""``execution_sections`` reads the trust declarations as JobSpec attributes, never with a silent default.

Every JobSpec has ``credentials``, ``child_credential_policy``, ``authorization_ref``, ``authorization``,
``authorization_proof``, ``evidence`` and ``evidence_ref``; an object that lacks one is not a job spec, and
projecting it must fail loudly rather than produce a digest as if the field were unset (the digests
themselves are pinned by tests/test_execution_artifacts.py and tests/test_handoff.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.artifact import execution_sections
from scheduler.core.spec import validate_spec
from scheduler.core.steps import StepBase, installed_as, registered

FIELDS = ("credentials", "child_credential_policy", "authorization_ref", "authorization", "authorization_proof", "evidence")


class Hiding:
    """A JobSpec with one attribute taken away (everything else delegated)."""

    def __init__(self, spec: Any, hidden: str) -> None:
        self._spec, self._hidden = spec, hidden

    def __getattr__(self, name: str) -> Any:
        if name == self._hidden:
            raise AttributeError(name)
        return getattr(self._spec, name)


@pytest.mark.parametrize("hidden", FIELDS)
def test_a_spec_without_a_trust_field_is_refused_not_defaulted(hidden: str) -> None:
    spec = validate_spec({"name": "s", "schedule_kind": "manual", "payload_message": "true"}, plugin_options=False)
    assert execution_sections(Hiding(spec, "nothing")) == execution_sections(spec)
    with pytest.raises(AttributeError):
        execution_sections(Hiding(spec, hidden))


def test_a_section_reading_a_field_outside_the_contract_fails_loudly() -> None:
    """Sections are cached per contract column values, shared by jobs that differ in name, schedule, retries...
    (``NON_CONTRACT_FIELDS``): a step whose section read one of those would be served another job's projection,
    so the view it projects refuses it."""
    class Reads(StepBase):
        name = "reads"
        sections = ("read",)

        def __init__(self, read: Any) -> None:
            self.read = read

        def project(self, spec: Any) -> dict[str, Any]:
            return {"read": self.read(spec)}

    spec = validate_spec({"name": "s", "schedule_kind": "manual", "payload_message": "true"}, plugin_options=False)
    for read in (lambda s: s.name, lambda s: s.schedule_at, lambda s: s.retention, lambda s: s.schedule(), lambda s: s.to_json()):
        with installed_as([*registered().steps, Reads(read)]), pytest.raises(AttributeError, match="only the execution contract"):
            execution_sections(spec)
    with installed_as([*registered().steps, Reads(lambda s: [s.executor_name(), s.payload_message, s.provenance])]):
        assert execution_sections(spec)["read"] == ["shell", "true", "user_added"]
