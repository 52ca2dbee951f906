"""Fixtures: the verifiers loaded through their entry points with a real settings file; the helpers' directory on the path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.testing import provider_loader

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # the tests import their helpers from proof_support.py (pytest runs with --import-mode=importlib)
    sys.path.insert(0, HERE)


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """``load(name, **settings)``: a verifier through its entry point with a real ``[providers.NAME]`` table."""
    with provider_loader(monkeypatch, tmp_path, "proof_verifier") as loader:
        yield loader
