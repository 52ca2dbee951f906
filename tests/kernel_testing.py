"""Helpers shared by the kernel tests (importable: ``tests`` is on pytest's pythonpath)."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest  # noqa: F401  (kept for helpers that skip)


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.01, what: str = "condition") -> Any:
    """Poll until ``predicate()`` is truthy; return its value, or fail the test after ``timeout``."""
    import time

    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def add_job(store: Any, **spec: Any) -> dict[str, Any]:
    """Create one job through the kernel (validated like the CLI does); testkit executor by default."""
    from scheduler.jobs import create_jobs
    from scheduler.spec import validate_spec

    spec.setdefault("executor", "testkit")
    spec.setdefault("schedule_kind", "manual")
    spec.setdefault("name", f"job-{uuid.uuid4().hex[:8]}")
    return create_jobs(store, [validate_spec(spec)])[0]


class RunningDispatcher:
    """A dispatcher running in a background thread of the test process."""

    def __init__(self, store: Any, **config: Any) -> None:
        import threading

        from scheduler.dispatcher import Dispatcher, DispatcherConfig

        config.setdefault("lease_ttl_ms", 3000)
        config.setdefault("kill_grace_s", 0.5)
        config.setdefault("grace_s", 2.0)
        self.messages: list[str] = []
        self.dispatcher = Dispatcher(store, DispatcherConfig(**config), say=self.messages.append)
        self.error: BaseException | None = None
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        wait_for(lambda: self.dispatcher.lease is not None or self.error is not None, what="dispatcher start")
        if self.error is not None:
            raise self.error

    def _main(self) -> None:
        try:
            self.exit_code = self.dispatcher.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def stop(self, timeout: float = 20.0) -> None:
        self.dispatcher.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "dispatcher did not stop"


def run_rows(store: Any, job_id: str) -> list[dict[str, Any]]:
    """All runs of a job, oldest first."""
    with store.read() as tx:
        return tx.all("SELECT * FROM runs WHERE job_id = ? ORDER BY created_at, id", (job_id,))



def scheduler_cmd() -> list[str]:
    """Argv prefix to run the real CLI in a subprocess."""
    return [sys.executable, "-m", "scheduler"]


def sideload_distribution(project_dir: Any, into: Any) -> list[str]:
    """Make a source distribution visible to entry-point discovery without installing it.

    Writes a minimal ``*.dist-info`` (METADATA + entry_points.txt from the project's
    pyproject.toml) into ``into`` and returns the sys.path entries to add (``into`` and
    the project directory). Used for deliberately broken test plugins, which must never
    be installed into a user's environment.
    """
    import tomllib
    from pathlib import Path

    project_dir, into = Path(project_dir), Path(into)
    meta = tomllib.loads((project_dir / "pyproject.toml").read_text())["project"]
    dist = into / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    lines = []
    for group, eps in meta.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines.extend(f"{name} = {target}" for name, target in eps.items())
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [str(into), str(project_dir)]
