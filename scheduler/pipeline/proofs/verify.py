"""Verifying one authorization proof: the kernel's policy around the verifier plugin the declaration names.

The proof's FORMAT (a JWT, a detached signature, a certificate chain) is a ``proof_verifier``
plugin's (group ``scheduler.proof_verifiers``, chosen by ``proof_verifier_name``: the declaration's
method, or ``detached-signature-ssh``). What the kernel keeps, whatever the format:

* the verifier is loaded through the kernel loader and kept for the process; one that is not
  installed, disabled or broken is ``PROOF_VERIFIER_NOT_AVAILABLE`` (the code the missing-plugin
  rule derives for the kind), never a run without the check;
* the call is bounded in time (``VERIFY_LIMIT_S``); an exception, a code that is not ``PROOF_*``,
  an answer that is not a ``VerifiedProof`` of the declared method, or one past the bound is
  ``PROOF_VERIFICATION_FAILED``: a verifier's failure denies, never permits;
* the proof id must be one the replay ledger can claim (``PROOF_MALFORMED``);
* the window the verifier reports is checked with the declared clock skew (``PROOF_NOT_YET_VALID``
  before ``not_before - skew``, ``PROOF_EXPIRED`` at or after ``expires_at + skew``), and the skew
  applied is recorded on the answer;
* the artifact the proof names must be this run's job's artifact (``PROOF_ARTIFACT_MISMATCH``).

Pure functions of the declaration, the proof text and the clock: no database (the step,
``scheduler.pipeline.proofs.step``, checks revocations and claims the id).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core.bounded import call_bounded
from scheduler.plugins.loaded import LoadedProviders
from scheduler.plugins.protocols import ProofRequest, ProofVerifier, VerifiedProof, proof_verifier_name
from scheduler.plugins.refs import not_available_code

#: How long one verifier call may take (a JWKS fetch and a helper program have their own, shorter, bounds).
VERIFY_LIMIT_S = 30.0
#: A verifier that failed to load is not retried for this long (seconds).
VERIFIER_RETRY_S = 5.0
#: What the replay ledger accepts as a proof id.
PROOF_ID_RE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,256}")
#: The error when the named verifier is not installed, disabled or does not load.
UNAVAILABLE = not_available_code("proof_verifier")

_verifiers = LoadedProviders("proof_verifier", unavailable_code=UNAVAILABLE, noun="proof verifier", retry_s=VERIFIER_RETRY_S,
                             per_settings=True)


def fail(code: str, message: str, **details: object) -> SchedulerError:
    """A ``PROOF_*`` error (details never hold the proof)."""
    return SchedulerError(code, message, details=details or None)


def verifier(name: str) -> Any:
    """The loaded proof verifier ``name``, kept for the process (``PROOF_VERIFIER_NOT_AVAILABLE`` when it cannot be had)."""
    return _verifiers.get(name)


def forget_verifiers() -> None:
    """Drop the loaded verifiers (tests; a settings reload drops them by itself)."""
    _verifiers.forget()


def _check_window(method: str, not_before_ms: int | None, expires_at_ms: int, skew_ms: int, now_ms: int) -> None:
    """``PROOF_NOT_YET_VALID`` before ``not_before - skew``, ``PROOF_EXPIRED`` at or after ``expires_at + skew``."""
    if not_before_ms is not None and now_ms < not_before_ms - skew_ms:
        raise fail("PROOF_NOT_YET_VALID", f"the {method} proof is valid from {not_before_ms} ms (epoch), now is {now_ms}"
                                          f" (clock skew {skew_ms} ms)")
    if now_ms >= expires_at_ms + skew_ms:
        raise fail("PROOF_EXPIRED", f"the {method} proof expired at {expires_at_ms} ms (epoch), now is {now_ms}"
                                    f" (clock skew {skew_ms} ms)")


def check_window(record: Mapping[str, Any], now_ms: int) -> None:
    """Re-check a recorded window (``VerifiedProof.to_json()``) with its recorded skew: after an approval wait."""
    _check_window(record["method"], record.get("not_before"), int(record["expires_at"]), int(record["clock_skew_ms"]), now_ms)


def _check_artifact(method: str, claimed: str, artifact_digest: str | None) -> None:
    if artifact_digest is None or claimed != artifact_digest:
        raise fail("PROOF_ARTIFACT_MISMATCH", f"the {method} proof is bound to artifact {claimed[:80]}, this run's job is"
                                              f" {artifact_digest}", proof_artifact=claimed[:80], artifact_digest=artifact_digest)


def _is_ms(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_answer(answer: object, declaration: Mapping[str, Any], name: str) -> VerifiedProof:
    """The verifier's answer, if it is a ``VerifiedProof`` of the declared method the kernel can record; else a refusal."""
    if not isinstance(answer, VerifiedProof):
        raise fail("PROOF_VERIFICATION_FAILED", f"proof verifier {name!r} answered {type(answer).__name__}, not a VerifiedProof")
    wrong = [what for what, bad in (
        (f"method {str(answer.method)[:40]!r} (the declaration's is {declaration['method']!r})", answer.method != declaration["method"]),
        ("a proof_id that is not a string", not isinstance(answer.proof_id, str)),
        ("an empty or non-string key_id", not isinstance(answer.key_id, str) or not answer.key_id),
        ("an artifact_digest that is not a string", not isinstance(answer.artifact_digest, str)),
        ("expires_at_ms that is not epoch milliseconds", not _is_ms(answer.expires_at_ms)),
        ("not_before_ms that is not epoch milliseconds", answer.not_before_ms is not None and not _is_ms(answer.not_before_ms)),
        ("an issuer or subject that is not a string", any(v is not None and not isinstance(v, str)
                                                          for v in (answer.issuer, answer.subject))),
    ) if bad]
    if wrong:
        raise fail("PROOF_VERIFICATION_FAILED", f"proof verifier {name!r} answered a VerifiedProof with {'; '.join(wrong)}")
    if not PROOF_ID_RE.fullmatch(answer.proof_id):
        raise fail("PROOF_MALFORMED", f"the {answer.method} proof's id must be 1-256 characters of [A-Za-z0-9._:@/+=-]",
                   key_id=answer.key_id)
    return answer


def _ask(provider: ProofVerifier, request: ProofRequest, name: str, limit_s: float) -> object:
    """The verifier's answer within ``limit_s``; its own ``PROOF_*`` refusal as it is, anything else a verification failure."""
    try:
        return call_bounded(lambda: provider.verify_proof(request), limit_s, code="PROOF_VERIFICATION_FAILED",
                            what=f"proof verifier {name!r}", details={"verifier": name}, name="proof-verifier")
    except SchedulerError as exc:
        if exc.code.startswith("PROOF_"):
            raise
        raise fail("PROOF_VERIFICATION_FAILED", f"proof verifier {name!r} failed: {exc.code}: {exc.message}") from None
    except Exception as exc:  # noqa: BLE001 - a verifier bug denies, never permits
        raise fail("PROOF_VERIFICATION_FAILED", f"proof verifier {name!r} raised {type(exc).__name__}: {exc}") from None


def verify_with(provider: ProofVerifier, declaration: Mapping[str, Any], proof: str, *, artifact_digest: str | None, now_ms: int,
                name: str | None = None, limit_s: float = VERIFY_LIMIT_S) -> VerifiedProof:
    """Verify ``proof`` with an already loaded verifier, then apply the kernel's policy (answer, proof id, window, artifact).

    The one path of every verification: the proof step's and the conformance engine's.
    """
    name = name or proof_verifier_name(declaration)
    request = ProofRequest(declaration=declaration, proof=proof, artifact_digest=artifact_digest, now_ms=now_ms)
    verified = check_answer(_ask(provider, request, name, limit_s), declaration, name)
    skew_ms = int(declaration["clock_skew_s"]) * 1000
    _check_window(verified.method, verified.not_before_ms, verified.expires_at_ms, skew_ms, now_ms)
    _check_artifact(verified.method, verified.artifact_digest, artifact_digest)
    return attrs.evolve(verified, skew_ms=skew_ms)


def verify(declaration: Mapping[str, Any], proof: str, *, artifact_digest: str | None, now_ms: int | None = None) -> VerifiedProof:
    """Verify ``proof`` (text from the declared source) against ``declaration`` for an artifact, at ``now_ms``, with the
    verifier the declaration names (loaded once per process)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    name = proof_verifier_name(declaration)
    return verify_with(verifier(name), declaration, proof, artifact_digest=artifact_digest, now_ms=now_ms, name=name)


__all__ = ["PROOF_ID_RE", "UNAVAILABLE", "VERIFY_LIMIT_S", "check_answer", "check_window", "forget_verifiers", "verifier",
           "verify", "verify_with"]
