"""``DetachedSignatureVerifier``: proof documents with a raw Ed25519 signature (``scheduler.proof_verifiers:detached-signature``).

For declarations of ``method`` ``detached-signature`` and ``format`` ``ed25519``: the document's
``signature`` is the base64 of a raw Ed25519 signature of the signed message
(``scheduler_toolkit.proofs``), verified with the declared ``public_key_file`` (PEM,
or an OpenSSH ``ssh-ed25519`` line). The key id is the key's OpenSSH ``SHA256:...``
fingerprint, as ``ssh-keygen -l`` prints it. (Format ``ssh`` is the ``detached-signature-ssh``
verifier of ``scheduler-provider-ssh``.)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from scheduler_toolkit.proofs import fail, message_of, parse_document, read_trust_file, verified_document
from scheduler_toolkit.types import ProofRequest

from scheduler.api import VerifiedProof

METHOD = "detached-signature"
FORMAT = "ed25519"


def openssh_fingerprint(public_key: Any) -> str:
    """``SHA256:<base64>`` of a public key's OpenSSH wire blob: what ``ssh-keygen -l`` prints for it."""
    line = public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def load_ed25519_key(path: str) -> Ed25519PublicKey:
    """The Ed25519 public key in ``path`` (PEM or an OpenSSH line); ``PROOF_KEY_UNAVAILABLE`` for anything else."""
    data = read_trust_file(path, "public key file")
    try:
        key = (serialization.load_ssh_public_key(data) if data.lstrip().startswith(b"ssh-")
               else serialization.load_pem_public_key(data))
    except Exception as exc:  # noqa: BLE001 - any unreadable key is unavailable (cryptography raises several types)
        raise fail("PROOF_KEY_UNAVAILABLE", f"{path} is not an Ed25519 public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise fail("PROOF_KEY_UNAVAILABLE", f"{path} is not an Ed25519 public key")
    return key


class DetachedSignatureVerifier:
    """The ``detached-signature`` proof verifier (format ``ed25519``). Stateless: thread-safe."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset()

    def verify_proof(self, request: ProofRequest) -> VerifiedProof:
        """Verify the document's Ed25519 signature with the declared key; report its id, key and window."""
        declaration = request.declaration
        if declaration.get("format") != FORMAT:
            raise fail("PROOF_VERIFICATION_FAILED", f"the detached-signature verifier verifies format {FORMAT}, not"
                                                    f" {str(declaration.get('format'))[:20]!r} (format ssh: detached-signature-ssh)")
        document = parse_document(METHOD, request.proof)
        key = load_ed25519_key(declaration["public_key_file"])
        key_id = openssh_fingerprint(key)
        try:
            key.verify(base64.b64decode(document["signature"], validate=True), message_of(METHOD, document))
        except (InvalidSignature, ValueError, binascii.Error):
            raise fail("PROOF_INVALID_SIGNATURE", "the Ed25519 signature does not verify with the declared key",
                       key_id=key_id) from None
        return verified_document(METHOD, document, key_id)


__all__ = ["DetachedSignatureVerifier", "load_ed25519_key", "openssh_fingerprint"]
