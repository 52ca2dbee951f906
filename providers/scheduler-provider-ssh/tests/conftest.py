"""Fixtures: evidence payloads built the way the kernel builds them, and the provider loaded through its entry
point with a real settings file (API, Protocol and settings checks, ``configure``), as the kernel loads it
(``make_payload`` and ``load_evidence`` come from ``scheduler.testing.evidence``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scheduler.testing.evidence import load_evidence, make_payload  # noqa: F401 - fixtures


class Keys:
    """Real ed25519 keys made by ssh-keygen in tmp_path, and an allowed-signers file trusting some of them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.alice = self.make("alice")          # trusted for principal alice
        self.carol = self.make("carol")          # trusted for principal carol
        self.mallory = self.make("mallory")      # trusted for nobody
        self.allowed_signers = root / "allowed_signers"
        self.allowed_signers.write_text(
            f"alice@example.org {self.public('alice')}\ncarol@example.org {self.public('carol')}\n")

    def make(self, name: str, passphrase: str = "") -> Path:
        path = self.root / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", str(path)],
                       check=True, capture_output=True, timeout=30)
        return path

    def public(self, name: str) -> str:
        return (self.root / f"{name}.pub").read_text().strip()

    def fingerprint(self, name: str) -> str:
        out = subprocess.run(["ssh-keygen", "-E", "sha256", "-lf", str(self.root / name)], check=True,
                             capture_output=True, text=True, timeout=30).stdout
        return out.split()[1]


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "keys")
