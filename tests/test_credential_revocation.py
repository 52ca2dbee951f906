"""Issue 28 item 4: provider-session revocation on the run path, against the OAuth2 provider's loopback token endpoint.

A binding with ``revoke: after_run`` is revoked through its provider when the run's credentials
are cleaned up. Only an explicit answer releases it (``revoked``; an explicit ``not_revoked``
such as a 400 is recorded and released); a missing, malformed or indeterminate one (a 503, a
timeout) fails the run closed with ``CREDENTIAL_REVOKE_INDETERMINATE``, keeping its output, and is
recorded on the run, its events, its presentation row and the provider session. After ``kill -9``
recovery records that the dead dispatcher's value could not be revoked. SQLite and PostgreSQL,
through the CLI and a real ``scheduler run``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import run_rows, scheduler_cmd, wait_for
from scheduler_provider_oauth2.testing import TokenServer, serve_token_endpoint

from scheduler.pipeline.credentials.step import RECOVERY_UNREVOKED
from scheduler.settings import reload_settings

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


def write_config(tmp_path: Path, state: TokenServer) -> dict[str, str]:
    secret = "cs-" + secrets.token_urlsafe(24)
    state.clients["reports-id"] = secret
    config = tmp_path / "scheduler.toml"
    config.write_text(f"""
[providers.oauth2]
timeout_s = 2
trust_env = false

[providers.oauth2.clients.reports]
token_url = "{state.url}/token"
revocation_url = "{state.url}/revoke"
client_id = "reports-id"
client_secret = {{credential = "env:OAUTH2_REVOKE_SECRET"}}
scope = "read"
""")
    return {"SCHEDULER_CONFIG": str(config), "OAUTH2_REVOKE_SECRET": secret, "SCHEDULER_CREDENTIALS_DIR": str(tmp_path)}


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[TokenServer]:
    """The token endpoint (``/token``, ``/revoke``) and a settings file naming it as client ``reports``."""
    from scheduler.pipeline.credentials import step as credentials
    from scheduler.plugins import options as plugin_options

    state, close = serve_token_endpoint()
    for k, v in write_config(tmp_path, state).items():
        monkeypatch.setenv(k, v)
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


def binding(**extra: Any) -> dict[str, Any]:
    return {"name": "reports", "provider": "oauth2", "ref": "reports", "present": {"medium": "env", "key": "REPORTS_TOKEN"},
            **extra}


def spec(name: str, **fields: Any) -> str:
    return json.dumps({"name": name, "schedule_kind": "manual", "executor": "shell", "payload_message": "echo ran",
                       "credentials": [binding(revoke="after_run")], **fields})


def run_once(cli: Any, store: Any, job_id: str) -> dict[str, Any]:
    before = {r["id"] for r in run_rows(store, job_id)}
    assert cli("--json", "jobs", "run", job_id).code == 0
    (run,) = wait_for(lambda: [r for r in run_rows(store, job_id) if r["status"] in TERMINAL and r["id"] not in before],
                      timeout=30, what="the run")
    return run


def presentation(store: Any, run_id: str) -> dict[str, Any]:
    with store.read() as tx:
        (row,) = tx.all("SELECT * FROM credential_presentations WHERE run_id = ?", (run_id,))
    return row


def events(store: Any, run_id: str, prefix: str = "credential.revoke") -> list[dict[str, Any]]:
    with store.read() as tx:
        return [{"kind": r["kind"], **json.loads(r["data"])} for r in tx.all(
            "SELECT kind, data FROM runtime_events WHERE run_id = ? AND kind LIKE ? ORDER BY id", (run_id, prefix + "%"))]


def session_status(store: Any) -> list[str]:
    with store.read() as tx:
        return [r["status"] for r in tx.all("SELECT status FROM provider_sessions ORDER BY created_at")]


def test_a_confirmed_revocation_releases_the_token(cli: Any, store: Any, dispatcher: Any, endpoint: TokenServer) -> None:
    added = cli("--json", "jobs", "add", spec("revoked"))
    assert added.code == 0, added
    assert added.json["job"]["credentials"][0]["revoke"] == "after_run"
    dispatcher()
    run = run_once(cli, store, added.json["job"]["id"])
    assert (run["status"], run["error_code"]) == ("ok", None), run["error_message"]
    assert endpoint.revoked == endpoint.issued and len(endpoint.issued) == 1  # the token the run was given, revoked
    shown = cli("--json", "runs", "get", run["id"]).json["run"]["credentials"]
    assert shown["bindings"][0]["revocation"] == {"outcome": "revoked", "explicit": True}
    assert [e["kind"] for e in events(store, run["id"], "credential.revoke")] == ["credential.revoked"]
    assert presentation(store, run["id"])["status"] == "cleaned" and presentation(store, run["id"])["last_error"] is None
    assert session_status(store) == ["revoked"]
    again = run_once(cli, store, added.json["job"]["id"])  # a revoked token is never presented again: a new one is fetched
    assert again["status"] == "ok" and len(endpoint.issued) == 2 and endpoint.revoked == endpoint.issued


@pytest.mark.parametrize("answer", [{"status": 503}, {"sleep": 3}])
def test_an_indeterminate_answer_fails_the_run_closed_and_is_recorded(
    cli: Any, store: Any, dispatcher: Any, endpoint: TokenServer, answer: dict[str, Any],
) -> None:
    job = cli("--json", "jobs", "add", spec("unanswered")).json["job"]
    endpoint.revoke_script.append(answer)  # the endpoint is down, or too slow for the provider's timeout
    dispatcher()
    run = run_once(cli, store, job["id"])
    assert (run["status"], run["error_code"]) == ("error", "CREDENTIAL_REVOKE_INDETERMINATE")
    assert "ran" in (run["stdout_excerpt"] or "")  # what the command did is kept
    (event,) = events(store, run["id"])
    assert event["kind"] == "credential.revoke_failed" and event["outcome"] == "indeterminate" and event["explicit"] is False
    assert event["reason"].startswith("CREDENTIAL_REVOKE_UNAVAILABLE")
    row = presentation(store, run["id"])
    assert row["status"] == "cleaned" and row["last_error"].startswith("CREDENTIAL_REVOKE_INDETERMINATE: indeterminate:")
    assert session_status(store) == ["revoke_failed"]
    assert endpoint.issued[0] not in json.dumps([run, row, event], default=str)


def test_an_explicit_refusal_is_recorded_and_releases_the_session(
    cli: Any, store: Any, dispatcher: Any, endpoint: TokenServer,
) -> None:
    job = cli("--json", "jobs", "add", spec("refused")).json["job"]
    endpoint.revoke_script.append({"status": 400, "json": {"error": "unsupported_token_type"}})
    dispatcher()
    run = run_once(cli, store, job["id"])
    assert run["status"] == "ok"  # an explicit answer: the session is released, with what it said
    (event,) = events(store, run["id"])
    assert (event["outcome"], event["explicit"]) == ("not_revoked", True)
    assert presentation(store, run["id"])["last_error"].startswith("CREDENTIAL_REVOKE_REJECTED")
    shown = cli("--json", "runs", "get", run["id"]).json["run"]["credentials"]["bindings"][0]["revocation"]
    assert shown["outcome"] == "not_revoked" and shown["explicit"] is True


def test_without_revoke_the_token_stays_cached_and_unrevoked(
    cli: Any, store: Any, dispatcher: Any, endpoint: TokenServer,
) -> None:
    job = cli("--json", "jobs", "add", json.dumps({"name": "cached", "schedule_kind": "manual", "executor": "shell",
                                                   "payload_message": "echo ran", "credentials": [binding()]})).json["job"]
    assert "revoke" not in job["credentials"][0]  # the default is left out: existing digests stay
    dispatcher()
    assert run_once(cli, store, job["id"])["status"] == "ok" and run_once(cli, store, job["id"])["status"] == "ok"
    assert endpoint.requests("/revoke") == [] and endpoint.token_requests == 1 and session_status(store) == ["active"]


def test_a_provider_that_cannot_revoke_is_refused_at_add(cli: Any, endpoint: TokenServer) -> None:
    env = {"name": "api", "provider": "env", "ref": "SOME_TOKEN", "present": {"medium": "env", "key": "API_TOKEN"},
           "revoke": "after_run"}
    out = cli("--json", "jobs", "add", json.dumps({"name": "no-revoke", "schedule_kind": "manual", "executor": "shell",
                                                   "payload_message": "true", "credentials": [env]}))
    assert out.code != 0 and out.json["code"] == "VALIDATION_FAILED"
    assert [(d["field"], d["code"]) for d in out.json["details"]] == [("credentials[0].revoke", "CREDENTIAL_REVOKE_UNSUPPORTED")]
    bad = cli("--json", "jobs", "add", spec("typo", credentials=[binding(revoke="sometimes")]))
    assert bad.code != 0 and bad.json["details"][0]["field"] == "credentials[0].revoke"
    assert cli("--json", "jobs", "list").json["jobs"] == []


def test_kill9_records_that_the_dead_dispatchers_token_was_not_revoked(
    store_url: str, store: Any, tmp_path: Path, endpoint: TokenServer,
) -> None:
    from test_dispatcher_process import Proc

    env = {k: os.environ[k] for k in ("SCHEDULER_CONFIG", "OAUTH2_REVOKE_SECRET", "SCHEDULER_CREDENTIALS_DIR")}
    out = subprocess.run([*scheduler_cmd(), "--db", store_url, "--json", "jobs", "add", spec("killed", payload_message="sleep 60")],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert out.returncode == 0, out.stdout
    job = json.loads(out.stdout)["job"]
    first = Proc(store_url, log=tmp_path / "first.log", env=env)
    try:
        first.wait_ready()
        subprocess.run([*scheduler_cmd(), "--db", store_url, "jobs", "run", "killed"], check=True, timeout=60,
                       env={**os.environ, **env}, capture_output=True)
        (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running" and r["executor_handle"]],
                          timeout=30, what="the run holding its token")
        wait_for(lambda: presentation(store, run["id"])["status"] == "materialized", what="the token presented")
        first.kill()  # SIGKILL: the token dies in the dispatcher's memory, unrevoked
        first.p.wait(10)
    finally:
        first.close()
    second = Proc(store_url, log=tmp_path / "second.log", env=env)
    try:
        second.wait_ready()
        wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "crashed"], timeout=60, what="recovered")
    finally:
        second.kill(15)
        second.p.wait(20)
        second.close()
    row = presentation(store, run["id"])
    assert row["status"] == "recovery_cleaned" and row["last_error"] == RECOVERY_UNREVOKED
    (event,) = events(store, run["id"])
    assert (event["kind"], event["outcome"], event["explicit"]) == ("credential.revoke_failed", "indeterminate", False)
    assert endpoint.requests("/revoke") == []  # nothing claims it was revoked
