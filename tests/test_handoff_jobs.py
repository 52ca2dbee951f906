"""Handoff v4 jobs through the CLI and the dispatcher, on SQLite and PostgreSQL.

``tests/test_handoff.py`` holds the artifact format to its rules; this file holds the kernel
to them: what ``jobs add`` stores (everything or nothing), how v4 jobs are updated, listed,
guarded and run.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import run_rows, wait_for

from scheduler.queue import enqueue_manual

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((ROOT / "conformance-fixtures" / "v1" / "handoff" / "conformance.json").read_text())
JOB_ID = "6d7c1c2a-8a54-4a39-9f3e-2f1d0c9b8a77"


def plain_spec(**changes: Any) -> dict[str, Any]:
    """A shell-target job on the testkit executor (runs without a shell), no approval gate."""
    return {"name": "nightly", "schedule_kind": "manual", "executor": "testkit", "payload_message": "echo:v4",
            "run_timeout_ms": 30000, **changes}


def compiled(cli: Any, spec: dict[str, Any], job_id: str = JOB_ID) -> dict[str, Any]:
    out = cli("--json", "handoff", "compile", json.dumps(spec), "--job-id", job_id, "--workflow", "wf", "--task", "t1")
    assert out.code == 0, out
    return out.json["job"]


def stored_counts(store: Any) -> tuple[int, int]:
    with store.read() as tx:
        return tx.scalar("SELECT COUNT(*) FROM jobs"), tx.scalar("SELECT COUNT(*) FROM execution_artifacts")


def test_a_compiled_job_is_added_bound_to_its_v4_artifact(cli: Any, store: Any) -> None:
    doc = compiled(cli, plain_spec())
    assert doc["handoff_version"] == 4 and doc["handoff_artifact_payload"]["compiled"]["job_id"] == JOB_ID
    assert cli("--json", "jobs", "validate", json.dumps(doc)).code == 0
    added = cli("--json", "jobs", "add", "--stdin", stdin=json.dumps(doc))
    assert added.code == 0, added
    job = added.json["job"]
    assert job["id"] == JOB_ID and job["handoff_version"] == 4
    assert job["artifact_digest"] == doc["handoff_artifact_digest"] and job["effective_task_hash"] == doc["effective_task_hash"]
    artifact = cli("--json", "jobs", "artifact", "nightly").json["artifact"]
    assert artifact["kind"] == "handoff-v4" and artifact["payload"] == doc["handoff_artifact_payload"]
    listed = cli("--json", "jobs", "list", "--include-handoff-artifacts").json["jobs"]
    assert listed[0]["handoff_artifact_payload"] == doc["handoff_artifact_payload"]
    assert "handoff_artifact_payload" not in cli("--json", "jobs", "list").json["jobs"][0]
    again = cli("--json", "jobs", "add", json.dumps({**doc, "name": "other-name"}))
    assert again.code != 0 and again.json["code"] in ("JOB_ID_CONFLICT", "HANDOFF_ARTIFACT_BINDING_MISMATCH")


@pytest.mark.parametrize("case", FIXTURE["negative_artifact_cases"], ids=[c["name"] for c in FIXTURE["negative_artifact_cases"]])
def test_each_negative_fixture_case_is_refused_by_jobs_add_and_stores_nothing(cli: Any, store: Any, case: dict[str, Any]) -> None:
    doc = compiled(cli, FIXTURE["spec"], FIXTURE["compile"]["job_id"])
    payload = copy.deepcopy(doc["handoff_artifact_payload"])
    for change in case["changes"]:
        *parents, last = change["path"]
        target = payload
        for key in parents:
            target = target[key]
        if change["op"] == "delete":
            del target[last]
        else:
            target[last] = change["value"]
    out = cli("--json", "jobs", "add", json.dumps({**doc, "handoff_artifact_payload": payload}))
    assert out.code != 0 and out.json["code"] == case["expected_code"], out
    assert case["expected_error"] in out.json["error"] + json.dumps(out.json.get("details"))
    assert stored_counts(store) == (0, 0)


def test_a_spec_edited_after_compiling_is_refused(cli: Any, store: Any) -> None:
    doc = compiled(cli, plain_spec())
    out = cli("--json", "jobs", "add", json.dumps({**doc, "run_timeout_ms": 60000}))
    assert out.code != 0 and out.json["code"] == "HANDOFF_ARTIFACT_BINDING_MISMATCH"
    partial = {k: v for k, v in doc.items() if k != "effective_task_hash"}
    out = cli("--json", "jobs", "add", json.dumps(partial))
    assert out.code != 0 and out.json["code"] == "HANDOFF_ARTIFACT_INVALID"
    assert stored_counts(store) == (0, 0)


def test_v4_jobs_change_bound_fields_only_with_a_replacement_artifact(cli: Any, store: Any) -> None:
    doc = compiled(cli, plain_spec())
    assert cli("jobs", "add", json.dumps(doc)).code == 0
    old = doc["handoff_artifact_digest"]
    pending = enqueue_manual(store, JOB_ID)
    required = cli("--json", "jobs", "update", "nightly", json.dumps({"run_timeout_ms": 1000}))
    assert required.code != 0 and required.json["code"] == "HANDOFF_ARTIFACT_REQUIRED"
    renamed = cli("--json", "jobs", "update", "nightly", json.dumps({"name": "nightly-2", "description": "not bound"}))
    assert renamed.code == 0 and renamed.json["job"]["artifact_digest"] == old
    for drop in ({"handoff_version": None}, {"handoff_artifact_payload": None}):
        refused = cli("--json", "jobs", "update", "nightly-2", json.dumps(drop))
        assert refused.code != 0 and refused.json["code"] == "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED"
    foreign = compiled(cli, plain_spec(name="nightly-2", description="not bound", run_timeout_ms=1000), job_id="another-job")
    wrong_job = cli("--json", "jobs", "update", "nightly-2", json.dumps(foreign))
    assert wrong_job.code != 0 and wrong_job.json["code"] == "HANDOFF_ARTIFACT_BINDING_MISMATCH"
    replacement = compiled(cli, plain_spec(name="nightly-2", description="not bound", run_timeout_ms=1000))
    updated = cli("--json", "jobs", "update", "nightly-2", json.dumps(replacement))
    assert updated.code == 0, updated
    assert updated.json["job"]["artifact_digest"] == replacement["handoff_artifact_digest"] != old
    with store.read() as tx:
        assert tx.scalar("SELECT status FROM job_dispatch_queue WHERE id = ?", (pending["id"],)) == "cancelled"
        assert tx.scalar("SELECT kind FROM execution_artifacts WHERE digest = ?", (old,)) == "handoff-v4"  # kept
    with pytest.raises(Exception) as err, store.transaction() as tx:  # the database refuses a downgrade too
        tx.execute("UPDATE jobs SET handoff_version = NULL WHERE id = ?", (JOB_ID,))
    assert "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED" in str(err.value)


def test_a_v4_job_runs_bound_to_its_artifact_and_never_after_an_edit(cli: Any, store: Any, dispatcher: Any,
                                                                     tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    doc = compiled(cli, plain_spec(payload_message=f"touch:{marker}"))
    assert cli("jobs", "add", json.dumps(doc)).code == 0
    enqueue_manual(store, JOB_ID)
    d = dispatcher()
    (run,) = wait_for(lambda: [r for r in run_rows(store, JOB_ID) if r["status"] == "ok"], what="v4 run")
    assert run["artifact_digest"] == doc["handoff_artifact_digest"] and marker.exists()
    marker.unlink()
    with store.transaction() as tx:
        tx.execute("UPDATE jobs SET run_timeout_ms = 5 WHERE id = ?", (JOB_ID,))
    enqueue_manual(store, JOB_ID)
    refused = wait_for(lambda: [r for r in run_rows(store, JOB_ID) if r["status"] == "error"], what="refused run")
    d.stop()
    assert refused[0]["error_code"] == "HANDOFF_ARTIFACT_BINDING_MISMATCH" and not marker.exists()
    listing = cli("--json", "jobs", "list", "--include-handoff-artifacts")
    assert listing.code != 0 and listing.json["code"] == "HANDOFF_ARTIFACT_BINDING_MISMATCH"
    assert cli("--json", "doctor").code != 0


def test_a_tampered_or_missing_artifact_fails_the_whole_listing(cli: Any, store: Any, store_url: str) -> None:
    doc = compiled(cli, plain_spec())
    assert cli("jobs", "add", json.dumps(doc)).code == 0
    assert cli("jobs", "add", json.dumps({"name": "native", "schedule_kind": "manual", "payload_message": "ok",
                                          "executor": "testkit"})).code == 0
    assert cli("--json", "jobs", "list", "--include-handoff-artifacts").code == 0
    postgres = not store_url.endswith(".db")
    with store.transaction() as tx:
        tx.execute("DROP TRIGGER execution_artifacts_no_update" + (" ON execution_artifacts" if postgres else ""))
        payload = doc["handoff_artifact_payload"]
        tampered = json.dumps({**payload, "runtime": {"timeout_ms": 1}}, sort_keys=True, separators=(",", ":"))
        tx.execute("UPDATE execution_artifacts SET payload = ? WHERE digest = ?", (tampered, doc["handoff_artifact_digest"]))
    out = cli("--json", "jobs", "list", "--include-handoff-artifacts")
    assert out.code != 0 and out.json["code"] in ("EXECUTION_ARTIFACT_TAMPERED", "HANDOFF_ARTIFACT_DIGEST_MISMATCH"), out
    assert "jobs" not in out.json
    if postgres:
        return
    conn = sqlite3.connect(store_url)  # SQLite only: deleting a referenced artifact needs foreign keys off
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("DELETE FROM execution_artifacts WHERE digest = ?", (doc["handoff_artifact_digest"],))
    conn.commit()
    conn.close()
    out = cli("--json", "jobs", "list", "--include-handoff-artifacts")
    assert out.code != 0 and out.json["code"] == "HANDOFF_ARTIFACT_MISSING"
