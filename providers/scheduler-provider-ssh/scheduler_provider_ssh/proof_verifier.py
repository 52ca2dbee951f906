"""``SshProofVerifier``: detached-signature proofs of format ``ssh`` (``scheduler.proof_verifiers:detached-signature-ssh``).

For declarations of ``method`` ``detached-signature`` and ``format`` ``ssh``: the proof document's
``signature`` is the armored text ``ssh-keygen -Y sign -n <namespace>`` made of the signed message
(``scheduler_toolkit.proofs``); ``ssh-keygen -Y verify -f <allowed_signers_file> -I <principal> -n
<namespace>`` must accept it. The key id is the signing key's ``SHA256:...`` fingerprint as
ssh-keygen reports it; the subject is the declared principal. Trust is the declaration's
allowed-signers file; the window is reported, and judged by the kernel with the declared skew.

``ssh-keygen`` runs directly (no shell), in its own process group, with a small fixed environment
and ``[providers.detached-signature-ssh] timeout_s``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import attrs
from scheduler_toolkit.process import minimal_env, run_bounded, snippet
from scheduler_toolkit.proofs import fail, message_of, parse_document
from scheduler_toolkit.types import ProofRequest

from scheduler.api import VerifiedProof

METHOD = "detached-signature"
FORMAT = "ssh"
NAME = "detached-signature-ssh"
_GOOD_KEY = re.compile(r"key (SHA256:[A-Za-z0-9+/=]+)")


@attrs.frozen(kw_only=True)
class SshProofSettings:
    """``[providers.detached-signature-ssh]`` of the settings file."""

    ssh_keygen: str = attrs.field(default="ssh-keygen", metadata={
        "doc": "The ssh-keygen program: a name looked up on PATH, or an absolute path."})
    timeout_s: float = attrs.field(default=10.0, metadata={
        "doc": "Seconds one ssh-keygen -Y verify may take (its process group is killed past it).", "minimum": 0.05,
        "maximum": 300})


class SshProofVerifier:
    """The ``detached-signature-ssh`` proof verifier. Stateless per call (settings aside): thread-safe."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset()
    settings_class = SshProofSettings

    def __init__(self) -> None:
        self._settings = SshProofSettings()

    def configure(self, settings: SshProofSettings) -> None:
        """Take the validated ``[providers.detached-signature-ssh]`` settings (the loader calls this once)."""
        self._settings = settings

    def verify_proof(self, request: ProofRequest) -> VerifiedProof:
        """``ssh-keygen -Y verify`` of the document's signature for the declared principal and namespace."""
        declaration = request.declaration
        if declaration.get("format") != FORMAT:
            raise fail("PROOF_VERIFICATION_FAILED", f"the {NAME} verifier verifies format {FORMAT}, not"
                                                    f" {str(declaration.get('format'))[:20]!r}")
        document = parse_document(METHOD, request.proof)
        key_id = self._ssh_verify(declaration["allowed_signers_file"], declaration["principal"], declaration["namespace"],
                                  message_of(METHOD, document), document["signature"])
        return VerifiedProof(method=METHOD, proof_id=document["proof_id"], key_id=key_id,
                             artifact_digest=document["artifact_digest"], not_before_ms=document["not_before"] * 1000,
                             expires_at_ms=document["expires_at"] * 1000, subject=declaration["principal"])

    def _keygen(self) -> str:
        name = self._settings.ssh_keygen
        path = minimal_env()["PATH"]
        found = shutil.which(name, path=path) if os.sep not in name else (name if os.access(name, os.X_OK) else None)
        if not found:
            raise fail("PROOF_KEY_UNAVAILABLE", "ssh-keygen is not installed on the dispatcher's host"
                                                f" ({name}; [providers.{NAME}] ssh_keygen)")
        return found

    def _ssh_verify(self, signers: str, principal: str, namespace: str, message: bytes, signature: str) -> str:
        """Run ``ssh-keygen -Y verify``; the signing key's fingerprint when it accepts, ``PROOF_*`` otherwise."""
        if not Path(signers).is_file():
            raise fail("PROOF_KEY_UNAVAILABLE", f"the allowed signers file {signers} does not exist")
        keygen = self._keygen()
        timeout_s = self._settings.timeout_s
        with tempfile.TemporaryDirectory(prefix="scheduler-proof-") as tmp:
            sig_path = Path(tmp, "proof.sig")
            sig_path.write_text(signature if signature.endswith("\n") else signature + "\n", encoding="utf-8")
            argv = [keygen, "-Y", "verify", "-f", signers, "-I", principal, "-n", namespace, "-s", str(sig_path)]
            try:
                done = run_bounded(argv, message, timeout_s=timeout_s, max_stdout=64 * 1024, env=minimal_env())
            except (FileNotFoundError, PermissionError):
                raise fail("PROOF_KEY_UNAVAILABLE", "ssh-keygen is not installed on the dispatcher's host") from None
        if done.timed_out:
            raise fail("PROOF_INVALID_SIGNATURE", f"ssh-keygen -Y verify did not answer within {timeout_s:g}s")
        said = snippet(done.stdout + b" " + done.stderr, 300)
        if done.returncode != 0 or done.oversized:
            raise fail("PROOF_INVALID_SIGNATURE", f"ssh-keygen -Y verify refused the signature for principal {principal!r}:"
                                                  f" {said}")
        match = _GOOD_KEY.search((done.stdout + done.stderr).decode("utf-8", "replace"))
        if match is None:
            raise fail("PROOF_INVALID_SIGNATURE", f"ssh-keygen -Y verify gave no key fingerprint: {said}")
        return match.group(1)


__all__ = ["SshProofSettings", "SshProofVerifier"]
