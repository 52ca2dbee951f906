"""The plugin contract: what the kernel hands a provider, what it must hand back, and nothing else.

A plugin imports the contract from here (store plugins: ``scheduler.api.store``), the helpers
several plugins share from the ``scheduler-toolkit`` distribution (``scheduler_toolkit.http``,
``.process``, ``.evidence``, ``.output``, ``.options``, ``.canonical`` ...) and, in its tests,
``scheduler.testing``; nothing else of the kernel (tests/test_api.py walks every first-party
plugin). The contract is at most 35 names across ``scheduler.api`` and its submodules (a test
counts them), by kind:

* the API version and hooks: ``PLUGIN_API_VERSION`` (what a provider declares as
  ``plugin_api``), ``hookimpl`` (the pluggy marker of hook modules);
* errors: ``SchedulerError`` (a failure with a stable ``UPPER_SNAKE`` code),
  ``TransientDeliveryError``, ``PermanentDeliveryError`` (what a channel's ``send`` raises);
* executors: ``Executor``; ``ExecutionRequest`` and ``RunControl`` (what ``execute`` is
  handed), ``ExecutionResult`` (what it returns); ``RecoveryRequest``, ``RecoveryOutcome``
  (crash recovery's ``recover``);
* channels: ``Channel``; ``DeliveryPart``, ``DeliveryRoute`` (what ``send`` is handed),
  ``DeliveryReceipt`` (what it returns);
* evidence providers: ``EvidenceProvider``; ``EvidencePayload``, ``EvidenceDeclaration``
  (handed to ``attest`` and ``verify``), ``EvidenceEnvelope`` (``attest``'s answer, handed
  back to ``verify``), ``EvidenceVerification`` (``verify``'s answer);
* credential providers: ``CredentialProvider``; ``CredentialBinding``, ``CredentialContext``
  (what ``resolve`` is handed), ``ResolvedCredential`` (what it returns);
* authorization providers: ``AuthorizationProvider``; ``AuthorizationRequest``,
  ``AuthorizationDecision``;
* proof verifiers: ``ProofVerifier``; ``VerifiedProof`` (what ``verify_proof`` returns);
* optional members, each a Protocol checked at load: ``DeclaresOptions`` (``options_class``),
  ``Configurable`` (``settings_class`` + ``configure``), ``Recoverable`` (``recover``),
  ``PolicyChecking`` (``check_policy``); a provider with a ``registered_as(name)`` method is
  told the entry-point name it was loaded under (``scheduler.core.members.Named``, structural:
  nothing to import);
* stores (``scheduler.api.store``): ``Store``, ``Tx``.

Value types a provider meets only inside these (``Constraints``, ``TriggerContext``,
``StreamCapture``, ``ChannelLimits``, ``CredentialPresent``, ``RefreshResult`` ...) and the
kernel's vocabularies (``KNOWN_CAPABILITIES``, ``ErrorCode``) are in
``scheduler_toolkit.types``; helpers (``StepBase``, option builders, canonical JSON, output
recorders, settings helpers) are in the toolkit or ``scheduler.testing``. Every name this
module exported before still imports from here for one release, with a ``DeprecationWarning``
naming its new import (``scheduler.base.deprecation``). If a plugin needs more of the
contract, it grows here, and ``PLUGIN_API_VERSION`` says when it breaks.
"""

from __future__ import annotations

from scheduler import PLUGIN_API_VERSION
from scheduler.base.deprecation import moved_names as _moved_names
from scheduler.base.errors import SchedulerError
from scheduler.core.execution import ExecutionRequest, ExecutionResult, RecoveryOutcome, RecoveryRequest, RunControl
from scheduler.plugins.hookspecs import hookimpl
from scheduler.plugins.protocols import (
    AuthorizationDecision,
    AuthorizationProvider,
    AuthorizationRequest,
    Channel,
    Configurable,
    CredentialBinding,
    CredentialContext,
    CredentialProvider,
    DeclaresOptions,
    DeliveryPart,
    DeliveryReceipt,
    DeliveryRoute,
    EvidenceDeclaration,
    EvidenceEnvelope,
    EvidencePayload,
    EvidenceProvider,
    EvidenceVerification,
    Executor,
    PermanentDeliveryError,
    PolicyChecking,
    ProofVerifier,
    Recoverable,
    ResolvedCredential,
    TransientDeliveryError,
    VerifiedProof,
)

__all__ = [  # noqa: RUF022 - grouped by topic, as docs/plugins.md presents the contract
    # the API version and hooks
    "PLUGIN_API_VERSION",
    "hookimpl",
    # errors
    "SchedulerError",
    "TransientDeliveryError",
    "PermanentDeliveryError",
    # executors
    "Executor",
    "ExecutionRequest",
    "RunControl",
    "ExecutionResult",
    "RecoveryRequest",
    "RecoveryOutcome",
    # channels
    "Channel",
    "DeliveryPart",
    "DeliveryRoute",
    "DeliveryReceipt",
    # evidence providers
    "EvidenceProvider",
    "EvidencePayload",
    "EvidenceDeclaration",
    "EvidenceEnvelope",
    "EvidenceVerification",
    # credential providers
    "CredentialProvider",
    "CredentialBinding",
    "CredentialContext",
    "ResolvedCredential",
    # authorization providers
    "AuthorizationProvider",
    "AuthorizationRequest",
    "AuthorizationDecision",
    # proof verifiers
    "ProofVerifier",
    "VerifiedProof",
    # optional members
    "DeclaresOptions",
    "Configurable",
    "Recoverable",
    "PolicyChecking",
]

_HTTP = "scheduler_toolkit.http"
_PROMPT = "scheduler_toolkit.prompt_safety"
_EVIDENCE = "scheduler_toolkit.evidence"
_TYPES = "scheduler_toolkit.types"

#: Every name this module exported before the contract was cut down -> where it lives now (one release).
__getattr__ = _moved_names(__name__, {
    # moved into the toolkit
    **dict.fromkeys(("AbortableRequest", "PooledHttpClient", "endpoint_label", "error_for_exception", "error_for_status",
                     "read_attachment", "retry_after_seconds"), _HTTP),
    **dict.fromkeys(("INJECTION_PATTERNS", "find_injection", "fold_text", "sanitise_text"), _PROMPT),
    **dict.fromkeys(("PAYLOAD_FORMAT", "CheckedPayload", "check_bound_payload", "check_keys", "check_payload",
                     "check_requested_methods", "declared_options", "envelope_parts", "requested_methods"), _EVIDENCE),
    # re-exported by the toolkit: the kernel keeps the code (it uses it too)
    **dict.fromkeys(("EvidenceFailure", "StrictJSONError", "parse_canonical", "strict_json"),
                    (_EVIDENCE, "scheduler.evidence.payload")),
    **dict.fromkeys(("CANONICALIZATION", "UNDEFINED", "canonical_bytes", "canonical_digest", "canonical_json", "hash_bytes",
                     "hash_text", "is_digest"), ("scheduler_toolkit.canonical", "scheduler.base.canonical")),
    **dict.fromkeys(("DEFAULT_EXCERPT_BYTES", "DEFAULT_OFFLOAD_BYTES", "StreamCapture", "StreamRecorder", "read_artifact"),
                    ("scheduler_toolkit.output", "scheduler.core.outputs")),
    **dict.fromkeys(("structured_from_capture", "unparsed_record"), "scheduler_toolkit.structured"),
    **dict.fromkeys(("build_options", "catalogue", "options_to_json"), ("scheduler_toolkit.options", "scheduler.base.options")),
    **dict.fromkeys(("SecretRef", "plugin_settings", "register_secret_scheme", "reload_settings"),
                    ("scheduler_toolkit.settings", "scheduler.settings")),
    **dict.fromkeys(("now_ms", "to_iso"), ("scheduler_toolkit.timeutil", "scheduler.base.timeutil")),
    **dict.fromkeys(("Run", "Step", "StepBase"), ("scheduler_toolkit.steps", "scheduler.core.steps")),
    **dict.fromkeys(("Delegation", "ResolvedIdentity", "TRUST_LEVELS"), ("scheduler_toolkit.identity", "scheduler.pipeline.identity")),
    **dict.fromkeys(("CancellationToken", "Constraints", "CredentialPresentation", "EXECUTION_STATUSES", "TriggerContext"),
                    (_TYPES, "scheduler.core.execution")),
    **dict.fromkeys(("ChannelLimits", "CredentialPresent", "DeliveryError", "KNOWN_CAPABILITIES", "ProviderSessions", "REVOKE_CODES",
                     "RefreshResult", "RevokeResult", "SESSION_STATUSES"), (_TYPES, "scheduler.plugins.protocols")),
    "ErrorCode": (_TYPES, "scheduler.base.errors"),
    "JobSpec": (_TYPES, "scheduler.core.spec"),
    # a test double: an in-memory ProviderSessions
    "MemoryProviderSessions": ("scheduler.testing", "scheduler.pipeline.credentials.sessions"),
})
