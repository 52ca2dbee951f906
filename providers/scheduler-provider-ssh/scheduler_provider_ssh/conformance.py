"""Conformance setup adapter of the SSH provider (entry point ``scheduler.conformance_adapters:ssh``).

Per case it makes real ed25519 keys with ``ssh-keygen`` in the case's directory (the
signing key and a second, unrelated one) and allowed-signers files, and configures the
provider for the case's signer: ``trusted`` (the signer's key, trusted for the expected
principal), ``untrusted_key`` (the verifier trusts only the other key), ``other_principal``
(the verifier trusts the signing key only for another principal) and ``other_namespace``
(the signer signs in a namespace the verifier does not expect). The signer's own settings
trust its key, so the provider's self-check after signing runs in every case. Only the
conformance engine imports this module.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

PRINCIPAL = "signer@conformance.invalid"
OTHER_PRINCIPAL = "someone-else@conformance.invalid"
OTHER_NAMESPACE = "conformance-elsewhere"


class _Setup:
    def __init__(self, settings: dict[str, Any], verify_settings: dict[str, Any] | None, private: list[Path]) -> None:
        self.settings = settings
        self.verify_settings = verify_settings
        self.provider_config: dict[str, Any] = {}
        self.secrets: dict[str, str] = {}
        self.signature_field = ("signature",)
        self._private = private

    def secret_values(self) -> list[str]:
        """The private keys' text: it must never appear in an envelope, an error or a log record."""
        return [line for p in self._private for line in p.read_text().splitlines() if line and not line.startswith("-----")]

    def close(self) -> None:
        """Nothing runs; the engine removes the case's directory (and the keys in it)."""


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


def _trust(path: Path, principal: str, public_key: Path) -> str:
    path.write_text(f"{principal} {public_key.read_text().strip()}\n")
    return str(path)


class SshSetup:
    """The setup adapter: real keys and allowed-signers files per case."""

    def conformance_setup(self, request: Any) -> _Setup:
        """Keys and trust for ``request.signer`` under ``request.workdir``."""
        if shutil.which("ssh-keygen") is None:
            raise NotImplementedError("ssh-keygen is not installed on this machine")
        root = Path(request.workdir) / "ssh"
        root.mkdir(mode=0o700)
        signer, other = root / "signer", root / "other"
        _keygen(signer, "conformance-signer")
        _keygen(other, "conformance-other")
        own = {"key": str(signer), "principal": PRINCIPAL,
               "allowed_signers": _trust(root / "allowed_signers", PRINCIPAL, Path(f"{signer}.pub"))}
        verify: dict[str, Any] | None = None
        if request.signer == "untrusted_key":
            verify = {**own, "allowed_signers": _trust(root / "verifier_signers", PRINCIPAL, Path(f"{other}.pub"))}
        elif request.signer == "other_principal":
            verify = {**own, "allowed_signers": _trust(root / "verifier_signers", OTHER_PRINCIPAL, Path(f"{signer}.pub"))}
        elif request.signer == "other_namespace":
            verify = dict(own)
            own = {**own, "namespace": OTHER_NAMESPACE}
        elif request.signer != "trusted":
            raise NotImplementedError(f"unknown signer {request.signer!r}")
        return _Setup(own, verify, [signer, other])
