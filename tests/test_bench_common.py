"""The bench's shared helpers that decide what a figure counts (``bench/common.py``)."""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path

from scheduler.plugins.stores import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: ``bench`` is not installed
from bench.common import ACTIVE_SQL, TERMINAL_SQL, count_terminal


def _statuses(sql_list: str) -> set[str]:
    return {s.strip().strip("'") for s in sql_list.strip("()").split(",")}


def test_active_and_terminal_statuses_partition_the_kernels_run_statuses(tmp_path: Path) -> None:
    """``count_terminal`` is all runs minus the active ones: only right if the two lists split every status."""
    store = open_store(str(tmp_path / "s.db"))
    store.close()
    conn = sqlite3.connect(str(tmp_path / "s.db"))
    ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'runs'").fetchone()[0]
    # The status column's CHECK names every status (spelled as OR'd equalities on SQLite since schema 12).
    column = next(line for line in ddl.splitlines() if line.split()[:1] == ["status"])
    declared = set(re.findall(r"status = '(\w+)'", column))
    active, terminal = _statuses(ACTIVE_SQL), _statuses(TERMINAL_SQL)
    assert len(declared) >= 10
    assert not active & terminal
    assert active | terminal == declared
    index = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'runs_status_idx'").fetchone()[0]
    assert _statuses(index.split("status IN ", 1)[1]) == active  # the count walks that partial index


def test_count_terminal_counts_ended_runs(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "c.db"))
    store.close()
    conn = sqlite3.connect(str(tmp_path / "c.db"))
    conn.execute("PRAGMA foreign_keys = OFF")
    for i, status in enumerate(["ok", "running", "error", "awaiting_approval", "skipped", "pending", "cancelled"]):
        conn.execute("INSERT INTO runs(id, job_id, status, attempt, created_at) VALUES (?, 'j', ?, 1, 0)", (f"r{i}", status))
    assert count_terminal(conn) == 4


def test_every_benchmark_module_has_what_the_report_calls() -> None:
    """Each registered benchmark gives run, render and headline (a module without headline broke
    `python -m bench` after its run, losing every result of that invocation: bench.web did)."""
    import importlib

    from bench.__main__ import BENCHMARKS

    missing = [f"{name}.{member}" for name, path in BENCHMARKS.items()
               for member in ("NAME", "TITLE", "params", "run", "render", "headline")
               if not hasattr(importlib.import_module(path), member)]
    assert missing == []
