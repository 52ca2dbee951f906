"""``bench/pass_profile.py``: the diagnostic the bench prose quotes times the loop's statements and leaves the store as it was."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.store import sqlite as sqlite_store
from scheduler.core.store import sqlite_statements

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: ``bench`` is not installed
from bench.pass_profile import LOOP_THREAD, main, profile, render


def test_the_profile_attributes_the_loops_statements_and_puts_the_store_back(tmp_path: Path, monkeypatch: Any) -> None:
    """A short run: every run ended ok, the loop's write transactions and its run INSERT are counted, the statements'
    CPU is the loop thread's (never more than it, allowing the thread clock's tick), and the wrappers and the
    environment are as they were after (hook plugins were off only for the run: later tests' plugin managers load them)."""
    monkeypatch.delenv("SCHEDULER_DISABLE_PLUGINS", raising=False)
    statement, control = sqlite_statements.execute, sqlite_store.SQLiteStore._exec
    res = profile(60, directory=tmp_path)
    assert sqlite_statements.execute is statement and sqlite_store.SQLiteStore._exec is control
    assert "SCHEDULER_DISABLE_PLUGINS" not in os.environ
    assert res["runs"] == 60 and res["passes_committed"] >= 60 / 4  # concurrency 4: at most 4 runs start a pass
    texts = [s["statement"] for s in res["statements"]]
    assert "BEGIN IMMEDIATE" in texts and "COMMIT" in texts
    assert any(t.startswith("INSERT INTO runs(") for t in texts) and any(t.startswith("UPDATE runs SET") for t in texts)
    loop = next(t for t in res["threads"] if t["thread"] == LOOP_THREAD)
    tick_ms_per_run = 10 / 60  # /proc counts CPU in clock ticks (10 ms)
    assert 0 < res["statements_cpu_ms_per_run"] <= loop["cpu_ms_per_run"] + tick_ms_per_run
    text = render(res)
    assert LOOP_THREAD in text and "COMMIT" in text


def test_the_tool_refuses_a_run_count_below_one_before_making_anything(capsys: Any) -> None:
    """``-n 0`` or ``-n x`` is an argparse error (exit 2, the reason on stderr), not a traceback after a database is made."""
    for bad in ("0", "-3", "x"):
        with pytest.raises(SystemExit) as exit_info:
            main(["-n", bad])
        assert exit_info.value.code == 2
        assert "--runs" in capsys.readouterr().err
