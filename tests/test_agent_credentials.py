"""Agent jobs with ``env`` credentials, through a real dispatcher, against the agent executor's loopback gateway.

The agent executor declares ``credentials-env`` and enforces it at run time: the values reach
the gateway only in the ``x-openclaw-env-inject`` header, and only when the gateway declares
``chat-completions-env-inject-v1`` (discovery is refreshed for a credential-bearing turn);
otherwise the run ends ``GATEWAY_ENV_INJECT_UNSUPPORTED`` and no chat request is sent. Either
way the value is nowhere in the database (every table's rows, and on SQLite the file with its
WAL), the runtime events or the artifacts directory, in any of its byte forms.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_job_once

INJECT = "chat-completions-env-inject-v1"


def forms(secret: str) -> dict[str, bytes]:
    """The byte forms a leaked secret would take (raw, base64, base64url, hex)."""
    raw = secret.encode()
    return {"raw": raw, "base64": base64.b64encode(raw).rstrip(b"="), "base64url": base64.urlsafe_b64encode(raw).rstrip(b"="),
            "hex": raw.hex().encode(), "HEX": raw.hex().upper().encode()}


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh secret in the dispatcher's environment, where the ``env`` provider reads it."""
    value = "agent-" + secrets.token_hex(12)
    monkeypatch.setenv("AGENT_CRED_SRC", value)
    return value


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """The agent executor's loopback gateway, configured as the endpoint ``default``; artifacts under the test."""
    from scheduler_executor_agent.loopback import LoopbackModel

    from scheduler.settings import reload_settings

    server = LoopbackModel().start()
    monkeypatch.setenv("SCHEDULER_AGENT_BASE_URL", server.base_url)
    monkeypatch.setenv("SCHEDULER_AGENT_MODEL", "loop-small")
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    reload_settings()
    yield server
    server.stop()


def _binding() -> dict[str, Any]:
    return {"name": "deploy", "provider": "env", "ref": "AGENT_CRED_SRC", "present": {"medium": "env", "key": "DEPLOY_TOKEN"}}


def _run(store: Any, dispatcher: Any, job: dict[str, Any]) -> dict[str, Any]:
    return run_job_once(store, dispatcher, job, what="the agent run to finish")


def _leaks(store: Any, tmp_path: Path, secret: str) -> list[str]:
    """Where any form of ``secret`` is: every row of every table, the SQLite files, every file under the artifacts."""
    from scheduler.core.store.schema import TABLES

    needles = forms(secret)
    blobs: dict[str, bytes] = {}
    with store.read() as tx:
        for t in TABLES:
            rows = tx.all(f"SELECT * FROM {t.name}")  # names come from the schema definition
            blobs[f"table {t.name}"] = json.dumps([dict(r) for r in rows], default=repr).encode()
    for path in sorted(tmp_path.rglob("*")):
        if path.is_file() and (path.name.startswith("scheduler.db") or "artifacts" in path.parts):
            blobs[str(path)] = path.read_bytes()
    assert "table runtime_events" in blobs and "table runs" in blobs
    return [f"{form} in {where}" for where, data in blobs.items() for form, needle in needles.items() if needle in data]


def test_an_agent_job_with_an_env_credential_is_accepted_and_other_media_are_not(cli: Any) -> None:
    """The executor claims ``credentials-env`` (and only it): ``jobs add`` and governance accept env, refuse file/stdin."""
    from scheduler_executor_agent import AgentExecutor

    from scheduler.core.spec import validate_spec
    from scheduler.pipeline import governance

    spec = {"name": "agent-env", "schedule_kind": "manual", "session_target": "isolated", "payload_message": "Deploy.",
            "credentials": [_binding()]}
    assert [c["enforced"] for c in governance.checks(validate_spec(spec), AgentExecutor())] == [True]
    added = cli("--json", "jobs", "add", json.dumps(spec))
    assert added.code == 0 and added.json["ok"] is True, added
    for medium in ("file", "stdin"):
        bad = {**spec, "name": f"agent-{medium}",
               "credentials": [{"name": "k", "provider": "env", "ref": "AGENT_CRED_SRC", "present": {"medium": medium}}]}
        refused = cli("--json", "jobs", "add", json.dumps(bad))
        assert refused.code != 0 and refused.json["code"] == "VALIDATION_FAILED", refused
        assert f"credentials-{medium}" in refused.out
    listed = cli("--json", "jobs", "list").json
    assert [j["name"] for j in listed["jobs"]] == ["agent-env"]  # the refused ones stored nothing


def test_the_value_reaches_the_gateway_in_the_header_and_nowhere_else(store: Any, dispatcher: Any, gateway: Any,
                                                                     secret: str, tmp_path: Path) -> None:
    from scheduler_executor_agent.loopback import Reply

    gateway.info = {"capabilities": [INJECT]}
    gateway.enqueue(Reply(chunks=["the token is ", secret, " and its hex ", secret.encode().hex()]))
    job = add_job(store, name="agent-deploy", session_target="isolated", executor=None, payload_message="Deploy.",
                  credentials=[_binding()])
    run = _run(store, dispatcher, job)
    assert (run["status"], run["error_code"]) == ("ok", None), run
    (seen,) = gateway.chat_requests()
    assert json.loads(base64.urlsafe_b64decode(seen.headers["x-openclaw-env-inject"])) == {"DEPLOY_TOKEN": secret}
    assert secret not in json.dumps(seen.body)  # the value went in the header only, not in the prompt
    assert "[REDACTED:deploy]" in run["stdout_excerpt"]  # the gateway echoed it back: redacted before it was stored
    with store.read() as tx:
        (row,) = tx.all("SELECT medium, env_key, status FROM credential_presentations WHERE run_id = ?", (run["id"],))
        kinds = [e["kind"] for e in tx.all("SELECT kind FROM runtime_events WHERE run_id = ? ORDER BY id", (run["id"],))]
    assert (row["medium"], row["env_key"], row["status"]) == ("env", "DEPLOY_TOKEN", "cleaned")
    assert "credential.materialized" in kinds and "credential.cleaned" in kinds
    assert json.loads(run["credentials_json"])["presented"] == 1
    assert _leaks(store, tmp_path, secret) == []


def test_a_gateway_without_env_injection_ends_the_run_and_nothing_is_sent(store: Any, dispatcher: Any, gateway: Any,
                                                                         secret: str, tmp_path: Path) -> None:
    gateway.info = {"capabilities": ["chat-completions-v1"]}
    gateway.health = "ok"
    job = add_job(store, name="agent-no-inject", session_target="isolated", executor=None, payload_message="Deploy.",
                  credentials=[_binding()])
    run = _run(store, dispatcher, job)
    assert (run["status"], run["error_code"]) == ("error", "GATEWAY_ENV_INJECT_UNSUPPORTED"), run
    assert INJECT in run["error_message"]
    assert gateway.chat_requests() == []  # no chat request: the value never left the dispatcher
    assert all("x-openclaw-env-inject" not in r.headers for r in gateway.requests)
    with store.read() as tx:
        (row,) = tx.all("SELECT status FROM credential_presentations WHERE run_id = ?", (run["id"],))
    assert row["status"] == "cleaned"
    assert _leaks(store, tmp_path, secret) == []
