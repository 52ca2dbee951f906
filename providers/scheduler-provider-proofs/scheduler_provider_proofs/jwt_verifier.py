"""``JwtVerifier``: authorization proofs that are compact JWTs (entry point ``scheduler.proof_verifiers:jwt``).

A proof is a JWT signed with an asymmetric algorithm the declaration allows (``algorithms``:
RS*, PS*, ES*, EdDSA; never ``HS*`` or ``none``), verified with the declared key: a PEM public
key (``public_key_file``), or the key named by the ``kid`` header in a JWKS (``jwks_file``, or
``jwks_url`` fetched afresh per proof). Claims ``iss`` and ``aud`` must be the declared ones;
``exp``, ``jti`` (the proof id) and ``artifact_digest`` are required, ``nbf`` and ``sub`` optional.
The key id is the ``kid`` header, else ``sha256:<hex>`` of the key's SubjectPublicKeyInfo (DER).
The window (``nbf``, ``exp``) is reported, not judged: the kernel checks it with the declared skew.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import attrs
import jwt
from cryptography.hazmat.primitives import serialization
from scheduler_toolkit.proofs import artifact_claim, fail, proof_id, read_trust_file
from scheduler_toolkit.types import ProofRequest

from scheduler.api import VerifiedProof
from scheduler_provider_proofs.jwks import fetch_jwks

METHOD = "jwt"


@attrs.frozen(kw_only=True)
class JwtSettings:
    """``[providers.jwt]`` of the settings file."""

    jwks_timeout_s: float = attrs.field(default=5.0, metadata={
        "doc": "Seconds a jwks_url fetch may take (connect and each read).", "minimum": 0.1, "maximum": 60})


class JwtVerifier:
    """The ``jwt`` proof verifier. Stateless per call (settings aside): thread-safe."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset()
    settings_class = JwtSettings

    def __init__(self) -> None:
        self._settings = JwtSettings()

    def configure(self, settings: JwtSettings) -> None:
        """Take the validated ``[providers.jwt]`` settings (the loader calls this once)."""
        self._settings = settings

    def verify_proof(self, request: ProofRequest) -> VerifiedProof:
        """Verify the JWT's signature, algorithm, issuer, audience and required claims; report its id, key and window."""
        declaration, token = request.declaration, request.proof
        algorithms = list(declaration["algorithms"])
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise fail("PROOF_MALFORMED", f"the proof is not a compact JWT: {exc}") from None
        if header.get("alg") not in algorithms:
            raise fail("PROOF_INVALID_SIGNATURE", f"JWT algorithm {str(header.get('alg'))[:20]!r} is not one of the declared"
                                                  f" {', '.join(algorithms)}")
        key, key_id = self._key(declaration, header)
        claims = _decode(token, key, key_id, declaration, algorithms)
        jti = proof_id(METHOD, claims.get("jti"), "jti")
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if isinstance(exp, bool) or not isinstance(exp, (int, float)) or (
                nbf is not None and (isinstance(nbf, bool) or not isinstance(nbf, (int, float)))):
            raise fail("PROOF_MALFORMED", "the JWT's exp/nbf must be numbers (epoch seconds)")
        digest = artifact_claim(METHOD, claims.get("artifact_digest"))
        sub = claims.get("sub")
        return VerifiedProof(method=METHOD, proof_id=jti, key_id=key_id, artifact_digest=digest,
                             not_before_ms=None if nbf is None else int(nbf * 1000), expires_at_ms=int(exp * 1000),
                             issuer=declaration["issuer"], subject=sub if isinstance(sub, str) else None)

    def _key(self, declaration: Any, header: dict[str, Any]) -> tuple[Any, str]:
        """The verifying key and its key id (``kid``, or the SPKI digest of a PEM key without one)."""
        kid = header.get("kid")
        if "public_key_file" in declaration:
            data = read_trust_file(declaration["public_key_file"], "public key file")
            try:
                key = serialization.load_pem_public_key(data)
            except (ValueError, TypeError) as exc:
                raise fail("PROOF_KEY_UNAVAILABLE", f"{declaration['public_key_file']} is not a PEM public key: {exc}") from None
            spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            return key, (kid if isinstance(kid, str) and kid else "sha256:" + hashlib.sha256(spki).hexdigest())
        if "jwks_file" in declaration:
            text, where = read_trust_file(declaration["jwks_file"], "JWKS file"), declaration["jwks_file"]
        else:
            text = fetch_jwks(declaration["jwks_url"], timeout_s=self._settings.jwks_timeout_s)
            where = declaration["jwks_url"]
        if not isinstance(kid, str) or not kid:
            raise fail("PROOF_MALFORMED", "a JWT verified against a JWKS must name its key in the kid header")
        try:
            keyset = jwt.PyJWKSet.from_dict(json.loads(text))
        except (ValueError, TypeError, jwt.PyJWTError) as exc:
            raise fail("PROOF_KEY_UNAVAILABLE", f"the JWKS at {where} is not usable: {exc}") from None
        for jwk in keyset.keys:
            if jwk.key_id == kid:
                return jwk.key, kid
        raise fail("PROOF_KEY_UNAVAILABLE", f"the JWKS at {where} has no key {kid!r}", key_id=kid)


def _decode(token: str, key: Any, key_id: str, declaration: Any, algorithms: list[str]) -> dict[str, Any]:
    """The verified claims (signature, ``iss``, ``aud`` and the required claims; the window is left to the kernel)."""
    try:
        return jwt.decode(
            token, key, algorithms=algorithms, audience=declaration["audience"], issuer=declaration["issuer"],
            options={"require": ["exp", "iss", "aud", "jti"], "verify_exp": False, "verify_nbf": False, "verify_iat": False},
        )
    except jwt.InvalidSignatureError:
        raise fail("PROOF_INVALID_SIGNATURE", "the JWT signature does not verify with the declared key", key_id=key_id) from None
    except jwt.InvalidAudienceError:
        raise fail("PROOF_AUDIENCE_MISMATCH", f"the JWT is not for audience {declaration['audience']!r}") from None
    except jwt.InvalidIssuerError:
        raise fail("PROOF_ISSUER_MISMATCH", f"the JWT was not issued by {declaration['issuer']!r}") from None
    except jwt.MissingRequiredClaimError as exc:
        raise fail("PROOF_MALFORMED", f"the JWT lacks a required claim: {exc}") from None
    except (jwt.InvalidAlgorithmError, jwt.InvalidKeyError, TypeError) as exc:  # TypeError: the key is not of the alg's type
        raise fail("PROOF_INVALID_SIGNATURE", f"the JWT cannot be verified with the declared key: {exc}") from None
    except jwt.PyJWTError as exc:
        raise fail("PROOF_MALFORMED", f"the JWT is not valid: {exc}") from None


__all__ = ["JwtSettings", "JwtVerifier"]
