"""scheduler-provider-external: the ``external`` evidence provider of the scheduler.

Hands a run's canonical evidence payload to an attestor that someone else runs (a
command speaking JSON on stdin/stdout, or an HTTP endpoint) for attestation and
verification, and fails closed on any doubtful answer. See ``README.md``.
"""

from __future__ import annotations

from scheduler_provider_external.provider import ExternalOptions, ExternalProvider, ExternalSettings, __version__

__all__ = ["ExternalOptions", "ExternalProvider", "ExternalSettings", "__version__"]
