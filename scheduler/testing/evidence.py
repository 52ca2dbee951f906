"""pytest fixtures for evidence-provider tests (import them into a ``conftest.py``).

* ``make_payload`` – ``make_payload(run_id=..., **result)``: an ``EvidencePayload`` for a run
  document shaped like the kernel's (``scheduler.testing.make_evidence_payload``);
* ``load_evidence`` – ``load_evidence(name, **settings)``: writes ``[providers.NAME]`` and loads
  the evidence provider through its entry point (``scheduler.testing.provider_loader``).

In a provider's ``tests/conftest.py``::

    from scheduler.testing.evidence import load_evidence, make_payload  # noqa: F401 - fixtures
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.testing import make_evidence_payload, provider_loader


@pytest.fixture
def make_payload() -> Callable[..., Any]:
    """``make_payload(run_id=..., **result)``: an ``EvidencePayload`` for a run document."""
    return make_evidence_payload


@pytest.fixture
def load_evidence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``load_evidence(name, **settings)``: write ``[providers.NAME]`` and load the driver through its entry point."""
    with provider_loader(monkeypatch, tmp_path, "evidence") as load:
        yield load


__all__ = ["load_evidence", "make_payload"]
