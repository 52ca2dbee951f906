"""Fixtures for the agent executor tests: a real loopback chat-completions server, real requests, real settings."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_executor_agent import AgentExecutor
from scheduler_executor_agent.loopback import LoopbackModel
from scheduler_toolkit.settings import reload_settings

from scheduler.api import ExecutionRequest, ExecutionResult
from scheduler.testing import LocalRunControl
from scheduler.testing import make_request as build_request

API_KEY = "sk-loopback-5f0c3a9e-do-not-leak"


@pytest.fixture(autouse=True)
def _clean_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Every test defines the agent's settings itself: an empty settings file, none of the agent variables."""
    for name in list(os.environ):
        if name.startswith(("SCHEDULER_EXECUTORS_AGENT_", "SCHEDULER_AGENT_")):
            monkeypatch.delenv(name)
    config = tmp_path / "scheduler-settings.toml"
    config.write_text("")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    reload_settings()
    yield
    reload_settings()


@pytest.fixture
def settings_file(tmp_path: Path) -> Callable[[str], Path]:
    """Write the settings file (TOML text) and make the process read it again."""

    def write(text: str) -> Path:
        path = tmp_path / "scheduler-settings.toml"
        path.write_text(text)
        reload_settings()
        return path

    return write


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackModel]:
    """A loopback model on a free port, configured as the endpoint ``default`` through the plain variables."""
    server = LoopbackModel().start()
    monkeypatch.setenv("SCHEDULER_AGENT_BASE_URL", server.base_url)
    monkeypatch.setenv("SCHEDULER_AGENT_MODEL", "loop-small")
    monkeypatch.setenv("SCHEDULER_AGENT_API_KEY", API_KEY)
    yield server
    server.stop()


@pytest.fixture
def api_key() -> str:
    """The key the loopback endpoint is configured with (it must never appear in a result or the database)."""
    return API_KEY


@pytest.fixture
def artifacts_root(tmp_path: Path) -> Path:
    return tmp_path / "artifacts"


class Ran:
    """One execution: result, control, request and wall time."""

    def __init__(self, result: ExecutionResult, control: LocalRunControl, request: ExecutionRequest, elapsed: float) -> None:
        self.result, self.control, self.request, self.elapsed = result, control, request, elapsed


@pytest.fixture
def run_turn(artifacts_root: Path) -> Callable[..., Ran]:
    """Execute a prompt with one AgentExecutor (shared by the calls of a test) and a LocalRunControl."""
    counter = itertools.count(1)
    executor = AgentExecutor()

    def run(payload: str = "Say hello.", *, control: LocalRunControl | None = None, credentials: tuple[Any, ...] = (),
            **fields: Any) -> Ran:
        control = control or LocalRunControl()
        fields.setdefault("session_target", "isolated")
        request = build_request(payload, artifacts_root=artifacts_root, run_id=f"run-{next(counter)}",
                                credentials=credentials, **fields)
        t0 = time.monotonic()
        result = executor.execute(request, control)
        return Ran(result, control, request, time.monotonic() - t0)

    run.executor = executor  # type: ignore[attr-defined]
    return run
