"""scheduler-provider-ssh: the ``ssh`` evidence provider of the scheduler.

Signs a run's canonical evidence payload with ``ssh-keygen -Y sign`` and verifies it
with ``ssh-keygen -Y verify`` against the host's allowed-signers file. See ``README.md``.
"""

from __future__ import annotations

from scheduler_provider_ssh.provider import SshOptions, SshProvider, SshSettings, __version__

__all__ = ["SshOptions", "SshProvider", "SshSettings", "__version__"]
