"""Fixtures: a real store on both backends (a SQLite file, a fresh PostgreSQL schema), the app over it, a dispatcher.

``store_url`` is parametrised over SQLite and PostgreSQL (PostgreSQL tests skip with the reason
when no server runs at 127.0.0.1:5432), as the kernel's own suite does; runs come from a real
in-process dispatcher with the testkit executor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_toolkit.settings import reload_settings
from scheduler_web import WebConfig, create_app
from starlette.testclient import TestClient

from scheduler.api.ops import open_store
from scheduler.testing import RunningDispatcher, isolate_settings
from scheduler.testing.fixtures import scheduler_dispatcher, scheduler_postgres_url  # noqa: F401 - fixtures used by name


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No developer settings file or ``SCHEDULER_*`` override leaks into a test."""
    isolate_settings(monkeypatch, tmp_path / "xdg-config")
    for var in ("SCHEDULER_WEB_TOKEN", "SCHEDULER_WEB_TOKEN_FILE", "SCHEDULER_WEB_HOST", "SCHEDULER_WEB_READ_ONLY"):
        monkeypatch.delenv(var, raising=False)
    yield
    reload_settings()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file, or a PostgreSQL schema of its own (``scheduler.testing``'s, dropped afterwards)."""
    if request.param == "sqlite":
        return str(tmp_path / "scheduler.db")
    url: str = request.getfixturevalue("scheduler_postgres_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[Any]:
    """An initialised store on ``store_url``."""
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def config() -> WebConfig:
    """The web view's settings for the test (a fresh CSRF token)."""
    return WebConfig(refresh_ms=500)


@pytest.fixture
def client(store: Any, config: WebConfig) -> Iterator[TestClient]:
    """The app over ``store``, called in-process (its Host is ``testserver``)."""
    with TestClient(create_app(store, config)) as c:
        yield c


@pytest.fixture
def dispatcher(store: Any, scheduler_dispatcher: Callable[..., RunningDispatcher]) -> Callable[..., RunningDispatcher]:  # noqa: F811
    """``dispatcher(**config)``: ``scheduler.testing``'s background dispatcher on ``store``, stopped after the test."""
    return functools.partial(scheduler_dispatcher, store)
