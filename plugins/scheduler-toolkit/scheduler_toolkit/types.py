"""The contract's second tier: value types nested in what a provider receives or returns, and the kernel's vocabularies.

``scheduler.api`` holds the provider Protocols and the requests and results their methods
take and give. What those carry inside, what optional members return and the names the
kernel reads are here:

* executors: ``Constraints``, ``TriggerContext``, ``CredentialPresentation`` (inside an
  ``ExecutionRequest``), ``CancellationToken`` (the cancellation half of a ``RunControl``),
  ``EXECUTION_STATUSES``;
* channels: ``ChannelLimits`` (what a channel declares as ``limits``), ``DeliveryError`` (the
  base of the transient and permanent delivery errors);
* credentials: ``CredentialPresent`` (inside a ``CredentialBinding``), ``ProviderSessions``
  and ``SESSION_STATUSES`` (``CredentialContext.sessions``), ``RefreshResult``,
  ``RevokeResult`` and ``REVOKE_CODES`` (what ``refresh`` and ``revoke`` return);
* proof verifiers: ``ProofRequest`` (what ``verify_proof`` is handed);
* the job: ``JobSpec`` (``ExecutionRequest.job``);
* vocabularies: ``KNOWN_CAPABILITIES`` (the capability names governance reads) and
  ``ErrorCode`` (the registry of the kernel's own error codes; docs/cli.md explains each).

The kernel's own types, re-exported.
"""

from __future__ import annotations

from scheduler.base.errors import ErrorCode
from scheduler.core.execution import EXECUTION_STATUSES, CancellationToken, Constraints, CredentialPresentation, TriggerContext
from scheduler.core.spec import JobSpec
from scheduler.plugins.protocols import (
    KNOWN_CAPABILITIES,
    REVOKE_CODES,
    SESSION_STATUSES,
    ChannelLimits,
    CredentialPresent,
    DeliveryError,
    ProofRequest,
    ProviderSessions,
    RefreshResult,
    RevokeResult,
)

__all__ = [
    "EXECUTION_STATUSES",
    "KNOWN_CAPABILITIES",
    "REVOKE_CODES",
    "SESSION_STATUSES",
    "CancellationToken",
    "ChannelLimits",
    "Constraints",
    "CredentialPresent",
    "CredentialPresentation",
    "DeliveryError",
    "ErrorCode",
    "JobSpec",
    "ProofRequest",
    "ProviderSessions",
    "RefreshResult",
    "RevokeResult",
    "TriggerContext",
]
