"""Conformance setup adapter of the ``detached-signature-ssh`` proof verifier (``scheduler.conformance_adapters``).

Per case it makes a real ed25519 key with ``ssh-keygen`` in the case's directory, an
allowed-signers file trusting it for ``PRINCIPAL``, and the proof document the case asks for
(``request.defect``), signed with ``ssh-keygen -Y sign -n scheduler-proof``: ``none`` (valid for
``request.artifact_digest``, from a minute before ``request.now_ms`` to ten minutes after),
``wrong_key`` (signed by a second key the allowed-signers file does not list), ``bad_signature``
(the window extended after signing), ``unbound`` (no artifact digest). Only the conformance
engine and this distribution's tests import this module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from scheduler_toolkit.proofs import signed_message

PRINCIPAL = "release@conformance.invalid"
NAMESPACE = "scheduler-proof"
BEFORE_S, AFTER_S = 60, 600


class SshProofSetup:
    """What the engine is handed: the declaration, the proof, what a verified proof reports, where the trust is."""

    def __init__(self, declaration: dict[str, Any], proof: str, *, proof_id: str, key_id: str, not_before_ms: int,
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


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


def fingerprint(public_key: Path) -> str:
    """``SHA256:...`` of a public key, as ``ssh-keygen -l`` prints it."""
    out = subprocess.run(["ssh-keygen", "-E", "sha256", "-lf", str(public_key)], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    return out.split()[1]


def ssh_sign(key: Path, message: bytes, namespace: str = NAMESPACE) -> str:
    """The armored signature ``ssh-keygen -Y sign -f KEY -n NAMESPACE`` makes of ``message``."""
    done = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", namespace], input=message, capture_output=True,
                          check=True, timeout=30)
    return done.stdout.decode()


class SshProofs:
    """The setup adapter: real keys, an allowed-signers file and a signed proof document per case."""

    def conformance_proof(self, request: Any) -> SshProofSetup:
        """Keys, trust and the case's proof under ``request.workdir``."""
        if shutil.which("ssh-keygen") is None:
            raise NotImplementedError("ssh-keygen is not installed on this machine")
        if request.defect not in ("none", "wrong_key", "bad_signature", "unbound"):
            raise NotImplementedError(f"unknown defect {request.defect!r}")
        root = Path(request.workdir) / "ssh"
        root.mkdir(mode=0o700)
        key, other = root / "signer", root / "other"
        _keygen(key, "conformance-proof-signer")
        signers = root / "allowed_signers"
        signers.write_text(f"{PRINCIPAL} {Path(f'{key}.pub').read_text().strip()}\n")
        signer = key
        if request.defect == "wrong_key":
            _keygen(other, "conformance-proof-other")
            signer = other
        now_s = int(request.now_ms) // 1000
        nbf, exp = now_s - BEFORE_S, now_s + AFTER_S
        proof_id = f"conformance-{uuid.uuid4()}"
        document: dict[str, Any] = {"proof_id": proof_id, "artifact_digest": request.artifact_digest, "not_before": nbf,
                                    "expires_at": exp}
        document["signature"] = ssh_sign(signer, signed_message("detached-signature", proof_id, request.artifact_digest, nbf, exp))
        if request.defect == "bad_signature":
            document["expires_at"] = exp + 3600
        if request.defect == "unbound":
            del document["artifact_digest"]
        declaration = {"method": "detached-signature", "format": "ssh", "allowed_signers_file": str(signers),
                       "principal": PRINCIPAL}
        return SshProofSetup(declaration, json.dumps(document), proof_id=proof_id, key_id=fingerprint(Path(f"{key}.pub")),
                             not_before_ms=nbf * 1000, expires_at_ms=exp * 1000, trust_files=[signers])


__all__ = ["NAMESPACE", "PRINCIPAL", "SshProofSetup", "SshProofs", "fingerprint", "ssh_sign"]
