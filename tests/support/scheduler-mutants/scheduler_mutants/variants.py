"""The broken variants, kind by kind: each subclasses the honest reference and overrides ONE method.

A variant's class name says the promise it breaks; ``VARIANTS`` (bottom) lists each with that
promise in words. The overridden method calls the honest one and then breaks its answer, so
everything else about the provider (loading, settings, capabilities, adapters) stays honest.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import jwt
from scheduler_channel_webhook import WebhookChannel
from scheduler_executor_shell import ShellExecutor
from scheduler_provider_local import CommandCredentialProvider
from scheduler_provider_policyfile import PolicyFileProvider
from scheduler_provider_proofs import JwtVerifier
from scheduler_provider_ssh import SshProvider

from scheduler.api import (
    AuthorizationDecision,
    DeliveryReceipt,
    EvidenceVerification,
    PermanentDeliveryError,
    ResolvedCredential,
    SchedulerError,
    TransientDeliveryError,
    VerifiedProof,
)
from scheduler_mutants import Variant

_log = logging.getLogger("scheduler_mutants")


# --------------------------------------------------------------------------- executor (shell)


class _Control:
    """The run control handed on, with one of its recording methods silenced."""

    def __init__(self, inner: Any, silence: str) -> None:
        self._inner, self._silence = inner, silence

    def __getattr__(self, name: str) -> Any:
        if name == self._silence:
            return lambda *args, **kwargs: None
        return getattr(self._inner, name)


class ExitStatusHidden(ShellExecutor):
    def execute(self, request: Any, control: Any) -> Any:
        result = super().execute(request, control)
        return attrs.evolve(result, status="ok", exit_code=0, error_code=None) if result.status == "error" else result


class StderrDropped(ShellExecutor):
    def execute(self, request: Any, control: Any) -> Any:
        return attrs.evolve(super().execute(request, control), stderr=None)


class StdoutDigestWrong(ShellExecutor):
    def execute(self, request: Any, control: Any) -> Any:
        result = super().execute(request, control)
        return attrs.evolve(result, stdout=attrs.evolve(result.stdout, sha256="0" * 64)) if result.stdout else result


class TimeoutReportedOk(ShellExecutor):
    def execute(self, request: Any, control: Any) -> Any:
        result = super().execute(request, control)
        return attrs.evolve(result, status="ok", error_code=None) if result.status == "timeout" else result


class HandleNotRecorded(ShellExecutor):
    def execute(self, request: Any, control: Any) -> Any:
        return super().execute(request, _Control(control, "record_handle"))


class StructuredAlwaysValid(ShellExecutor):
    def execute(self, request: Any, control: Any) -> Any:
        result = super().execute(request, control)
        if isinstance(result.structured, dict):
            return attrs.evolve(result, structured={**result.structured, "valid": True})
        return result


class VerificationDropped(ShellExecutor):
    def execute(self, request: Any, control: Any) -> Any:
        return attrs.evolve(super().execute(request, control), verification=None)


class CancelReportedOk(ShellExecutor):
    def execute(self, request: Any, control: Any) -> Any:
        result = super().execute(request, control)
        return attrs.evolve(result, status="ok", error_code=None, exit_code=0) if result.status == "cancelled" else result


# --------------------------------------------------------------------------- channel (webhook)


class RefusalSwallowed(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        try:
            return super().send(part, route)
        except PermanentDeliveryError:
            return DeliveryReceipt(receipt_id="swallowed")


class FailureSwallowed(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        try:
            return super().send(part, route)
        except TransientDeliveryError:
            return DeliveryReceipt(receipt_id="swallowed")


class TransientMadePermanent(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        try:
            return super().send(part, route)
        except TransientDeliveryError as exc:
            raise PermanentDeliveryError(exc.message, code=exc.code) from None


class ErrorUnwrapped(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        try:
            return super().send(part, route)
        except TransientDeliveryError as exc:
            raise RuntimeError(exc.message) from None


class BodyCut(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        return super().send(attrs.evolve(part, body=part.body[:-20] if len(part.body) > 40 else part.body), route)


class IdempotencyKeyReplaced(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        return super().send(attrs.evolve(part, idempotency_key=f"mutant-{time.monotonic_ns()}:part:1/1"), route)


class RetriesInsideSend(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        try:
            return super().send(part, route)
        except TransientDeliveryError:
            return super().send(part, route)


_FAILED_KEYS: set[str] = set()
_FAILED_LOCK = threading.Lock()


class DuplicatesOnRetry(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        with _FAILED_LOCK:
            retried = part.idempotency_key in _FAILED_KEYS
        try:
            receipt = super().send(part, route)
        except TransientDeliveryError:
            with _FAILED_LOCK:
                _FAILED_KEYS.add(part.idempotency_key)
            raise
        if retried:  # "make sure it arrived": the part is sent again after a retry
            super().send(attrs.evolve(part, idempotency_key=part.idempotency_key + ":again"), route)
        return receipt


class AttachmentsDropped(WebhookChannel):
    def send(self, part: Any, route: Any) -> Any:
        return super().send(attrs.evolve(part, attachments=()), route)


# --------------------------------------------------------------------------- credential (command)


def _refusal(exc: SchedulerError, code: str | None = None, message: str | None = None) -> SchedulerError:
    return SchedulerError(code if code is not None else exc.code, exc.message if message is None else message,
                          details=exc.details)


class ValueAltered(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        answer = super().resolve(binding, context)
        return attrs.evolve(answer, value=answer.value + ("x" if isinstance(answer.value, str) else b"x"))


class ValueInMetadata(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        answer = super().resolve(binding, context)
        return attrs.evolve(answer, metadata={**answer.metadata, "preview": answer.value})


class ValueLogged(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        answer = super().resolve(binding, context)
        _log.info("resolved %s = %s", binding.name, answer.value)
        return answer


class RefusalNotCoded(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        try:
            return super().resolve(binding, context)
        except SchedulerError as exc:
            raise RuntimeError(exc.message) from None


class MissingCalledEmpty(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        try:
            return super().resolve(binding, context)
        except SchedulerError as exc:
            raise _refusal(exc, "CREDENTIAL_EMPTY" if exc.code == "CREDENTIAL_NOT_FOUND" else exc.code) from None


class RefusalWithoutMessage(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        try:
            return super().resolve(binding, context)
        except SchedulerError as exc:
            raise _refusal(exc, message="") from None


class AnswerForAnotherBinding(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        return attrs.evolve(super().resolve(binding, context), name=binding.name + "-other")


class ExpiredValuePresented(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        return attrs.evolve(super().resolve(binding, context), expires_at_ms=int(time.time() * 1000) - 60_000)


class FailureBecomesValue(CommandCredentialProvider):
    def resolve(self, binding: Any, context: Any) -> Any:
        try:
            return super().resolve(binding, context)
        except SchedulerError:
            return ResolvedCredential(value="mutant-fallback-value", name=binding.name)


# --------------------------------------------------------------------------- evidence (ssh)


def _accepting(provider: Any, verification: Any, codes: tuple[str, ...]) -> Any:
    if not verification.verified and verification.code in codes:
        return EvidenceVerification(verified=True, provider=verification.provider)
    return verification


class VerifiesWithoutTrust(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        if not self._settings.allowed_signers and not self._settings.allowed_keys:
            return EvidenceVerification(verified=True, provider=self._name)
        return super().verify(envelope, payload, declaration)


class TrustFileNotRequired(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        return _accepting(self, super().verify(envelope, payload, declaration),
                          ("EVIDENCE_TRUST_FILE_UNREADABLE", "EVIDENCE_TRUST_NOT_CONFIGURED"))


class PayloadNotCompared(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        return _accepting(self, super().verify(envelope, payload, declaration),
                          ("EVIDENCE_PAYLOAD_MISMATCH", "EVIDENCE_DIGEST_MISMATCH"))


class SignatureNotChecked(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        return _accepting(self, super().verify(envelope, payload, declaration),
                          ("EVIDENCE_SIGNATURE_INVALID", "EVIDENCE_SIGNATURE_MALFORMED", "EVIDENCE_SIGNED_PAYLOAD_MISMATCH",
                           "EVIDENCE_FINGERPRINT_MISMATCH"))


class SignerNotChecked(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        return _accepting(self, super().verify(envelope, payload, declaration),
                          ("EVIDENCE_SIGNER_UNTRUSTED", "EVIDENCE_PRINCIPAL_MISMATCH", "EVIDENCE_NAMESPACE_MISMATCH"))


class ProviderNotChecked(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        return _accepting(self, super().verify(envelope, payload, declaration), ("EVIDENCE_PROVIDER_MISMATCH",))


class EnvelopeShapeNotChecked(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        return _accepting(self, super().verify(envelope, payload, declaration), ("EVIDENCE_ENVELOPE_INVALID",))


class VerifyRaises(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        verification = super().verify(envelope, payload, declaration)
        if not verification.verified:
            raise RuntimeError(f"verification failed: {verification.code}")
        return verification


class AttestRefusalNotCoded(SshProvider):
    def attest(self, payload: Any, declaration: Any) -> Any:
        try:
            return super().attest(payload, declaration)
        except SchedulerError as exc:
            raise RuntimeError(exc.message) from None


class KeyInReason(SshProvider):
    def verify(self, envelope: Any, payload: Any, declaration: Any) -> Any:
        verification = super().verify(envelope, payload, declaration)
        key = self._settings.key
        if not verification.verified and key and Path(key).is_file():
            return attrs.evolve(verification, reason=f"{verification.reason} (signing key: {Path(key).read_text()})")
        return verification


# --------------------------------------------------------------------------- authorization (policyfile)


def _decision(answer: Any, decision: str, reason: str | None = None) -> Any:
    return AuthorizationDecision(decision=decision, reason=answer.reason if reason is None else reason,  # type: ignore[arg-type]
                                 details=answer.details)


class PermitsEverything(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        return AuthorizationDecision(decision="permit", reason="mutant: permit everything")


class PermitsWhenUnconfigured(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        if not self.policy_dir:
            return AuthorizationDecision(decision="permit", reason="mutant: no policy_dir, nothing to enforce")
        return super().resolve_authorization(request)


class EscalateBecomesPermit(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        answer = super().resolve_authorization(request)
        return _decision(answer, "permit") if answer.decision == "escalate" else answer


class DenyWithoutReason(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        answer = super().resolve_authorization(request)
        return _decision(answer, "deny", "") if answer.decision == "deny" else answer


class PrincipalIgnored(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        identity = dict(request.identity or {})
        if identity.get("principal") and identity["principal"] != "service:conformance":
            identity["principal"] = "service:conformance"
            request = attrs.evolve(request, identity=identity)
        return super().resolve_authorization(request)


class MissingIdentityGuessed(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        if request.identity is None:
            request = attrs.evolve(request, identity={"principal": "service:conformance", "kind": "service"})
        return super().resolve_authorization(request)


class RequestChanged(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        answer = super().resolve_authorization(request)
        if isinstance(request.trigger, dict):
            request.trigger["decided_by"] = "mutant"
        return answer


class PolicyCheckAlwaysClean(PolicyFileProvider):
    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        return []


class PayloadInReason(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        answer = super().resolve_authorization(request)
        if answer.decision == "permit":
            return answer
        return _decision(answer, answer.decision, f"{answer.reason} (job payload: {dict(request.job).get('payload_message')})")


class Undecided(PolicyFileProvider):
    def resolve_authorization(self, request: Any) -> Any:
        time.sleep(3)
        return super().resolve_authorization(request)


# --------------------------------------------------------------------------- proof verifier (jwt)


def _forged(request: Any) -> VerifiedProof:
    """A VerifiedProof for whatever the token says, checked against nothing."""
    claims = jwt.decode(request.proof, options={"verify_signature": False})
    header = jwt.get_unverified_header(request.proof)
    now = int(time.time() * 1000)
    return VerifiedProof(method="jwt", proof_id=str(claims.get("jti") or "forged"), key_id=str(header.get("kid") or "forged"),
                         artifact_digest=request.artifact_digest or "", not_before_ms=None, expires_at_ms=now + 600_000)


class _Accepting(JwtVerifier):
    codes: tuple[str, ...] = ()

    def verify_proof(self, request: Any) -> Any:
        try:
            return super().verify_proof(request)
        except SchedulerError as exc:
            if exc.code in self.codes:
                return _forged(request)
            raise


class AcceptsBadSignature(_Accepting):
    codes = ("PROOF_INVALID_SIGNATURE",)


class AcceptsUntrustedKey(_Accepting):
    codes = ("PROOF_INVALID_SIGNATURE", "PROOF_KEY_UNAVAILABLE")


class AcceptsUnbound(_Accepting):
    codes = ("PROOF_MALFORMED",)


class RefusalNotCodedProof(JwtVerifier):
    def verify_proof(self, request: Any) -> Any:
        try:
            return super().verify_proof(request)
        except SchedulerError as exc:
            raise RuntimeError(exc.message) from None


class ExpiryMisreported(JwtVerifier):
    def verify_proof(self, request: Any) -> Any:
        return attrs.evolve(super().verify_proof(request), expires_at_ms=int(time.time() * 1000) + 10 * 365 * 86_400_000)


class ArtifactMisreported(JwtVerifier):
    def verify_proof(self, request: Any) -> Any:
        return attrs.evolve(super().verify_proof(request), artifact_digest=request.artifact_digest or "")


class NotBeforeDropped(JwtVerifier):
    def verify_proof(self, request: Any) -> Any:
        return attrs.evolve(super().verify_proof(request), not_before_ms=None)


class ProofIdDropped(JwtVerifier):
    def verify_proof(self, request: Any) -> Any:
        return attrs.evolve(super().verify_proof(request), proof_id="")


class Hangs(JwtVerifier):
    def verify_proof(self, request: Any) -> Any:
        time.sleep(5)
        return super().verify_proof(request)


def _v(kind: str, name: str, cls: type, promise: str) -> Variant:
    return Variant(kind=kind, name=name, promise=promise, target=f"scheduler_mutants.variants:{cls.__name__}")


VARIANTS: tuple[Variant, ...] = (
    _v("executor", "exit-status-hidden", ExitStatusHidden, "a failing payload is reported as failing (status, exit code)"),
    _v("executor", "stderr-dropped", StderrDropped, "stderr is captured"),
    _v("executor", "stdout-digest-wrong", StdoutDigestWrong, "the stdout digest is the stream's"),
    _v("executor", "timeout-reported-ok", TimeoutReportedOk, "a run past its timeout is reported as a timeout"),
    _v("executor", "handle-not-recorded", HandleNotRecorded, "the process handle is recorded (crash recovery needs it)"),
    _v("executor", "structured-always-valid", StructuredAlwaysValid, "invalid structured output is reported invalid"),
    _v("executor", "verification-dropped", VerificationDropped, "the verify command's outcome is reported"),
    _v("executor", "cancel-reported-ok", CancelReportedOk, "a cancelled run is reported as cancelled"),
    _v("channel", "refusal-swallowed", RefusalSwallowed, "a refused message is a PermanentDeliveryError, never a receipt"),
    _v("channel", "failure-swallowed", FailureSwallowed, "a failed attempt is a TransientDeliveryError, never a receipt"),
    _v("channel", "transient-made-permanent", TransientMadePermanent, "a retryable failure is transient (the outbox retries)"),
    _v("channel", "error-unwrapped", ErrorUnwrapped, "a failure is a delivery error, never another exception"),
    _v("channel", "body-cut", BodyCut, "a body within limits.max_chars arrives whole"),
    _v("channel", "idempotency-key-replaced", IdempotencyKeyReplaced, "the part's idempotency key is carried"),
    _v("channel", "retries-inside-send", RetriesInsideSend, "one send is one request (finding 5)"),
    _v("channel", "duplicates-on-retry", DuplicatesOnRetry, "a retried part is accepted once (finding 4)"),
    _v("channel", "attachments-dropped", AttachmentsDropped, "declared attachments arrive"),
    _v("credential", "value-altered", ValueAltered, "the value presented is the one the source holds"),
    _v("credential", "value-in-metadata", ValueInMetadata, "no value in an answer's metadata"),
    _v("credential", "value-logged", ValueLogged, "no value in a log record"),
    _v("credential", "refusal-not-coded", RefusalNotCoded, "a refusal is a SchedulerError with a CREDENTIAL_* code"),
    _v("credential", "missing-called-empty", MissingCalledEmpty, "a missing value is CREDENTIAL_NOT_FOUND"),
    _v("credential", "refusal-without-message", RefusalWithoutMessage, "a refusal says why"),
    _v("credential", "answer-for-another-binding", AnswerForAnotherBinding, "the answer is for the binding asked"),
    _v("credential", "expired-value-presented", ExpiredValuePresented, "an expired value is never presented"),
    _v("credential", "failure-becomes-value", FailureBecomesValue, "a source that fails presents nothing"),
    _v("evidence", "verifies-without-trust", VerifiesWithoutTrust, "no trust configured is never verified (finding 1)"),
    _v("evidence", "trust-file-not-required", TrustFileNotRequired, "an unreadable trust file is never verified (finding 1)"),
    _v("evidence", "payload-not-compared", PayloadNotCompared, "a changed payload is refused"),
    _v("evidence", "signature-not-checked", SignatureNotChecked, "the signature is checked (finding 6)"),
    _v("evidence", "signer-not-checked", SignerNotChecked, "only a trusted signer verifies"),
    _v("evidence", "provider-not-checked", ProviderNotChecked, "another provider's envelope is refused"),
    _v("evidence", "envelope-shape-not-checked", EnvelopeShapeNotChecked, "a malformed envelope is refused"),
    _v("evidence", "verify-raises", VerifyRaises, "verify returns a refusal, never raises"),
    _v("evidence", "attest-refusal-not-coded", AttestRefusalNotCoded, "attest refuses with an EVIDENCE_* SchedulerError"),
    _v("evidence", "key-in-reason", KeyInReason, "no key material in a reason"),
    _v("authorization", "permits-everything", PermitsEverything, "a deny policy denies"),
    _v("authorization", "permits-when-unconfigured", PermitsWhenUnconfigured, "no settings is a deny (finding 2)"),
    _v("authorization", "escalate-becomes-permit", EscalateBecomesPermit, "an escalate policy escalates"),
    _v("authorization", "deny-without-reason", DenyWithoutReason, "a deny says why"),
    _v("authorization", "principal-ignored", PrincipalIgnored, "the request's principal decides"),
    _v("authorization", "missing-identity-guessed", MissingIdentityGuessed, "a request without identity is never a guess"),
    _v("authorization", "request-changed", RequestChanged, "the request handed over is left as it was"),
    _v("authorization", "policy-check-always-clean", PolicyCheckAlwaysClean, "check_policy reports a broken policy"),
    _v("authorization", "payload-in-reason", PayloadInReason, "no job payload in a reason"),
    _v("authorization", "undecided", Undecided, "a decision within the kernel's bound"),
    _v("proof_verifier", "accepts-bad-signature", AcceptsBadSignature, "a bad signature is refused"),
    _v("proof_verifier", "accepts-untrusted-key", AcceptsUntrustedKey, "a proof by an untrusted key is refused"),
    _v("proof_verifier", "accepts-unbound", AcceptsUnbound, "a proof bound to no artifact is refused"),
    _v("proof_verifier", "refusal-code-lost", RefusalNotCodedProof, "a refusal carries its PROOF_* code"),
    _v("proof_verifier", "expiry-misreported", ExpiryMisreported, "the window reported is the proof's (its end)"),
    _v("proof_verifier", "artifact-misreported", ArtifactMisreported, "the artifact reported is the one the proof binds"),
    _v("proof_verifier", "not-before-dropped", NotBeforeDropped, "the window reported is the proof's (its start)"),
    _v("proof_verifier", "proof-id-dropped", ProofIdDropped, "the proof's id is reported (replays are refused by it)"),
    _v("proof_verifier", "hangs", Hangs, "a verification within the kernel's bound"),
)
