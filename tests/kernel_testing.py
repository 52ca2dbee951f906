"""Helpers shared by the kernel tests (importable: ``tests`` is on pytest's pythonpath)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.testing import RunningDispatcher, add_job, run_rows, wait_for  # noqa: F401  (one definition, re-exported)


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


@contextlib.contextmanager
def sideloaded(*project_dirs: Any, into: Any) -> Iterator[list[str]]:
    """Side-load the test distributions ``project_dirs`` (``sideload_distribution``) on ``sys.path`` while the block runs.

    Yields the sys.path entries; they are removed again when the block ends, so a module-
    scoped fixture keeps its deliberately broken or test-only plugins to its own tests.
    """
    from pathlib import Path

    paths: list[str] = []
    for n, project_dir in enumerate(project_dirs):
        paths += sideload_distribution(project_dir, Path(into) / str(n) if len(project_dirs) > 1 else into)
    with pytest.MonkeyPatch.context() as mp:
        for entry in reversed(paths):
            mp.syspath_prepend(entry)
        yield paths


#: Run statuses that end a run (what the tests that run a job once wait for).
TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


def run_job_once(store: Any, dispatcher: Any, job: dict[str, Any], *, what: str = "the run to finish",
                 **dispatcher_config: Any) -> dict[str, Any]:
    """Enqueue a manual run of ``job``, start a real dispatcher (the ``dispatcher`` fixture), return the one finished run.

    The dispatcher is stopped before returning, so the run's whole completion (credential
    cleanup, summaries, evidence) has been committed when the caller looks at it.
    """
    from scheduler.core.queue import enqueue_manual

    enqueue_manual(store, job["id"])
    d = dispatcher(**dispatcher_config)
    try:
        (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] in TERMINAL], timeout=30,
                          what=what)
    finally:
        d.stop()
    return run
