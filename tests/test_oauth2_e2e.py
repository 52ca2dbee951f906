"""A shell job with an ``oauth2`` binding through a real dispatcher, against a real token endpoint on loopback.

The token reaches the command's environment (the command prints only its SHA-256), two
runs cost one token request (the provider instance and its cache live as long as the
dispatcher process), and neither ``provider_sessions`` nor any other row of the run holds
the token or the client secret in any form. SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for
from scheduler_provider_oauth2.testing import TokenServer, secret_forms, serve_token_endpoint

from scheduler.core.queue import enqueue_manual
from scheduler.settings import reload_settings

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[TokenServer]:
    """The endpoint, and a settings file naming it as client ``reports``; fresh provider caches."""
    from scheduler.pipeline.credentials import step as credentials
    from scheduler.plugins import options as plugin_options

    state, close = serve_token_endpoint()
    secret = "cs-" + secrets.token_urlsafe(24)
    state.clients["reports-id"] = secret
    monkeypatch.setenv("OAUTH2_E2E_SECRET", secret)
    config = tmp_path / "scheduler.toml"
    config.write_text(f"""
[providers.oauth2]
timeout_s = 2
trust_env = false

[providers.oauth2.clients.reports]
token_url = "{state.url}/token"
client_id = "reports-id"
client_secret = {{credential = "env:OAUTH2_E2E_SECRET"}}
scope = "read"
""")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    monkeypatch.setenv(credentials.DIR_ENV, str(tmp_path))
    reload_settings()
    credentials.forget_providers()
    plugin_options._validators.clear()
    plugin_options._misses.clear()
    try:
        yield state
    finally:
        credentials.forget_providers()
        close()
        reload_settings()


def _run(store: Any, dispatcher: Any, job_id: str) -> dict[str, Any]:
    before = {r["id"] for r in run_rows(store, job_id)}
    enqueue_manual(store, job_id)
    (run,) = wait_for(lambda: [r for r in run_rows(store, job_id) if r["status"] in TERMINAL and r["id"] not in before],
                      timeout=30, what="the run to finish")
    return run


def test_the_token_reaches_the_command_and_no_row_holds_it(store, dispatcher, endpoint) -> None:
    binding = {"name": "reports", "provider": "oauth2", "ref": "reports", "present": {"medium": "env", "key": "REPORTS_TOKEN"}}
    job = add_job(store, executor="shell", payload_message='printf "%s" "$REPORTS_TOKEN" | sha256sum',
                  credentials=[binding])
    d = dispatcher()
    try:
        first = _run(store, dispatcher, job["id"])
        second = _run(store, dispatcher, job["id"])
    finally:
        d.stop()
    assert first["status"] == "ok" and second["status"] == "ok", (first.get("error_code"), first.get("error_message"))
    assert endpoint.token_requests == 1  # one token for both runs
    (token,) = endpoint.issued
    expected = hashlib.sha256(token.encode()).hexdigest()
    for run in (first, second):
        assert expected in (run.get("stdout_excerpt") or run.get("output") or json.dumps(run, default=str))
    with store.read() as tx:
        sessions = tx.all("SELECT * FROM provider_sessions")
        rows = {table: tx.all(f"SELECT * FROM {table}") for table in
                ("runs", "runtime_events", "credential_presentations", "provider_sessions", "jobs")}
    (session,) = sessions
    assert session["provider"] == "oauth2" and session["status"] == "active" and session["scopes"] == "read"
    assert session["session_key"].startswith("sha256:") and session["expires_at"] > session["refresh_after"]
    text = json.dumps(rows, default=str)
    values = [token, endpoint.clients["reports-id"], f"reports-id:{endpoint.clients['reports-id']}"]
    assert [f for v in values for f in secret_forms(v) if f in text] == []
    assert token not in json.dumps(sessions, default=str)
