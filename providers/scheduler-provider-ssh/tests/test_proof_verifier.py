"""The ``detached-signature-ssh`` proof verifier: real ssh-keygen keys, allowed-signers files and signatures.

Proofs are minted as an operator would (``ssh-keygen -Y sign -n scheduler-proof`` over the signed
message of docs/proofs.md); the verifier is loaded through its entry point with a real settings
file where its settings matter, and the conformance corpus of kind ``proof_verifier`` runs
against it as CI runs it.
"""

from __future__ import annotations

import json
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_provider_ssh import SshProofVerifier
from scheduler_provider_ssh.proof_conformance import ssh_sign
from scheduler_toolkit.proofs import signed_message
from scheduler_toolkit.types import ProofRequest

from scheduler.api import SchedulerError
from scheduler.testing import provider_loader, run_conformance

DIGEST = "sha256:" + "ab" * 32
METHOD = "detached-signature"


def declaration(keys: Any, principal: str = "alice@example.org", **extra: Any) -> dict[str, Any]:
    """A normalised ``format: ssh`` declaration trusting ``keys.allowed_signers``."""
    return {"method": METHOD, "source": {"env": "P"}, "format": "ssh", "allowed_signers_file": str(keys.allowed_signers),
            "principal": principal, "namespace": "scheduler-proof", "clock_skew_s": 30, **extra}


def proof(key: Path, *, namespace: str = "scheduler-proof", digest: str = DIGEST, exp_in: int = 300, **changes: Any) -> str:
    now = int(time.time())
    doc: dict[str, Any] = {"proof_id": f"ssh-{uuid.uuid4().hex[:8]}", "artifact_digest": digest, "not_before": now - 5,
                           "expires_at": now + exp_in}
    doc["signature"] = ssh_sign(key, signed_message(METHOD, doc["proof_id"], digest, doc["not_before"], doc["expires_at"]),
                                namespace)
    return json.dumps({**doc, **changes})


def verify(verifier: Any, decl: dict[str, Any], text: str) -> Any:
    return verifier.verify_proof(ProofRequest(declaration=decl, proof=text, artifact_digest=DIGEST, now_ms=int(time.time() * 1000)))


def code_of(verifier: Any, decl: dict[str, Any], text: str) -> str:
    with pytest.raises(SchedulerError) as err:
        verify(verifier, decl, text)
    assert err.value.code.startswith("PROOF_") and err.value.message
    return err.value.code


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    with provider_loader(monkeypatch, tmp_path, "proof_verifier") as loader:
        yield loader


def test_it_loads_through_its_entry_point(load: Any) -> None:
    assert isinstance(load("detached-signature-ssh"), SshProofVerifier)


def test_a_signature_ssh_keygen_accepts_verifies(keys: Any) -> None:
    text = proof(keys.alice, exp_in=-3600)  # long expired: the window is reported, the kernel judges it
    got = verify(SshProofVerifier(), declaration(keys), text)
    doc = json.loads(text)
    assert (got.method, got.proof_id, got.key_id, got.subject) == (METHOD, doc["proof_id"], keys.fingerprint("alice"),
                                                                   "alice@example.org")
    assert (got.not_before_ms, got.expires_at_ms, got.artifact_digest) == (doc["not_before"] * 1000, doc["expires_at"] * 1000,
                                                                           DIGEST)


def test_what_ssh_keygen_refuses_is_refused(keys: Any, tmp_path: Path) -> None:
    verifier, decl = SshProofVerifier(), declaration(keys)
    assert code_of(verifier, decl, proof(keys.alice, namespace="other")) == "PROOF_INVALID_SIGNATURE"
    assert code_of(verifier, decl, proof(keys.mallory)) == "PROOF_INVALID_SIGNATURE"  # in no allowed-signers line
    assert code_of(verifier, decl, proof(keys.carol)) == "PROOF_INVALID_SIGNATURE"  # trusted, but for another principal
    assert code_of(verifier, declaration(keys, "someone@else"), proof(keys.alice)) == "PROOF_INVALID_SIGNATURE"
    tampered = json.loads(proof(keys.alice))
    tampered["expires_at"] += 3600  # a longer window than was signed
    assert code_of(verifier, decl, json.dumps(tampered)) == "PROOF_INVALID_SIGNATURE"
    assert code_of(verifier, decl, json.dumps({**tampered, "signature": "-----BEGIN SSH SIGNATURE-----\nAAAA\n"})) == \
        "PROOF_INVALID_SIGNATURE"
    assert code_of(verifier, decl, json.dumps({k: v for k, v in tampered.items() if k != "artifact_digest"})) == "PROOF_MALFORMED"
    assert code_of(verifier, decl, "not json") == "PROOF_MALFORMED"
    missing = {**decl, "allowed_signers_file": str(tmp_path / "missing")}
    assert code_of(verifier, missing, proof(keys.alice)) == "PROOF_KEY_UNAVAILABLE"
    ed = {**decl, "format": "ed25519"}
    assert code_of(verifier, ed, proof(keys.alice)) == "PROOF_VERIFICATION_FAILED"  # not this verifier's format


def test_a_missing_ssh_keygen_is_key_unavailable(load: Any, keys: Any, tmp_path: Path) -> None:
    absent = load("detached-signature-ssh", ssh_keygen=str(tmp_path / "no-ssh-keygen"))
    assert code_of(absent, declaration(keys), proof(keys.alice)) == "PROOF_KEY_UNAVAILABLE"


def test_a_hanging_ssh_keygen_is_cut_off_at_the_settings_timeout(load: Any, keys: Any, tmp_path: Path) -> None:
    stuck = tmp_path / "stuck-ssh-keygen"
    stuck.write_text("#!/bin/sh\nsleep 30 &\nexec sleep 30\n")  # a child holding the pipes too
    stuck.chmod(stuck.stat().st_mode | stat.S_IXUSR)
    slow = load("detached-signature-ssh", ssh_keygen=str(stuck), timeout_s=0.5)
    text = proof(keys.alice)
    started = time.monotonic()
    assert code_of(slow, declaration(keys), text) == "PROOF_INVALID_SIGNATURE"
    assert time.monotonic() - started < 4


def test_the_conformance_corpus_passes() -> None:
    report = run_conformance("proof_verifier", "detached-signature-ssh")
    failed = [r.explain() for r in report.results if r.outcome not in ("passed", "skipped")]
    assert report.ok and report.error is None and not failed, (report.error, failed)
    # The one case skipped: the empty-settings case, for a verifier whose trust is the declaration's own (no host table).
    skipped = [r.id for r in report.results if r.outcome == "skipped"]
    assert skipped == ["proof_verifier.unconfigured-refuses"], skipped
    assert report.passed == len(report.results) - 1 >= 14
