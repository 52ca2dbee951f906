"""Fixtures: bindings and contexts as the kernel builds them, a real settings file, providers loaded by entry point."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_toolkit.settings import reload_settings
from scheduler_toolkit.types import CredentialPresent

from scheduler import testing
from scheduler.api import CredentialBinding, CredentialContext
from scheduler.testing import isolate_settings, load_provider

#: The secret every test hands around; no message, detail, log line or metadata may contain it.
SECRET = "s3cr3t-Local-7f9a2c1e"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No developer settings file or SCHEDULER_PROVIDERS_* override reaches a test."""
    isolate_settings(monkeypatch, tmp_path / "xdg")
    yield
    reload_settings()


@pytest.fixture
def secret() -> str:
    return SECRET


@pytest.fixture
def binding() -> Callable[..., CredentialBinding]:
    """``binding(provider, ref, name="api", medium="env")``: one entry of a job's ``credentials``."""

    def make(provider: str, ref: str, *, name: str = "api", medium: str = "env", options: Any = None) -> CredentialBinding:
        present = CredentialPresent(medium=medium, key="API_TOKEN" if medium == "env" else None,  # type: ignore[arg-type]
                                    file_name="token" if medium == "file" else None)
        return CredentialBinding(name=name, provider=provider, ref=ref, present=present, options=options)

    return make


@pytest.fixture
def context() -> CredentialContext:
    return CredentialContext(run_id="run-42", job_id="job-7", attempt=1)


@pytest.fixture
def write_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., Path]:
    """``write_settings({"providers.file": {...}, ...})``: a real settings file, selected by ``SCHEDULER_CONFIG``."""

    def write(tables: dict[str, dict[str, Any]]) -> Path:
        path = testing.write_settings(tmp_path / "scheduler.toml", tables)
        monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
        reload_settings()
        return path

    return write


@pytest.fixture
def load(write_settings: Callable[..., Path]) -> Callable[..., Any]:
    """``load(driver, **settings)``: write ``[providers.DRIVER]`` and load the driver through its entry point."""

    def make(driver: str, **settings: Any) -> Any:
        write_settings({f"providers.{driver}": settings})
        return load_provider("credential", driver)

    return make


def assert_no_secret(exc: BaseException, secret: str) -> None:
    """The secret is nowhere in an exception: message, repr, details, the formatted traceback."""
    import traceback

    text = "".join(traceback.format_exception(exc)) + repr(exc) + json.dumps(getattr(exc, "details", None), default=str)
    assert secret not in text


@pytest.fixture
def no_secret_in() -> Callable[[BaseException, str], None]:
    return assert_no_secret
