"""The participants completion and crash recovery get by default: delivery, evidence, proofs, credentials, executors.

The composition root (``scheduler.runtime``) puts these in ``scheduler.core.parts.Parts``
(``completion`` and ``recovery``); core calls them through the Protocols of
``scheduler.core.participants`` and never imports them. Tests that drive completion or
recovery directly use the same functions, so they exercise what ``scheduler run`` wires.
"""

from __future__ import annotations

from typing import Any

from scheduler.core.participants import CompletionParticipants, RecoveryParticipants
from scheduler.delivery.participant import DeliveryOutbox
from scheduler.evidence.participant import EvidenceParticipant
from scheduler.pipeline.credentials.recovery import CredentialRecovery
from scheduler.pipeline.proofs.completion import ProofGateWindow
from scheduler.plugins.loader import load_provider


def load_executor(name: str) -> Any:
    """Recovery's ``ExecutorSource``: the executor plugin ``name``, loaded afresh (``SchedulerError`` when it cannot load)."""
    return load_provider("executor", name)


def default_completion_participants() -> CompletionParticipants:
    """Completion's participants: the delivery outbox, the evidence rows, the proof step's gate window."""
    return CompletionParticipants(outbox=DeliveryOutbox(), evidence=EvidenceParticipant(), proofs=ProofGateWindow())


def default_recovery_participants() -> RecoveryParticipants:
    """Recovery's participants: executors loaded by name, the credentials step's cleanup, the evidence rows, the outbox."""
    return RecoveryParticipants(executors=load_executor, credentials=CredentialRecovery(), evidence=EvidenceParticipant(),
                                outbox=DeliveryOutbox())
