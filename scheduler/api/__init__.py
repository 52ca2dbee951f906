"""The public plugin API: the one module a plugin imports.

Everything a third-party executor, channel, evidence, credential or authorization
provider needs is importable from here: the provider Protocols and the types they
exchange with the kernel, ``RunControl``, the output stream recorder and the
structured-output parser, json-sort-v1 canonical JSON and ``sha256:`` digests (what evidence
and artifacts are bound by), the checks every evidence provider makes of its payload and
envelopes (``check_payload``, ``envelope_parts`` ...; ``scheduler.evidence.payload``), what
every HTTP channel does with failures and attachments (``error_for_status``,
``error_for_exception``, ``retry_after_seconds``, ``endpoint_label``, ``read_attachment``,
``PooledHttpClient``;
``scheduler.toolkit.channel_support``), what every executor that prompts a language model does with
untrusted text (``sanitise_text``, ``fold_text``, ``find_injection``, ``INJECTION_PATTERNS``;
``scheduler.toolkit.prompt_safety``), the error type and the registry of kernel error codes,
``hookimpl`` for pluggy hook modules, the run step contract for a ``scheduler.steps``
entry point (``Step``, ``StepBase``, ``Run``), option and settings helpers, and
``PLUGIN_API_VERSION``. Store plugins use ``scheduler.api.store``; executors that
manage processes use ``scheduler.api.process``. Plugin tests use ``scheduler.testing``.

A test fails when anything under ``plugins/``, ``providers/`` or ``examples/``
imports another kernel module, so this module is the whole contract: if a plugin
needs more, this API grows (and ``PLUGIN_API_VERSION`` says when it breaks).
"""

from __future__ import annotations

from scheduler import PLUGIN_API_VERSION
from scheduler.core.outputs import DEFAULT_EXCERPT_BYTES, DEFAULT_OFFLOAD_BYTES, StreamRecorder, read_artifact
from scheduler.base.canonical import (
    CANONICALIZATION,
    UNDEFINED,
    canonical_bytes,
    canonical_digest,
    canonical_json,
    hash_bytes,
    hash_text,
    is_digest,
)
from scheduler.toolkit.channel_support import (
    PooledHttpClient,
    endpoint_label,
    error_for_exception,
    error_for_status,
    read_attachment,
    retry_after_seconds,
)
from scheduler.base.errors import ErrorCode, SchedulerError
from scheduler.toolkit.http_request import AbortableRequest
from scheduler.evidence.payload import (
    PAYLOAD_FORMAT,
    CheckedPayload,
    EvidenceFailure,
    StrictJSONError,
    check_bound_payload,
    check_keys,
    check_payload,
    check_requested_methods,
    declared_options,
    envelope_parts,
    parse_canonical,
    requested_methods,
    strict_json,
)
from scheduler.core.execution import (
    EXECUTION_STATUSES,
    CancellationToken,
    Constraints,
    CredentialPresentation,
    ExecutionRequest,
    ExecutionResult,
    RecoveryOutcome,
    RecoveryRequest,
    RunControl,
    StreamCapture,
    TriggerContext,
)
from scheduler.base.options import build_options, catalogue, options_to_json
from scheduler.plugins.hookspecs import hookimpl
from scheduler.plugins.protocols import (
    KNOWN_CAPABILITIES,
    AuthorizationDecision,
    AuthorizationProvider,
    AuthorizationRequest,
    Channel,
    ChannelLimits,
    CredentialBinding,
    CredentialContext,
    CredentialPresent,
    CredentialProvider,
    DeliveryError,
    DeliveryPart,
    DeliveryReceipt,
    DeliveryRoute,
    EvidenceDeclaration,
    EvidenceEnvelope,
    EvidencePayload,
    EvidenceProvider,
    EvidenceVerification,
    Executor,
    SESSION_STATUSES,
    PermanentDeliveryError,
    ProviderSessions,
    RefreshResult,
    REVOKE_CODES,
    ResolvedCredential,
    RevokeResult,
    TransientDeliveryError,
)
from scheduler.pipeline.identity import TRUST_LEVELS, Delegation, ResolvedIdentity
from scheduler.pipeline.credentials.sessions import MemoryProviderSessions
from scheduler.toolkit.prompt_safety import INJECTION_PATTERNS, find_injection, fold_text, sanitise_text
from scheduler.settings import SecretRef, plugin_settings, register_secret_scheme, reload_settings
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Run, Step, StepBase
from scheduler.core.structured import structured_from_capture, unparsed_record
from scheduler.base.timeutil import now_ms, to_iso

__all__ = [
    "AbortableRequest",
    "CANONICALIZATION",
    "UNDEFINED",
    "AuthorizationDecision",
    "AuthorizationProvider",
    "AuthorizationRequest",
    "CancellationToken",
    "Channel",
    "canonical_bytes",
    "canonical_digest",
    "canonical_json",
    "hash_bytes",
    "hash_text",
    "is_digest",
    "ChannelLimits",
    "Constraints",
    "CredentialBinding",
    "CredentialContext",
    "CredentialPresent",
    "CredentialPresentation",
    "CredentialProvider",
    "DEFAULT_EXCERPT_BYTES",
    "DEFAULT_OFFLOAD_BYTES",
    "DeliveryError",
    "DeliveryPart",
    "DeliveryReceipt",
    "DeliveryRoute",
    "EXECUTION_STATUSES",
    "ErrorCode",
    "EvidenceDeclaration",
    "EvidenceEnvelope",
    "EvidencePayload",
    "EvidenceProvider",
    "EvidenceVerification",
    # evidence-provider checks (scheduler.evidence.payload)
    "PAYLOAD_FORMAT",
    "CheckedPayload",
    "EvidenceFailure",
    "StrictJSONError",
    "check_bound_payload",
    "check_keys",
    "check_payload",
    "check_requested_methods",
    "declared_options",
    "envelope_parts",
    "parse_canonical",
    "requested_methods",
    "strict_json",
    "ExecutionRequest",
    "ExecutionResult",
    "Executor",
    "JobSpec",
    # third-party run pipeline steps (scheduler.core.steps; entry-point group scheduler.steps)
    "Run",
    "Step",
    "StepBase",
    # who a run acts as (scheduler.pipeline.identity): RunOutcomes.identity, as_mapping() for providers
    "Delegation",
    "ResolvedIdentity",
    "TRUST_LEVELS",
    "KNOWN_CAPABILITIES",
    "PLUGIN_API_VERSION",
    "PermanentDeliveryError",
    "ProviderSessions",
    "MemoryProviderSessions",
    "SESSION_STATUSES",
    "RecoveryOutcome",
    "RecoveryRequest",
    "RefreshResult",
    "ResolvedCredential",
    "REVOKE_CODES",
    "RevokeResult",
    "RunControl",
    "SchedulerError",
    "SecretRef",
    "StreamCapture",
    "TriggerContext",
    "StreamRecorder",
    "TransientDeliveryError",
    # channel helpers (scheduler.toolkit.channel_support)
    "PooledHttpClient",
    "endpoint_label",
    "error_for_exception",
    "error_for_status",
    "read_attachment",
    "retry_after_seconds",
    # prompt sanitising and injection patterns (scheduler.toolkit.prompt_safety)
    "INJECTION_PATTERNS",
    "find_injection",
    "fold_text",
    "sanitise_text",
    "build_options",
    "catalogue",
    "hookimpl",
    "now_ms",
    "options_to_json",
    "plugin_settings",
    "register_secret_scheme",
    "reload_settings",
    "read_artifact",
    "structured_from_capture",
    "to_iso",
    "unparsed_record",
]
