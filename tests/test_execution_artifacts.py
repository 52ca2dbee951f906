"""Execution artifacts: every job bound to its immutable canonical contract, on SQLite and PostgreSQL.

The artifact is the binding approvals, evidence and credentials will rely on, so these
tests attack it the way a careless operator or a hostile database user would: direct
SQL edits of jobs, artifacts and bindings, stale queued work, and tampered payloads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.base.canonical import canonical_digest, canonical_json, is_digest
from scheduler.base.errors import SchedulerError
from scheduler.core import artifact
from scheduler.core.artifact import check_job, load_artifact, native_payload, redact_secrets
from scheduler.core.jobs import resolve_job, set_enabled, update_job
from scheduler.core.queue import enqueue_manual
from scheduler.core.rows import JobRow
from scheduler.core.spec import spec_from_row, spec_to_row, validate_spec
from scheduler.core.steps import StepBase, installed_as, registered


def job_row(store: Any, ref: str) -> JobRow:
    with store.read() as tx:
        return resolve_job(tx, ref)


def refused(store: Any, sql: str, params: tuple = (), tag: str = "") -> SchedulerError:
    """The statement fails with CONSTRAINT_VIOLATION (naming the guard when ``tag``) and changes nothing."""
    with pytest.raises(SchedulerError) as info, store.transaction() as tx:
        tx.execute(sql, params)
    assert info.value.code == "CONSTRAINT_VIOLATION", info.value
    assert tag in info.value.message
    return info.value


def test_a_new_job_is_bound_to_its_canonical_artifact(store: Any) -> None:
    job = add_job(store, name="report", payload_message="echo:hi", run_timeout_ms=5000, output_format="json")
    digest = job["artifact_digest"]
    assert is_digest(digest)
    with store.read() as tx:
        artifact = load_artifact(tx, digest)
        event = tx.one("SELECT artifact_digest FROM runtime_events WHERE kind = 'job.created' AND job_id = ?", (job["id"],))
    assert artifact.kind == "native" and artifact.job_id == job["id"]
    payload = artifact.payload
    assert artifact.payload_text == canonical_json(payload)
    assert "sha256:" + hashlib.sha256(artifact.payload_text.encode()).hexdigest() == digest
    assert payload["job_id"] == job["id"] and payload["runtime"] == {"timeout_ms": 5000}
    assert payload["target"]["executor"] == "testkit" and payload["output"] == {"format": "json"}
    assert "echo:hi" not in artifact.payload_text  # the command is a digest, never raw text
    assert payload["command"]["payload_sha256"] == "sha256:" + hashlib.sha256(b"echo:hi").hexdigest()
    assert event["artifact_digest"] == digest


def test_secret_like_options_never_enter_the_artifact_raw() -> None:
    options = {"stdin_text": "hunter2", "env_allow": ["HOME"], "nested": {"api_key": "k-123", "mode": "x"}}
    projected = redact_secrets(options)
    assert projected["env_allow"] == ["HOME"] and projected["nested"]["mode"] == "x"
    assert projected["stdin_text"] == {"redacted": True, "value_hash": "sha256:" + hashlib.sha256(b"hunter2").hexdigest()}
    assert "hunter2" not in canonical_json(projected) and "k-123" not in canonical_json(projected)


def test_the_projection_covers_the_execution_contract_and_nothing_cosmetic() -> None:
    base = validate_spec({"name": "a", "schedule_kind": "manual", "payload_message": "x", "executor": "testkit"}, plugin_options=False)

    def digest(**changes: Any) -> str:
        fields = {"name": "a", "schedule_kind": "manual", "payload_message": "x", "executor": "testkit", **changes}
        return canonical_digest(native_payload(validate_spec(fields, plugin_options=False), "job-1"))

    same = canonical_digest(native_payload(base, "job-1"))
    assert digest(name="renamed", description="words", max_consecutive_failures=9) == same
    for change in ({"payload_message": "y"}, {"run_timeout_ms": 1000}, {"output_format": "json"}, {"verify_shell": "true"},
                   {"approval_required": True}, {"approval_risk_level": "high"}, {"delivery_mode": "always", "delivery_channel": "log"},
                   {"executor_options": {"a": 1}}, {"constraints": {"max_tokens": 5}}, {"job_type": "watchdog"}):
        assert digest(**change) != same, change
    assert canonical_digest(native_payload(base, "job-2")) != same  # bound to its job


def test_artifacts_are_immutable_and_kept_while_referenced(store: Any) -> None:
    job = add_job(store, payload_message="ok")
    digest = job["artifact_digest"]
    refused(store, "UPDATE execution_artifacts SET payload = '{}' WHERE digest = ?", (digest,), "ARTIFACT_IMMUTABLE")
    # the job (and its events) refer to it: the delete guard refuses before the foreign keys are even asked (issue 29, defect 4)
    refused(store, "DELETE FROM execution_artifacts WHERE digest = ?", (digest,), "ARTIFACT_REFERENCED")
    refused(store, "INSERT INTO execution_artifacts VALUES ('sha256:abc', 'native', NULL, '{}', 2, 1)")  # not a digest
    refused(store, "INSERT INTO execution_artifacts VALUES (?, 'other', NULL, '{}', 2, 1)", ("sha256:" + "0" * 64,))
    refused(store, "UPDATE jobs SET artifact_digest = ? WHERE id = ?", ("sha256:" + "1" * 64, job["id"]))  # no such artifact
    orphan = "sha256:" + "2" * 64
    with store.transaction() as tx:  # an artifact nothing refers to may go (pruning will use this)
        tx.execute("INSERT INTO execution_artifacts VALUES (?, 'native', NULL, '{}', 2, 1)", (orphan,))
    with store.transaction() as tx:
        assert tx.execute("DELETE FROM execution_artifacts WHERE digest = ?", (orphan,)) == 1
    with store.read() as tx:
        assert load_artifact(tx, digest).digest == digest


def test_bindings_on_dispatches_runs_and_approvals_never_change(store: Any, dispatcher: Any) -> None:
    job = add_job(store, payload_message="ok")
    other = add_job(store, payload_message="ok")["artifact_digest"]
    dispatch = enqueue_manual(store, job["id"])
    for column, value in (("artifact_digest", other), ("source_artifact_digest", other), ("source_run_id", "r-x")):
        refused(store, f"UPDATE job_dispatch_queue SET {column} = ? WHERE id = ?", (value, dispatch["id"]), "ARTIFACT_BINDING_IMMUTABLE")
    dispatcher()
    wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], what="ok run")
    (run,) = run_rows(store, job["id"])
    assert run["artifact_digest"] == job["artifact_digest"]
    refused(store, "UPDATE runs SET artifact_digest = ? WHERE id = ?", (other, run["id"]), "ARTIFACT_BINDING_IMMUTABLE")
    refused(store, "UPDATE runs SET artifact_digest = NULL WHERE id = ?", (run["id"],), "ARTIFACT_BINDING_IMMUTABLE")
    with store.transaction() as tx:
        tx.execute("INSERT INTO approvals(id, job_id, run_id, status, risk_level, requested_at, artifact_digest)"
                   " VALUES ('a1', ?, ?, 'pending', 'low', 1, ?)", (job["id"], run["id"], job["artifact_digest"]))
    refused(store, "UPDATE approvals SET artifact_digest = ? WHERE id = 'a1'", (other,), "ARTIFACT_BINDING_IMMUTABLE")
    with store.transaction() as tx:  # everything else about the row may still change
        assert tx.execute("UPDATE approvals SET status = 'cancelled', version = version + 1 WHERE id = 'a1'") == 1


def test_runs_and_their_events_carry_the_digest_and_chains_and_retries_bind_their_source(store: Any, dispatcher: Any) -> None:
    parent = add_job(store, name="parent", payload_message="fail", max_retries=1, retry_backoff_ms=0)
    child = add_job(store, name="child", schedule_kind="chain", parent_id="parent", trigger_on="failure", payload_message="ok")
    enqueue_manual(store, parent["id"])
    dispatcher()
    wait_for(lambda: len([r for r in run_rows(store, parent["id"]) if r["status"] == "error"]) == 2, what="run and retry")
    wait_for(lambda: [r for r in run_rows(store, child["id"]) if r["status"] == "ok"], what="chained child")
    first, retry = run_rows(store, parent["id"])
    (chained,) = [r for r in run_rows(store, child["id"]) if r["status"] == "ok"]
    assert first["artifact_digest"] == retry["artifact_digest"] == parent["artifact_digest"]
    assert (retry["source_run_id"], retry["source_artifact_digest"]) == (first["id"], parent["artifact_digest"])
    assert chained["artifact_digest"] == child["artifact_digest"]
    assert chained["source_run_id"] in (first["id"], retry["id"])
    assert chained["source_artifact_digest"] == parent["artifact_digest"]
    with store.read() as tx:
        events = tx.all("SELECT kind, artifact_digest FROM runtime_events WHERE run_id = ?", (first["id"],))
        dispatches = tx.all("SELECT kind, artifact_digest, source_run_id, source_artifact_digest FROM job_dispatch_queue"
                            " WHERE kind IN ('retry', 'chain')")
    assert events and {e["artifact_digest"] for e in events} == {parent["artifact_digest"]}
    assert {d["kind"] for d in dispatches} == {"retry", "chain"}
    assert all(d["source_artifact_digest"] == parent["artifact_digest"] and d["source_run_id"] for d in dispatches)


def test_changing_the_contract_binds_a_new_artifact_and_cancels_work_bound_to_the_old(store: Any) -> None:
    job = add_job(store, name="contract", payload_message="ok")
    old = job["artifact_digest"]
    pending = enqueue_manual(store, job["id"])
    renamed = update_job(store, job["id"], {"name": "contract-2", "description": "cosmetic"})
    assert renamed.artifact_digest == old
    with store.read() as tx:
        assert tx.scalar("SELECT status FROM job_dispatch_queue WHERE id = ?", (pending["id"],)) == "pending"
    changed = update_job(store, job["id"], {"run_timeout_ms": 1234})
    new = changed.artifact_digest
    assert new != old and is_digest(new)
    with store.read() as tx:
        row = tx.one("SELECT status, cancel_reason, artifact_digest FROM job_dispatch_queue WHERE id = ?", (pending["id"],))
        superseded = tx.one("SELECT data FROM runtime_events WHERE kind = 'job.artifact_superseded' AND job_id = ?", (job["id"],))
        assert load_artifact(tx, old).payload["runtime"]["timeout_ms"] == 300000  # the old one is kept, unchanged
        assert load_artifact(tx, new).payload["runtime"]["timeout_ms"] == 1234
    assert row["status"] == "cancelled" and "execution contract changed" in row["cancel_reason"] and row["artifact_digest"] == old
    assert json.loads(superseded["data"]) == {"previous": old, "current": new}
    back = update_job(store, job["id"], {"run_timeout_ms": None})  # back to the old contract: the same artifact again
    assert back.artifact_digest == old


def test_disabling_keeps_the_artifact_and_enabling_requires_the_job_to_match_it(store: Any) -> None:
    job = add_job(store, payload_message="ok")
    disabled = set_enabled(store, job["id"], False)
    assert disabled.artifact_digest == job["artifact_digest"]
    assert set_enabled(store, job["id"], True).enabled == 1
    set_enabled(store, job["id"], False)
    with store.transaction() as tx:  # someone edits the row behind the scheduler's back
        tx.execute("UPDATE jobs SET run_timeout_ms = 1 WHERE id = ?", (job["id"],))
    with pytest.raises(SchedulerError) as err:
        set_enabled(store, job["id"], True)
    assert err.value.code == "EXECUTION_ARTIFACT_MISMATCH"
    assert job_row(store, job["id"]).enabled == 0
    rebound = update_job(store, job["id"], {})  # re-saving the edited row binds the artifact it now projects to
    assert rebound.artifact_digest != job["artifact_digest"]
    assert set_enabled(store, job["id"], True).enabled == 1


def test_a_job_edited_outside_the_scheduler_never_runs(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    job = add_job(store, payload_message=f"touch:{marker}")
    with store.transaction() as tx:
        tx.execute("UPDATE jobs SET payload_message = ? WHERE id = ?", (f"touch:{marker}.evil", job["id"]))
    enqueue_manual(store, job["id"])
    dispatcher()
    (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "error"], what="refused run")
    assert run["error_code"] == "EXECUTION_ARTIFACT_MISMATCH"
    assert not marker.exists() and not Path(f"{marker}.evil").exists()


@pytest.mark.parametrize(("column", "donor_fields"), [
    ("payload_message", {"payload_message": "touch:{other}"}),
    ("provenance", {"provenance": "static"}),
    ("run_timeout_ms", {"run_timeout_ms": 4321}),
])
def test_a_row_edited_to_a_warm_shape_of_another_job_never_runs(
    store: Any, dispatcher: Any, tmp_path: Path, column: str, donor_fields: dict[str, Any],
) -> None:
    """The projection, its canonical text and the plan are cached per contract column values without the job id
    (every job of one shape shares them): a row edited by SQL to exactly the values of another job whose shape is
    warm is served that shape, and still refused, since its own id's digest is not the one it records."""
    ran, other = tmp_path / "ran", tmp_path / "other"
    fields = {k: (v.format(other=other) if isinstance(v, str) else v) for k, v in donor_fields.items()}
    victim = add_job(store, name="victim", payload_message=f"touch:{ran}")
    twin = add_job(store, name="twin", payload_message=f"touch:{ran}")  # the victim's shape, another job
    donor = add_job(store, name="donor", **{"payload_message": f"touch:{ran}", **fields})
    dispatcher()
    for job in (victim, donor, twin):  # the twin's first run is served the victim's warm shape
        enqueue_manual(store, job["id"])
        wait_for(lambda job=job: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], what=f"{job['name']} ok")
    ran.unlink()
    other.unlink(missing_ok=True)
    with store.transaction() as tx:  # the victim now has the donor's stored value, behind the scheduler's back
        tx.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (donor[column], victim["id"]))
    enqueue_manual(store, victim["id"])
    (run,) = wait_for(lambda: [r for r in run_rows(store, victim["id"]) if r["status"] == "error"], what="refused run")
    assert run["error_code"] == "EXECUTION_ARTIFACT_MISMATCH"
    assert not ran.exists() and not other.exists()  # nothing executed
    enqueue_manual(store, donor["id"])  # the shape it was served still runs its own job
    wait_for(lambda: len([r for r in run_rows(store, donor["id"]) if r["status"] == "ok"]) == 2, what="donor ok again")


def test_queued_work_bound_to_a_superseded_artifact_is_cancelled_at_claim(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    job = add_job(store, payload_message=f"touch:{marker}")
    old = job["artifact_digest"]
    update_job(store, job["id"], {"run_timeout_ms": 4321})
    with store.transaction() as tx:  # a row queued with the old binding (as a crashed writer could leave it)
        tx.execute("INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, artifact_digest)"
                   " VALUES ('stale', ?, 'manual', 'pending', 1, 1, 1, ?)", (job["id"], old))
    dispatcher()
    wait_for(lambda: job_status(store, "stale") == "cancelled", what="stale dispatch cancelled")
    with store.read() as tx:
        assert old in tx.scalar("SELECT cancel_reason FROM job_dispatch_queue WHERE id = 'stale'")
    assert run_rows(store, job["id"]) == [] and not marker.exists()


def job_status(store: Any, dispatch_id: str) -> str | None:
    with store.read() as tx:
        return tx.scalar("SELECT status FROM job_dispatch_queue WHERE id = ?", (dispatch_id,))


def test_the_remembered_projection_never_hides_an_edit(store: Any) -> None:
    job = add_job(store, payload_message="ok")
    row = job_row(store, job["id"])
    assert check_job(None, row) == check_job(None, row.to_dict()) == job["artifact_digest"]
    for column, value in (("payload_message", "echo:x"), ("executor_options", '{"a":1}'), ("approval_required", 1)):
        with pytest.raises(SchedulerError) as err:
            check_job(None, {**row.to_dict(), column: value})
        assert err.value.code == "EXECUTION_ARTIFACT_MISMATCH", column


class OddSections(StepBase):
    """A step whose section names a plain sort does not place (an array index, non-ASCII) and one named like a header key."""

    name = "odd-sections"
    sections = ("10", "\u00e9t\u00e9", "version")

    def project(self, spec: Any) -> dict[str, Any]:
        return {"10": spec.payload_message, "\u00e9t\u00e9": {"9": 1.5}, "version": None}


VARIED = [
    {"payload_message": "ok"},
    {"payload_message": "echo:h\u00e9llo \U0001f600 \u2028 \x01 \"q\" \\"},
    {"payload_message": "ok", "executor_options": {"\u00e9": 1, "10": [1.5, -0.0], "9": {"": None}, "api_key": "s"}},
    {"payload_message": "ok", "provenance": "static", "run_timeout_ms": 7},
    {"payload_message": "ok", "provenance": "external", "approval_required": True, "constraints": {"network": "none"}},
]
JOB_IDS = ["job-1", "j\u00f6b-\u2713", "x\ud800y", "\"quoted\"\\id", ""]


def varied_rows() -> list[JobRow]:
    """Rows of varied jobs (non-ASCII payloads, odd option keys, floats, provenances) under varied job ids."""
    rows = []
    for fields in VARIED:
        spec = validate_spec({"name": "v", "schedule_kind": "manual", "executor": "testkit", **fields}, plugin_options=False)
        for job_id in JOB_IDS:
            values = {**spec_to_row(spec), "id": job_id, "artifact_digest": canonical_digest(native_payload(spec, job_id))}
            rows.append(JobRow.from_row({name: values.get(name) for name in attrs.fields_dict(JobRow)}))
    return rows


@pytest.mark.parametrize("extra", [(), (OddSections(),)], ids=["installed", "odd-sections"])
def test_the_composed_digest_is_the_canonical_digest_of_the_payload(extra: tuple[StepBase, ...]) -> None:
    """The check composes each job's digest from its shape's canonical text and its id (``member_template``): for varied
    jobs and ids it is exactly ``canonical_digest`` of the native payload, composed where the section names allow it
    and canonicalised whole where they do not (an array-index or non-ASCII section name, a section named like a
    header key)."""
    with installed_as([*registered().steps, *extra]):
        for row in varied_rows():
            digest, shape = artifact._native(row, None)
            assert digest == canonical_digest(native_payload(spec_from_row(row), row.id)) == row.artifact_digest, row.id
            assert (shape.template is None) == bool(extra)
            assert check_job(None, row) == row.artifact_digest


def test_check_job_reports_a_missing_binding(store: Any) -> None:
    job = add_job(store, payload_message="ok")
    row = {**job_row(store, job["id"]).to_dict(), "artifact_digest": None}
    with store.read() as tx, pytest.raises(SchedulerError) as err:
        check_job(tx, row)
    assert err.value.code == "EXECUTION_ARTIFACT_MISSING"
    assert check_job(None, job_row(store, job["id"])) == job["artifact_digest"]
    assert canonical_digest(native_payload(spec_from_row(job), job["id"])) == job["artifact_digest"]


# -- the CLI -------------------------------------------------------------------------------------


def test_cli_shows_the_digest_and_prints_the_canonical_artifact(cli: Any) -> None:
    added = cli("--json", "jobs", "add", json.dumps({"name": "shown", "schedule_kind": "manual", "payload_message": "true",
                                                     "executor": "testkit"}))
    assert added.code == 0, added
    digest = added.json["job"]["artifact_digest"]
    assert is_digest(digest)
    assert cli("--json", "jobs", "get", "shown").json["job"]["artifact_digest"] == digest
    printed = cli("jobs", "artifact", "shown")
    assert printed.code == 0 and "sha256:" + hashlib.sha256(printed.out.encode()).hexdigest() == digest
    as_json = cli("--json", "jobs", "artifact", "shown").json["artifact"]
    assert as_json["digest"] == digest and as_json["kind"] == "native" and as_json["payload"]["command"]["kind"] == "shell"
    missing = cli("--json", "jobs", "artifact", "shown", "--run", "no-such-run")
    assert missing.code != 0 and missing.json["code"] == "NOT_FOUND"


def test_cli_prints_the_artifact_a_run_was_bound_to(cli: Any, store: Any, dispatcher: Any) -> None:
    job = add_job(store, name="history", payload_message="ok")
    enqueue_manual(store, job["id"])
    d = dispatcher()
    (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], what="ok run")
    d.stop()
    update_job(store, job["id"], {"payload_message": "echo:changed"})
    got = cli("--json", "runs", "get", run["id"]).json["run"]
    assert got["artifact_digest"] == job["artifact_digest"]
    by_run = cli("jobs", "artifact", "history", "--run", run["id"])
    assert "sha256:" + hashlib.sha256(by_run.out.encode()).hexdigest() == job["artifact_digest"]
    current = cli("jobs", "artifact", "history")
    assert "sha256:" + hashlib.sha256(current.out.encode()).hexdigest() != job["artifact_digest"]


def test_doctor_finds_a_tampered_artifact_and_a_drifted_job(cli: Any, store: Any, store_url: str) -> None:
    job = add_job(store, name="tampered", payload_message="ok")
    add_job(store, name="drifted", payload_message="ok")
    healthy = cli("--json", "doctor").json
    checks = healthy["checks"] if healthy.get("ok") else healthy["details"]  # other checks (plugins) are not this test's
    assert [c["ok"] for c in checks if c["check"] == "execution_artifacts"] == [True]
    with store.transaction() as tx:  # an attacker with database access: drop the guard, rewrite the payload
        postgres = not store_url.endswith(".db")
        tx.execute("DROP TRIGGER execution_artifacts_no_update" + (" ON execution_artifacts" if postgres else ""))
        tx.execute("UPDATE execution_artifacts SET payload = ? WHERE digest = ?", ('{"job_id":"x"}', job["artifact_digest"]))
        tx.execute("UPDATE jobs SET verify_shell = 'true' WHERE name = 'drifted'")
    report = cli("--json", "doctor")
    assert report.code != 0 and report.json["code"] == "UNHEALTHY"
    (check,) = [c for c in report.json["details"] if c["check"] == "execution_artifacts"]
    codes = {(p.get("job"), p["code"]) for p in check["problems"]}
    assert (None, "EXECUTION_ARTIFACT_TAMPERED") in codes
    assert ("tampered", "EXECUTION_ARTIFACT_TAMPERED") in codes and ("drifted", "EXECUTION_ARTIFACT_MISMATCH") in codes
    refused_print = cli("--json", "jobs", "artifact", "tampered")
    assert refused_print.code != 0 and refused_print.json["code"] == "EXECUTION_ARTIFACT_TAMPERED"


def test_issue29_defect_3_session_and_presentation_bindings_never_change(store: Any) -> None:
    """Before: ``UPDATE provider_sessions SET artifact_digest = ...`` (and on presentations) succeeded."""
    job = add_job(store, payload_message="ok")
    other = add_job(store, payload_message="other")["artifact_digest"]
    with store.transaction() as tx:
        tx.execute("INSERT INTO provider_sessions(id, provider, session_key, artifact_digest, created_at, updated_at)"
                   " VALUES ('s1', 'p', 'k', ?, 1, 1)", (job["artifact_digest"],))
        tx.execute("INSERT INTO credential_presentations(id, run_id, binding_name, provider, medium, artifact_digest,"
                   " materialized_at) VALUES ('c1', 'r1', 'b', 'p', 'env', ?, 1)", (job["artifact_digest"],))
    for table, key in (("provider_sessions", "s1"), ("credential_presentations", "c1")):
        refused(store, f"UPDATE {table} SET artifact_digest = ? WHERE id = ?", (other, key), "ARTIFACT_BINDING_IMMUTABLE")
        refused(store, f"UPDATE {table} SET artifact_digest = NULL WHERE id = ?", (key,), "ARTIFACT_BINDING_IMMUTABLE")
    with store.transaction() as tx:  # the rest of the row still moves as the runtime needs
        tx.execute("UPDATE provider_sessions SET status = 'revoked', updated_at = 2 WHERE id = 's1'")
        tx.execute("UPDATE credential_presentations SET status = 'cleaned', cleaned_at = 2 WHERE id = 'c1'")
    with store.read() as tx:
        assert tx.scalar("SELECT artifact_digest FROM provider_sessions WHERE id = 's1'") == job["artifact_digest"]
        assert tx.scalar("SELECT artifact_digest FROM credential_presentations WHERE id = 'c1'") == job["artifact_digest"]
