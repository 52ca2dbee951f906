"""``payload.bind`` and ``collect`` shape the evidence payload (version 2 and later), and version 1 payloads stay verifiable.

Real shell runs through a real dispatcher on SQLite and PostgreSQL (the ``store`` fixture),
re-verified with ``verify_run`` and the CLI. A forged row is written as an attacker with
database access would (guards dropped, the checksum envelope recomputed), so only the
kernel's own rebuild can tell.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from evidence_support import (
    EVIDENCE_GUARDS,
    artifacts_dir,  # noqa: F401  (the autouse artifacts-root fixture)
    evidence_row,
    run_job,
    unguarded,
)

from scheduler.base.canonical import canonical_json
from scheduler.evidence.build import CORE_BINDINGS, PAYLOAD_VERSION, build_document
from scheduler.evidence.verify import verify_run


def payload_of(store: Any, run_id: str) -> dict[str, Any]:
    return json.loads(evidence_row(store, run_id)["canonical_payload"])


def forge(store: Any, store_url: str, run_id: str, document: dict[str, Any]) -> None:
    """Replace a checksum row's payload, digest and envelope consistently (only the rebuild can tell)."""
    row = evidence_row(store, run_id)
    text = canonical_json(document)
    digest = hashlib.sha256(text.encode()).hexdigest()
    envelope = json.loads(row["envelope"])
    envelope["payload_digest"] = envelope["data"]["payload_digest"] = "sha256:" + digest
    envelope["data"]["payload_bytes"] = len(text.encode())
    with store.transaction() as tx:
        unguarded(tx, store_url, *EVIDENCE_GUARDS)
        tx.execute("UPDATE evidence_records SET canonical_payload = ?, payload_sha256 = ?, envelope = ? WHERE run_id = ?",
                   (text, digest, canonical_json(envelope), run_id))


def test_bind_and_collect_shape_the_payload_and_it_reverifies(store: Any, dispatcher: Any, cli: Any) -> None:
    dispatcher()
    _job, plain = run_job(store, name="plain", payload_message="printf 'hello\\n'", evidence={})
    _job, bound = run_job(store, name="bound", payload_message="printf 'hello\\n'; printf 'oops' >&2", evidence={
        "payload": {"bind": ["identity", "trust", "result", "context"], "context": {"ticket": "CHG-1"}},
        "collect": ["stdout", "governance", "exit_code"]})
    assert plain["status"] == bound["status"] == "ok"
    p, b = payload_of(store, plain["id"]), payload_of(store, bound["id"])
    assert p["version"] == b["version"] == PAYLOAD_VERSION == 3
    # Nothing declared: nothing requested or collected; the core set and every outcome the run has are enforced,
    # and no outcome the run lacks appears (not even as null).
    outcome_names = {"identity": "identity", "trust": "trust_level", "delegation": "delegation",
                     "authorization": "authorization", "authorization_proof": "authorization_proof",
                     "credential_handoff": "credential_presentation"}
    assert p["bindings"]["requested"] == [] and p["collected"] == {}
    assert p["bindings"]["enforced"] == sorted(set(CORE_BINDINGS) | {n for n, k in outcome_names.items() if k in p["outcomes"]})
    assert all(v is not None for v in p["outcomes"].values()), p["outcomes"]
    assert "delegation" not in p["outcomes"] and "governance" not in p["outcomes"]
    # Declared: requested names recorded and enforced; an absent one is bound as null; stdout collected, stderr not.
    assert b["bindings"]["requested"] == ["context", "identity", "result", "trust"]
    assert set(b["bindings"]["enforced"]) >= set(CORE_BINDINGS) | {"context", "identity", "trust"}
    assert "identity" in b["outcomes"] and "trust_level" in b["outcomes"]
    assert "governance" in b["outcomes"], "a collected outcome is present (null when the run has none)"
    assert b["collected"] == {"stdout": {"excerpt": "hello\n", "excerpt_bytes": 6, "complete": True}}
    assert b["result"]["exit_code"] == 0 and b["declaration"]["payload"]["context"] == {"ticket": "CHG-1"}
    for run in (plain, bound):
        check = verify_run(store, run["id"])
        assert check.verified, check
    out = cli("--json", "runs", "evidence", bound["id"])
    assert out.code == 0 and out.json["verified"] is True, out


def test_a_collected_excerpt_is_bounded_and_says_it_is_not_the_whole_stream(store: Any, dispatcher: Any) -> None:
    dispatcher()
    _job, run = run_job(store, payload_message="head -c 200000 /dev/zero | tr '\\0' a; printf 'é' >&2",
                        evidence={"collect": ["stdout", "stderr"]})
    collected = payload_of(store, run["id"])["collected"]
    assert collected["stdout"] == {"excerpt": "a" * 4096, "excerpt_bytes": 4096, "complete": False}
    assert collected["stderr"] == {"excerpt": "é", "excerpt_bytes": 2, "complete": True}
    assert verify_run(store, run["id"]).verified


def test_a_changed_stored_excerpt_no_longer_matches_a_collected_payload(store: Any, store_url: str, dispatcher: Any) -> None:
    dispatcher()
    _job, run = run_job(store, payload_message="echo shown", evidence={"collect": ["stdout"]})
    assert verify_run(store, run["id"]).verified
    with store.transaction() as tx:
        tx.execute("UPDATE runs SET stdout_excerpt = ? WHERE id = ?", ("hidden\n", run["id"]))
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_PAYLOAD_MISMATCH", check
    assert "collected.stdout.excerpt" in check.details["fields"]


def test_forged_bindings_are_refused(store: Any, store_url: str, dispatcher: Any) -> None:
    dispatcher()
    _job, run = run_job(store, payload_message="echo x", evidence={"payload": {"bind": ["identity"]}})
    document = payload_of(store, run["id"])
    dropped = json.loads(json.dumps(document))
    dropped["bindings"]["requested"] = []  # claims nothing was asked for
    forge(store, store_url, run["id"], dropped)
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_ARTIFACT_STALE", check
    unenforced = json.loads(json.dumps(document))
    unenforced["bindings"]["enforced"].remove("identity")
    forge(store, store_url, run["id"], unenforced)
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_ARTIFACT_STALE", check
    forge(store, store_url, run["id"], document)
    assert verify_run(store, run["id"]).verified


def test_a_version_1_payload_still_verifies_and_an_unknown_version_is_refused(store: Any, store_url: str,
                                                                               dispatcher: Any) -> None:
    from scheduler.core.artifact import load_artifact

    dispatcher()
    _job, run = run_job(store, payload_message="echo old", evidence={"payload": {"bind": ["identity"]}, "collect": ["stdout"]})
    document = payload_of(store, run["id"])
    with store.read() as tx:
        stored = tx.one("SELECT * FROM runs WHERE id = ?", (run["id"],))
        artifact = load_artifact(tx, stored["artifact_digest"]).payload
    old = build_document(stored, artifact, duration_ms=document["result"]["duration_ms"], version=1)
    assert old["version"] == 1 and "bindings" not in old and "collected" not in old
    forge(store, store_url, run["id"], old)  # as the version-1 builder attested it
    check = verify_run(store, run["id"])
    assert check.verified, check
    future = {**document, "version": PAYLOAD_VERSION + 1}
    forge(store, store_url, run["id"], future)
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_PAYLOAD_INVALID", check


def test_version_2_binds_the_authorization_decision_and_the_proof() -> None:
    artifact = {"evidence": {"payload": {"bind": ["authorization_proof", "delegation"]}, "collect": ["authorization"]}}
    row = {"id": "r", "job_id": "j", "status": "ok",
           "authorization_json": json.dumps({"decision": "permit", "provider": "policyfile"}),
           "proof_json": json.dumps({"method": "jws", "proof_id": "p1", "token": "raw"})}
    v2 = build_document(row, artifact, duration_ms=1)
    assert v2["outcomes"]["authorization"] == {"decision": "permit", "provider": "policyfile"}
    assert v2["outcomes"]["authorization_proof"]["proof_id"] == "p1"
    assert v2["outcomes"]["authorization_proof"]["token"]["redacted"] is True  # secret-like keys are redacted
    assert v2["outcomes"]["delegation"] is None  # asked for, absent: bound as null
    assert {"authorization", "authorization_proof", "delegation"} <= set(v2["bindings"]["enforced"])
    v1 = build_document(row, artifact, duration_ms=1, version=1)
    assert "authorization" not in v1["outcomes"] and "authorization_proof" not in v1["outcomes"]
    with pytest.raises(ValueError):
        build_document(row, artifact, duration_ms=1, version=9)


def test_signed_evidence_is_a_known_capability_of_every_first_party_provider_and_case() -> None:
    """Every capability a first-party evidence provider declares, or a conformance case requires, is a known name."""
    from scheduler_toolkit.types import KNOWN_CAPABILITIES

    from scheduler.plugins.loader import load_provider

    root = Path(__file__).resolve().parents[1]
    for name in ("checksum", "ssh", "external"):
        provider = load_provider("evidence", name)
        assert set(provider.capabilities) <= KNOWN_CAPABILITIES, (name, set(provider.capabilities) - KNOWN_CAPABILITIES)
    required: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            required.update(value.get("requires") or () if isinstance(value.get("requires"), list) else ())
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for case in (root / "conformance-fixtures" / "v2" / "evidence").glob("*.json"):
        walk(json.loads(case.read_text()))
    assert "signed-evidence" in required and required <= KNOWN_CAPABILITIES, required - KNOWN_CAPABILITIES
    assert "`signed-evidence`" in (root / "docs" / "plugins.md").read_text()
