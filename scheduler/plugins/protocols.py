"""One typed Protocol per provider kind.

Every provider declares ``plugin_api`` (the major version of this API it was
written for, compared with ``scheduler.PLUGIN_API_VERSION`` before use) and
``capabilities`` (a set of strings the kernel and governance read; a provider
never claims enforcement it does not really do).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from scheduler.execution import ExecutionRequest, ExecutionResult, RunControl


@runtime_checkable
class Executor(Protocol):
    """Runs a job's payload (group ``scheduler.executors``)."""

    plugin_api: int
    capabilities: frozenset[str]

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        """Run one attempt; honour ``control`` cancellation and ``request.deadline_ms``."""


@runtime_checkable
class Channel(Protocol):
    """Delivers an outbox part to an external destination (group ``scheduler.channels``)."""

    plugin_api: int
    capabilities: frozenset[str]

    def deliver(self, target: str | None, body: str, *, idempotency_key: str, attachments: list[dict[str, Any]]) -> dict[str, Any]:
        """Send one part; return a receipt; raise ``SchedulerError`` (retryable unless its code says otherwise)."""


@runtime_checkable
class EvidenceProvider(Protocol):
    """Signs or verifies canonical evidence payloads (group ``scheduler.evidence_providers``)."""

    plugin_api: int
    capabilities: frozenset[str]

    def sign(self, payload: bytes, declaration: dict[str, Any]) -> dict[str, Any]:
        """Produce an evidence envelope for the canonical payload bytes."""

    def verify(self, payload: bytes, envelope: dict[str, Any], declaration: dict[str, Any]) -> dict[str, Any]:
        """Verify an envelope against the payload; raise ``SchedulerError`` on any mismatch (fail closed)."""


@runtime_checkable
class CredentialProvider(Protocol):
    """Resolves credential bindings to values at run time (group ``scheduler.credential_providers``)."""

    plugin_api: int
    capabilities: frozenset[str]

    def resolve(self, binding: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        """Return ``{"values": [...], "expires_at": ms|None}``; values are never persisted by the kernel."""


@runtime_checkable
class AuthorizationProvider(Protocol):
    """Decides an ``authorization_ref`` (group ``scheduler.authorization_providers``)."""

    plugin_api: int
    capabilities: frozenset[str]

    def authorize(self, ref: str, request: dict[str, Any]) -> dict[str, Any]:
        """Return ``{"allow": bool, "reason": str}``; any error or missing answer means deny."""


#: Provider kind -> (entry-point group, Protocol). The single table the loader and the docs test read.
PROVIDER_KINDS: dict[str, tuple[str, type]] = {
    "executor": ("scheduler.executors", Executor),
    "channel": ("scheduler.channels", Channel),
    "evidence": ("scheduler.evidence_providers", EvidenceProvider),
    "credential": ("scheduler.credential_providers", CredentialProvider),
    "authorization": ("scheduler.authorization_providers", AuthorizationProvider),
}

#: Every entry-point group the kernel knows, in display order.
GROUPS: tuple[str, ...] = (
    "scheduler.executors",
    "scheduler.channels",
    "scheduler.evidence_providers",
    "scheduler.credential_providers",
    "scheduler.authorization_providers",
    "scheduler.stores",
    "scheduler.hooks",
)
