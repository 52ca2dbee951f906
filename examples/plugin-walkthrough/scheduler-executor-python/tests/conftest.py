"""Shared helpers: a real ExecutionRequest for a python job, in a fresh artifact store under tmp_path."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import attrs
import pytest
from scheduler_executor_python import PythonOptions
from scheduler_toolkit.options import build_options

from scheduler.api import ExecutionRequest
from scheduler.testing import make_request as kernel_make_request


@pytest.fixture
def make_request(tmp_path: Path) -> Callable[..., ExecutionRequest]:
    """The request the dispatcher would build for a python job (``timeout_ms`` shortens the deadline).

    ``executor_options`` are validated with ``PythonOptions`` here, as the kernel does for an
    installed executor, so the tests run the same from a plain checkout.
    """

    def build(payload: str, *, timeout_ms: int = 20_000, **fields: Any) -> ExecutionRequest:
        request = kernel_make_request(
            payload, artifacts_root=tmp_path / "artifacts", executor="python", run_timeout_ms=timeout_ms, **fields
        )
        return attrs.evolve(request, options=build_options(PythonOptions, request.job.executor_options, "executor_options"))

    return build


@pytest.fixture
def python_installed() -> None:
    """Skip tests that load the plugin by entry point unless it is installed (`pip install -e .`)."""
    try:
        distribution("scheduler-executor-python")
    except PackageNotFoundError:
        pytest.skip("scheduler-executor-python is not installed (run `pip install -e .` in its directory)")
