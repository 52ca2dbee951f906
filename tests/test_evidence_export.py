"""Portable evidence (``runs evidence --export in-toto``), ``runs evidence --all``, and retained evidence after pruning.

Runs are real (a dispatcher in the test process runs real shell commands with checksum
evidence, on SQLite and PostgreSQL). The exported DSSE envelope is verified by a separate
``python -c`` process that imports only securesystemslib, in_toto_attestation and
cryptography, never ``scheduler``: what a third party would do with the file.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.queue import enqueue_manual
from scheduler.testing import add_job, run_rows, wait_for

BIG = "printf 'hello\\n'; head -c 150000 /dev/zero | tr '\\0' z"

#: The independent verifier: argv = envelope file, public key PEM file, expected JSON (subjects, payload sha256).
VERIFIER = r"""
import base64, hashlib, json, sys
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

envelope = Envelope.from_dict(json.load(open(sys.argv[1])))
key = SSlibKey.from_crypto(load_pem_public_key(open(sys.argv[2], "rb").read()))
expected = json.load(open(sys.argv[3]))
assert envelope.payload_type == "application/vnd.in-toto+json", envelope.payload_type
envelope.verify([key], 1)  # raises VerificationError unless the Ed25519 signature is good
body = json.loads(envelope.payload)
statement = Statement.copy_from_pb(json_format.ParseDict(body, statement_pb2.Statement()))
statement.validate()
subjects = {s["name"]: s["digest"]["sha256"] for s in body["subject"]}
assert subjects == expected["subjects"], (subjects, expected["subjects"])
predicate = json.dumps(body["predicate"], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
assert hashlib.sha256(predicate).hexdigest() == expected["payload_sha256"], "the predicate is not the attested payload"
assert body["predicate"]["run_id"] == expected["run_id"]
assert not any(name == "scheduler" or name.startswith("scheduler.") for name in sys.modules), "imported the scheduler"
print("VERIFIED")
"""


def _key(tmp_path: Path, kind: str = "ed25519") -> tuple[Path, Path]:
    """A real private key (PEM, PKCS#8) and its public key file."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    private = ed25519.Ed25519PrivateKey.generate() if kind == "ed25519" else ec.generate_private_key(ec.SECP256R1())
    key_path, pub_path = tmp_path / f"{kind}.pem", tmp_path / f"{kind}.pub.pem"
    key_path.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    pub_path.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_path, pub_path


@pytest.fixture
def artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "artifacts"
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(root))
    return root


def _evidence_runs(store: Any, dispatcher: Any, artifacts: Path, commands: list[str]) -> list[dict[str, Any]]:
    """Run each command once as a job with checksum evidence; the finished runs (with their evidence rows)."""
    jobs = [add_job(store, executor="shell", payload_message=c, evidence={"provider": "checksum", "retention": "30d"})
            for c in commands]
    d = dispatcher(artifacts_root=artifacts)
    for job in jobs:
        enqueue_manual(store, job["id"])
    runs = [wait_for(lambda j=job: next((r for r in run_rows(store, j["id"]) if r["evidence_status"]), None),
                     timeout=30, what="a run with evidence") for job in jobs]
    d.stop()
    return runs


def _use_key(monkeypatch: pytest.MonkeyPatch, path: Path | str) -> None:
    from scheduler.settings import reload_settings

    monkeypatch.setenv("SCHEDULER_EVIDENCE_EXPORT_KEY", str(path))
    reload_settings()


def _verify_outside(tmp_path: Path, envelope: Path, public: Path, expected: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    expected_file = tmp_path / "expected.json"
    expected_file.write_text(json.dumps(expected))
    return subprocess.run([sys.executable, "-I", "-c", VERIFIER, str(envelope), str(public), str(expected_file)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_export_in_toto_verifies_without_the_scheduler(store: Any, dispatcher: Any, artifacts: Path, cli: Any,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (run,) = _evidence_runs(store, dispatcher, artifacts, [BIG])
    assert run["stdout_artifact"], "the stream must be offloaded, so the subject is the digest of the COMPLETE output"
    out = tmp_path / "run.intoto.json"

    missing = cli("--json", "runs", "evidence", run["id"], "--export", "in-toto", "--output", str(out))
    assert missing.code != 0 and missing.json["code"] == "EVIDENCE_EXPORT_KEY_MISSING" and not out.exists()
    ec_key, _ = _key(tmp_path, "ec")
    for bad in (ec_key, tmp_path / "no-such.pem", tmp_path / "artifacts"):
        _use_key(monkeypatch, bad)
        refused = cli("--json", "runs", "evidence", run["id"], "--export", "in-toto", "--output", str(out))
        assert refused.code != 0 and refused.json["code"] == "EVIDENCE_EXPORT_KEY_INVALID", refused
        assert not out.exists()

    key, public = _key(tmp_path)
    _use_key(monkeypatch, key)
    done = cli("--json", "runs", "evidence", run["id"][-8:], "--export", "in-toto", "--output", str(out))
    assert done.code == 0, done
    stdout = cli("runs", "output", run["id"]).out.encode()
    with store.read() as tx:
        record = tx.one("SELECT * FROM evidence_records WHERE run_id = ?", (run["id"],))
    expected = {"run_id": run["id"], "payload_sha256": record["payload_sha256"], "subjects": {
        f"run/{run['id']}/stdout": hashlib.sha256(stdout).hexdigest(),
        f"run/{run['id']}/stderr": hashlib.sha256(b"").hexdigest()}}
    assert len(stdout) > 150_000 and done.json["path"] == str(out)
    verified = _verify_outside(tmp_path, out, public, expected)
    assert verified.returncode == 0 and "VERIFIED" in verified.stdout, verified.stderr

    # The verifier can fail: a changed byte of the statement, or another key, is refused.
    envelope = json.loads(out.read_text())
    forged = dict(envelope, payload=envelope["payload"][:-8] + ("A" * 8 if not envelope["payload"].endswith("A" * 8) else "B" * 8))
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    assert _verify_outside(tmp_path, tmp_path / "forged.json", public, expected).returncode != 0
    (tmp_path / "other").mkdir()
    _, other_public = _key(tmp_path / "other")
    assert _verify_outside(tmp_path, out, other_public, expected).returncode != 0

    printed = cli("runs", "evidence", run["id"], "--export", "in-toto")  # without --output: the envelope on stdout
    assert printed.code == 0 and json.loads(printed.out)["payloadType"] == "application/vnd.in-toto+json"


def test_export_refuses_evidence_that_does_not_verify(store: Any, dispatcher: Any, artifacts: Path, cli: Any,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (run,) = _evidence_runs(store, dispatcher, artifacts, [BIG])
    key, _ = _key(tmp_path)
    _use_key(monkeypatch, key)
    offloaded = artifacts / run["stdout_artifact"]
    data = bytearray(offloaded.read_bytes())
    data[-1] ^= 1
    offloaded.write_bytes(bytes(data))
    out = tmp_path / "x.json"
    refused = cli("--json", "runs", "evidence", run["id"], "--export", "in-toto", "--output", str(out))
    assert refused.code != 0 and refused.json["code"] == "EVIDENCE_EXPORT_FAILED", refused
    assert refused.json["details"]["verification_code"].startswith("EVIDENCE_OUTPUT") and not out.exists()


def test_export_options_are_checked(cli: Any, store: Any) -> None:
    for args, code in ((["--export", "in-toto"], "INVALID_ARGUMENT"), (["--all", "--export", "in-toto"], "INVALID_ARGUMENT"),
                       (["x", "--since", "1d"], "INVALID_ARGUMENT"), (["--all", "--output", "f"], "INVALID_ARGUMENT"),
                       (["--all", "--since", "yesterday"], "INVALID_TIME"), (["--export", "spdx", "x"], "INVALID_ARGUMENT")):
        result = cli("--json", "runs", "evidence", *args)
        assert result.code != 0 and result.json["code"] == code, (args, result)


def test_all_reverifies_many_and_counts_invalid_by_code(store: Any, dispatcher: Any, artifacts: Path, cli: Any) -> None:
    runs = _evidence_runs(store, dispatcher, artifacts, [BIG, "echo two", "echo three"])
    ok = cli("--json", "runs", "evidence", "--all")
    assert ok.code == 0, ok
    assert (ok.json["checked"], ok.json["verified"], ok.json["invalid"], ok.json["missing"]) == (3, 3, {}, 0)
    later = cli("--json", "runs", "evidence", "--all", "--since", "2999-01-01T00:00:00Z")
    assert later.code == 0 and later.json["checked"] == 0
    recent = cli("--json", "runs", "evidence", "--all", "--since", "1h")
    assert recent.code == 0 and recent.json["checked"] == 3

    (artifacts / runs[0]["stdout_artifact"]).write_bytes(b"not what ran\n")
    bad = cli("--json", "runs", "evidence", "--all")
    assert bad.code != 0 and bad.json["code"] == "EVIDENCE_CHECK_FAILED", bad
    summary = bad.json["details"]
    assert (summary["checked"], summary["verified"], summary["invalid_total"]) == (3, 2, 1)
    assert list(summary["invalid"]) == [summary["failures"][0]["code"]] and summary["failures"][0]["run_id"] == runs[0]["id"]
    human = cli("runs", "evidence", "--all")
    assert human.code != 0 and "EVIDENCE_CHECK_FAILED" in human.err


def test_retained_evidence_verifies_after_its_run_and_job_are_gone(store: Any, dispatcher: Any, artifacts: Path, cli: Any) -> None:
    from scheduler.evidence.verify import verify_run
    from scheduler.ops.pruning import prune_runs

    (run,) = _evidence_runs(store, dispatcher, artifacts, [BIG])
    with store.transaction() as tx:
        tx.execute("UPDATE runs SET finished_at = finished_at - ?, started_at = started_at - ?, created_at = created_at - ?"
                   " WHERE id = ?", (10 * 86_400_000, 10 * 86_400_000, 10 * 86_400_000, run["id"]))
    report = prune_runs(store, older_than_ms=86_400_000, artifacts_root=artifacts)
    assert report.tombstoned == [run["id"]] and not (artifacts / run["stdout_artifact"]).exists()
    check = verify_run(store, run["id"], artifacts_root=artifacts)
    assert check.verified and not check.run_present, check
    assert cli("jobs", "delete", run["job_id"]).code == 0
    after = cli("--json", "runs", "evidence", run["id"])
    assert after.code == 0 and after.json["verified"] is True, after
    summary = cli("--json", "runs", "evidence", "--all")
    assert summary.code == 0 and summary.json["verified"] == 1
