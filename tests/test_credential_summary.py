"""The run's credentials summary carries the output redaction counts, and ``runs get`` shows it (SQLite, PostgreSQL).

A real shell run through a real dispatcher is presented two ``env`` credentials and prints one of them to stdout
and stderr; ``runs.credentials_json`` (``runs get``: ``credentials``) then says, per binding, how often its value
was replaced, beside the per-stream counts of the ``output.redacted`` event, and holds no value.
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

from kernel_testing import add_job, run_job_once


def _run(store: Any, dispatcher: Any, command: str, bindings: list[dict[str, Any]]) -> dict[str, Any]:
    job = add_job(store, executor="shell", payload_message=command, credentials=bindings)
    return run_job_once(store, dispatcher, job)


def _env(name: str, ref: str, key: str) -> dict[str, Any]:
    return {"name": name, "provider": "env", "ref": ref, "present": {"medium": "env", "key": key}}


def test_redaction_counts_are_in_the_credentials_summary_and_runs_get(store: Any, dispatcher: Any, cli: Any,
                                                                      monkeypatch: Any) -> None:
    from scheduler.pipeline.credentials import step as credentials

    credentials.forget_providers()
    shown, quiet = "shown-" + secrets.token_hex(10), "quiet-" + secrets.token_hex(10)
    monkeypatch.setenv("SUMMARY_SHOWN", shown)
    monkeypatch.setenv("SUMMARY_QUIET", quiet)
    run = _run(store, dispatcher, 'echo "a=$SHOWN b=$SHOWN"; echo "c=$SHOWN" >&2; test -n "$QUIET"',
               [_env("shown", "SUMMARY_SHOWN", "SHOWN"), _env("quiet", "SUMMARY_QUIET", "QUIET")])
    assert run["status"] == "ok", run
    assert run["stdout_excerpt"] == "a=[REDACTED:shown] b=[REDACTED:shown]\n"
    summary = json.loads(run["credentials_json"])
    by_name = {b["name"]: b for b in summary["bindings"]}
    assert (by_name["shown"]["redacted"], by_name["quiet"]["redacted"]) == (3, 0)
    assert summary["redactions"] == {"stdout": {"shown": 2}, "stderr": {"shown": 1}, "total": {"shown": 3}}
    assert (summary["presented"], summary["cleanup"]) == (2, "cleaned")
    with store.read() as tx:
        (event,) = tx.all("SELECT data FROM runtime_events WHERE run_id = ? AND kind = 'output.redacted'", (run["id"],))
    event_data = json.loads(event["data"]) if isinstance(event["data"], str) else event["data"]
    assert event_data == summary["redactions"]  # one set of counts, in both places

    view = cli("--json", "runs", "get", run["id"]).json["run"]
    assert view["credentials"] == summary
    text = json.dumps(view)
    for value in (shown, quiet):
        for form in (value, base64.b64encode(value.encode()).decode().rstrip("="), value.encode().hex()):
            assert form not in text and form not in run["credentials_json"]
    credentials.forget_providers()


def test_a_run_without_redactions_gets_zero_counts_and_no_event(store: Any, dispatcher: Any, cli: Any,
                                                                monkeypatch: Any) -> None:
    from scheduler.pipeline.credentials import step as credentials

    credentials.forget_providers()
    monkeypatch.setenv("SUMMARY_QUIET", "quiet-" + secrets.token_hex(10))
    run = _run(store, dispatcher, 'test -n "$QUIET" && echo fine', [_env("quiet", "SUMMARY_QUIET", "QUIET")])
    assert run["status"] == "ok", run
    summary = json.loads(run["credentials_json"])
    assert [b["redacted"] for b in summary["bindings"]] == [0] and summary["redactions"] == {"total": {}}
    with store.read() as tx:
        assert tx.all("SELECT id FROM runtime_events WHERE run_id = ? AND kind = 'output.redacted'", (run["id"],)) == []
    assert cli("--json", "runs", "get", run["id"]).json["run"]["credentials"]["bindings"][0]["redacted"] == 0
    credentials.forget_providers()


def test_a_run_without_credentials_shows_none(store: Any, dispatcher: Any, cli: Any) -> None:
    job = add_job(store, executor="shell", payload_message="echo plain")
    run = run_job_once(store, dispatcher, job)
    assert run["credentials_json"] is None
    assert cli("--json", "runs", "get", run["id"]).json["run"]["credentials"] is None
