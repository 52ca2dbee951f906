"""Helpers of the verifiers' tests: real keys made per test, proofs minted as an operator would.

Declarations are written in their normalised form (what the kernel hands a verifier after
``jobs add`` normalised them: ``algorithms`` sorted, ``format`` filled in, ``clock_skew_s`` set).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from scheduler_toolkit.proofs import signed_message
from scheduler_toolkit.types import ProofRequest

from scheduler.api import SchedulerError

ISSUER = "https://idp.test"
AUDIENCE = "scheduler-test"
DIGEST = "sha256:" + "ab" * 32


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def write_public_pem(key: Any, path: Path) -> Path:
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def mint_jwt(key: Any, digest: str | None = DIGEST, *, alg: str = "RS256", jti: str | None = None, exp_in: int = 300,
             nbf_in: int | None = 0, iss: str = ISSUER, aud: str = AUDIENCE, kid: str | None = None, **claims: Any) -> str:
    now = int(time.time())
    payload: dict[str, Any] = {"iss": iss, "aud": aud, "exp": now + exp_in, "jti": jti or str(uuid.uuid4()), "sub": "ci", **claims}
    if digest is not None:
        payload["artifact_digest"] = digest
    if nbf_in is not None:
        payload["nbf"] = now + nbf_in
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid} if kid else None)


def jwt_declaration(**keys: Any) -> dict[str, Any]:
    return {"method": "jwt", "source": {"env": "P"}, "issuer": ISSUER, "audience": AUDIENCE, "algorithms": ["ES256", "RS256"],
            "clock_skew_s": 30, **keys}


def jwks(*pairs: tuple[str, Any]) -> dict[str, Any]:
    """A JWKS document of (kid, private key) pairs' public halves."""
    keys = []
    for kid, key in pairs:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()) if isinstance(key, rsa.RSAPrivateKey)
                         else jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        keys.append({**jwk, "kid": kid, "use": "sig"})
    return {"keys": keys}


def document(method: str, digest: str = DIGEST, *, proof_id: str | None = None, nbf_in: int = 0, exp_in: int = 300) -> dict[str, Any]:
    now = int(time.time())
    return {"proof_id": proof_id or str(uuid.uuid4()), "artifact_digest": digest, "not_before": now + nbf_in,
            "expires_at": now + exp_in}


def signed(method: str, doc: dict[str, Any], sign: Any) -> str:
    """``doc`` with the base64 of ``sign(message)`` as its signature, as JSON text."""
    message = signed_message(method, doc["proof_id"], doc["artifact_digest"], doc["not_before"], doc["expires_at"])
    return json.dumps({**doc, "signature": base64.b64encode(sign(message)).decode()})


def request(declaration: dict[str, Any], proof: str, digest: str | None = DIGEST, now_ms: int | None = None) -> ProofRequest:
    return ProofRequest(declaration=declaration, proof=proof, artifact_digest=digest,
                        now_ms=int(time.time() * 1000) if now_ms is None else now_ms)


def code_of(verifier: Any, declaration: dict[str, Any], proof: str, **kw: Any) -> str:
    """The ``PROOF_*`` code ``verifier`` refuses the proof with (it must refuse, with a message)."""
    with pytest.raises(SchedulerError) as err:
        verifier.verify_proof(request(declaration, proof, **kw))
    assert err.value.code.startswith("PROOF_") and err.value.message
    return err.value.code
