"""``revoke`` (RFC 7009) reports an explicit result, released only on an explicit success; ``refresh`` forces a token."""

from __future__ import annotations

import threading

import pytest

from scheduler.api import ResolvedCredential


def test_revoked_only_on_an_explicit_200(provider, binding, context, token_server, client_secret) -> None:
    p = provider()
    token = p.resolve(binding(), context)
    result = p.revoke(token, binding(), context)
    assert result.revoked is True and result.reason is None
    assert token_server.revoked == [token.value]
    seen = token_server.requests("/revoke")[0]
    assert seen.auth == "basic" and seen.form == {"token": token.value, "token_type_hint": "access_token"}
    again = p.resolve(binding(), context)  # the revoked token is gone from the cache
    assert again.value != token.value and token_server.token_requests == 2


REVOKE_CASES = [
    ({"status": 503, "body": b""}, "CREDENTIAL_REVOKE_UNAVAILABLE"),
    ({"status": 500, "json": {"error": "server_error"}}, "CREDENTIAL_REVOKE_UNAVAILABLE"),
    ({"status": 429, "body": b""}, "CREDENTIAL_REVOKE_UNAVAILABLE"),
    ({"status": 400, "json": {"error": "unsupported_token_type"}}, "CREDENTIAL_REVOKE_REJECTED"),
    ({"status": 401, "json": {"error": "invalid_client"}}, "CREDENTIAL_REVOKE_REJECTED"),
    ({"status": 302, "headers": {"Location": "https://elsewhere/revoke"}}, "CREDENTIAL_REVOKE_INDETERMINATE"),
    ({"status": 204, "body": b""}, "CREDENTIAL_REVOKE_INDETERMINATE"),
]


@pytest.mark.parametrize(("reply", "code"), REVOKE_CASES, ids=[f"{c[0]['status']}" for c in REVOKE_CASES])
def test_anything_else_is_not_revoked_and_says_why(reply, code, provider, binding, context, token_server, no_secrets) -> None:
    p = provider()
    token = p.resolve(binding(), context)
    token_server.revoke_script.append(reply)
    result = p.revoke(token, binding(), context)
    assert result.revoked is False and result.reason.startswith(f"{code}: ")
    assert "not known to be revoked" in result.reason and no_secrets(result.reason, token_server)
    assert p.resolve(binding(), context).value != token.value  # never presented again either way


def test_a_slow_or_absent_revocation_endpoint(provider, binding, context, token_server) -> None:
    p = provider(timeout_s=0.3)
    token = p.resolve(binding(), context)
    token_server.revoke_script.append({"sleep": 1.5, "status": 200, "body": b""})
    result = p.revoke(token, binding(), context)
    assert result.revoked is False and result.reason.startswith("CREDENTIAL_REVOKE_UNAVAILABLE: ")
    assert "0.3 s" in result.reason


def test_no_revocation_url_is_unsupported(provider, binding, context, token_server) -> None:
    p = provider(revocation_url=None)
    token = p.resolve(binding(), context)
    result = p.revoke(token, binding(), context)
    assert result.revoked is False and result.reason.startswith("CREDENTIAL_REVOKE_UNSUPPORTED: ")
    assert token_server.requests("/revoke") == []


def test_revoking_for_an_unknown_client(provider, binding, context) -> None:
    result = provider().revoke(ResolvedCredential(value="at-whatever"), binding("nope"), context)
    assert result.revoked is False and result.reason.startswith("CREDENTIAL_NOT_FOUND: ")


def test_refresh_fetches_a_new_token_before_the_refresh_point(provider, binding, context, token_server) -> None:
    p = provider()
    old = p.resolve(binding(), context)
    result = p.refresh(old, binding(), context)
    assert result.refreshed is True and result.credential.value != old.value
    assert result.credential.metadata["cached"] is False
    assert p.resolve(binding(), context).value == result.credential.value  # the new one is cached
    assert token_server.token_requests == 2


def test_refreshes_of_the_same_old_token_share_one_request(provider, binding, context, token_server) -> None:
    token_server.delay_s = 0.2
    p = provider()
    old = p.resolve(binding(), context)
    results = []
    barrier = threading.Barrier(4)

    def one() -> None:
        barrier.wait()
        results.append(p.refresh(old, binding(), context))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {r.credential.value for r in results} == {token_server.issued[1]} and token_server.token_requests == 2


def test_a_failed_refresh_is_a_result_not_an_exception(provider, binding, context, token_server, no_secrets) -> None:
    p = provider()
    old = p.resolve(binding(), context)
    token_server.token_script.append({"status": 400, "json": {"error": "invalid_client"}})
    result = p.refresh(old, binding(), context)
    assert result.refreshed is False and result.credential is None
    assert result.reason.startswith("CREDENTIAL_OAUTH_INVALID_CLIENT: ") and no_secrets(result.reason, token_server)
