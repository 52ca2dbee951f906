"""The approval gate: the pipeline step that owns the ``approval_*`` fields and opens the gate when a dispatch is claimed.

A job with ``approval_required`` waits before anything of its run starts: its claim opens the
gate in the claim transaction (``gates`` / ``open_gate``: the run in ``awaiting_approval``
beside a ``pending`` approval, ``scheduler.approvals.decisions``). An approved run is claimed
again by exactly one dispatcher and runs its plan, the same one (the approval snapshots the
artifact digest the plan is derived from), from the artifact check on: nothing of it ran
before the gate. An authorization provider's ``escalate`` waits at the same kind of gate
(``gate_kind`` ``authorization``), opened by the completion transaction; on that resume the
steps before the gate decide again (the proof is re-checked, the approval is the permit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scheduler.approvals.decisions import open_gate
from scheduler.core.rows import JobRow, JSONObject
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Gate, Normaliser, Problems, StepBase
from scheduler.core.store.base import Tx

#: The only colon form of a scope: ``uid:`` and a decimal uid (a user name never holds a colon).
_UID_SCOPE = re.compile(r"^uid:[0-9]{1,10}$")


class ApprovalStep(StepBase):
    """Every dispatch of an ``approval_required`` job waits for a decision before its run starts."""

    name = "approval"
    fields: Mapping[str, Normaliser | None] = {"approval_required": None, "approval_timeout_s": None, "approval_timeout_action": None,
              "approval_risk_level": None, "approval_approver_scope": None}
    sections = ("approval",)

    def project(self, spec: JobSpec) -> JSONObject:
        """What an approval of this job's runs decides under."""
        return {"approval": {
            "required": spec.approval_required,
            "timeout_s": spec.approval_timeout_s,
            "timeout_action": spec.approval_timeout_action,
            "risk_level": spec.approval_risk_level,
            "approver_scope": spec.approval_approver_scope,
        }}

    def check(self, values: Mapping[str, Any], problems: Problems) -> None:
        """A scope must be one that some account can match; a scoped gate never auto-approves."""
        scope = values.get("approval_approver_scope")
        if isinstance(scope, str) and ":" in scope and not _UID_SCOPE.match(scope):
            # "uid:abc" (or any other colon form) names no account: nobody could ever approve the gate
            problems.add("approval_approver_scope", "must be a local user name or uid:N with N a decimal uid", "INVALID_SCOPE")
        if values.get("approval_approver_scope") and values.get("approval_timeout_action") == "approve":
            problems.add("approval_timeout_action", "a scoped approval gate cannot auto-approve on timeout", "CONFLICT")

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Jobs whose runs need an approval."""
        return bool((sections.get("approval") or {}).get("required"))

    def gates(self, job: JobRow) -> bool:
        """A claimed dispatch of an ``approval_required`` job waits at the gate."""
        return bool(job.approval_required)

    def open_gate(self, tx: Tx, gate: Gate) -> None:
        """Open the gate for the claimed dispatch (run ``awaiting_approval``, approval ``pending``, a notice)."""
        open_gate(tx, run_id=gate.run_id, job=gate.job, dispatch_id=gate.dispatch_id, dispatch_kind=gate.dispatch_kind,
                  attempt=gate.attempt, scheduled_for=gate.scheduled_for, parent_run_id=gate.parent_run_id,
                  retry_of_run_id=gate.retry_of_run_id, replay_of_run_id=gate.replay_of_run_id, now=gate.now, actor=gate.actor)
