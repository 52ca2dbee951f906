"""pytest fixtures over ``scheduler.testing`` (``pytest_plugins = ["scheduler.testing.fixtures"]``).

* ``scheduler_artifacts`` – a fresh artifact root;
* ``scheduler_sqlite`` – an initialised store on a fresh SQLite file;
* ``scheduler_postgres_url`` – a fresh PostgreSQL schema URL (skips with the reason when no server runs);
* ``scheduler_dispatcher`` – ``start(store, **config) -> RunningDispatcher``, stopped after the test;
* ``scheduler_isolated_settings`` – no settings file or ``SCHEDULER_<SECTION>_*`` variable from
  outside the test (``XDG_CONFIG_HOME`` is a fresh directory); use it ``autouse`` in a conftest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.settings import reload_settings
from scheduler.testing import (
    RunningDispatcher,
    isolate_settings,
    postgres_unavailable_reason,
    sqlite_store,
    temporary_postgres_schema,
)


@pytest.fixture
def scheduler_isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A fresh, empty settings location for this test; the settings cache is reset before and after."""
    yield isolate_settings(monkeypatch, tmp_path / "xdg-config")
    reload_settings()


@pytest.fixture
def scheduler_artifacts(tmp_path: Path) -> Path:
    """Root of a fresh artifact store."""
    return tmp_path / "artifacts"


@pytest.fixture
def scheduler_sqlite(tmp_path: Path) -> Iterator[Any]:
    """An initialised store on a fresh SQLite file."""
    store = sqlite_store(tmp_path / "scheduler.db")
    yield store
    store.close()


@pytest.fixture
def scheduler_postgres_url() -> Iterator[str]:
    """A store URL in a fresh PostgreSQL schema, dropped afterwards; skips when no server runs."""
    reason = postgres_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with temporary_postgres_schema() as url:
        yield url


@pytest.fixture
def scheduler_dispatcher() -> Iterator[Any]:
    """``start(store, **config)``: a dispatcher in a background thread, stopped after the test."""
    started: list[RunningDispatcher] = []

    def start(store: Any, **config: Any) -> RunningDispatcher:
        d = RunningDispatcher(store, **config)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.thread.is_alive():
            d.stop()
