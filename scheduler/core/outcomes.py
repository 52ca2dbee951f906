"""The run pipeline's shared record: what the steps around execution decided, committed with the run.

The steps (``scheduler.core.steps``, registered in order by ``scheduler.pipeline``) run as one
plan per run: ``claim -> artifact check -> governance -> identity & trust -> proofs ->
authorization -> credentials materialised -> execute -> credentials cleaned -> evidence attest ->
completion``. Each writes what it decided into the run's ``RunOutcomes``; the completion
transaction commits those run columns, events and the evidence row together with the terminal
state, so a run's record and its decisions never disagree. A step that denies raises
``SchedulerError``: the run ends ``error`` with that code and the payload never starts, but what
was decided so far is still committed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from scheduler.core.rows import JSONObject, SQLValue


@attrs.define
class RunOutcomes:
    """Decisions of one run, gathered in its worker and committed by the completion transaction."""

    #: Extra ``runs`` columns (``identity_json``, ``trust_level``, ``governance_json``, ``credentials_json``, ...).
    columns: dict[str, SQLValue] = attrs.Factory(dict)
    #: Runtime events to append in the completion transaction: ``(kind, data)``.
    events: list[tuple[str, Mapping[str, object]]] = attrs.Factory(list)
    #: The evidence row to insert with the terminal state (built by ``scheduler.evidence.attest``), or None.
    evidence: JSONObject | None = None
    #: When set, the completion enqueues no delivery and triggers no children (a failed required attestation).
    suppress_consequences: bool = False
    #: The resolved identity (``scheduler.pipeline.identity``), handed to later steps, evidence and events.
    identity: Any = None
    #: Set by ``scheduler.pipeline.authorization`` when its provider escalated (gate_kind, risk_level, reason): the completion
    #: transaction opens an approval gate (run ``awaiting_approval``) instead of ending the run.
    escalate: dict[str, str] | None = None

    def record(self, kind: str, data: Mapping[str, object]) -> None:
        """Queue a runtime event for the completion transaction."""
        self.events.append((kind, data))
