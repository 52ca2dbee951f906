"""Fixtures: evidence payloads built the way the kernel builds them, and the provider loaded through its entry
point with a real settings file (API, Protocol and settings checks, ``configure``), as the kernel loads it
(``make_payload`` and ``load_evidence`` come from ``scheduler.testing.evidence``)."""

from __future__ import annotations

from scheduler.testing.evidence import load_evidence, make_payload  # noqa: F401 - fixtures
