"""Conformance setup adapters of the three verifiers (entry points ``scheduler.conformance_adapters:jwt`` ...).

Per case each mints real keys in the case's directory (an RSA key and its PEM public key for
``jwt``, an Ed25519 key and its OpenSSH line for ``detached-signature``, a CA and a client
certificate for ``certificate``), a declaration naming them, and the proof the case asks for
(``request.defect``): ``none`` (valid for ``request.artifact_digest``, from a minute before
``request.now_ms`` to ten minutes after), ``wrong_key`` (signed by a key the declaration does not
trust: another key, or a certificate of another CA), ``bad_signature`` (the window extended after
signing), ``unbound`` (no artifact digest). Only the conformance engine and this
distribution's tests import this module.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from scheduler_toolkit.proofs import signed_message

from scheduler_provider_proofs.detached import openssh_fingerprint

ISSUER = "https://idp.conformance.invalid"
AUDIENCE = "scheduler-conformance"
KEY_ID = "conformance-key"
SAN = "signer.conformance.invalid"
#: The window of a minted proof, relative to the request's clock (seconds).
BEFORE_S, AFTER_S = 60, 600


class ProofSetup:
    """What the engine is handed: the declaration, the proof, what a verified proof reports, where the trust is."""

    def __init__(self, declaration: dict[str, Any], proof: str, *, proof_id: str, key_id: str, not_before_ms: int | None,
                 expires_at_ms: int, trust_files: list[Path]) -> None:
        self.declaration = declaration
        self.proof = proof
        self.proof_id = proof_id
        self.key_id = key_id
        self.not_before_ms = not_before_ms
        self.expires_at_ms = expires_at_ms
        self.trust_files = trust_files
        self.settings: dict[str, Any] = {}

    def close(self) -> None:
        """Nothing runs; the engine removes the case's directory (and the keys in it)."""


def _window(request: Any) -> tuple[int, int]:
    now_s = int(request.now_ms) // 1000
    return now_s - BEFORE_S, now_s + AFTER_S


def _check_defect(defect: str) -> None:
    if defect not in ("none", "wrong_key", "bad_signature", "unbound"):
        raise NotImplementedError(f"unknown defect {defect!r}")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def public_pem(key: Any) -> bytes:
    """The SubjectPublicKeyInfo PEM of a private key's public half."""
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class JwtProofs:
    """JWTs signed with RS256 by a fresh RSA key; the declaration trusts its PEM public key (``public_key_file``)."""

    def conformance_proof(self, request: Any) -> ProofSetup:
        """A PEM key and the case's JWT under ``request.workdir``."""
        _check_defect(request.defect)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pub = Path(request.workdir) / "idp.pem"
        pub.write_bytes(public_pem(key))
        nbf, exp = _window(request)
        jti = f"conformance-{uuid.uuid4()}"
        claims: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "nbf": nbf, "exp": exp, "jti": jti, "sub": "conformance",
                                  "artifact_digest": request.artifact_digest}
        if request.defect == "unbound":
            del claims["artifact_digest"]
        signer = rsa.generate_private_key(public_exponent=65537, key_size=2048) if request.defect == "wrong_key" else key
        token = jwt.encode(claims, signer, algorithm="RS256", headers={"kid": KEY_ID})
        if request.defect == "bad_signature":
            head, _, signature = token.split(".")
            longer = _b64url(json.dumps({**claims, "exp": exp + 3600}, separators=(",", ":")).encode())
            token = f"{head}.{longer}.{signature}"
        declaration = {"method": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "algorithms": ["RS256"],
                       "public_key_file": str(pub)}
        return ProofSetup(declaration, token, proof_id=jti, key_id=KEY_ID, not_before_ms=nbf * 1000, expires_at_ms=exp * 1000,
                          trust_files=[pub])


def _document(method: str, request: Any, sign: Any) -> tuple[str, str, int, int]:
    """A proof document for ``method`` signed by ``sign(message) -> bytes``, with the request's defect applied."""
    nbf, exp = _window(request)
    proof_id = f"conformance-{uuid.uuid4()}"
    document: dict[str, Any] = {"proof_id": proof_id, "artifact_digest": request.artifact_digest, "not_before": nbf,
                                "expires_at": exp}
    document["signature"] = base64.b64encode(sign(signed_message(method, proof_id, request.artifact_digest, nbf, exp))).decode()
    if request.defect == "bad_signature":
        document["expires_at"] = exp + 3600
    if request.defect == "unbound":
        del document["artifact_digest"]
    return json.dumps(document), proof_id, nbf, exp


class Ed25519Proofs:
    """Proof documents with a raw Ed25519 signature; the declaration trusts the key's OpenSSH line (``public_key_file``)."""

    def conformance_proof(self, request: Any) -> ProofSetup:
        """An Ed25519 key and the case's proof document under ``request.workdir``."""
        _check_defect(request.defect)
        key = ed25519.Ed25519PrivateKey.generate()
        pub = Path(request.workdir) / "signer.pub"
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
        signer = ed25519.Ed25519PrivateKey.generate() if request.defect == "wrong_key" else key
        text, proof_id, nbf, exp = _document("detached-signature", request, signer.sign)
        declaration = {"method": "detached-signature", "format": "ed25519", "public_key_file": str(pub)}
        return ProofSetup(declaration, text, proof_id=proof_id, key_id=openssh_fingerprint(key.public_key()),
                          not_before_ms=nbf * 1000, expires_at_ms=exp * 1000, trust_files=[pub])


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(now: datetime.datetime, cn: str = "Conformance CA") -> tuple[Any, x509.Certificate]:
    """A self-signed EC CA valid from a day before ``now`` to thirty days after."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca_key: Any, ca: x509.Certificate, now: datetime.datetime, *, cn: str = "conformance-signer", san: str = SAN,
              start: datetime.timedelta = datetime.timedelta(hours=-1),
              end: datetime.timedelta = datetime.timedelta(days=7)) -> tuple[Any, x509.Certificate]:
    """An EC client certificate (extendedKeyUsage clientAuth, a DNS SAN) issued by ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now + start).not_valid_after(now + end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def pem(cert: x509.Certificate) -> str:
    """A certificate as PEM text."""
    return cert.public_bytes(serialization.Encoding.PEM).decode()


class CertificateProofs:
    """Proof documents signed (ECDSA SHA-256) by a client certificate's key; the declaration trusts the CA (``ca_file``)."""

    def conformance_proof(self, request: Any) -> ProofSetup:
        """A CA, a leaf certificate and the case's proof document under ``request.workdir``."""
        _check_defect(request.defect)
        now = datetime.datetime.fromtimestamp(int(request.now_ms) / 1000, tz=datetime.UTC)
        ca_key, ca = make_ca(now)
        ca_file = Path(request.workdir) / "ca.pem"
        ca_file.write_text(pem(ca))
        issuer_key, issuer = make_ca(now, "Another CA") if request.defect == "wrong_key" else (ca_key, ca)
        leaf_key, leaf = make_leaf(issuer_key, issuer, now)
        text, proof_id, nbf, exp = _document("certificate", request, lambda m: leaf_key.sign(m, ec.ECDSA(hashes.SHA256())))
        document = json.loads(text)
        document["certificate_chain"] = pem(leaf)
        declaration = {"method": "certificate", "ca_file": str(ca_file), "san": SAN}
        key_id = "sha256:" + hashlib.sha256(leaf.public_bytes(serialization.Encoding.DER)).hexdigest()
        return ProofSetup(declaration, json.dumps(document), proof_id=proof_id, key_id=key_id, not_before_ms=nbf * 1000,
                          expires_at_ms=exp * 1000, trust_files=[ca_file])


__all__ = [
    "AUDIENCE",
    "ISSUER",
    "KEY_ID",
    "SAN",
    "CertificateProofs",
    "Ed25519Proofs",
    "JwtProofs",
    "ProofSetup",
    "make_ca",
    "make_leaf",
    "pem",
    "public_pem",
]
