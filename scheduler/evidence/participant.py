"""Evidence as a participant in completion and recovery: the rows behind ``scheduler.core.participants.EvidenceRows``."""

from __future__ import annotations

from typing import Any

from scheduler.core.outcomes import RunOutcomes
from scheduler.core.participants import Run
from scheduler.core.store.base import Tx
from scheduler.evidence.attest import interrupt
from scheduler.evidence.store import insert_record, record_interrupted


class EvidenceParticipant:
    """Completion's and recovery's ``EvidenceRows``: the evidence store (``scheduler.evidence.store``)."""

    def insert(self, tx: Tx, run: Run, record: dict[str, Any], *, now: int) -> None:
        """Insert the row the pipeline attested for ``run`` (or its interrupted row, for an abandoned run)."""
        insert_record(tx, run, record, now=now)

    def interrupted(self, tx: Tx, run: Run, *, now: int, actor: str | None, error_code: str = "INTERRUPTED") -> bool:
        """The ``interrupted`` row of a run ended without its attestation, when its artifact declares evidence."""
        return record_interrupted(tx, run, now=now, actor=actor, error_code=error_code)

    def interrupt(self, outcomes: RunOutcomes, code: str) -> None:
        """Mark the outcomes of a run committed without its worker: its completion inserts an ``interrupted`` row."""
        interrupt(outcomes, code)

