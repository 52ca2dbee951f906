"""``CertificateVerifier``: proof documents signed by an X.509 certificate's key (``scheduler.proof_verifiers:certificate``).

The document carries ``certificate_chain`` (PEM, leaf first, then any intermediates); the chain
must validate to the declared ``ca_file`` roots at the kernel's clock (cryptography's X.509 path
validation, RFC 5280 web-PKI profile, client verifier: the leaf needs extendedKeyUsage
``clientAuth``), the leaf must have the declared ``subject`` (RFC 4514, exact) and ``san`` (a DNS
name or URI) when given, and the ``signature`` (base64) must verify with the leaf's key (RSA
PKCS#1 v1.5 SHA-256, ECDSA SHA-256 or Ed25519). The reported window is the document's, narrowed
to the leaf's validity. Key id: ``sha256:<hex of the leaf certificate DER>``.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from scheduler_toolkit.proofs import fail, message_of, parse_document, read_trust_file, verified_document
from scheduler_toolkit.types import ProofRequest

from scheduler.api import VerifiedProof

METHOD = "certificate"


def _names(leaf: x509.Certificate) -> list[str]:
    """The leaf's DNS and URI subject alternative names."""
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
        str(v) for v in san.get_values_for_type(x509.UniformResourceIdentifier)]


def _check_signature(key: Any, signature: bytes, message: bytes, key_id: str) -> None:
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
    elif isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    elif isinstance(key, ed25519.Ed25519PublicKey):
        key.verify(signature, message)
    else:
        raise fail("PROOF_CERTIFICATE_INVALID", f"unsupported certificate key type {type(key).__name__}", key_id=key_id)


class CertificateVerifier:
    """The ``certificate`` proof verifier. Stateless: thread-safe."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset()

    def verify_proof(self, request: ProofRequest) -> VerifiedProof:
        """Validate the chain to the declared roots, the subject and SAN, then the document's signature with the leaf's key."""
        declaration = request.declaration
        document = parse_document(METHOD, request.proof)
        chain_pem = document.get("certificate_chain")
        if not isinstance(chain_pem, str) or "BEGIN CERTIFICATE" not in chain_pem:
            raise fail("PROOF_MALFORMED", "a certificate proof carries its certificate_chain (PEM, leaf first)")
        try:
            chain = x509.load_pem_x509_certificates(chain_pem.encode("utf-8"))
            roots = x509.load_pem_x509_certificates(read_trust_file(declaration["ca_file"], "CA file"))
        except ValueError as exc:
            raise fail("PROOF_CERTIFICATE_INVALID", f"unreadable certificate: {exc}") from None
        leaf = chain[0]
        key_id = "sha256:" + leaf.fingerprint(hashes.SHA256()).hex()
        at = datetime.datetime.fromtimestamp(request.now_ms / 1000, tz=datetime.UTC)
        try:
            PolicyBuilder().store(Store(roots)).time(at).build_client_verifier().verify(leaf, chain[1:])
        except VerificationError as exc:
            raise fail("PROOF_CERTIFICATE_INVALID", f"the certificate does not chain to {declaration['ca_file']} at this time:"
                                                    f" {exc}", key_id=key_id) from None
        subject = leaf.subject.rfc4514_string()
        if declaration.get("subject") is not None and subject != declaration["subject"]:
            raise fail("PROOF_CERTIFICATE_INVALID", f"the certificate's subject {subject!r} is not {declaration['subject']!r}",
                       key_id=key_id)
        if declaration.get("san") is not None and declaration["san"] not in _names(leaf):
            raise fail("PROOF_CERTIFICATE_INVALID", f"the certificate has no subject alternative name {declaration['san']!r}",
                       key_id=key_id)
        try:
            _check_signature(leaf.public_key(), base64.b64decode(document["signature"], validate=True),
                             message_of(METHOD, document), key_id)
        except (InvalidSignature, ValueError, binascii.Error):
            raise fail("PROOF_INVALID_SIGNATURE", "the proof's signature does not verify with the certificate's key",
                       key_id=key_id) from None
        cert_nbf = int(leaf.not_valid_before_utc.timestamp() * 1000)
        cert_exp = int(leaf.not_valid_after_utc.timestamp() * 1000)
        return verified_document(METHOD, document, key_id, subject=subject,
                                 not_before_ms=max(document["not_before"] * 1000, cert_nbf),
                                 expires_at_ms=min(document["expires_at"] * 1000, cert_exp))


__all__ = ["CertificateVerifier"]
