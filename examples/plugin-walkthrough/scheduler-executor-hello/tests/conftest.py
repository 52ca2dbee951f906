"""Shared helpers: a real ExecutionRequest for a job spec, in a fresh artifact store under tmp_path."""

from __future__ import annotations

import uuid
from importlib.metadata import PackageNotFoundError, distribution
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler.artifacts import run_dir
from scheduler.execution import ExecutionRequest
from scheduler.spec import validate_spec
from scheduler.timeutil import now_ms


@pytest.fixture
def make_request(tmp_path: Path) -> Callable[..., ExecutionRequest]:
    """Build the request the dispatcher would build for a job spec (``timeout_ms`` shortens the deadline)."""

    def build(payload: str, *, timeout_ms: int = 20_000, **fields: Any) -> ExecutionRequest:
        work = tmp_path / "work"
        work.mkdir(exist_ok=True)
        spec = {"name": "hello test", "schedule_kind": "manual", "payload_message": payload, "executor": "hello",
                "working_dir": str(work), "run_timeout_ms": timeout_ms, **fields}
        job = validate_spec(spec)
        root = tmp_path / "artifacts"
        run_id, started = uuid.uuid4().hex, now_ms()
        return ExecutionRequest(
            run_id=run_id, job_id=uuid.uuid4().hex, job=job, started_at_ms=started, deadline_ms=started + timeout_ms,
            artifacts_dir=run_dir(root, run_id), artifacts_root=root, extra_env={"SCHEDULER_RUN_ID": run_id},
        )

    return build


@pytest.fixture
def hello_installed() -> None:
    """Skip tests that load the plugin by entry point unless it is installed (`pip install -e .`)."""
    try:
        distribution("scheduler-executor-hello")
    except PackageNotFoundError:
        pytest.skip("scheduler-executor-hello is not installed (run `pip install -e .` in its directory)")
