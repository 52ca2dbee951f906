"""Shared fixtures for the kernel tests: a real SQLite file per test, PostgreSQL where it runs, the CLI.

``store`` is parametrised over both stores: every test that takes it runs on a
fresh SQLite file and on a fresh PostgreSQL schema (skipped with the reason when
the server or the store plugin is absent).
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import RunningDispatcher, scheduler_cmd  # noqa: F401  (re-exported for tests)

ROOT = Path(__file__).resolve().parents[1]


def pg_reason() -> str | None:
    """Why PostgreSQL tests must skip here (cached), or None when they can run."""
    from scheduler.testing import postgres_unavailable_reason

    return postgres_unavailable_reason()


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No developer settings file or ``SCHEDULER_<SECTION>_*`` variable leaks into a test (subprocesses included).

    Nor a developer's ``$SCHEDULER_CONFORMANCE_FIXTURES``: it would add cases to every conformance run.
    """
    from scheduler.conformance.engine import FIXTURES_ENV
    from scheduler.settings import reload_settings
    from scheduler.testing import isolate_settings

    isolate_settings(monkeypatch, tmp_path / "xdg-config")
    monkeypatch.delenv(FIXTURES_ENV, raising=False)
    yield
    reload_settings()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A fresh SQLite database path for this test."""
    return tmp_path / "scheduler.db"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL in a fresh schema of its own (dropped afterwards); skips when unavailable."""
    reason = pg_reason()
    if reason:
        pytest.skip(reason)
    from scheduler.testing import temporary_postgres_schema

    with temporary_postgres_schema() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The database target for this test: a SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        return str(tmp_path / "scheduler.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(store_url: str) -> Iterator[Any]:
    """An initialised store on ``store_url``."""
    from scheduler.plugins.stores import open_store

    s = open_store(store_url)
    yield s
    s.close()


class CliResult:
    """What one in-process CLI invocation produced."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    @property
    def json(self) -> Any:
        lines = [ln for ln in self.out.strip().splitlines() if ln.strip()]
        assert lines, f"no output (stderr: {self.err!r})"
        return json.loads(lines[-1])

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, out={self.out[:400]!r}, err={self.err[:400]!r})"


@pytest.fixture
def cli(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run ``scheduler --db <store_url> ARGS...`` in-process; returns a ``CliResult``."""
    from scheduler.cli.main import main

    def invoke(*args: str, stdin: str | None = None, db: str | None = store_url) -> CliResult:
        if db == store_url and "://" not in db and not Path(db).exists():
            # Only commands adding jobs create a missing database (issue 30): the test's database exists, as after set-up.
            from scheduler.plugins.stores import open_store

            open_store(db).close()
        out, err = io.StringIO(), io.StringIO()
        argv = (["--db", db] if db else []) + list(args)
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
        return CliResult(code, out.getvalue(), err.getvalue())

    return invoke


@pytest.fixture
def dispatcher(store: Any) -> Iterator[Any]:
    """Start an in-process dispatcher on ``store``: ``dispatcher(**config) -> RunningDispatcher``."""
    started: list[RunningDispatcher] = []

    def start(**config: Any) -> RunningDispatcher:
        d = RunningDispatcher(store, **config)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.thread.is_alive():
            d.stop()


#: The ``user_properties`` key a test records one line of the mutation suite's report under (issue 27).
MUTANT_REPORT_KEY = "mutant_report"
#: The lines gathered in this process (on xdist's controller, from the workers' reports).
_mutant_lines: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep each line a test recorded under ``MUTANT_REPORT_KEY`` (xdist hands the workers' reports, properties included, here)."""
    if report.when == "call":
        _mutant_lines.extend(str(value) for key, value in report.user_properties if key == MUTANT_REPORT_KEY)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the mutation suite's report (kind, variant, catching case: one line per variant) in any run that ran it."""
    if _mutant_lines:
        terminalreporter.section("conformance mutation suite: what caught each broken provider")
        for line in sorted(_mutant_lines):
            terminalreporter.write_line(line)
