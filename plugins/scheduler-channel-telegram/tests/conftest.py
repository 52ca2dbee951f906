"""Fixtures: a real HTTP server on loopback that records requests and answers as scripted, and the channel
loaded through its entry point with a real settings file, exactly as the kernel loads it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.testing import provider_loader
from scheduler.testing.http import LoopbackHTTPServer


@pytest.fixture
def server() -> Iterator[LoopbackHTTPServer]:
    """A scripted HTTP/1.1 server on 127.0.0.1 (``server.url``, ``server.queue(path, ...)``, ``server.to(path)``)."""
    srv = LoopbackHTTPServer()
    yield srv
    srv.close()


@pytest.fixture
def load_channel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``load_channel(name, **settings)``: write ``[channels.NAME]`` to a real settings file and load the driver
    through its entry point (API, Protocol and settings checks, ``configure``), as the kernel does."""
    with provider_loader(monkeypatch, tmp_path, "channel") as load:
        yield load
