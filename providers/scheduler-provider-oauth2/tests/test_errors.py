"""Failures become stable CREDENTIAL_* codes, permanent or transient; no secret reaches an exception or a log."""

from __future__ import annotations

import json
import logging
import socket
import traceback

import pytest

from scheduler.api import SchedulerError


def _everything(exc: BaseException) -> str:
    """All an operator could ever see of an exception: traceback (with chained causes), repr, details."""
    return "".join(traceback.format_exception(exc)) + repr(exc) + json.dumps(getattr(exc, "details", None), default=str)


CASES = [
    # (scripted reply, code, transient)
    ({"status": 400, "json": {"error": "invalid_client"}}, "CREDENTIAL_OAUTH_INVALID_CLIENT", False),
    ({"status": 400, "json": {"error": "unauthorized_client"}}, "CREDENTIAL_OAUTH_INVALID_CLIENT", False),
    ({"status": 401, "json": {}}, "CREDENTIAL_OAUTH_INVALID_CLIENT", False),
    ({"status": 401, "body": b"<html>denied</html>"}, "CREDENTIAL_OAUTH_INVALID_CLIENT", False),
    ({"status": 400, "json": {"error": "invalid_grant"}}, "CREDENTIAL_OAUTH_INVALID_GRANT", False),
    ({"status": 400, "json": {"error": "invalid_scope"}}, "CREDENTIAL_OAUTH_INVALID_SCOPE", False),
    ({"status": 400, "json": {"error": "unsupported_grant_type"}}, "CREDENTIAL_OAUTH_REJECTED", False),
    ({"status": 403, "body": b"forbidden"}, "CREDENTIAL_OAUTH_REJECTED", False),
    ({"status": 400, "json": {"error": "temporarily_unavailable"}}, "CREDENTIAL_OAUTH_UNAVAILABLE", True),
    ({"status": 500, "json": {"error": "server_error"}}, "CREDENTIAL_OAUTH_UNAVAILABLE", True),
    ({"status": 502, "body": b"<html>bad gateway</html>"}, "CREDENTIAL_OAUTH_UNAVAILABLE", True),
    ({"status": 503, "body": b""}, "CREDENTIAL_OAUTH_UNAVAILABLE", True),
    ({"status": 429, "json": {"error": "slow_down"}}, "CREDENTIAL_OAUTH_UNAVAILABLE", True),
    ({"status": 429, "body": b"too many"}, "CREDENTIAL_OAUTH_UNAVAILABLE", True),
    ({"status": 200, "body": b"not json at all"}, "CREDENTIAL_OAUTH_BAD_RESPONSE", False),
    ({"status": 200, "json": ["a", "list"]}, "CREDENTIAL_OAUTH_BAD_RESPONSE", False),
    ({"status": 200, "json": {"token_type": "Bearer", "expires_in": 60}}, "CREDENTIAL_OAUTH_BAD_RESPONSE", False),
    ({"status": 200, "json": {"access_token": "", "expires_in": 60}}, "CREDENTIAL_OAUTH_BAD_RESPONSE", False),
    ({"status": 200, "json": {"access_token": "at-x", "expires_in": "soon"}}, "CREDENTIAL_OAUTH_BAD_RESPONSE", False),
    ({"status": 302, "headers": {"Location": "https://elsewhere/token"}}, "CREDENTIAL_OAUTH_BAD_RESPONSE", False),
]


@pytest.mark.parametrize(("reply", "code", "transient"), CASES, ids=[f"{c[0]['status']}-{c[1]}" for c in CASES])
def test_answers_are_classified(reply, code, transient, provider, binding, context, token_server, no_secrets) -> None:
    token_server.token_script.append(reply)
    with pytest.raises(SchedulerError) as info:
        provider().resolve(binding(), context)
    err = info.value
    assert (err.code, err.retryable, err.details["transient"]) == (code, transient, transient)
    assert err.details["client"] == "reports" and err.details["token_url"] == f"{token_server.url}/token"
    assert no_secrets(_everything(err), token_server)


def test_a_slow_endpoint_is_a_transient_timeout(provider, binding, context, token_server) -> None:
    token_server.token_script.append({"sleep": 2.0, "status": 200, "json": {"access_token": "at-late", "expires_in": 60}})
    with pytest.raises(SchedulerError) as info:
        provider(timeout_s=0.3).resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_OAUTH_UNAVAILABLE" and info.value.details["reason"] == "timeout"
    assert "0.3 s" in info.value.message and info.value.retryable


def test_a_closed_port_is_a_transient_connection_failure(provider, binding, context) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = provider(token_url=f"http://127.0.0.1:{port}/token", revocation_url=None)
    with pytest.raises(SchedulerError) as info:
        p.resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_OAUTH_UNAVAILABLE" and info.value.details["reason"] == "ConnectError"


def test_a_wrong_client_secret_is_invalid_client(provider, binding, context, token_server, monkeypatch, no_secrets) -> None:
    monkeypatch.setenv("OAUTH2_TEST_SECRET", "cs-wrong-but-still-secret")
    with pytest.raises(SchedulerError) as info:
        provider().resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_OAUTH_INVALID_CLIENT"
    assert "client authentication failed" in info.value.message  # the server's description, scrubbed
    assert no_secrets(_everything(info.value), token_server, "cs-wrong-but-still-secret")


def test_a_description_echoing_a_secret_is_scrubbed(provider, binding, context, token_server, client_secret, no_secrets) -> None:
    token_server.token_script.append({"status": 400, "json": {
        "error": "invalid_request", "error_description": f"bad secret {client_secret} \u2603\x00" + "x" * 500}})
    with pytest.raises(SchedulerError) as info:
        provider().resolve(binding(), context)
    err = info.value
    assert err.code == "CREDENTIAL_OAUTH_REJECTED" and "bad secret [REDACTED] ??" in err.message
    assert len(err.details["error_description"]) <= 200
    assert no_secrets(_everything(err), token_server)


def test_a_malformed_error_code_is_not_repeated(provider, binding, context, token_server) -> None:
    token_server.token_script.append({"status": 400, "json": {"error": "<script>alert(1)</script>"}})
    with pytest.raises(SchedulerError) as info:
        provider().resolve(binding(), context)
    assert info.value.code == "CREDENTIAL_OAUTH_REJECTED" and "<script>" not in info.value.message
    assert info.value.details["error"] is None


def test_secrets_never_reach_the_logs(provider, binding, context, token_server, monkeypatch, caplog, no_secrets) -> None:
    """Every logger at DEBUG (httpx, httpcore, authlib, ours) through successes, errors, refresh, rotation, revocation."""
    caplog.set_level(logging.DEBUG)
    token_server.rotate = True
    monkeypatch.setenv("OAUTH2_TEST_RT", token_server.new_refresh_token("reports-id"))
    p = provider(grant="refresh_token", refresh_token="env:OAUTH2_TEST_RT")
    first = p.resolve(binding(), context)
    p.refresh(first, binding(), context)
    token_server.token_script.extend([{"status": 400, "json": {"error": "invalid_grant"}}, {"status": 503, "body": b""}])
    for _ in range(2):
        p.clear_cache()
        with pytest.raises(SchedulerError):
            p.resolve(binding(), context)
    second = provider().resolve(binding(), context)
    assert provider().revoke(second, binding(), context).revoked is True
    assert caplog.records, "the test must see some log records"
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.args!r}" for r in caplog.records)
    assert "httpx" in logged and "scheduler_provider_oauth2" in logged
    assert no_secrets(logged + caplog.text, token_server)
