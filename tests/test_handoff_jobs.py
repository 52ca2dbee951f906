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

from scheduler.base.errors import SchedulerError
from scheduler.core.queue import enqueue_manual

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DIR = ROOT / "conformance-fixtures" / "v1" / "handoff"
FIXTURE = json.loads((FIXTURE_DIR / "conformance.json").read_text())
JOB_ID = "6d7c1c2a-8a54-4a39-9f3e-2f1d0c9b8a77"
JOB_ID_FROZEN = FIXTURE["compile"]["job_id"]


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
    if not postgres:  # a read-only SQLite open refuses a database missing a guard (issue 29 defect 5), naming it
        out = cli("--json", "jobs", "list", "--include-handoff-artifacts")
        assert out.code != 0 and out.json["code"] == "DB_INIT_FAILED", out
        assert "trigger execution_artifacts_no_update" in out.json["details"]["missing"], out.json
        cli("jobs", "disable", "native")  # a writing command recreates the guard; the tampered payload stays
    out = cli("--json", "jobs", "list", "--include-handoff-artifacts")
    assert out.code != 0 and out.json["code"] in ("EXECUTION_ARTIFACT_TAMPERED", "HANDOFF_ARTIFACT_DIGEST_MISMATCH"), out
    assert "jobs" not in out.json
    if postgres:
        return
    conn = sqlite3.connect(store_url)  # SQLite only: with foreign keys off only the delete guard keeps the artifact
    conn.execute("PRAGMA foreign_keys = OFF")
    with pytest.raises(sqlite3.IntegrityError, match="ARTIFACT_REFERENCED"):
        conn.execute("DELETE FROM execution_artifacts WHERE digest = ?", (doc["handoff_artifact_digest"],))
    conn.execute("DROP TRIGGER execution_artifacts_referenced")  # as an attacker with the file would
    conn.execute("DELETE FROM execution_artifacts WHERE digest = ?", (doc["handoff_artifact_digest"],))
    conn.commit()
    conn.close()
    cli("jobs", "enable", "native")  # the guard comes back; the artifact does not
    out = cli("--json", "jobs", "list", "--include-handoff-artifacts")
    assert out.code != 0 and out.json["code"] == "HANDOFF_ARTIFACT_MISSING"


# --------------------------------------------------------------------------- upgrades and the trust declarations


def test_a_job_stored_before_the_trust_fields_keeps_validating_and_runs(cli: Any, store: Any, dispatcher: Any) -> None:
    """The artifact the freezing revision compiled (``positive-artifact.json``, before identity, credentials,
    authorization, proofs, evidence and retention were job fields) is still accepted, stored byte for byte,
    re-checked before the run and bound to it: adding fields at their defaults changed no digest."""
    frozen_text = (FIXTURE_DIR / "positive-artifact.json").read_text(encoding="utf-8")
    digest = FIXTURE["expected"]["artifact_digest"]
    doc = {**FIXTURE["spec"], "handoff_version": 4, "handoff_artifact_digest": digest,
           "effective_task_hash": FIXTURE["expected"]["effective_task_hash"], "handoff_artifact_payload": json.loads(frozen_text)}
    added = cli("--json", "jobs", "add", json.dumps(doc))
    assert added.code == 0, added
    assert added.json["job"]["id"] == JOB_ID_FROZEN and added.json["job"]["artifact_digest"] == digest
    with store.transaction() as tx:  # the new columns as an upgraded row has them: never written
        tx.execute("UPDATE jobs SET identity = NULL, authorization_proof = NULL, evidence = NULL, evidence_ref = NULL,"
                   " retention = NULL, authorization_ref = NULL, \"authorization\" = NULL WHERE id = ?", (JOB_ID_FROZEN,))
        assert tx.scalar("SELECT payload FROM execution_artifacts WHERE digest = ?", (digest,)) == frozen_text
    assert cli("--json", "jobs", "list", "--include-handoff-artifacts").code == 0
    enqueue_manual(store, JOB_ID_FROZEN)
    d = dispatcher()
    wait_for(lambda: cli("--json", "jobs", "approve", FIXTURE["spec"]["name"]).code == 0, what="the approval gate")
    (run,) = wait_for(lambda: [r for r in run_rows(store, JOB_ID_FROZEN) if r["status"] in ("ok", "error")], what="run")
    d.stop()
    assert run["status"] == "ok", run
    assert run["artifact_digest"] == digest


def test_a_v4_job_declaring_identity_credentials_and_ssh_evidence_runs_them(
    cli: Any, store: Any, dispatcher: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Accepted declarations are enforced: the run acts as the declared principal, gets the credential (and
    only for the run), and its evidence is signed in namespace ``agentcli`` (the v4 default) and re-verifies."""
    from evidence_support import SshKeys, evidence_row, use_settings

    keys = SshKeys(tmp_path / "keys")
    use_settings(monkeypatch, tmp_path, {"providers": {"ssh": keys.settings()}})
    monkeypatch.setenv("H14_DEPLOY_API", "s3cret-value")
    spec = {"name": "declared", "schedule_kind": "manual", "executor": "shell", "run_timeout_ms": 30000,
            "payload_message": 'test "${#API_TOKEN}" = 12 && echo presented',
            "identity": {"subject": {"kind": "service", "principal": "deploy-bot"}, "trust": {"level": "user"}},
            "credentials": [{"name": "api", "provider": "env", "ref": "H14_DEPLOY_API",
                             "present": {"medium": "env", "key": "API_TOKEN"}}],
            "evidence": {"provider": "ssh", "verify": {"required": True}}, "evidence_ref": "handoff-v4"}
    doc = compiled(cli, spec)
    payload = doc["handoff_artifact_payload"]
    assert payload["identity"]["subject"] == {"kind": "service", "principal": "deploy-bot"}
    assert payload["credential_presentation"]["bindings"][0]["ref"] == "H14_DEPLOY_API"
    assert payload["evidence"]["provider"] == "ssh" and payload["evidence"]["ref"] == "handoff-v4"
    assert "s3cret" not in json.dumps(doc)
    added = cli("--json", "jobs", "add", json.dumps(doc))
    assert added.code == 0, added
    enqueue_manual(store, JOB_ID)
    d = dispatcher()
    (run,) = wait_for(lambda: [r for r in run_rows(store, JOB_ID) if r["status"] in ("ok", "error")], what="declared run")
    d.stop()
    assert run["status"] == "ok", run
    assert run["artifact_digest"] == doc["handoff_artifact_digest"]
    assert run["principal"] == "service:deploy-bot" and run["trust_level"] == "user"
    row = evidence_row(store, run["id"])
    assert row is not None and row["status"] == "attested" and row["verified"]
    envelope = json.loads(row["envelope"])
    assert envelope["data"]["namespace"] == "agentcli" and envelope["data"]["schema"] == "agentcli.evidence.envelope"
    document = json.loads(row["canonical_payload"])
    assert document["handoff"] == {
        "version": 4, "manifest_digest": payload["manifest"]["digest"], "workflow_id": "wf", "task_id": "t1",
        "effective_task_hash": doc["effective_task_hash"]}
    verified = cli("--json", "runs", "evidence", run["id"])
    assert verified.code == 0 and verified.json["verified"] is True, verified
    with store.read() as tx:
        assert tx.scalar("SELECT status FROM credential_presentations WHERE run_id = ?", (run["id"],)) == "cleaned"
    # A configured namespace still wins over the v4 default.
    use_settings(monkeypatch, tmp_path, {"providers": {"ssh": {**keys.settings(), "namespace": "scheduler"}}})
    enqueue_manual(store, JOB_ID)
    d = dispatcher()
    runs = wait_for(lambda: [r for r in run_rows(store, JOB_ID) if r["status"] in ("ok", "error")][1:] or None,
                    what="second run")
    d.stop()
    second = evidence_row(store, runs[-1]["id"])
    assert second is not None and json.loads(second["envelope"])["data"]["namespace"] == "scheduler"


def test_a_v4_artifact_whose_declaration_differs_from_the_job_stores_nothing(cli: Any, store: Any) -> None:
    spec = plain_spec(identity={"subject": {"kind": "service", "principal": "deploy-bot"}})
    doc = compiled(cli, spec)
    raised = copy.deepcopy(doc)
    raised["handoff_artifact_payload"]["identity"]["trust"]["level"] = "system"
    out = cli("--json", "jobs", "add", json.dumps(raised))
    assert out.code != 0 and out.json["code"] == "HANDOFF_ARTIFACT_DIGEST_MISMATCH"
    from scheduler.base.canonical import canonical_digest

    raised["handoff_artifact_digest"] = canonical_digest(raised["handoff_artifact_payload"])
    out = cli("--json", "jobs", "add", json.dumps(raised))
    assert out.code != 0 and out.json["code"] == "HANDOFF_ARTIFACT_MISMATCH"
    assert out.json["details"][0]["field"] == "identity.trust.level"
    agentcli = copy.deepcopy(doc)
    agentcli["handoff_artifact_payload"]["identity"]["auth"] = {"mode": "oauth2"}
    agentcli["handoff_artifact_digest"] = canonical_digest(agentcli["handoff_artifact_payload"])
    out = cli("--json", "jobs", "add", json.dumps(agentcli))
    assert out.code != 0 and out.json["code"] == "HANDOFF_ARTIFACT_UNSUPPORTED"
    assert out.json["details"][0]["field"] == "identity.auth"
    assert stored_counts(store) == (0, 0)


def test_a_v4_job_is_not_changed_without_the_handoff_kind_installed(cli: Any, store: Any) -> None:
    """Core binds jobs to handoff v4 through the kind the composition root installs; without it, it fails closed."""
    from scheduler.core import submissions
    from scheduler.core.jobs import update_job

    doc = compiled(cli, plain_spec())
    assert cli("jobs", "add", json.dumps(doc)).code == 0
    assert cli("jobs", "add", json.dumps(plain_spec(name="native"))).code == 0
    with submissions.installed_as(None):  # (a CLI command would install it again)
        for patch in ({"description": "not bound"}, {"handoff_version": None}, doc):
            with pytest.raises(SchedulerError) as info:
                update_job(store, "nightly", patch)
            assert info.value.code == submissions.NOT_INSTALLED
        # a native job's update needs no kind, and a spec object's submission keys are then unknown fields
        assert update_job(store, "native", {"description": "changed"}).description == "changed"
        with pytest.raises(SchedulerError) as info:
            update_job(store, "native", {"handoff_version": 4})
        assert info.value.code == "VALIDATION_FAILED"
    assert update_job(store, "nightly", {"description": "not bound"}).artifact_digest == doc["handoff_artifact_digest"]
