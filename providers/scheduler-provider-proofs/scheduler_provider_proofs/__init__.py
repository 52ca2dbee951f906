"""scheduler-provider-proofs: the ``jwt``, ``detached-signature`` (Ed25519) and ``certificate`` proof verifiers.

Entry points in ``scheduler.proof_verifiers``; the kernel calls the one a job's
``authorization_proof`` names and keeps the policy around it (window and clock skew, artifact
binding, revocations, the replay ledger). See ``README.md`` and docs/proofs.md.
"""

from __future__ import annotations

from scheduler_provider_proofs.certificate import CertificateVerifier
from scheduler_provider_proofs.detached import DetachedSignatureVerifier
from scheduler_provider_proofs.jwt_verifier import JwtSettings, JwtVerifier

__version__ = "0.1.0"

__all__ = ["CertificateVerifier", "DetachedSignatureVerifier", "JwtSettings", "JwtVerifier", "__version__"]
