"""Shared helpers: a real ExecutionRequest for a job spec, in a fresh artifact store under tmp_path."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import pytest

from scheduler.api import ExecutionRequest
from scheduler.testing import make_request as kernel_make_request


@pytest.fixture
def make_request(tmp_path: Path) -> Callable[..., ExecutionRequest]:
    """Build the request the dispatcher would build for a hello job (``timeout_ms`` shortens the deadline)."""

    def build(payload: str, *, timeout_ms: int = 20_000, **fields: Any) -> ExecutionRequest:
        return kernel_make_request(
            payload, artifacts_root=tmp_path / "artifacts", executor="hello", run_timeout_ms=timeout_ms, **fields
        )

    return build


@pytest.fixture
def hello_installed() -> None:
    """Skip tests that load the plugin by entry point unless it is installed (`pip install -e .`)."""
    try:
        distribution("scheduler-executor-hello")
    except PackageNotFoundError:
        pytest.skip("scheduler-executor-hello is not installed (run `pip install -e .` in its directory)")
