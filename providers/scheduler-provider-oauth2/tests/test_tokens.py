"""Tokens from a real endpoint: one request for many resolves, refresh before expiry, never an expired token."""

from __future__ import annotations

import threading

import pytest
from scheduler_provider_oauth2 import OAuth2CredentialProvider

from scheduler.api import SchedulerError


def test_one_token_request_serves_many_resolves(provider, binding, context, token_server) -> None:
    p = provider()
    first = p.resolve(binding(), context)
    assert first.value == token_server.issued[0]
    for i in range(5):
        again = p.resolve(binding(name=f"b{i}"), context)
        assert again.value == first.value and again.metadata["cached"] is True
    assert token_server.token_requests == 1
    seen = token_server.requests()[0]
    assert seen.auth == "basic" and seen.client_id == "reports-id"
    assert seen.form == {"grant_type": "client_credentials", "scope": "read write"}
    meta = first.metadata
    assert meta["cached"] is False and meta["client"] == "reports" and meta["grant"] == "client_credentials"
    assert meta["token_type"] == "Bearer" and meta["scope"] == "read write" and meta["expiry_assumed"] is False
    assert meta["cache_key_hash"].startswith("sha256:") and len(meta["cache_key_hash"]) == 71
    assert first.expires_at_ms == meta["expires_at_ms"] == meta["issued_at_ms"] + 3_600_000
    assert meta["refresh_after_ms"] == first.expires_at_ms - 60_000
    assert first.value not in repr(first) and first.value not in repr(meta)


def test_concurrent_resolves_make_one_request(provider, binding, context, token_server) -> None:
    token_server.delay_s = 0.3
    p = provider()
    values: list[str] = []
    barrier = threading.Barrier(8)

    def one() -> None:
        barrier.wait()
        values.append(p.resolve(binding(), context).value)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert token_server.token_requests == 1 and len(set(values)) == 1 and len(values) == 8


def test_the_token_is_replaced_at_its_refresh_point_before_it_expires(provider, binding, context, token_server, clock) -> None:
    token_server.expires_in = 100
    p = provider(refresh_margin_s=10)
    first = p.resolve(binding(), context)
    assert first.metadata["refresh_after_ms"] == first.expires_at_ms - 10_000
    clock.advance(89.9)
    assert p.resolve(binding(), context).value == first.value and token_server.token_requests == 1
    clock.advance(0.2)  # past refresh_after (90 s), still 9.9 s before expiry
    second = p.resolve(binding(), context)
    assert second.value != first.value and second.metadata["cached"] is False and token_server.token_requests == 2
    assert second.expires_at_ms > first.expires_at_ms


def test_the_margin_is_at_most_half_the_lifetime(provider, binding, context, token_server, clock) -> None:
    token_server.expires_in = 10
    p = provider(refresh_margin_s=60)
    first = p.resolve(binding(), context)
    assert first.metadata["refresh_after_ms"] == first.metadata["issued_at_ms"] + 5_000
    clock.advance(4.9)
    assert p.resolve(binding(), context).value == first.value
    clock.advance(0.2)
    assert p.resolve(binding(), context).value != first.value and token_server.token_requests == 2


@pytest.mark.parametrize("expires_in", [0, -30, "0"])
def test_a_token_expired_on_arrival_is_never_presented(expires_in, provider, binding, context, token_server, no_secrets) -> None:
    token_server.expires_in = expires_in
    p = provider()
    for _ in range(2):  # and it is not cached either
        with pytest.raises(SchedulerError) as info:
            p.resolve(binding(), context)
        assert info.value.code == "CREDENTIAL_EXPIRED" and "not presented" in info.value.message
        assert no_secrets(str(info.value) + repr(info.value.details), token_server)
    assert token_server.token_requests == 2


def test_expiry_counts_from_when_the_request_was_sent(settings_for, binding, context, token_server) -> None:
    """A slow endpoint does not lengthen the token's life: 1 s lifetime + 1.2 s latency = expired on arrival."""
    token_server.expires_in = 1
    token_server.token_script.append(lambda form: {"sleep": 1.2})
    p = OAuth2CredentialProvider()  # the real clock: the latency must count
    p.configure(settings_for())
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_EXPIRED" and token_server.token_requests == 1


def test_an_expired_cached_token_is_not_presented_when_the_endpoint_fails(provider, binding, context, token_server, clock) -> None:
    token_server.expires_in = 100
    p = provider(refresh_margin_s=10)
    p.resolve(binding(), context)
    token_server.token_script.extend([{"status": 503, "json": {"error": "temporarily_unavailable"}}] * 2)
    clock.advance(95)  # past the refresh point, not yet expired: still no stale token
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_OAUTH_UNAVAILABLE" and info.value.retryable
    clock.advance(10)  # now expired too
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_OAUTH_UNAVAILABLE"
    fresh = p.resolve(binding(), context)  # the endpoint is back
    assert fresh.metadata["cached"] is False and fresh.expires_at_ms > clock.now * 1000
    assert token_server.token_requests == 4


def test_no_expires_in_means_the_configured_lifetime(provider, binding, context, token_server, clock) -> None:
    token_server.expires_in = None
    p = provider(default_lifetime_s=120, refresh_margin_s=30)
    first = p.resolve(binding(), context)
    assert first.metadata["expiry_assumed"] is True
    assert first.expires_at_ms - first.metadata["issued_at_ms"] == 120_000
    clock.advance(91)
    assert p.resolve(binding(), context).value != first.value


def test_a_binding_may_narrow_the_scopes(provider, binding, context, token_server) -> None:
    p = provider()
    wide = p.resolve(binding(), context)
    narrow = p.resolve(binding(options={"scope": "read"}), context)
    assert narrow.value != wide.value and narrow.metadata["scope"] == "read"
    assert narrow.metadata["cache_key_hash"] != wide.metadata["cache_key_hash"]
    assert [s.form.get("scope") for s in token_server.requests()] == ["read write", "read"]
    assert p.resolve(binding(options={"scope": "read read"}), context).value == narrow.value  # same set, same session
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding(options={"scope": "read admin"}), context)
    assert info.value.code == "CREDENTIAL_SCOPE_NOT_ALLOWED" and "admin" in info.value.message
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding(options={"scopes": "read"}), context)
    assert info.value.code == "CREDENTIAL_OPTIONS_INVALID"
    assert token_server.token_requests == 2


def test_audience_is_sent(provider, binding, context, token_server) -> None:
    p = provider(audience="https://api.example")
    assert p.resolve(binding(), context).metadata["audience"] == "https://api.example"
    assert token_server.requests()[0].form["audience"] == "https://api.example"


@pytest.mark.parametrize("method", ["client_secret_post", "none"])
def test_client_authentication_methods(method, provider, binding, context, token_server, client_secret) -> None:
    if method == "none":
        token_server.public.add("reports-id")
        p = provider(auth_method="none", client_secret=None)
    else:
        p = provider(auth_method=method)
    p.resolve(binding(), context)
    seen = token_server.requests()[0]
    assert seen.auth == ("post" if method == "client_secret_post" else "none") and seen.client_id == "reports-id"
    assert "authorization" not in seen.headers
    assert (seen.form.get("client_secret") == client_secret) is (method == "client_secret_post")


def test_refresh_token_grant_uses_and_keeps_the_rotated_token(provider, binding, context, token_server, clock,
                                                              monkeypatch) -> None:
    token_server.rotate = True
    token_server.expires_in = 100
    configured = token_server.new_refresh_token("reports-id")
    monkeypatch.setenv("OAUTH2_TEST_RT", configured)
    p = provider(grant="refresh_token", refresh_token="env:OAUTH2_TEST_RT", refresh_margin_s=10)
    first = p.resolve(binding(), context)
    assert first.metadata["grant"] == "refresh_token" and first.metadata["rotation"] == 1
    assert token_server.requests()[0].form["refresh_token"] == configured
    assert configured not in token_server.refresh_tokens  # the endpoint rotated it: reusing it would fail
    clock.advance(95)
    second = p.resolve(binding(), context)
    assert second.value != first.value and second.metadata["rotation"] == 2
    used = [s.form["refresh_token"] for s in token_server.requests()]
    assert used[1] != configured and len(set(used)) == 2


def test_refresh_token_reuse_is_a_permanent_invalid_grant(provider, binding, context, token_server, monkeypatch) -> None:
    monkeypatch.setenv("OAUTH2_TEST_RT", "rt-never-issued")
    p = provider(grant="refresh_token", refresh_token="env:OAUTH2_TEST_RT")
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_OAUTH_INVALID_GRANT" and not info.value.retryable
    assert "rt-never-issued" not in str(info.value) + repr(info.value.details)


def test_an_unknown_client_and_an_unreadable_secret_make_no_request(provider, binding, context, token_server, monkeypatch) -> None:
    p = provider()
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding("billing"), context)
    assert info.value.code == "CREDENTIAL_NOT_FOUND" and "known: reports" in info.value.message
    monkeypatch.delenv("OAUTH2_TEST_SECRET")
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_SECRET_UNRESOLVED" and "env:OAUTH2_TEST_SECRET" in info.value.message
    assert token_server.token_requests == 0


def test_each_provider_instance_has_its_own_cache(provider, binding, context, token_server) -> None:
    a, b = provider(), provider()
    assert a.resolve(binding(), context).value != b.resolve(binding(), context).value
    a.clear_cache()
    a.resolve(binding(), context)
    assert token_server.token_requests == 3
