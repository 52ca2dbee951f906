"""The proof step as a participant in completion: the window an escalation's approval gate keeps."""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.core.outcomes import RunOutcomes
from scheduler.pipeline.proofs.step import approval_columns


class ProofGateWindow:
    """Completion's ``ProofWindow``: the verified proof's window, re-checked when the escalated run resumes."""

    def gate_columns(self, outcomes: RunOutcomes) -> Mapping[str, int | None]:
        """``proof_not_before``, ``proof_expires_at`` and ``proof_clock_skew_ms`` of the run's verified proof, or nothing."""
        return approval_columns(outcomes)
