"""Issue 28 item 5: a job's provenance is bound by its execution artifact, and the host's provenance trust gate.

``UPDATE jobs SET provenance = 'static'`` used to switch off the prompt-injection checks with
``doctor`` healthy. The native artifact now binds any provenance but the default ``user_added``
(so default jobs keep their digests), the run is refused before anything executes even with the
artifact check's projection remembered for the row, and ``doctor`` names the row. On SQLite and
PostgreSQL, through the CLI.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kernel_testing import run_rows, wait_for

from scheduler.core.artifact import native_payload
from scheduler.core.spec import validate_spec
from scheduler.settings import reload_settings

SPEC = {"schedule_kind": "manual", "payload_message": "echo:hi", "executor": "testkit"}


def add(cli: Any, name: str, **fields: Any) -> dict[str, Any]:
    out = cli("--json", "jobs", "add", json.dumps({"name": name, **SPEC, **fields}))
    assert out.code == 0, out
    job: dict[str, Any] = out.json["job"]
    return job


def run_once(cli: Any, store: Any, job_id: str, count: int) -> dict[str, Any]:
    assert cli("--json", "jobs", "run", job_id).code == 0
    runs = wait_for(lambda: [r for r in run_rows(store, job_id) if r["status"] in ("ok", "error")][count - 1:] or None,
                    what=f"run {count}")
    run: dict[str, Any] = runs[0]
    return run


def test_the_default_provenance_leaves_the_artifact_as_it_was() -> None:
    default = native_payload(validate_spec({"name": "a", **SPEC}, plugin_options=False), "job-1")
    assert "provenance" not in default  # user_added: the digest every existing job carries
    external = native_payload(validate_spec({"name": "a", **SPEC, "provenance": "external"}, plugin_options=False), "job-1")
    assert external["provenance"] == "external" and {k: v for k, v in external.items() if k != "provenance"} == default


@pytest.mark.parametrize(("added", "raised"), [("user_added", "static"), ("external", "static"), ("external", "user_added")])
def test_provenance_edited_by_sql_is_refused_with_the_check_warm(
    cli: Any, store: Any, dispatcher: Any, added: str, raised: str,
) -> None:
    job = add(cli, "tiered", provenance=added)
    dispatcher()
    first = run_once(cli, store, job["id"], 1)
    assert first["status"] == "ok"  # the artifact check ran: its projection of this row is remembered
    assert [c["ok"] for c in cli("--json", "doctor").json.get("checks", [])
            if c["check"] == "execution_artifacts"] in ([True], [])
    with store.transaction() as tx:  # a database user raises (or changes) the trust tier behind the scheduler's back
        tx.execute("UPDATE jobs SET provenance = ? WHERE id = ?", (raised, job["id"]))
    second = run_once(cli, store, job["id"], 2)
    assert (second["status"], second["error_code"]) == ("error", "EXECUTION_ARTIFACT_MISMATCH")
    assert second["stdout_excerpt"] in (None, "")  # nothing executed
    report = cli("--json", "doctor")
    assert report.code != 0 and report.json["code"] == "UNHEALTHY"
    (check,) = [c for c in report.json["details"] if c["check"] == "execution_artifacts"]
    assert [(p["job"], p["code"]) for p in check["problems"]] == [("tiered", "EXECUTION_ARTIFACT_MISMATCH")]
    listed = cli("--json", "jobs", "get", "tiered").json["job"]
    assert listed["provenance"] == raised and listed["artifact_digest"] == job["artifact_digest"]


def test_jobs_update_binds_a_new_provenance(cli: Any) -> None:
    job = add(cli, "lowered")
    out = cli("--json", "jobs", "update", "lowered", json.dumps({"provenance": "external"}))
    assert out.code == 0, out
    assert out.json["job"]["artifact_digest"] != job["artifact_digest"]
    artifact = cli("--json", "jobs", "artifact", "lowered").json["artifact"]
    assert artifact["payload"]["provenance"] == "external"


def test_the_host_can_refuse_prompts_of_external_jobs(
    cli: Any, store: Any, dispatcher: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompt = add(cli, "outside", session_target="isolated", provenance="external")
    trusted = add(cli, "inside", session_target="isolated")
    shell = add(cli, "outside-shell", provenance="external")
    dispatcher()
    assert run_once(cli, store, prompt["id"], 1)["status"] == "ok"  # off by default
    monkeypatch.setenv("SCHEDULER_IDENTITY_REFUSE_EXTERNAL_PROMPTS", "true")
    reload_settings()
    shown = {s["key"]: s["value"] for s in cli("--json", "config").json["settings"]}
    assert shown["identity.refuse_external_prompts"] is True
    refused = run_once(cli, store, prompt["id"], 2)
    assert (refused["status"], refused["error_code"]) == ("error", "PROVENANCE_PROMPT_REFUSED")
    assert refused["stdout_excerpt"] in (None, "")
    assert run_once(cli, store, trusted["id"], 1)["status"] == "ok"  # user_added prompts still run
    assert run_once(cli, store, shell["id"], 1)["status"] == "ok"  # a shell command is not a prompt


def test_a_v4_jobs_provenance_edited_by_sql_is_refused(cli: Any, store: Any, dispatcher: Any) -> None:
    """A handoff v4 job binds provenance in ``scheduler_job_binding`` (its ``lifecycle``): the same edit is refused."""
    job_id = "6d7c1c2a-8a54-4a39-9f3e-2f1d0c9b8a78"
    out = cli("--json", "handoff", "compile", json.dumps({"name": "v4-tiered", **SPEC, "provenance": "external"}),
              "--job-id", job_id, "--workflow", "wf", "--task", "t1")
    assert out.code == 0, out
    assert cli("jobs", "add", json.dumps(out.json["job"])).code == 0
    dispatcher()
    assert run_once(cli, store, job_id, 1)["status"] == "ok"
    with store.transaction() as tx:
        tx.execute("UPDATE jobs SET provenance = 'static' WHERE id = ?", (job_id,))
    refused = run_once(cli, store, job_id, 2)
    assert (refused["status"], refused["error_code"]) == ("error", "HANDOFF_ARTIFACT_BINDING_MISMATCH")
    assert cli("--json", "doctor").code != 0
