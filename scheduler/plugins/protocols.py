"""One typed Protocol per provider kind, and the request/result types they exchange with the kernel.

Every provider declares ``plugin_api`` (the major version of this API it was
written for, compared with ``scheduler.PLUGIN_API_VERSION`` before use) and
``capabilities`` (kebab-case strings the kernel and governance read; a provider
never claims enforcement it does not really do). A provider may also declare

* ``options_class``: an attrs class of its per-job options. The job spec carries one
  object per plugin (``executor_options``, ``delivery_options``, the provider's
  block inside ``evidence`` / ``credentials`` / ``authorization``); the kernel
  validates it against this class, stores it as JSON and never names its fields.
* ``settings_class``: an attrs class of its host-level settings, read from the
  settings file table of the plugin (``[executors.shell]``, ``[channels.slack]``,
  ``[providers.oauth2]``) with ``SCHEDULER_<SECTION>_<NAME>_<KEY>`` overrides; the
  loader validates them and hands them to ``configure(settings)``.

Plugins import the contract's names from ``scheduler.api`` (the nested value types, such as
``ChannelLimits`` and ``ProofRequest``, from ``scheduler_toolkit.types``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from scheduler.base.plugin_kinds import GROUPS, KINDS, kind_named
from scheduler.core.execution import ExecutionRequest, ExecutionResult, RecoveryOutcome, RecoveryRequest, RunControl
from scheduler.core.members import (  # optional members; re-exported here
    Configurable,
    DeclaresOptions,
    JobChecking,
    Named,
    PolicyChecking,
    Recoverable,
)
from scheduler.core.steps import Step  # the contract of kind ``step``; re-exported here
from scheduler.core.store.base import Store  # the contract of kind ``store``; re-exported here
from scheduler.settings.load import SETTINGS_SECTIONS  # the settings own each kind's section; re-exported here

#: Capability names the kernel and governance understand (kebab-case). A provider may
#: declare others (they are informational); these are the ones decisions read.
KNOWN_CAPABILITIES = frozenset({
    # executors
    "process-group", "timeout", "cancel", "output-capture", "structured-output", "verify", "env-policy", "recover", "state",
    "sandbox", "network-restriction", "path-restriction", "token-cap", "cost-cap", "stdin", "credentials-env",
    "credentials-file", "credentials-stdin",
    # channels
    "attachments", "idempotency-keys", "threads",
    # evidence, credentials, authorization
    "attest", "verify-evidence", "signed-evidence", "refresh", "revoke", "escalate",
})


# -- executors -----------------------------------------------------------------------------------


@runtime_checkable
class Executor(Protocol):
    """Runs a job's payload (group ``scheduler.executors``).

    Optional members: ``options_class``, ``settings_class``, ``configure(settings)``
    and ``recover(request) -> RecoveryOutcome`` (declare the ``recover`` capability):
    crash recovery calls it to stop whatever a dead dispatcher's run left behind
    (a process group, a remote agent turn) from the handle the run recorded.
    """

    plugin_api: int
    capabilities: frozenset[str]

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        """Run one attempt; honour ``control`` cancellation and ``request.deadline_ms``."""


# -- delivery channels ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ChannelLimits:
    """What one message of a channel can carry; the outbox splits longer output into parts."""

    max_chars: int = 4000
    max_parts: int = 20
    supports_attachments: bool = False
    max_attachment_bytes: int = 0


@attrs.frozen(kw_only=True)
class DeliveryRoute:
    """Where a part goes: the channel driver, its destination and the job's ``delivery_options``."""

    channel: str
    target: str | None = None
    options: Any = None


@attrs.frozen(kw_only=True)
class DeliveryPart:
    """One part of one delivery; ``idempotency_key`` is deterministic (``<group>:part:i/N``)."""

    idempotency_key: str
    index: int
    count: int
    body: str
    run_id: str
    job_id: str
    attachments: tuple[Mapping[str, Any], ...] = ()


@attrs.frozen(kw_only=True)
class DeliveryReceipt:
    """What the channel says it did: its own message id, when known."""

    receipt_id: str | None = None
    details: Mapping[str, Any] = attrs.Factory(dict)


class DeliveryError(Exception):
    """A part could not be sent. Raise a subclass."""

    def __init__(self, message: str, *, code: str = "DELIVERY_FAILED") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class TransientDeliveryError(DeliveryError):
    """Worth retrying later (timeouts, 5xx, 429); ``retry_after_s`` honours a ``Retry-After``."""

    def __init__(self, message: str, *, code: str = "DELIVERY_TRANSIENT", retry_after_s: float | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class PermanentDeliveryError(DeliveryError):
    """Retrying cannot help (bad destination, rejected credentials, 4xx): the part fails now."""


@runtime_checkable
class Channel(Protocol):
    """Delivers outbox parts to an external destination (group ``scheduler.channels``)."""

    plugin_api: int
    capabilities: frozenset[str]
    limits: ChannelLimits

    def send(self, part: DeliveryPart, route: DeliveryRoute) -> DeliveryReceipt:
        """Send one part; raise ``TransientDeliveryError`` or ``PermanentDeliveryError`` when it did not go out."""


# -- evidence ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class EvidencePayload:
    """The canonical evidence document of a run, built by the kernel from the persisted run."""

    document: Mapping[str, Any]
    canonical: bytes
    digest: str  # "sha256:<hex>" of ``canonical``


@attrs.frozen(kw_only=True)
class EvidenceDeclaration:
    """A job's ``evidence`` block: which provider, whether verification is required, its options.

    ``methods`` are the methods the job asks for (empty: the provider's own); a provider
    refuses a method it does not perform (``check_requested_methods``), never downgrades.
    """

    provider: str
    required: bool = False
    verify: bool = False
    options: Any = None
    methods: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class EvidenceEnvelope:
    """What a provider produced for a payload; stored with the evidence row, re-verifiable later."""

    provider: str
    format: str
    payload_digest: str
    data: Mapping[str, Any] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class EvidenceVerification:
    """The outcome of verifying an envelope: ``verified`` or not, with a stable code when not."""

    verified: bool
    provider: str
    code: str | None = None
    reason: str | None = None


@runtime_checkable
class EvidenceProvider(Protocol):
    """Attests and verifies canonical evidence payloads (group ``scheduler.evidence_providers``)."""

    plugin_api: int
    capabilities: frozenset[str]

    def attest(self, payload: EvidencePayload, declaration: EvidenceDeclaration) -> EvidenceEnvelope:
        """Produce an envelope for the payload; raise ``SchedulerError`` when it cannot (fail closed)."""

    def verify(self, envelope: EvidenceEnvelope, payload: EvidencePayload, declaration: EvidenceDeclaration) -> EvidenceVerification:
        """Check an envelope against the payload; any mismatch is ``verified=False``, never an exception to swallow."""


# -- credentials ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CredentialPresent:
    """How a credential reaches the run: an environment variable, a 0600 file, or standard input.

    ``key`` is the variable of an ``env`` presentation; ``file_name`` the name of a ``file``
    presentation inside the run's private directory (default: the binding's name).
    """

    medium: Literal["env", "file", "stdin"]
    key: str | None = None
    file_name: str | None = None


@attrs.frozen(kw_only=True)
class CredentialBinding:
    """One entry of a job's ``credentials`` list: which provider resolves ``ref``, and how the value is presented.

    ``options`` is the provider's validated ``options_class`` instance (None without one).
    A binding always stands for exactly one value (cardinality ``one``).
    """

    name: str
    provider: str
    ref: str
    present: CredentialPresent
    required: bool = True
    options: Any = None


#: ``provider_sessions.status`` values a provider may set through ``ProviderSessions.mark_session``.
SESSION_STATUSES = ("active", "expired", "revoked", "revoke_failed")


@runtime_checkable
class ProviderSessions(Protocol):
    """The kernel's bookkeeping of a credential provider's cached sessions (``CredentialContext.sessions``).

    A provider that caches something across runs (an OAuth2 token) reports each session
    here, so operators can see what is live, until when, and what a revocation did. Only a
    hashed cache key (``sha256:<64 hex>``), scopes, times and a status are stored; the
    kernel refuses anything else (``PROVIDER_SESSION_INVALID``), so no token can end up in
    the database. The kernel's implementation is ``scheduler.pipeline.credentials.sessions``.
    """

    def record_session(self, provider: str, session_key: str, *, scopes: Any = (), expires_at_ms: int | None = None,
                       refresh_after_ms: int | None = None) -> str:
        """A new (or renewed) live session: status ``active``; returns the row id."""

    def mark_session(self, provider: str, session_key: str, status: str) -> bool:
        """Set a session's status (``expired``, ``revoked``, ``revoke_failed``, ``active``); False when unknown."""


@attrs.frozen(kw_only=True)
class CredentialContext:
    """Who asks, for which run and which execution contract.

    ``sessions`` is the kernel's ``ProviderSessions`` bookkeeping of cached provider
    sessions (None where there is no database, e.g. settings references).
    """

    run_id: str
    job_id: str
    attempt: int = 1
    artifact_digest: str | None = None
    identity: Mapping[str, Any] | None = None
    #: The run this one follows (a chain parent), and the job it belongs to, when the credential flows down a chain.
    source_run_id: str | None = None
    source_job_id: str | None = None
    sessions: ProviderSessions | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen(kw_only=True, repr=False)
class ResolvedCredential:
    """A provider's answer to ``resolve``: a value held only in memory, and what it was resolved for.

    The kernel exposes the value only when the answer matches the binding it asked about:
    ``name``, ``medium``, ``key``, ``file_name``, ``cardinality`` (always ``one``) and
    ``required`` must equal the binding's (build the answer with ``for_binding``; an answer
    that does not say what it is for is refused, ``CREDENTIAL_BINDING_MISMATCH``). A value
    whose ``expires_at_ms`` has passed is never presented (``CREDENTIAL_EXPIRED``);
    ``refresh_after_ms`` tells a caching provider when to fetch a new one. ``repr`` never
    shows the value, and ``metadata`` must never hold it either.
    """

    value: str | bytes
    expires_at_ms: int | None = None
    metadata: Mapping[str, Any] = attrs.Factory(dict)
    name: str | None = None
    medium: str | None = None
    key: str | None = None
    file_name: str | None = None
    cardinality: Literal["one", "many"] = "one"
    required: bool | None = None
    refresh_after_ms: int | None = None

    @classmethod
    def for_binding(cls, binding: CredentialBinding, value: str | bytes, **kwargs: Any) -> ResolvedCredential:
        """The answer for ``binding``: its name, medium, key, file name and required state echoed with ``value``."""
        present = binding.present
        return cls(value=value, name=binding.name, medium=present.medium, key=present.key, file_name=present.file_name,
                   required=binding.required, **kwargs)

    def __repr__(self) -> str:
        return f"ResolvedCredential(name={self.name!r}, value=<redacted>, expires_at_ms={self.expires_at_ms!r})"


@attrs.frozen(kw_only=True)
class RefreshResult:
    """Outcome of ``refresh``: a new credential, or why there is none."""

    refreshed: bool
    credential: ResolvedCredential | None = None
    reason: str | None = None


#: The explicit answers of ``revoke``.
REVOKE_CODES = ("revoked", "not_revoked", "unsupported")


@attrs.frozen(kw_only=True)
class RevokeResult:
    """Outcome of ``revoke``: ``revoked``, ``not_revoked`` (with a reason) or ``unsupported``.

    ``code`` may be omitted: it is then ``revoked`` when ``revoked`` is true, ``unsupported``
    when the reason starts with ``CREDENTIAL_REVOKE_UNSUPPORTED``, else ``not_revoked``.
    Anything but ``revoked`` means the credential may still be valid (fail closed).
    """

    revoked: bool
    reason: str | None = None
    code: Literal["revoked", "not_revoked", "unsupported"] | None = None

    @property
    def outcome(self) -> str:
        """The explicit answer (``revoked`` only when both ``revoked`` and ``code`` agree)."""
        if self.code is not None:
            return self.code if (self.code == "revoked") == bool(self.revoked) else "not_revoked"
        if self.revoked:
            return "revoked"
        return "unsupported" if (self.reason or "").startswith("CREDENTIAL_REVOKE_UNSUPPORTED") else "not_revoked"


@runtime_checkable
class CredentialProvider(Protocol):
    """Resolves credential bindings to values at run time (group ``scheduler.credential_providers``).

    ``resolve`` returns ``ResolvedCredential.for_binding(binding, value, expires_at_ms=...)``
    or raises ``SchedulerError`` with a ``CREDENTIAL_*`` code; the kernel bounds the call in
    time. Optional members (declare the matching capability): ``options_class`` (the
    binding's ``options`` object), ``refresh(credential, binding, context) -> RefreshResult``
    (``refresh``) and ``revoke(credential, binding, context) -> RevokeResult`` (``revoke``).
    See docs/credentials.md.
    """

    plugin_api: int
    capabilities: frozenset[str]

    def resolve(self, binding: CredentialBinding, context: CredentialContext) -> ResolvedCredential:
        """Return the value; raise ``SchedulerError`` when it cannot be had. The kernel never stores it."""


# -- authorization -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AuthorizationRequest:
    """Everything an ``authorization_ref`` provider decides on."""

    policy_ref: str
    job: Mapping[str, Any]
    trigger: Mapping[str, Any]
    artifact_digest: str | None = None
    identity: Mapping[str, Any] | None = None
    proof: Mapping[str, Any] | None = None
    options: Any = None
    #: The executor that will run the job, as the kernel resolved it (``executor``, else the default of its
    #: ``session_target``); sent with the ``job`` part. Providers read this, never a copy of the kernel's defaults.
    executor: str | None = None


@attrs.frozen(kw_only=True)
class AuthorizationDecision:
    """``permit``, ``deny`` or ``escalate`` (escalate opens the approval gate) and why."""

    decision: Literal["permit", "deny", "escalate"]
    reason: str = ""
    details: Mapping[str, Any] = attrs.Factory(dict)


@runtime_checkable
class AuthorizationProvider(Protocol):
    """Decides an ``authorization_ref`` (group ``scheduler.authorization_providers``).

    Any exception, timeout or malformed answer is a deny with a stable code, never a permit.
    """

    plugin_api: int
    capabilities: frozenset[str]

    def resolve_authorization(self, request: AuthorizationRequest) -> AuthorizationDecision:
        """Decide the request."""


# -- authorization-proof verifiers (kind ``proof_verifier``) -------------------------------------
#
# The kernel reads a job's proof from its declared source and keeps the policy around it (the window
# with the declared clock skew, the artifact binding, revocations, the replay ledger, quarantine:
# docs/proofs.md); a verifier knows one proof FORMAT (a JWT, a detached signature, a certificate
# chain) and says what a proof states, or why it cannot be believed.


@attrs.frozen(kw_only=True)
class ProofRequest:
    """One proof to verify: the job's normalised ``authorization_proof`` declaration, the proof text the kernel read
    from the declared source, the digest of the job's execution artifact, and the kernel's clock.

    The trust anchors (key files, a JWKS, CA roots, an allowed-signers file) are named by the
    declaration. ``artifact_digest`` is what the kernel will hold the proof's own binding to; a
    verifier whose format binds the artifact implicitly may use it. ``repr`` never shows the proof.
    """

    declaration: Mapping[str, Any]
    proof: str = attrs.field(repr=False)
    artifact_digest: str | None
    now_ms: int


@attrs.frozen
class VerifiedProof:
    """What a verified proof established (never the proof itself): a verifier's answer, and the run's record.

    ``method`` is the declaration's method; ``proof_id`` the id the replay ledger claims once
    (1-256 characters of ``[A-Za-z0-9._:@/+=-]``); ``key_id`` the id revocations name;
    ``artifact_digest`` the artifact the proof says it is for; ``not_before_ms`` /
    ``expires_at_ms`` the window it states (epoch ms), which the kernel checks. ``skew_ms`` is
    the kernel's: the declared clock skew it applied (a verifier leaves it 0).
    """

    method: str
    proof_id: str
    key_id: str
    artifact_digest: str
    not_before_ms: int | None
    expires_at_ms: int
    skew_ms: int = 0
    issuer: str | None = None
    subject: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record kept on the run (``runs.proof_json``) and in the ``proof.verified`` event."""
        return {"method": self.method, "proof_id": self.proof_id, "key_id": self.key_id, "artifact_digest": self.artifact_digest,
                "not_before": self.not_before_ms, "expires_at": self.expires_at_ms, "clock_skew_ms": self.skew_ms,
                "issuer": self.issuer, "subject": self.subject}


#: The verifier of a ``detached-signature`` declaration of format ``ssh``; every other declaration names its ``method``.
SSH_SIGNATURE_VERIFIER = "detached-signature-ssh"


def proof_verifier_name(declaration: Mapping[str, Any]) -> str:
    """The ``scheduler.proof_verifiers`` entry point that verifies a (normalised) declaration's proofs.

    Its ``method`` (``jwt``, ``detached-signature``, ``certificate``), except a detached signature
    of format ``ssh``, which another distribution verifies: ``detached-signature-ssh``. The one
    rule the missing-plugin check and the proof step share.
    """
    method = str(declaration.get("method"))
    if method == "detached-signature" and declaration.get("format") == "ssh":
        return SSH_SIGNATURE_VERIFIER
    return method


@runtime_checkable
class ProofVerifier(Protocol):
    """Verifies authorization proofs of one format (group ``scheduler.proof_verifiers``; name: ``proof_verifier_name``).

    ``verify_proof`` checks the proof against the trust the declaration names and returns the
    ``VerifiedProof`` it states, or raises ``SchedulerError`` with a ``PROOF_*`` code
    (``PROOF_MALFORMED``, ``PROOF_KEY_UNAVAILABLE``, ``PROOF_INVALID_SIGNATURE`` ...). It does not
    judge the window or compare the artifact digest: the kernel does, with the declared skew.
    Any other exception, a code that is not ``PROOF_*``, or an answer that is not a
    ``VerifiedProof`` of the declared method denies the run (``PROOF_VERIFICATION_FAILED``).
    """

    plugin_api: int
    capabilities: frozenset[str]

    def verify_proof(self, request: ProofRequest) -> VerifiedProof:
        """Verify one proof's format and signature; say what it states (raise ``SchedulerError`` when it cannot be believed)."""


# -- (end of the proof verifiers) -----------------------------------------------------------------


def protocol_of(kind: str) -> type | None:
    """The Protocol of plugin kind ``kind`` (the one registry, ``scheduler.base.plugin_kinds``, names it)."""
    name = kind_named(kind).protocol
    return None if name is None else globals()[name]


#: Provider kind -> (entry-point group, Protocol), derived from the registry: what ``load_provider`` checks against.
PROVIDER_KINDS: dict[str, tuple[str, type]] = {
    k.name: (k.group, globals()[k.protocol]) for k in KINDS if k.provider and k.protocol is not None
}

__all__ = [
    "GROUPS",
    "KNOWN_CAPABILITIES",
    "PROVIDER_KINDS",
    "REVOKE_CODES",
    "SESSION_STATUSES",
    "SETTINGS_SECTIONS",
    "SSH_SIGNATURE_VERIFIER",
    "AuthorizationDecision",
    "AuthorizationProvider",
    "AuthorizationRequest",
    "Channel",
    "ChannelLimits",
    "Configurable",
    "CredentialBinding",
    "CredentialContext",
    "CredentialPresent",
    "CredentialProvider",
    "DeclaresOptions",
    "DeliveryError",
    "DeliveryPart",
    "DeliveryReceipt",
    "DeliveryRoute",
    "EvidenceDeclaration",
    "EvidenceEnvelope",
    "EvidencePayload",
    "EvidenceProvider",
    "EvidenceVerification",
    "ExecutionRequest",
    "ExecutionResult",
    "Executor",
    "JobChecking",
    "Named",
    "PermanentDeliveryError",
    "PolicyChecking",
    "ProofRequest",
    "ProofVerifier",
    "ProviderSessions",
    "Recoverable",
    "RecoveryOutcome",
    "RecoveryRequest",
    "RefreshResult",
    "ResolvedCredential",
    "RevokeResult",
    "RunControl",
    "Step",
    "Store",
    "TransientDeliveryError",
    "VerifiedProof",
    "proof_verifier_name",
    "protocol_of",
]

