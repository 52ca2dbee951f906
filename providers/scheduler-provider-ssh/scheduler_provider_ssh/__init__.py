"""scheduler-provider-ssh: the ``ssh`` evidence provider and the ``detached-signature-ssh`` proof verifier.

Signs a run's canonical evidence payload with ``ssh-keygen -Y sign`` and verifies it
with ``ssh-keygen -Y verify`` against the host's allowed-signers file; verifies
authorization proofs of method ``detached-signature``, format ``ssh``, with
``ssh-keygen -Y verify`` against the declaration's allowed-signers file. See ``README.md``.
"""

from __future__ import annotations

from scheduler_provider_ssh.proof_verifier import SshProofSettings, SshProofVerifier
from scheduler_provider_ssh.provider import SshOptions, SshProvider, SshSettings, __version__

__all__ = ["SshOptions", "SshProofSettings", "SshProofVerifier", "SshProvider", "SshSettings", "__version__"]
