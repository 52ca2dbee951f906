"""json-sort-v1 canonical JSON and ``sha256:`` digests, byte-identical to the kernel's.

What evidence payloads, execution artifacts and envelopes are bound by: ``canonical_json``,
``canonical_bytes``, ``canonical_digest``, ``hash_text``, ``hash_bytes``, ``is_digest``,
``CANONICALIZATION`` (the scheme's name) and ``UNDEFINED`` (JavaScript's ``undefined``).
The kernel's own code (``scheduler.base.canonical``), re-exported.
"""

from __future__ import annotations

from scheduler.base.canonical import (
    CANONICALIZATION,
    UNDEFINED,
    canonical_bytes,
    canonical_digest,
    canonical_json,
    hash_bytes,
    hash_text,
    is_digest,
)

__all__ = [
    "CANONICALIZATION",
    "UNDEFINED",
    "canonical_bytes",
    "canonical_digest",
    "canonical_json",
    "hash_bytes",
    "hash_text",
    "is_digest",
]
