"""OAuth2 provider sessions in the kernel's ``provider_sessions`` table, against a real token endpoint on loopback.

The provider caches one token per session key in memory; the kernel's record
(``scheduler.pipeline.credentials.sessions.StoreProviderSessions``, on ``CredentialContext.sessions``)
keeps only the hashed key, scopes, expiry, refresh point and status. Every test runs on
SQLite and PostgreSQL (the ``store`` fixture) and scans the rows for the token, the
client secret and their base64/hex forms.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from scheduler_provider_oauth2 import ClientSettings, OAuth2CredentialProvider, OAuth2Settings
from scheduler_provider_oauth2.testing import TokenServer, secret_forms, serve_token_endpoint
from scheduler_toolkit.settings import SecretRef
from scheduler_toolkit.types import CredentialPresent

from scheduler.api import CredentialBinding, CredentialContext, SchedulerError
from scheduler.pipeline.credentials.sessions import StoreProviderSessions, session_id
from scheduler.testing import MemoryProviderSessions


class Clock:
    """Epoch seconds moved by hand (the provider's notion of now)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[TokenServer]:
    state, close = serve_token_endpoint()
    secret = "cs-" + secrets.token_urlsafe(24)
    state.clients["reports-id"] = secret
    monkeypatch.setenv("OAUTH2_SESSIONS_SECRET", secret)
    try:
        yield state
    finally:
        close()


@pytest.fixture
def make_provider(endpoint: TokenServer) -> Callable[..., OAuth2CredentialProvider]:
    def make(clock: Any = None, revocation_url: str | None = "/revoke", **overrides: Any) -> OAuth2CredentialProvider:
        """Client ``reports`` at the endpoint (``revocation_url=None``: none); ``overrides`` are provider-wide keys."""
        client = ClientSettings(token_url=f"{endpoint.url}/token", client_id="reports-id",
                                client_secret=SecretRef.parse("env:OAUTH2_SESSIONS_SECRET"), scope="read write",
                                revocation_url=f"{endpoint.url}{revocation_url}" if revocation_url else None)
        values: dict[str, Any] = {"timeout_s": 2.0, "trust_env": False, **overrides}
        provider = OAuth2CredentialProvider(clock=clock)
        provider.configure(OAuth2Settings(clients={"reports": client}, **values))
        return provider

    return make


BINDING = CredentialBinding(name="api", provider="oauth2", ref="reports", present=CredentialPresent(medium="env", key="API_TOKEN"))


def _context(sessions: Any, n: int = 1) -> CredentialContext:
    return CredentialContext(run_id=f"run-{n}", job_id="job-1", sessions=sessions)


def _rows(store: Any) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT * FROM provider_sessions ORDER BY created_at")


def _leaks(rows: list[dict[str, Any]], server: TokenServer) -> list[str]:
    text = json.dumps(rows, default=str)
    values = [*server.every_secret(), *(f"{c}:{s}" for c, s in server.clients.items())]
    return [form for value in values for form in secret_forms(value) if form in text]


def test_one_token_request_for_many_runs_one_row_without_the_token(store, make_provider, endpoint) -> None:
    sessions = StoreProviderSessions(store, runtime_instance="host-a:1")
    provider = make_provider()
    answers = [provider.resolve(BINDING, _context(sessions, n)) for n in range(6)]
    assert endpoint.token_requests == 1 and len({a.value for a in answers}) == 1
    first = answers[0]
    assert first.name == "api" and first.medium == "env" and first.key == "API_TOKEN" and first.required is True
    assert first.refresh_after_ms == first.metadata["refresh_after_ms"] < first.expires_at_ms
    (row,) = _rows(store)
    assert row["provider"] == "oauth2" and row["status"] == "active" and row["runtime_instance"] == "host-a:1"
    assert row["session_key"] == first.metadata["cache_key_hash"] and row["scopes"] == "read write"
    assert row["expires_at"] == first.expires_at_ms and row["refresh_after"] == first.refresh_after_ms
    assert row["id"] == session_id("oauth2", row["session_key"], "host-a:1") and row["artifact_digest"] is None
    assert _leaks(_rows(store), endpoint) == [] and endpoint.issued[0] in first.value  # the scan can find the token


def test_the_row_is_renewed_after_refresh_after(store, make_provider, endpoint) -> None:
    endpoint.expires_in = 100
    clock = Clock()
    sessions = StoreProviderSessions(store)
    provider = make_provider(clock, refresh_margin_s=10)
    first = provider.resolve(BINDING, _context(sessions))
    clock.now += 89
    assert provider.resolve(BINDING, _context(sessions)).value == first.value and endpoint.token_requests == 1
    clock.now += 2  # past the refresh point (90 s)
    second = provider.resolve(BINDING, _context(sessions))
    assert second.value != first.value and endpoint.token_requests == 2
    (row,) = _rows(store)
    assert row["expires_at"] == second.expires_at_ms > first.expires_at_ms and row["status"] == "active"
    assert _leaks(_rows(store), endpoint) == []


def test_a_one_second_token_is_never_presented_once_expired(store, make_provider, endpoint) -> None:
    """expires_in 1 s, real clock: served until its refresh point, then never again; the session is marked expired."""
    endpoint.expires_in = 1
    sessions = StoreProviderSessions(store)
    provider = make_provider()
    first = provider.resolve(BINDING, _context(sessions))
    assert first.expires_at_ms - first.metadata["issued_at_ms"] == 1000 and first.refresh_after_ms <= first.expires_at_ms - 500
    time.sleep(1.1)
    endpoint.token_script.append({"status": 503, "json": {"error": "temporarily_unavailable"}})
    with pytest.raises(SchedulerError) as info:
        provider.resolve(BINDING, _context(sessions))
    assert info.value.code == "CREDENTIAL_OAUTH_UNAVAILABLE" and first.value not in str(info.value)
    (row,) = _rows(store)
    assert row["status"] == "expired"
    endpoint.expires_in = 3600
    fresh = provider.resolve(BINDING, _context(sessions))
    assert fresh.value != first.value and fresh.expires_at_ms > time.time() * 1000
    assert [r["status"] for r in _rows(store)] == ["active"] and endpoint.token_requests == 3


@pytest.mark.parametrize(("reply", "outcome", "status"), [
    (None, "revoked", "revoked"),
    ({"status": 503, "body": b""}, "not_revoked", "revoke_failed"),
    ({"status": 400, "json": {"error": "unsupported_token_type"}}, "not_revoked", "revoke_failed"),
    ({"status": 302, "headers": {"Location": "http://127.0.0.1:1/"}}, "not_revoked", "revoke_failed"),
    ({"sleep": 2.5}, "not_revoked", "revoke_failed"),  # no answer within timeout_s
])
def test_revocation_outcomes_reach_the_row(reply, outcome, status, store, make_provider, endpoint) -> None:
    sessions = StoreProviderSessions(store)
    provider = make_provider()
    token = provider.resolve(BINDING, _context(sessions))
    if reply is not None:
        endpoint.revoke_script.append(reply)
    result = provider.revoke(token, BINDING, _context(sessions))
    assert result.outcome == outcome and result.revoked is (outcome == "revoked")
    (row,) = _rows(store)
    assert row["status"] == status and (row["revoked_at"] is not None) is (status == "revoked")
    if not (reply or {}).get("sleep"):
        # A server that answers after the client gave up may still revoke (that is why the row says revoke_failed:
        # unknown); only an answered request tells what the server did. Asserting it for the slow server raced the
        # server's late handler on a loaded machine.
        assert (endpoint.revoked == [token.value]) is (outcome == "revoked")
    again = provider.resolve(BINDING, _context(sessions))  # a token whose revocation was attempted is never presented again
    assert again.value != token.value and endpoint.token_requests == 2
    assert _rows(store)[0]["status"] == "active" and _leaks(_rows(store), endpoint) == []


def test_without_a_revocation_url_the_answer_is_unsupported(store, make_provider, endpoint) -> None:
    sessions = StoreProviderSessions(store)
    provider = make_provider(revocation_url=None)
    token = provider.resolve(BINDING, _context(sessions))
    result = provider.revoke(token, BINDING, _context(sessions))
    assert result.outcome == "unsupported" and not result.revoked and result.reason.startswith("CREDENTIAL_REVOKE_UNSUPPORTED")
    assert _rows(store)[0]["status"] == "revoke_failed" and endpoint.requests("/revoke") == []


def test_the_facade_refuses_what_could_carry_a_secret(store) -> None:
    sessions = StoreProviderSessions(store)
    raw = "at-" + secrets.token_urlsafe(24)
    bad_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("oauth2", raw), {}),                                            # a raw token as the key
        (("oauth2", "sha256:" + "A" * 64), {}),                           # not lowercase hex
        (("OAuth 2", "sha256:" + "a" * 64), {}),                          # not a driver name
        (("oauth2", "sha256:" + "a" * 64), {"scopes": [raw + " x\""]}),   # not scope tokens
        (("oauth2", "sha256:" + "a" * 64), {"expires_at_ms": "soon"}),
        (("oauth2", "sha256:" + "a" * 64), {"refresh_after_ms": -1}),
    ]
    for args, kwargs in bad_calls:
        with pytest.raises(SchedulerError) as info:
            sessions.record_session(*args, **kwargs)
        assert info.value.code == "PROVIDER_SESSION_INVALID" and raw not in str(info.value) + repr(info.value.details)
    with pytest.raises(SchedulerError) as info:
        sessions.mark_session("oauth2", "sha256:" + "a" * 64, "gone")
    assert info.value.code == "PROVIDER_SESSION_INVALID"
    assert _rows(store) == []  # nothing was written
    assert sessions.mark_session("oauth2", "sha256:" + "b" * 64, "revoked") is False  # unknown session


def test_a_session_the_kernel_cannot_record_is_not_presented(make_provider, endpoint) -> None:
    class Refusing(MemoryProviderSessions):
        def record_session(self, *args: Any, **kwargs: Any) -> str:
            raise SchedulerError("DB_BUSY", "database is locked")

    provider = make_provider()
    with pytest.raises(SchedulerError) as info:
        provider.resolve(BINDING, _context(Refusing()))
    assert info.value.code == "DB_BUSY"
    memory = MemoryProviderSessions()
    token = provider.resolve(BINDING, _context(memory))  # nothing was cached: a second request, now recorded
    assert endpoint.token_requests == 2 and memory.statuses() == ["active"]
    assert token.value not in repr(memory.records)


def test_two_dispatchers_keep_a_row_each(store, make_provider, endpoint) -> None:
    a, b = make_provider(), make_provider()
    a.resolve(BINDING, _context(StoreProviderSessions(store, runtime_instance="host-a:1")))
    b.resolve(BINDING, _context(StoreProviderSessions(store, runtime_instance="host-b:2")))
    rows = _rows(store)
    assert sorted(r["runtime_instance"] for r in rows) == ["host-a:1", "host-b:2"]
    assert len({r["session_key"] for r in rows}) == 1 and endpoint.token_requests == 2
