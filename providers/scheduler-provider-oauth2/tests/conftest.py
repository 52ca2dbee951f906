"""The provider wired to a real OAuth 2.0 token endpoint on loopback (``scheduler_provider_oauth2.testing``)."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from scheduler_provider_oauth2 import ClientSettings, OAuth2CredentialProvider, OAuth2Settings
from scheduler_provider_oauth2.testing import TokenServer, secret_forms, serve_token_endpoint
from scheduler_toolkit.settings import SecretRef, reload_settings
from scheduler_toolkit.types import CredentialPresent

from scheduler.api import CredentialBinding, CredentialContext
from scheduler.testing import isolate_settings


@pytest.fixture
def token_server() -> Iterator[TokenServer]:
    """A live endpoint at ``token_server.url`` (``/token``, ``/revoke``)."""
    state, close = serve_token_endpoint()
    try:
        yield state
    finally:
        close()


class Clock:
    """Epoch seconds that tests move forward by hand (the provider's notion of now)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No developer settings and no proxy reach a test."""
    isolate_settings(monkeypatch, tmp_path / "xdg")
    for name in list(os.environ):
        if name.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            monkeypatch.delenv(name)
    yield
    reload_settings()


@pytest.fixture
def client_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    """The client secret of client ``reports``, found by the provider through ``env:OAUTH2_TEST_SECRET``."""
    value = "cs-" + secrets.token_urlsafe(24)
    monkeypatch.setenv("OAUTH2_TEST_SECRET", value)
    return value


@pytest.fixture
def clock() -> Clock:
    return Clock()


#: Keys of one client (``ClientSettings``); any other override is a provider-wide key.
CLIENT_KEYS = {f.name for f in attrs.fields(ClientSettings)}


@pytest.fixture
def settings_for(token_server: TokenServer, client_secret: str) -> Callable[..., OAuth2Settings]:
    """``settings_for(**overrides)``: client ``reports`` (basic auth, scopes ``read write``) at the live endpoint.

    An override named like a client key (``audience="..."``, ``revocation_url=None``) changes
    client ``reports``, a reference given as text (``refresh_token="env:X"``) is parsed; any
    other override is a provider-wide key (``timeout_s=0.3``).
    """
    token_server.clients["reports-id"] = client_secret

    def make(**overrides: Any) -> OAuth2Settings:
        client: dict[str, Any] = {
            "token_url": f"{token_server.url}/token",
            "client_id": "reports-id",
            "client_secret": SecretRef.parse("env:OAUTH2_TEST_SECRET"),
            "scope": "read write",
            "revocation_url": f"{token_server.url}/revoke",
        }
        values: dict[str, Any] = {"timeout_s": 2.0, "trust_env": False}
        for key, value in overrides.items():
            if key in ("client_secret", "refresh_token") and isinstance(value, str):
                value = SecretRef.parse(value)
            (client if key in CLIENT_KEYS else values)[key] = value
        return OAuth2Settings(clients={"reports": ClientSettings(**client)}, **values)

    return make


@pytest.fixture
def provider(settings_for: Callable[..., OAuth2Settings], clock: Clock) -> Callable[..., OAuth2CredentialProvider]:
    """``provider(**overrides)``: a configured provider on the fake clock."""

    def make(**overrides: Any) -> OAuth2CredentialProvider:
        p = OAuth2CredentialProvider(clock=clock)
        p.configure(settings_for(**overrides))
        return p

    return make


@pytest.fixture
def binding() -> Callable[..., CredentialBinding]:
    def make(ref: str = "reports", *, name: str = "api", options: Any = None) -> CredentialBinding:
        return CredentialBinding(name=name, provider="oauth2", ref=ref, options=options,
                                 present=CredentialPresent(medium="env", key="API_TOKEN"))

    return make


@pytest.fixture
def context() -> CredentialContext:
    return CredentialContext(run_id="run-1", job_id="job-1")


@pytest.fixture
def toml_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], Path]:
    """``toml_file(text)``: a real settings file selected by ``SCHEDULER_CONFIG``."""

    def write(text: str) -> Path:
        path = tmp_path / "scheduler.toml"
        path.write_text(text)
        monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
        reload_settings()
        return path

    return write


def secret_free(text: str, server: TokenServer, *extra: str) -> bool:
    """True when none of the endpoint's secrets (nor ``extra``, nor a Basic credential) occurs in ``text`` in any form."""
    values = [*server.every_secret(), *extra]
    values += [f"{cid}:{secret}" for cid, secret in server.clients.items()]  # what an Authorization: Basic header carries
    return not [f for v in values if v for f in secret_forms(v) if f in text]


@pytest.fixture
def no_secrets() -> Callable[..., bool]:
    return secret_free
