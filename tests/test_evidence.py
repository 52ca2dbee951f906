"""Evidence in the kernel: the declaration, attestation through a real dispatcher, recovery, re-verification.

Real parts throughout: shell commands run by the dispatcher, ``ssh-keygen`` through the ssh
provider, SQLite files and PostgreSQL schemas (the ``store`` fixture), and the CLI in-process.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from evidence_support import (
    EVIDENCE_GUARDS,
    SshKeys,
    artifacts_dir,  # noqa: F401  (the autouse artifacts-root fixture)
    events_of,
    evidence_row,
    is_postgres,
    run_job,
    unguarded,
    use_settings,
)
from kernel_testing import add_job, run_rows, wait_for

from scheduler.evidence.verify import verify_run


@pytest.fixture
def ssh_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SshKeys:
    """A real key and allowed-signers file, configured as ``[providers.ssh]``."""
    keys = SshKeys(tmp_path / "keys")
    use_settings(monkeypatch, tmp_path, {"providers.ssh": keys.settings()})
    return keys


BIG = "head -c 200000 /dev/zero | tr '\\0' a; printf 'warn' >&2"


# -- the declaration ------------------------------------------------------------------------------------


def _spec(**fields: Any) -> str:
    return json.dumps({"name": "ev", "schedule_kind": "manual", "payload_message": "echo hi", **fields})


REFUSALS = [
    ({"evidence": {"provider": "checksum", "bogus": 1}}, "VALIDATION_FAILED", "evidence.bogus", "UNKNOWN_FIELD"),
    ({"evidence": {"provider": "ssh", "methods": ["sha256"]}}, "VALIDATION_FAILED", "evidence.methods", "CONFLICT"),
    ({"evidence": {"methods": ["ssh-signature"]}}, "VALIDATION_FAILED", "evidence.methods", "INVALID_CHOICE"),
    ({"evidence": {"provider_config": {"key": "/x"}}}, "VALIDATION_FAILED", "evidence.provider_config", "UNKNOWN_FIELD"),
    ({"evidence": {"provider": "ssh", "provider_config": {"nope": 1}}}, "VALIDATION_FAILED",
     "evidence.provider_config.nope", "UNKNOWN_FIELD"),
    ({"evidence": {"retention": "5 days"}}, "VALIDATION_FAILED", "evidence.retention", "EVIDENCE_RETENTION_INVALID"),
    ({"evidence": {"verify": {"required": "yes"}}}, "VALIDATION_FAILED", "evidence.verify.required", "INVALID_TYPE"),
    ({"evidence": {"verify": {"required": True, "strict": True}}}, "VALIDATION_FAILED", "evidence.verify.strict", "UNKNOWN_FIELD"),
    ({"evidence": {"payload": {"bind": ["result", "everything"]}}}, "VALIDATION_FAILED", "evidence.payload.bind", "INVALID_CHOICE"),
    ({"evidence": {"payload": {"context": {"note": "x" * 17000}}}}, "VALIDATION_FAILED", "evidence.payload.context", "TOO_LARGE"),
    ({"evidence": {"payload": {"format": "yaml"}}}, "VALIDATION_FAILED", "evidence.payload.format", "INVALID_CHOICE"),
    ({"evidence": {"collect": ["stdout", "memory"]}}, "VALIDATION_FAILED", "evidence.collect", "INVALID_CHOICE"),
    ({"evidence": "checksum"}, "VALIDATION_FAILED", "evidence", "INVALID_TYPE"),
    ({"evidence_ref": "audit-1"}, "VALIDATION_FAILED", "evidence_ref", "CONFLICT"),
    ({"evidence": {}, "evidence_ref": "x" * 257}, "VALIDATION_FAILED", "evidence_ref", "INVALID_VALUE"),
    ({"evidence": {"provider": "notary"}}, "EVIDENCE_NOT_AVAILABLE", "evidence.provider", "EVIDENCE_NOT_AVAILABLE"),
]


@pytest.mark.parametrize(("fields", "code", "field", "detail"), REFUSALS, ids=[r[2] + ":" + r[3] for r in REFUSALS])
def test_a_bad_declaration_is_refused_and_nothing_is_stored(cli: Any, fields: dict[str, Any], code: str, field: str,
                                                            detail: str) -> None:
    for command in (("jobs", "validate"), ("jobs", "add")):
        out = cli("--json", *command, _spec(**fields))
        assert out.code != 0, out
        assert out.json["code"] == code, out.json
        assert {"field": field, "code": detail} in [{"field": d["field"], "code": d["code"]} for d in out.json["details"]], out.json
    assert cli("--json", "jobs", "list").json["jobs"] == []


def test_a_declaration_is_stored_normalised_and_becomes_part_of_the_artifact(cli: Any, store: Any) -> None:
    from scheduler.core.artifact import load_artifact

    plain = cli("--json", "jobs", "add", _spec(name="plain")).json["job"]
    added = cli("--json", "jobs", "add", _spec(evidence={"verify": {"required": True}, "payload": {"format": "json",
                                                                                                    "bind": ["result", "command"]}},
                                                evidence_ref="audit-7")).json["job"]
    with store.read() as tx:
        row = tx.one("SELECT evidence, evidence_ref FROM jobs WHERE id = ?", (added["id"],))
        artifact = load_artifact(tx, added["artifact_digest"]).payload
        plain_artifact = load_artifact(tx, plain["artifact_digest"]).payload
    declaration = json.loads(row["evidence"])
    assert declaration == {"provider": "checksum", "methods": [], "provider_config": {}, "verify": {"required": True},
                           "payload": {"bind": ["command", "result"], "context": None, "format": "canonical-json"},
                           "collect": [], "retention": None}
    assert row["evidence_ref"] == "audit-7"
    assert artifact["evidence"] == {**declaration, "ref": "audit-7"}
    assert plain_artifact["evidence"] is None  # a job without evidence keeps the artifact it had before evidence existed
    assert added["artifact_digest"] != plain["artifact_digest"]


def test_a_job_without_evidence_keeps_its_artifact_digest() -> None:
    """The artifact of a job that declares no evidence is exactly the one built before the field existed."""
    from scheduler.base.canonical import canonical_digest
    from scheduler.core.artifact import native_digest, native_payload
    from scheduler.core.spec import validate_spec

    spec = validate_spec({"name": "n", "schedule_kind": "manual", "payload_message": "echo hi"}, plugin_options=False)
    payload = native_payload(spec, "job-1")
    assert payload["evidence"] is None
    assert native_digest(spec, "job-1") == canonical_digest(payload)


# -- attestation through the dispatcher ----------------------------------------------------------------------


def test_checksum_evidence_of_a_run_with_offloaded_output(store: Any, dispatcher: Any, cli: Any, artifacts_dir: Path) -> None:  # noqa: F811 - the fixture imported above
    dispatcher()
    job, run = run_job(store, payload_message=BIG, evidence={}, evidence_ref="nightly")
    assert run["status"] == "ok" and run["evidence_status"] == "attested", run
    assert run["stdout_artifact"], "200 kB of stdout is offloaded"
    row = evidence_row(store, run["id"])
    assert row["status"] == "attested" and row["provider"] == "checksum" and json.loads(row["methods"]) == ["sha256"]
    assert row["evidence_ref"] == "nightly" and row["artifact_digest"] == run["artifact_digest"] == job["artifact_digest"]
    assert row["retention_until"] is None and row["verified"] == 0
    assert hashlib.sha256(row["canonical_payload"].encode()).hexdigest() == row["payload_sha256"]
    payload = json.loads(row["canonical_payload"])
    whole = (artifacts_dir / run["stdout_artifact"]).read_bytes()
    assert len(whole) == 200000
    assert payload["result"]["stdout_sha256"] == "sha256:" + hashlib.sha256(whole).hexdigest()
    assert payload["result"]["stdout_bytes"] == 200000 and payload["result"]["stderr_bytes"] == 4
    assert payload["result"]["stderr_sha256"] == "sha256:" + hashlib.sha256(b"warn").hexdigest()
    assert payload["run_id"] == run["id"] and payload["job_id"] == job["id"] and payload["attempt"] == 1
    assert payload["actor"] == {"dispatcher_owner": run["dispatcher_owner"], "dispatcher_token": run["dispatcher_token"]}
    assert payload["command"]["payload_sha256"] == "sha256:" + hashlib.sha256(BIG.encode()).hexdigest()
    assert payload["declaration"]["ref"] == "nightly" and payload["result"]["status"] == "ok"
    assert 0 <= payload["result"]["duration_ms"] <= run["duration_ms"]
    envelope = json.loads(row["envelope"])
    assert envelope["provider"] == "checksum" and envelope["payload_digest"] == "sha256:" + row["payload_sha256"]
    assert [k for k, _ in events_of(store, run["id"]) if k.startswith("evidence.")] == ["evidence.attested"]
    check = verify_run(store, run["id"])
    assert check.verified and check.checks["stdout"].startswith("ok (200000 bytes, offloaded)"), check
    out = cli("--json", "runs", "evidence", run["id"])
    assert out.code == 0, out
    assert {k: out.json[k] for k in ("ok", "verified", "provider", "method")} == {
        "ok": True, "verified": True, "provider": "checksum", "method": "sha256"}
    human = cli("runs", "evidence", run["id"][-8:])
    assert human.code == 0 and "checksum" in human.out


def test_ssh_evidence_required_and_verified_then_reverified(store: Any, dispatcher: Any, cli: Any, ssh_keys: SshKeys) -> None:
    dispatcher()
    _job, run = run_job(store, payload_message="echo signed", evidence={"provider": "ssh", "verify": {"required": True}})
    assert run["status"] == "ok" and run["evidence_status"] == "verified", run
    row = evidence_row(store, run["id"])
    assert row["verified"] == 1 and row["status"] == "attested" and json.loads(row["methods"]) == ["ssh-signature"]
    data = json.loads(row["envelope"])["data"]
    assert data["principal"] == "ops@example.org" and data["namespace"] == "scheduler"
    assert data["signed_payload"] == row["canonical_payload"] and "BEGIN SSH SIGNATURE" in data["signature"]
    assert json.loads(row["verification"])["verified"] is True
    assert [k for k, _ in events_of(store, run["id"]) if k.startswith("evidence.")] == ["evidence.verified"]
    out = cli("--json", "runs", "evidence", run["id"])
    assert out.code == 0 and out.json["provider"] == "ssh" and out.json["method"] == "ssh-signature", out


def _child_and_delivery(store: Any, parent: dict[str, Any]) -> dict[str, Any]:
    return add_job(store, name=f"child-{parent['name']}", executor="shell", schedule_kind="chain", parent_id=parent["id"],
                   trigger_on="complete", payload_message="echo child")


def _consequences(store: Any, job: dict[str, Any], child: dict[str, Any]) -> tuple[int, int]:
    with store.read() as tx:
        children = tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE job_id = ?", (child["id"],))
        outbox = tx.scalar("SELECT COUNT(*) FROM delivery_outbox WHERE job_id = ?", (job["id"],))
    return children, outbox


@pytest.mark.parametrize("case", ["attestation", "verification"])
def test_required_evidence_that_fails_ends_the_run_error_without_consequences(
        store: Any, dispatcher: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    keys = SshKeys(tmp_path / "keys")
    if case == "attestation":  # the key is gone: ssh-keygen cannot sign
        use_settings(monkeypatch, tmp_path, {"providers.ssh": keys.settings(key=tmp_path / "no-such-key")})
    else:  # signed, but this host trusts no allowed-signers file: the envelope cannot be verified
        use_settings(monkeypatch, tmp_path, {"providers.ssh": keys.settings(trust=False)})
    dispatcher()
    parent = add_job(store, name="parent", executor="shell", payload_message="echo out", delivery_mode="always",
                     delivery_channel="log", evidence={"provider": "ssh", "verify": {"required": True}})
    child = _child_and_delivery(store, parent)
    from scheduler.core.queue import enqueue_manual

    enqueue_manual(store, parent["id"])
    run = wait_for(lambda: [r for r in run_rows(store, parent["id"]) if r["status"] not in ("running", "pending")],
                   timeout=30, what="run end")[0]
    expected = {"attestation": ("EVIDENCE_ATTESTATION_FAILED", "EVIDENCE_SSH_KEY_MISSING"),
                "verification": ("EVIDENCE_VERIFICATION_FAILED", "EVIDENCE_TRUST_NOT_CONFIGURED")}[case]
    assert run["status"] == "error" and run["error_code"] == expected[0], run
    assert expected[1] in run["error_message"]
    assert run["evidence_status"] == "failed" and run["exit_code"] == 0  # the command itself succeeded
    row = evidence_row(store, run["id"])
    assert row["status"] == "failed" and row["error_code"] == expected[1] and row["verified"] == 0
    assert (row["envelope"] is None) == (case == "attestation")
    assert _consequences(store, parent, child) == (0, 0), "no delivery and no children after failed required evidence"
    failed = [d for k, d in events_of(store, run["id"]) if k == "evidence.failed"]
    assert failed and failed[0]["code"] == expected[1] and failed[0]["required"] is True


def test_evidence_that_is_not_required_fails_without_changing_the_run(
        store: Any, dispatcher: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = SshKeys(tmp_path / "keys")
    use_settings(monkeypatch, tmp_path, {"providers.ssh": keys.settings(key=tmp_path / "no-such-key")})
    dispatcher()
    parent = add_job(store, name="parent", executor="shell", payload_message="echo out", evidence={"provider": "ssh"})
    child = _child_and_delivery(store, parent)
    from scheduler.core.queue import enqueue_manual

    enqueue_manual(store, parent["id"])
    run = wait_for(lambda: [r for r in run_rows(store, parent["id"]) if r["status"] == "ok"], timeout=30, what="ok run")[0]
    assert run["evidence_status"] == "failed" and run["error_code"] is None
    row = evidence_row(store, run["id"])
    assert row["status"] == "failed" and row["error_code"] == "EVIDENCE_SSH_KEY_MISSING"
    wait_for(lambda: _consequences(store, parent, child)[0] == 1, what="the child still runs")
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_NOT_VERIFIED"
    assert check.details["record_error_code"] == "EVIDENCE_SSH_KEY_MISSING"


def test_a_job_without_evidence_gets_no_row_and_no_query(store: Any, dispatcher: Any, cli: Any) -> None:
    dispatcher()
    _job, run = run_job(store, payload_message="echo plain")
    assert run["status"] == "ok" and run["evidence_status"] is None and evidence_row(store, run["id"]) is None
    out = cli("--json", "runs", "evidence", run["id"])
    assert out.code != 0 and out.json["code"] == "EVIDENCE_RECORD_MISSING", out


def test_attest_run_returns_at_once_for_a_job_without_evidence() -> None:
    """The hot path: no store access at all (the store passed here would fail on any use)."""
    from scheduler.core.execution import ExecutionResult
    from scheduler.core.outcomes import RunOutcomes
    from scheduler.core.spec import validate_spec
    from scheduler.evidence.attest import attest_run

    spec = validate_spec({"name": "n", "schedule_kind": "manual", "payload_message": "echo"}, plugin_options=False)
    result = ExecutionResult(status="ok")
    outcomes = RunOutcomes()
    assert attest_run(object(), object(), spec, result, outcomes) is result
    assert outcomes == RunOutcomes()


# -- retention guard ------------------------------------------------------------------------------------------


def test_an_evidence_row_cannot_be_deleted_before_its_retention_ends(store: Any, dispatcher: Any) -> None:
    from scheduler.base.errors import SchedulerError
    from scheduler.base.timeutil import now_ms

    dispatcher()
    _job, kept = run_job(store, name="kept", payload_message="echo a", evidence={"retention": "30d"})
    _job, forever = run_job(store, name="forever", payload_message="echo b", evidence={})
    row = evidence_row(store, kept["id"])
    assert row["retention_policy"] == "30d" and row["retention_until"] >= now_ms() + 29 * 86_400_000
    for run in (kept, forever):
        with pytest.raises(SchedulerError) as refused, store.transaction() as tx:
            tx.execute("DELETE FROM evidence_records WHERE run_id = ?", (run["id"],))
        assert "EVIDENCE_RETAINED" in refused.value.message
        assert evidence_row(store, run["id"]) is not None
    with pytest.raises(SchedulerError) as immutable, store.transaction() as tx:
        tx.execute("UPDATE evidence_records SET retention_until = 1 WHERE run_id = ?", (kept["id"],))
    assert "EVIDENCE_IMMUTABLE" in immutable.value.message


# -- status, doctor, capabilities ------------------------------------------------------------------------------


def test_status_counts_and_doctor_reverifies(store: Any, store_url: str, dispatcher: Any, cli: Any) -> None:
    dispatcher()
    _job, good = run_job(store, name="good", payload_message="echo good", evidence={})
    _job, bad = run_job(store, name="bad", payload_message="echo bad", evidence={})
    status = cli("--json", "status").json["status"]["evidence"]
    assert status == {"total": 2, "records": {"attested": 2}, "runs": {"attested": 2}, "missing": 0}, status

    def evidence_check() -> dict[str, Any]:
        out = cli("--json", "doctor").json
        checks = out["checks"] if out.get("ok") else out["details"]
        (check,) = [c for c in checks if c["check"] == "evidence"]
        return check

    healthy = evidence_check()
    assert healthy["ok"] and healthy["evidence"]["checked"] == 2 and healthy["evidence"]["invalid"] == 0, healthy
    with store.transaction() as tx:
        unguarded(tx, store_url, *EVIDENCE_GUARDS)
        tx.execute("UPDATE runs SET exit_code = 9 WHERE id = ?", (bad["id"],))
        tx.execute("DELETE FROM evidence_records WHERE run_id = ?", (good["id"],))
    if not is_postgres(store_url):  # a read-only SQLite open refuses a database missing its guards (issue 29 defect 5)
        refused = cli("--json", "status")
        assert refused.code != 0 and refused.json["code"] == "DB_INIT_FAILED", refused
        assert "trigger evidence_records_no_update" in refused.json["details"]["missing"], refused.json
    sick = evidence_check()  # doctor writes: it recreates the guards, then re-verifies
    assert cli("--json", "status").json["status"]["evidence"]["missing"] == 1
    assert not sick["ok"] and sick["evidence"]["invalid"] == 1 and sick["evidence"]["missing"] == 1, sick
    assert sick["evidence"]["invalid_samples"][0] == {**sick["evidence"]["invalid_samples"][0], "run_id": bad["id"],
                                                      "code": "EVIDENCE_PAYLOAD_MISMATCH"}
    assert sick["evidence"]["missing_samples"] == [good["id"]]
    assert cli("--json", "doctor").code != 0


def test_capabilities_report_the_seeds_evidence_values() -> None:
    from scheduler.testing import run_cli

    code, out, _err = run_cli("--json", "capabilities")
    caps = json.loads(out)["capabilities"]
    assert code == 0
    assert caps["evidence_generation"] is True and caps["checksum_evidence_generation"] is True
    assert caps["signed_or_provider_verified_evidence"] is True
    assert caps["evidence_integrity"] == "artifact-bound-signed-or-provider-verified-v4"
    assert "evidence_contract" not in caps  # the payload is the scheduler's own, not AgentCLI's (docs/evidence.md)
