"""The ``certificate`` verifier: X.509 path validation to the declared roots at the kernel's clock, subject, SAN, signature."""

from __future__ import annotations

import base64
import datetime
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from proof_support import DIGEST, code_of, document, ec_key, request, signed
from scheduler_provider_proofs import CertificateVerifier
from scheduler_provider_proofs.conformance import make_ca, make_leaf, pem

NOW = datetime.datetime.now(datetime.UTC)


def proof(leaf_key: Any, leaf: Any, **kw: Any) -> str:
    doc = {**document("certificate", **kw), "certificate_chain": pem(leaf)}
    return signed("certificate", doc, lambda m: leaf_key.sign(m, ec.ECDSA(hashes.SHA256())))


@pytest.fixture
def pki(tmp_path: Path) -> tuple[dict[str, Any], Any, Any, Any, Any]:
    ca_key, ca = make_ca(NOW)
    (tmp_path / "ca.pem").write_text(pem(ca))
    leaf_key, leaf = make_leaf(ca_key, ca, NOW, cn="deployer", san="deployer.example.test")
    declaration = {"method": "certificate", "source": {"env": "P"}, "ca_file": str(tmp_path / "ca.pem"),
                   "san": "deployer.example.test", "clock_skew_s": 30}
    return declaration, ca_key, ca, leaf_key, leaf


def test_it_loads_through_its_entry_point(load: Any) -> None:
    assert isinstance(load("certificate"), CertificateVerifier)


def test_a_chain_to_the_declared_ca_verifies(pki: Any) -> None:
    d, _ca_key, _ca, leaf_key, leaf = pki
    got = CertificateVerifier().verify_proof(request(d, proof(leaf_key, leaf, proof_id="cert-1")))
    assert (got.proof_id, got.subject, got.artifact_digest) == ("cert-1", "CN=deployer", DIGEST)
    assert got.key_id == "sha256:" + leaf.fingerprint(hashes.SHA256()).hex()


def test_certificate_refusals(pki: Any, tmp_path: Path) -> None:
    d, ca_key, ca, leaf_key, leaf = pki
    verifier = CertificateVerifier()
    other_key, other_ca = make_ca(NOW, "Other CA")
    rogue_key, rogue = make_leaf(other_key, other_ca, NOW, san="deployer.example.test")
    assert code_of(verifier, d, proof(rogue_key, rogue)) == "PROOF_CERTIFICATE_INVALID"
    expired_key, expired = make_leaf(ca_key, ca, NOW, san="deployer.example.test", start=datetime.timedelta(days=-3),
                                     end=datetime.timedelta(days=-1))
    assert code_of(verifier, d, proof(expired_key, expired)) == "PROOF_CERTIFICATE_INVALID"
    assert code_of(verifier, {**d, "san": "other.example.test"}, proof(leaf_key, leaf)) == "PROOF_CERTIFICATE_INVALID"
    assert code_of(verifier, {**d, "subject": "CN=someone"}, proof(leaf_key, leaf)) == "PROOF_CERTIFICATE_INVALID"
    forged = json.loads(proof(leaf_key, leaf))
    forged["signature"] = base64.b64encode(ec_key().sign(b"x", ec.ECDSA(hashes.SHA256()))).decode()
    assert code_of(verifier, d, json.dumps(forged)) == "PROOF_INVALID_SIGNATURE"
    assert code_of(verifier, d, json.dumps({k: v for k, v in forged.items() if k != "certificate_chain"})) == "PROOF_MALFORMED"
    assert code_of(verifier, {**d, "ca_file": str(tmp_path / "none.pem")}, proof(leaf_key, leaf)) == "PROOF_KEY_UNAVAILABLE"
    # the chain is validated at the kernel's clock: a leaf valid now is not valid a year from now
    later = int((time.time() + 365 * 86400) * 1000)
    assert code_of(verifier, d, proof(leaf_key, leaf), now_ms=later) == "PROOF_CERTIFICATE_INVALID"


def test_the_window_is_narrowed_to_the_certificates_validity(pki: Any) -> None:
    d, ca_key, ca, _leaf_key, _leaf = pki
    # The leaf starts now, not at import (NOW): on a loaded CI machine the test may run minutes after collection,
    # and a 60-second certificate made at import time had expired by then.
    start = datetime.datetime.now(datetime.UTC)
    short_key, short = make_leaf(ca_key, ca, start, san="deployer.example.test", end=datetime.timedelta(seconds=60))
    got = CertificateVerifier().verify_proof(request(d, proof(short_key, short, exp_in=3600)))
    assert got.expires_at_ms <= int(start.timestamp() * 1000) + 61_000
