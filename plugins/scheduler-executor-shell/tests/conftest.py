"""Fixtures for the shell executor tests: real requests, real artifact dirs, real processes."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_executor_shell import ShellExecutor
from scheduler_toolkit.settings import reload_settings

from scheduler.api import ExecutionRequest, ExecutionResult, SchedulerError
from scheduler.testing import LocalRunControl
from scheduler.testing import make_request as build_request


@pytest.fixture(autouse=True)
def _clean_dispatcher_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The tests define the executor's settings themselves: an empty settings file, no override from outside."""
    for name in list(os.environ):
        if name.startswith("SCHEDULER_EXECUTORS_SHELL_"):
            monkeypatch.delenv(name)
    empty = tmp_path / "scheduler-settings.toml"
    empty.write_text("")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(empty))
    reload_settings()
    yield
    reload_settings()


@pytest.fixture
def artifacts_root(tmp_path: Path) -> Path:
    """Root of a fresh artifact store."""
    return tmp_path / "artifacts"


@pytest.fixture
def make_request(artifacts_root: Path) -> Callable[..., ExecutionRequest]:
    """Build an ExecutionRequest for a payload plus spec fields (``scheduler.testing.make_request``)."""
    counter = itertools.count(1)

    def make(payload: str, **fields: Any) -> ExecutionRequest:
        return build_request(payload, artifacts_root=artifacts_root, run_id=f"run-{next(counter)}", **fields)

    return make


class Ran:
    """One execution: result, control and wall time."""

    def __init__(self, result: ExecutionResult, control: LocalRunControl, request: ExecutionRequest, elapsed: float) -> None:
        self.result = result
        self.control = control
        self.request = request
        self.elapsed = elapsed


@pytest.fixture
def run_job(make_request: Callable[..., ExecutionRequest]) -> Callable[..., Ran]:
    """Execute a payload with ShellExecutor and a LocalRunControl (or the one given)."""

    def run(payload: str, *, control: LocalRunControl | None = None, **fields: Any) -> Ran:
        control = control or LocalRunControl()
        request = make_request(payload, **fields)
        t0 = time.monotonic()
        result = ShellExecutor().execute(request, control)
        return Ran(result, control, request, time.monotonic() - t0)

    return run


def live_members(pgid: int) -> list[int]:
    """Non-zombie processes of a group, read straight from /proc (independent of the code under test)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def assert_group_gone(pgid: int, *, reaped: bool = False, timeout_s: float = 15.0) -> None:
    """No live member of the group is left; with ``reaped``, also wait for ``os.killpg(pgid, 0)`` to fail.

    Killed grandchildren are orphans that init must reap; some container inits do
    that only every second or two, so ``killpg`` may still find their zombies for a
    moment. Zombies cannot run: the immediate guarantee is "no live member", and
    ``reaped=True`` additionally waits until the group id is entirely gone.
    """
    assert live_members(pgid) == []
    if not reaped:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert live_members(pgid) == []
        assert time.monotonic() < deadline, f"process group {pgid} still exists"
        time.sleep(0.05)


@pytest.fixture
def group_gone() -> Callable[..., None]:
    """``assert_group_gone`` as a fixture (test modules cannot import conftest under importlib mode)."""
    return assert_group_gone


class _FenceLostControl(LocalRunControl):
    """A run control whose fence is lost as the handle is recorded: the payload must never start."""

    def record_handle(self, handle: dict) -> None:
        super().record_handle(handle)
        raise SchedulerError("LEASE_LOST", "fence lost")


@pytest.fixture
def fence_lost_control() -> LocalRunControl:
    """A fresh ``LocalRunControl`` whose ``record_handle`` records the handle, then raises ``LEASE_LOST``."""
    return _FenceLostControl()
