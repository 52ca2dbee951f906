"""Evidence covers the parsed structured output (issue 30, defect 3).

A JSON job's run stores its parsed output in ``runs.output_parsed`` beside ``output_sha256`` (the
digest of the raw stream). Payload version 3 binds the digest of that stored text
(``result.structured.parsed_sha256``), so a value rewritten in the database (the runs triggers
dropped, as anyone with write access to the file can) no longer re-verifies, and ``runs get``
refuses to show it (``OUTPUT_TAMPERED``). Real shell runs through a real dispatcher on SQLite and
PostgreSQL, real ``checksum`` and ``ssh`` providers, the CLI in-process.
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
    evidence_row,
    run_job,
    run_row,
    unguarded,
    use_settings,
)

from scheduler.base.canonical import canonical_json
from scheduler.core.artifact import load_artifact
from scheduler.evidence.build import PAYLOAD_VERSION, build_document
from scheduler.plugins.stores import open_store

RUNS_GUARDS = (("runs_terminal_is_final", "runs"), ("runs_binding_immutable", "runs"))


@pytest.fixture(params=["checksum", "ssh"])
def provider(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The evidence provider of the job: ``checksum``, or ``ssh`` with a real ssh-keygen key trusted here."""
    if request.param == "ssh":
        keys = SshKeys(tmp_path / "keys")
        use_settings(monkeypatch, tmp_path, {"providers.ssh": keys.settings()})
    return str(request.param)


def forge_parsed(store: Any, store_url: str, run_id: str, text: str | None) -> None:
    """Rewrite the run's ``output_parsed`` as an attacker with write access would (the runs triggers dropped).

    A writing open then puts the guards back (read commands refuse a database whose guards are
    missing, ``DB_INIT_FAILED``), so only the evidence can tell.
    """
    with store.transaction() as tx:
        unguarded(tx, store_url, *RUNS_GUARDS)
        tx.execute("UPDATE runs SET output_parsed = ? WHERE id = ?", (text, run_id))
    open_store(store_url).close()


def json_run(store: Any, provider: str) -> dict[str, Any]:
    _job, run = run_job(store, name=f"js-{provider}", payload_message="""printf '{"a":1}'""", output_format="json",
                        evidence={"provider": provider})
    assert run["status"] == "ok" and run["evidence_status"] == "attested", run
    assert json.loads(run["output_parsed"]) == {"a": 1}
    return run


def test_a_forged_parsed_output_fails_reverification_and_runs_get(store: Any, store_url: str, dispatcher: Any, cli: Any,
                                                                  provider: str) -> None:
    dispatcher()
    run = json_run(store, provider)
    payload = json.loads(evidence_row(store, run["id"])["canonical_payload"])
    assert payload["version"] == PAYLOAD_VERSION == 3
    structured = payload["result"]["structured"]
    assert structured["parsed_sha256"] == "sha256:" + hashlib.sha256(run["output_parsed"].encode()).hexdigest()
    ok = cli("--json", "runs", "evidence", run["id"])
    assert ok.code == 0 and ok.json["verified"] is True, ok
    shown = cli("--json", "runs", "get", run["id"])
    assert shown.code == 0 and shown.json["run"]["output_parsed"] == {"a": 1}, shown
    assert shown.json["run"]["output_parsed_verified"] is True

    forge_parsed(store, store_url, run["id"], '{"a":2,"forged":true}')
    check = cli("--json", "runs", "evidence", run["id"])
    assert check.code != 0 and check.json["code"] == "EVIDENCE_PAYLOAD_MISMATCH", check
    assert "result.structured.parsed_sha256" in check.json["details"]["details"]["fields"], check.json
    refused = cli("--json", "runs", "get", run["id"])
    assert refused.code != 0 and refused.json["code"] == "OUTPUT_TAMPERED", refused
    assert "forged" not in refused.out
    human = cli("runs", "get", run["id"])
    assert human.code != 0 and "OUTPUT_TAMPERED" in human.err and "forged" not in human.out + human.err, human

    forge_parsed(store, store_url, run["id"], None)  # the value removed is as much a change
    gone = cli("--json", "runs", "get", run["id"])
    assert gone.json["code"] == "OUTPUT_TAMPERED", gone
    assert cli("--json", "runs", "evidence", run["id"]).json["code"] == "EVIDENCE_PAYLOAD_MISMATCH"

    forge_parsed(store, store_url, run["id"], run["output_parsed"])  # the original back: verifies again
    assert cli("--json", "runs", "evidence", run["id"]).code == 0
    assert cli("--json", "runs", "get", run["id"]).json["run"]["output_parsed"] == {"a": 1}


def test_the_normalised_text_of_a_text_job_is_bound_too(store: Any, store_url: str, dispatcher: Any, cli: Any) -> None:
    dispatcher()
    _job, run = run_job(store, payload_message="echo plain", evidence={})
    assert run["output_format"] == "text" and json.loads(run["output_parsed"]) == "plain"
    shown = cli("--json", "runs", "get", run["id"]).json["run"]
    assert shown["output_parsed"] == "plain" and shown["output_parsed_verified"] is True
    forge_parsed(store, store_url, run["id"], '"forged"')
    assert cli("--json", "runs", "get", run["id"]).json["code"] == "OUTPUT_TAMPERED"
    assert cli("--json", "runs", "evidence", run["id"]).json["code"] == "EVIDENCE_PAYLOAD_MISMATCH"


def test_a_version_2_payload_still_verifies_and_runs_get_says_nothing_binds_the_value(
        store: Any, store_url: str, dispatcher: Any, cli: Any) -> None:
    """Rows attested before version 3 stay verifiable; ``runs get`` shows their value, flagged as not bound."""
    dispatcher()
    run = json_run(store, "checksum")
    row = evidence_row(store, run["id"])
    document = json.loads(row["canonical_payload"])
    stored = run_row(store, run["id"])
    with store.read() as tx:
        artifact = load_artifact(tx, stored["artifact_digest"]).payload
    old = build_document(stored, artifact, duration_ms=document["result"]["duration_ms"], version=2)
    assert old["version"] == 2 and "parsed_sha256" not in old["result"]["structured"]
    text = canonical_json(old)
    digest = hashlib.sha256(text.encode()).hexdigest()
    envelope = json.loads(row["envelope"])
    envelope["payload_digest"] = envelope["data"]["payload_digest"] = "sha256:" + digest
    envelope["data"]["payload_bytes"] = len(text.encode())
    with store.transaction() as tx:  # as the version-2 builder attested it
        unguarded(tx, store_url, *EVIDENCE_GUARDS)
        tx.execute("UPDATE evidence_records SET canonical_payload = ?, payload_sha256 = ?, envelope = ? WHERE run_id = ?",
                   (text, digest, canonical_json(envelope), run["id"]))
    open_store(store_url).close()
    assert cli("--json", "runs", "evidence", run["id"]).code == 0
    shown = cli("--json", "runs", "get", run["id"])
    assert shown.code == 0 and shown.json["run"]["output_parsed"] == {"a": 1}
    assert shown.json["run"]["output_parsed_verified"] is False


def test_runs_get_of_a_run_without_evidence_says_nothing_binds_its_parsed_output(store: Any, dispatcher: Any,
                                                                                 cli: Any) -> None:
    dispatcher()
    _job, run = run_job(store, payload_message="""printf '[1,2]'""", output_format="json")
    shown = cli("--json", "runs", "get", run["id"])
    assert shown.code == 0 and shown.json["run"]["output_parsed"] == [1, 2]
    assert shown.json["run"]["output_parsed_verified"] is False
