"""Helpers for the authorization-proof tests: real keys generated per test, proofs minted like an operator would.

The signed message of a proof document is built here from docs/proofs.md (sorted keys, no
spaces, UTF-8), not imported from a verifier: an independent oracle of the format the
first-party verifiers (``scheduler-provider-proofs``, ``scheduler-provider-ssh``) check.
(No tests here; named so that it belongs with tests/test_proofs*.py.)
"""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ISSUER = "https://idp.test"
AUDIENCE = "scheduler-test"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def write_public_pem(key: Any, path: Path) -> Path:
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def mint_jwt(key: Any, digest: str, *, alg: str = "RS256", jti: str | None = None, exp_in: int = 300, nbf_in: int | None = 0,
             iss: str = ISSUER, aud: str = AUDIENCE, kid: str | None = None, **claims: Any) -> str:
    now = int(time.time())
    payload: dict[str, Any] = {"iss": iss, "aud": aud, "exp": now + exp_in, "jti": jti or str(uuid.uuid4()),
                               "artifact_digest": digest, "sub": "ci-pipeline", **claims}
    if nbf_in is not None:
        payload["nbf"] = now + nbf_in
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid} if kid else None)


def jwt_declaration(source: dict[str, str], **keys: Any) -> dict[str, Any]:
    return {"method": "jwt", "source": source, "issuer": ISSUER, "audience": AUDIENCE, "algorithms": ["RS256", "ES256"], **keys}


def jwks(*pairs: tuple[str, Any]) -> dict[str, Any]:
    """A JWKS document of (kid, private key) pairs' public halves."""
    keys = []
    for kid, key in pairs:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()) if isinstance(key, rsa.RSAPrivateKey)
                         else jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        keys.append({**jwk, "kid": kid, "use": "sig"})
    return {"keys": keys}


def document(method: str, digest: str, *, proof_id: str | None = None, nbf_in: int = 0, exp_in: int = 300) -> dict[str, Any]:
    now = int(time.time())
    return {"proof_id": proof_id or str(uuid.uuid4()), "artifact_digest": digest, "not_before": now + nbf_in,
            "expires_at": now + exp_in}


def signed_message(method: str, proof_id: str, artifact_digest: str, not_before: int, expires_at: int) -> bytes:
    """The bytes a detached-signature or certificate proof signs, as docs/proofs.md defines them."""
    fields = {"schema": "scheduler.authorization-proof", "version": 1, "method": method, "proof_id": proof_id,
              "artifact_digest": artifact_digest, "not_before": not_before, "expires_at": expires_at}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def message_of(method: str, doc: dict[str, Any]) -> bytes:
    return signed_message(method, doc["proof_id"], doc["artifact_digest"], doc["not_before"], doc["expires_at"])


def ed25519_proof(key: ed25519.Ed25519PrivateKey, digest: str, **kw: Any) -> str:
    doc = document("detached-signature", digest, **kw)
    doc["signature"] = base64.b64encode(key.sign(message_of("detached-signature", doc))).decode()
    return json.dumps(doc)


def ssh_keypair(tmp: Path, principal: str = "release@example.test") -> tuple[Path, Path]:
    """A real ssh-keygen Ed25519 key and an allowed_signers file for ``principal``."""
    key = tmp / f"id_{uuid.uuid4().hex[:6]}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "proof-test", "-f", str(key)], check=True)
    signers = tmp / f"allowed_signers_{key.name}"
    signers.write_text(f"{principal} {key.with_suffix('.pub').read_text().strip()}\n")
    return key, signers


def ssh_proof(key: Path, digest: str, namespace: str = "scheduler-proof", **kw: Any) -> str:
    doc = document("detached-signature", digest, **kw)
    done = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", namespace], input=message_of("detached-signature", doc),
                          capture_output=True, check=True)
    doc["signature"] = done.stdout.decode()
    return json.dumps(doc)


def ssh_fingerprint(key: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(key.with_suffix(".pub"))], capture_output=True, check=True, text=True).stdout
    return out.split()[1]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(days: int = 30) -> tuple[Any, x509.Certificate]:
    key = ec_key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("Proof Test CA")).issuer_name(_name("Proof Test CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca_key: Any, ca_cert: x509.Certificate, *, cn: str = "deployer", san: str = "deployer.example.test",
              start: datetime.timedelta = datetime.timedelta(hours=-1),
              end: datetime.timedelta = datetime.timedelta(days=7)) -> tuple[Any, x509.Certificate]:
    key = ec_key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now + start).not_valid_after(now + end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def certificate_proof(leaf_key: Any, leaf: x509.Certificate, digest: str, **kw: Any) -> str:
    doc = document("certificate", digest, **kw)
    doc["certificate_chain"] = pem(leaf)
    doc["signature"] = base64.b64encode(leaf_key.sign(message_of("certificate", doc), ec.ECDSA(hashes.SHA256()))).decode()
    return json.dumps(doc)
