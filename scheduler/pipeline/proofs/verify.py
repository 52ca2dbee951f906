"""Cryptographic verification of one authorization proof (JWT, detached signature, X.509 certificate).

Pure functions of the declaration, the proof text and the clock: no database. Each returns a
``VerifiedProof`` (method, proof id, key id, the verified window and the skew used) or raises
``SchedulerError`` with a ``PROOF_*`` code. The exact formats are in docs/proofs.md:

- ``jwt``: a compact JWT signed with an asymmetric algorithm; claims ``iss``, ``aud``, ``exp``,
  ``jti`` and ``artifact_digest`` required, ``nbf`` optional; key id = the ``kid`` header, else
  ``sha256:<hex>`` of the verifying key's SubjectPublicKeyInfo (DER).
- ``detached-signature`` and ``certificate``: a JSON proof document ``{proof_id, artifact_digest,
  not_before, expires_at, signature[, certificate_chain]}`` (times in epoch seconds); the signed
  message is the canonical JSON (json-sort-v1) of ``signed_message_fields(...)``.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.canonical import canonical_json
from scheduler.base.errors import SchedulerError

#: Largest proof (token or document) read from a source, and largest key/JWKS/CA file.
MAX_PROOF_BYTES = 64 * 1024
MAX_KEY_FILE_BYTES = 1024 * 1024
JWKS_TIMEOUT_S = 5.0
SSH_KEYGEN_TIMEOUT_S = 10.0
#: ``schema`` of the signed message of detached-signature and certificate proofs.
MESSAGE_SCHEMA = "scheduler.authorization-proof"
_PROOF_ID_RE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,256}")
_DOCUMENT_KEYS = frozenset({"proof_id", "artifact_digest", "not_before", "expires_at", "signature", "certificate_chain"})


@attrs.frozen
class VerifiedProof:
    """What a verified proof established (never the proof itself)."""
    method: str
    proof_id: str
    key_id: str
    artifact_digest: str
    not_before_ms: int | None
    expires_at_ms: int
    skew_ms: int
    issuer: str | None = None
    subject: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record kept on the run (``runs.proof_json``) and in the ``proof.verified`` event."""
        return {"method": self.method, "proof_id": self.proof_id, "key_id": self.key_id, "artifact_digest": self.artifact_digest,
                "not_before": self.not_before_ms, "expires_at": self.expires_at_ms, "clock_skew_ms": self.skew_ms,
                "issuer": self.issuer, "subject": self.subject}


def fail(code: str, message: str, **details: Any) -> SchedulerError:
    """A ``PROOF_*`` error (details never hold the proof)."""
    return SchedulerError(code, message, details=details or None)


# --------------------------------------------------------------------------- the source


def read_source(declaration: dict[str, Any], env: dict[str, str] | None = None) -> str:
    """The proof text from the declared source, read afresh (``PROOF_MISSING`` when absent, empty or oversized)."""
    source = declaration["source"]
    if "env" in source:
        value = (os.environ if env is None else env).get(source["env"], "")
        where = f"environment variable {source['env']}"
    else:
        where = f"file {source['file']}"
        try:
            with open(source["file"], "rb") as fh:
                raw = fh.read(MAX_PROOF_BYTES + 1)
        except OSError as exc:
            raise fail("PROOF_MISSING", f"no proof: cannot read {where}: {exc.strerror}") from None
        if len(raw) > MAX_PROOF_BYTES:
            raise fail("PROOF_MALFORMED", f"the proof in {where} is larger than {MAX_PROOF_BYTES} bytes")
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise fail("PROOF_MALFORMED", f"the proof in {where} is not UTF-8 text") from None
    value = value.strip()
    if not value:
        raise fail("PROOF_MISSING", f"no proof: {where} is unset or empty")
    if len(value.encode("utf-8")) > MAX_PROOF_BYTES:
        raise fail("PROOF_MALFORMED", f"the proof in {where} is larger than {MAX_PROOF_BYTES} bytes")
    return value


def _read_key_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise fail("PROOF_KEY_UNAVAILABLE", f"cannot read the {what} {path}: {exc.strerror}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise fail("PROOF_KEY_UNAVAILABLE", f"the {what} {path} is larger than {MAX_KEY_FILE_BYTES} bytes")
    return data


def _check_window(method: str, not_before_ms: int | None, expires_at_ms: int, skew_ms: int, now_ms: int) -> None:
    """``PROOF_NOT_YET_VALID`` before ``not_before - skew``, ``PROOF_EXPIRED`` at or after ``expires_at + skew``."""
    if not_before_ms is not None and now_ms < not_before_ms - skew_ms:
        raise fail("PROOF_NOT_YET_VALID", f"the {method} proof is valid from {not_before_ms} ms (epoch), now is {now_ms}"
                                          f" (clock skew {skew_ms} ms)")
    if now_ms >= expires_at_ms + skew_ms:
        raise fail("PROOF_EXPIRED", f"the {method} proof expired at {expires_at_ms} ms (epoch), now is {now_ms}"
                                    f" (clock skew {skew_ms} ms)")


def check_window(record: dict[str, Any], now_ms: int) -> None:
    """Re-check a recorded window (``VerifiedProof.to_json()``) with its recorded skew: after an approval wait."""
    _check_window(record["method"], record.get("not_before"), int(record["expires_at"]), int(record["clock_skew_ms"]), now_ms)


def _check_artifact(method: str, claimed: Any, artifact_digest: str | None) -> str:
    if not isinstance(claimed, str):
        raise fail("PROOF_MALFORMED", f"the {method} proof carries no artifact_digest (a proof must be bound to the artifact)")
    if artifact_digest is None or claimed != artifact_digest:
        raise fail("PROOF_ARTIFACT_MISMATCH", f"the {method} proof is bound to artifact {claimed[:80]}, this run's job is"
                                              f" {artifact_digest}", proof_artifact=claimed[:80], artifact_digest=artifact_digest)
    return claimed


def _proof_id(method: str, value: Any, name: str) -> str:
    if not isinstance(value, str) or not _PROOF_ID_RE.fullmatch(value):
        raise fail("PROOF_MALFORMED", f"the {method} proof's {name} must be 1-256 characters of [A-Za-z0-9._:@/+=-]")
    return value


def verify(declaration: dict[str, Any], proof: str, *, artifact_digest: str | None, now_ms: int | None = None) -> VerifiedProof:
    """Verify ``proof`` (text from the declared source) against ``declaration`` for an artifact, at ``now_ms``."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    method = declaration["method"]
    if method == "jwt":
        return _verify_jwt(declaration, proof, artifact_digest, now_ms)
    document = _document(method, proof)
    if method == "detached-signature":
        return _verify_detached(declaration, document, artifact_digest, now_ms)
    return _verify_certificate(declaration, document, artifact_digest, now_ms)


# --------------------------------------------------------------------------- jwt


def _jwt_key(declaration: dict[str, Any], header: dict[str, Any]) -> tuple[Any, str]:
    """The verifying key and its key id (``kid`` or the SPKI digest)."""
    import jwt
    from cryptography.hazmat.primitives import serialization

    kid = header.get("kid")
    if "public_key_file" in declaration:
        data = _read_key_file(declaration["public_key_file"], "public key file")
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as exc:
            raise fail("PROOF_KEY_UNAVAILABLE", f"{declaration['public_key_file']} is not a PEM public key: {exc}") from None
        spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return key, (kid if isinstance(kid, str) and kid else "sha256:" + hashlib.sha256(spki).hexdigest())
    if "jwks_file" in declaration:
        text = _read_key_file(declaration["jwks_file"], "JWKS file")
        where = declaration["jwks_file"]
    else:
        text, where = _fetch_jwks(declaration["jwks_url"]), declaration["jwks_url"]
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


def _fetch_jwks(url: str) -> bytes:
    """GET the JWKS (httpx, bounded in time and size, no redirects: the declared URL is the trust anchor)."""
    import httpx

    try:
        with httpx.Client(timeout=JWKS_TIMEOUT_S, follow_redirects=False, trust_env=False) as client:
            with client.stream("GET", url, headers={"accept": "application/json"}) as response:
                if response.status_code != 200:
                    raise fail("PROOF_KEY_UNAVAILABLE", f"the JWKS at {url} answered HTTP {response.status_code}")
                body = b""
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_KEY_FILE_BYTES:
                        raise fail("PROOF_KEY_UNAVAILABLE", f"the JWKS at {url} is larger than {MAX_KEY_FILE_BYTES} bytes")
                return body
    except httpx.HTTPError as exc:
        raise fail("PROOF_KEY_UNAVAILABLE", f"cannot fetch the JWKS at {url}: {type(exc).__name__}: {exc}") from None


def _verify_jwt(declaration: dict[str, Any], token: str, artifact_digest: str | None, now_ms: int) -> VerifiedProof:
    import jwt

    skew_s = int(declaration["clock_skew_s"])
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise fail("PROOF_MALFORMED", f"the proof is not a compact JWT: {exc}") from None
    if header.get("alg") not in declaration["algorithms"]:
        raise fail("PROOF_INVALID_SIGNATURE", f"JWT algorithm {str(header.get('alg'))[:20]!r} is not one of the declared"
                                              f" {', '.join(declaration['algorithms'])}")
    key, key_id = _jwt_key(declaration, header)
    try:
        claims = jwt.decode(
            token, key, algorithms=declaration["algorithms"], audience=declaration["audience"], issuer=declaration["issuer"],
            leeway=skew_s, options={"require": ["exp", "iss", "aud", "jti"], "verify_exp": False, "verify_nbf": False,
                                    "verify_iat": False},
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
    proof_id = _proof_id("jwt", claims.get("jti"), "jti")
    exp, nbf = claims.get("exp"), claims.get("nbf")
    if isinstance(exp, bool) or not isinstance(exp, (int, float)) or (
            nbf is not None and (isinstance(nbf, bool) or not isinstance(nbf, (int, float)))):
        raise fail("PROOF_MALFORMED", "the JWT's exp/nbf must be numbers (epoch seconds)")
    expires_at_ms, not_before_ms = int(exp * 1000), None if nbf is None else int(nbf * 1000)
    _check_window("jwt", not_before_ms, expires_at_ms, skew_s * 1000, now_ms)
    digest = _check_artifact("jwt", claims.get("artifact_digest"), artifact_digest)
    sub = claims.get("sub")
    return VerifiedProof(method="jwt", proof_id=proof_id, key_id=key_id, artifact_digest=digest, not_before_ms=not_before_ms,
                         expires_at_ms=expires_at_ms, skew_ms=skew_s * 1000, issuer=declaration["issuer"],
                         subject=sub if isinstance(sub, str) else None)


# --------------------------------------------------------------------------- proof documents


def signed_message_fields(method: str, proof_id: str, artifact_digest: str, not_before: int, expires_at: int) -> dict[str, Any]:
    """The object whose canonical JSON (json-sort-v1, UTF-8) a detached-signature or certificate proof signs."""
    return {"schema": MESSAGE_SCHEMA, "version": 1, "method": method, "proof_id": proof_id,
            "artifact_digest": artifact_digest, "not_before": not_before, "expires_at": expires_at}


def signed_message(method: str, proof_id: str, artifact_digest: str, not_before: int, expires_at: int) -> bytes:
    """The exact bytes a detached-signature or certificate proof signs."""
    return canonical_json(signed_message_fields(method, proof_id, artifact_digest, not_before, expires_at)).encode("utf-8")


def _document(method: str, proof: str) -> dict[str, Any]:
    try:
        document = json.loads(proof)
    except ValueError:
        raise fail("PROOF_MALFORMED", f"a {method} proof must be a JSON proof document (docs/proofs.md)") from None
    if not isinstance(document, dict):
        raise fail("PROOF_MALFORMED", f"a {method} proof must be a JSON object")
    unknown = sorted(str(k) for k in document if k not in _DOCUMENT_KEYS)
    if unknown:
        raise fail("PROOF_MALFORMED", f"the proof document has unknown keys: {', '.join(unknown)[:200]}")
    for key in ("not_before", "expires_at"):
        if isinstance(document.get(key), bool) or not isinstance(document.get(key), int):
            raise fail("PROOF_MALFORMED", f"the proof document's {key} must be an integer (epoch seconds)")
    if not isinstance(document.get("signature"), str) or not document["signature"]:
        raise fail("PROOF_MALFORMED", "the proof document carries no signature")
    if not isinstance(document.get("artifact_digest"), str):
        raise fail("PROOF_MALFORMED", f"the {method} proof carries no artifact_digest (a proof must be bound to the artifact)")
    _proof_id(method, document.get("proof_id"), "proof_id")
    return document


def _message_of(method: str, document: dict[str, Any]) -> bytes:
    return signed_message(method, document["proof_id"], document["artifact_digest"], document["not_before"], document["expires_at"])


def _finish_document(method: str, document: dict[str, Any], key_id: str, skew_ms: int, artifact_digest: str | None,
                     now_ms: int, *, subject: str | None = None, not_before_ms: int | None = None,
                     expires_at_ms: int | None = None) -> VerifiedProof:
    nbf = document["not_before"] * 1000 if not_before_ms is None else not_before_ms
    exp = document["expires_at"] * 1000 if expires_at_ms is None else expires_at_ms
    _check_window(method, nbf, exp, skew_ms, now_ms)
    digest = _check_artifact(method, document["artifact_digest"], artifact_digest)
    return VerifiedProof(method=method, proof_id=document["proof_id"], key_id=key_id, artifact_digest=digest,
                         not_before_ms=nbf, expires_at_ms=exp, skew_ms=skew_ms, subject=subject)


def openssh_fingerprint(public_key: Any) -> str:
    """``SHA256:<base64>`` of a public key's OpenSSH wire blob: what ``ssh-keygen -l`` prints for it."""
    from cryptography.hazmat.primitives import serialization

    line = public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def _verify_detached(declaration: dict[str, Any], document: dict[str, Any], artifact_digest: str | None,
                     now_ms: int) -> VerifiedProof:
    skew_ms = int(declaration["clock_skew_s"]) * 1000
    message = _message_of("detached-signature", document)
    if declaration["format"] == "ed25519":
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        data = _read_key_file(declaration["public_key_file"], "public key file")
        try:
            key = (serialization.load_ssh_public_key(data) if data.lstrip().startswith(b"ssh-")
                   else serialization.load_pem_public_key(data))
        except (ValueError, TypeError, Exception) as exc:  # noqa: BLE001 - any unreadable key is unavailable
            raise fail("PROOF_KEY_UNAVAILABLE", f"{declaration['public_key_file']} is not an Ed25519 public key: {exc}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise fail("PROOF_KEY_UNAVAILABLE", f"{declaration['public_key_file']} is not an Ed25519 public key")
        key_id = openssh_fingerprint(key)
        try:
            signature = base64.b64decode(document["signature"], validate=True)
            key.verify(signature, message)
        except (InvalidSignature, ValueError):
            raise fail("PROOF_INVALID_SIGNATURE", "the Ed25519 signature does not verify with the declared key",
                       key_id=key_id) from None
        return _finish_document("detached-signature", document, key_id, skew_ms, artifact_digest, now_ms)
    key_id = _ssh_verify(declaration, message, document["signature"])
    return _finish_document("detached-signature", document, key_id, skew_ms, artifact_digest, now_ms,
                            subject=declaration["principal"])


def _ssh_verify(declaration: dict[str, Any], message: bytes, signature: str) -> str:
    """``ssh-keygen -Y verify`` of ``message`` for the declared principal and namespace; the signing key's fingerprint."""
    signers = declaration["allowed_signers_file"]
    if not Path(signers).is_file():
        raise fail("PROOF_KEY_UNAVAILABLE", f"the allowed signers file {signers} does not exist")
    with tempfile.TemporaryDirectory(prefix="scheduler-proof-") as tmp:
        sig_path = Path(tmp, "proof.sig")
        sig_path.write_text(signature if signature.endswith("\n") else signature + "\n", encoding="utf-8")
        try:
            done = subprocess.run(
                ["ssh-keygen", "-Y", "verify", "-f", signers, "-I", declaration["principal"], "-n", declaration["namespace"],
                 "-s", str(sig_path)],
                input=message, capture_output=True, timeout=SSH_KEYGEN_TIMEOUT_S, check=False,
            )
        except FileNotFoundError:
            raise fail("PROOF_KEY_UNAVAILABLE", "ssh-keygen is not installed on the dispatcher's host") from None
        except subprocess.TimeoutExpired:
            raise fail("PROOF_INVALID_SIGNATURE", f"ssh-keygen -Y verify did not answer within {SSH_KEYGEN_TIMEOUT_S:g}s") from None
    said = (done.stdout + done.stderr).decode("utf-8", "replace")
    if done.returncode != 0:
        raise fail("PROOF_INVALID_SIGNATURE", f"ssh-keygen -Y verify refused the signature for principal"
                                              f" {declaration['principal']!r}: {said.strip()[:300]}")
    match = re.search(r"key (SHA256:[A-Za-z0-9+/=]+)", said)
    if match is None:
        raise fail("PROOF_INVALID_SIGNATURE", f"ssh-keygen -Y verify gave no key fingerprint: {said.strip()[:300]}")
    return match.group(1)


# --------------------------------------------------------------------------- certificate


def _verify_certificate(declaration: dict[str, Any], document: dict[str, Any], artifact_digest: str | None,
                        now_ms: int) -> VerifiedProof:

    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    skew_ms = int(declaration["clock_skew_s"]) * 1000
    chain_pem = document.get("certificate_chain")
    if not isinstance(chain_pem, str) or "BEGIN CERTIFICATE" not in chain_pem:
        raise fail("PROOF_MALFORMED", "a certificate proof carries its certificate_chain (PEM, leaf first)")
    try:
        chain = x509.load_pem_x509_certificates(chain_pem.encode("utf-8"))
        roots = x509.load_pem_x509_certificates(_read_key_file(declaration["ca_file"], "CA file"))
    except ValueError as exc:
        raise fail("PROOF_CERTIFICATE_INVALID", f"unreadable certificate: {exc}") from None
    leaf = chain[0]
    key_id = "sha256:" + leaf.fingerprint(hashes.SHA256()).hex()
    # The chain, checked by cryptography's X.509 path validation (RFC 5280 web-PKI profile, client verifier) at the
    # proof's use time; subject and SAN requirements checked below.
    from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

    at = datetime.datetime.fromtimestamp(now_ms / 1000, tz=datetime.timezone.utc)
    try:
        verifier = PolicyBuilder().store(Store(roots)).time(at).build_client_verifier()
        verifier.verify(leaf, chain[1:])
    except VerificationError as exc:
        raise fail("PROOF_CERTIFICATE_INVALID", f"the certificate does not chain to {declaration['ca_file']} at this time: {exc}",
                   key_id=key_id) from None
    subject = leaf.subject.rfc4514_string()
    if declaration.get("subject") is not None and subject != declaration["subject"]:
        raise fail("PROOF_CERTIFICATE_INVALID", f"the certificate's subject {subject!r} is not {declaration['subject']!r}",
                   key_id=key_id)
    if declaration.get("san") is not None:
        try:
            names = [str(v) for v in leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                     .get_values_for_type(x509.DNSName)]
            names += [str(v) for v in leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                      .get_values_for_type(x509.UniformResourceIdentifier)]
        except x509.ExtensionNotFound:
            names = []
        if declaration["san"] not in names:
            raise fail("PROOF_CERTIFICATE_INVALID", f"the certificate has no subject alternative name {declaration['san']!r}",
                       key_id=key_id)
    message = _message_of("certificate", document)
    key = leaf.public_key()
    try:
        signature = base64.b64decode(document["signature"], validate=True)
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, message)
        else:
            raise fail("PROOF_CERTIFICATE_INVALID", f"unsupported certificate key type {type(key).__name__}", key_id=key_id)
    except (InvalidSignature, ValueError):
        raise fail("PROOF_INVALID_SIGNATURE", "the proof's signature does not verify with the certificate's key",
                   key_id=key_id) from None
    # The verified window is the document's, narrowed to the certificate's own validity.
    cert_nbf = int(leaf.not_valid_before_utc.timestamp() * 1000)
    cert_exp = int(leaf.not_valid_after_utc.timestamp() * 1000)
    return _finish_document("certificate", document, key_id, skew_ms, artifact_digest, now_ms, subject=subject,
                            not_before_ms=max(document["not_before"] * 1000, cert_nbf),
                            expires_at_ms=min(document["expires_at"] * 1000, cert_exp))
