"""The participants of completion and crash recovery: what core calls there, and the layers above implement.

Completion (``scheduler.core.completion``) and recovery (``scheduler.core.recovery``) own the
order of everything they do; a few of the things they do belong to a feature or a pipeline
step above core. Core names each of those here as a small Protocol, the feature implements
it, and the composition root hands the implementations to core in ``scheduler.core.parts.Parts``
(``completion`` and ``recovery``), bundled below. Core never imports a feature or a step.

Completion, inside the one completion transaction (all of it commits, or none of it):

* ``Outbox``: enqueue delivery (a run's result, a watchdog alert, a notification, an approval
  notice), the only way a message leaves;
* ``EvidenceRows``: insert the evidence row the pipeline built with the terminal state;
* ``ProofWindow``: the verified proof's window, kept on the approval gate an escalation opens.

Recovery, for each orphaned run, in this order: ``ExecutorSource`` (the run's executor makes
sure its work is gone), ``CredentialCleanup`` (its credential files are removed, or the job is
paused), then the crash transaction with ``EvidenceRows.interrupted`` and the crashed run's
consequences (messages through the ``Outbox``); after the orphans, ``CredentialCleanup.sweep``.
Credentials are cleaned before evidence is written, as in a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from scheduler.core.outcomes import RunOutcomes
from scheduler.core.rows import JSONObject
from scheduler.core.store.base import Store, Tx

#: A run row as the store returns it, or the part of one a participant needs (``id`` and ``job_id`` at least).
Run = dict[str, Any]
#: An attachment staged with an outbox message (``name``, ``mime_type``, ``size_bytes``, ``sha256``, ``content`` or ``path``).
Attachment = dict[str, Any]


class Outbox(Protocol):
    """Enqueue delivery: messages that leave through channels, written in the transaction that decided them."""

    def enqueue(self, tx: Tx, run: Run, channel: str, target: str | None, body: str, group: str, now: int, *,
                attachments: tuple[Attachment, ...] = ()) -> int:
        """Enqueue one message about ``run`` for ``channel``; idempotent on ``group``; returns how many parts were new."""

    def attachments(self, run: Run, channel: str, body: str) -> tuple[Attachment, ...]:
        """What the message ``body`` about ``run`` carries as files on ``channel`` (its complete output when it
        does not fit in the message and the channel takes files), or nothing."""


class EvidenceRows(Protocol):
    """Insert evidence: the run's terminal evidence row, in the transaction that ends the run."""

    def insert(self, tx: Tx, run: Run, record: JSONObject, *, now: int) -> None:
        """Insert the evidence row the pipeline built (``RunOutcomes.evidence``) for the finished ``run``."""

    def interrupted(self, tx: Tx, run: Run, *, now: int, actor: str | None, error_code: str = "INTERRUPTED") -> bool:
        """Give a run ended without its attestation (a crash, a failed completion) its ``interrupted`` row when its
        artifact declares evidence; False when it gets none."""

    def interrupt(self, outcomes: RunOutcomes, code: str) -> None:
        """Mark ``outcomes`` of a run committed without its worker: its completion inserts an ``interrupted`` row."""


class ProofWindow(Protocol):
    """The proof step's part of an escalation: the approval gate keeps the window of the proof the run verified."""

    def gate_columns(self, outcomes: RunOutcomes) -> Mapping[str, int | None]:
        """The ``approvals`` columns of the verified proof's window (empty when the run verified no proof)."""


class ExecutorSource(Protocol):
    """Where recovery gets a run's executor, to ask its ``recover`` whether the run's work is gone."""

    def __call__(self, name: str) -> Any:
        """The executor plugin ``name``, loaded; raises ``SchedulerError`` when it cannot be loaded."""


class CredentialCleanup(Protocol):
    """Clean credentials after a crash: what a dead run presented is removed before the run is ended."""

    def clean(self, store: Store, run: Run) -> tuple[bool, str | None]:
        """Remove what the dead ``run`` presented; ``(True, None)`` when cleanup is proven, else ``(False, reason)``."""

    def block_job(self, tx: Tx, run: Run, reason: str, *, actor: str, now: int) -> None:
        """Pause the job of a run whose cleanup cannot be proven (inside the recovery transaction)."""

    def sweep(self, store: Store) -> None:
        """Clean what finished runs of dead dispatchers left presented (after the orphans are ended)."""


@attrs.frozen(kw_only=True)
class CompletionParticipants:
    """What the completion transaction calls above core (``Parts.completion``)."""

    outbox: Outbox
    evidence: EvidenceRows
    proofs: ProofWindow


@attrs.frozen(kw_only=True)
class RecoveryParticipants:
    """What crash recovery calls above core (``Parts.recovery``)."""

    executors: ExecutorSource
    credentials: CredentialCleanup
    evidence: EvidenceRows
    outbox: Outbox
