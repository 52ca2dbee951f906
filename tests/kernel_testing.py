"""Helpers shared by the kernel tests (importable: ``tests`` is on pytest's pythonpath)."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest  # noqa: F401  (kept for helpers that skip)


from scheduler.testing import RunningDispatcher, add_job, run_rows, wait_for  # noqa: E402,F401  (one definition, re-exported)


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
