"""scheduler-provider-checksum: the ``checksum`` evidence provider of the scheduler.

Attests a run's canonical evidence payload with its SHA-256 digest and verifies by
recomputing it. Integrity, not authenticity: see ``README.md``.
"""

from __future__ import annotations

from scheduler_provider_checksum.provider import ChecksumProvider, ChecksumSettings, __version__

__all__ = ["ChecksumProvider", "ChecksumSettings", "__version__"]
