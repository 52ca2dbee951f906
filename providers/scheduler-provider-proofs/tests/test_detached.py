"""The ``detached-signature`` verifier (format ed25519): real keys, the fingerprint ssh-keygen shows, every refusal."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from proof_support import DIGEST, code_of, document, request, signed
from scheduler_provider_proofs import DetachedSignatureVerifier


def _declaration(pub: Path) -> dict[str, Any]:
    return {"method": "detached-signature", "source": {"env": "P"}, "format": "ed25519", "public_key_file": str(pub),
            "clock_skew_s": 30}


@pytest.fixture
def keyed(tmp_path: Path) -> tuple[ed25519.Ed25519PrivateKey, Path]:
    key = ed25519.Ed25519PrivateKey.generate()
    pub = tmp_path / "ed.pub"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return key, pub


def test_it_loads_through_its_entry_point(load: Any) -> None:
    assert isinstance(load("detached-signature"), DetachedSignatureVerifier)


def test_an_ed25519_proof_verifies_with_the_fingerprint_ssh_keygen_shows(keyed: Any, tmp_path: Path) -> None:
    key, pub = keyed
    doc = document("detached-signature", proof_id="ed-1", nbf_in=-10, exp_in=600)
    got = DetachedSignatureVerifier().verify_proof(request(_declaration(pub), signed("detached-signature", doc, key.sign)))
    listed = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]
    assert (got.proof_id, got.key_id, got.artifact_digest) == ("ed-1", listed, DIGEST)
    assert (got.not_before_ms, got.expires_at_ms) == (doc["not_before"] * 1000, doc["expires_at"] * 1000)
    pem = tmp_path / "ed.pem"  # the same key as PEM
    pem.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    assert DetachedSignatureVerifier().verify_proof(request(_declaration(pem), signed("detached-signature", doc, key.sign))).key_id == listed


def test_ed25519_refusals(keyed: Any, tmp_path: Path) -> None:
    key, pub = keyed
    d, verifier = _declaration(pub), DetachedSignatureVerifier()
    doc = document("detached-signature")
    assert code_of(verifier, d, signed("detached-signature", doc, ed25519.Ed25519PrivateKey.generate().sign)) == "PROOF_INVALID_SIGNATURE"
    longer = {**json.loads(signed("detached-signature", doc, key.sign)), "expires_at": doc["expires_at"] + 3600}
    assert code_of(verifier, d, json.dumps(longer)) == "PROOF_INVALID_SIGNATURE"  # a longer window than was signed
    assert code_of(verifier, d, signed("certificate", doc, key.sign)) == "PROOF_INVALID_SIGNATURE"  # signed for another method
    assert code_of(verifier, d, json.dumps({**longer, "signature": "not base64!"})) == "PROOF_INVALID_SIGNATURE"
    assert code_of(verifier, d, json.dumps({"proof_id": "x"})) == "PROOF_MALFORMED"
    assert code_of(verifier, d, json.dumps({**longer, "colour": "red"})) == "PROOF_MALFORMED"
    unbound = {k: v for k, v in longer.items() if k != "artifact_digest"}
    assert code_of(verifier, d, json.dumps(unbound)) == "PROOF_MALFORMED"
    assert code_of(verifier, d, "[1, 2]") == "PROOF_MALFORMED"
    (tmp_path / "rsa.pub").write_text("ssh-rsa AAAA not-a-key\n")
    assert code_of(verifier, _declaration(tmp_path / "rsa.pub"), signed("detached-signature", doc, key.sign)) == "PROOF_KEY_UNAVAILABLE"
    assert code_of(verifier, _declaration(tmp_path / "none.pub"), signed("detached-signature", doc, key.sign)) == "PROOF_KEY_UNAVAILABLE"


def test_format_ssh_is_not_this_verifiers(keyed: Any) -> None:
    key, pub = keyed
    ssh = {"method": "detached-signature", "source": {"env": "P"}, "format": "ssh", "allowed_signers_file": str(pub),
           "principal": "a@b", "namespace": "scheduler-proof", "clock_skew_s": 30}
    assert code_of(DetachedSignatureVerifier(), ssh, signed("detached-signature", document("x"), key.sign)) == \
        "PROOF_VERIFICATION_FAILED"
