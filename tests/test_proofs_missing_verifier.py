"""A job whose ``authorization_proof`` names a verifier that is not installed: refused at add, denied at run.

Through the real CLI in subprocesses, with the verifier switched off by
``SCHEDULER_DISABLE_PLUGINS=proof_verifiers:NAME`` (as a host without the distribution sees it):
``jobs add`` and ``jobs validate`` refuse the job with ``PROOF_VERIFIER_NOT_AVAILABLE`` (the code
the missing-plugin rule derives for kind ``proof_verifier``) naming the field, unless
``--allow-missing-plugins``; a job added while the verifier was installed, run by a ``scheduler
run`` that no longer has it, ends ``error`` / ``PROOF_VERIFIER_NOT_AVAILABLE`` before its payload
starts (fail closed), and the same job runs once the verifier is back.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from kernel_testing import scheduler_cmd
from test_proofs_support import jwt_declaration, mint_jwt, rsa_key, write_public_pem

CODE = "PROOF_VERIFIER_NOT_AVAILABLE"
NO_JWT = {"SCHEDULER_DISABLE_PLUGINS": "proof_verifiers:jwt"}
NO_SSH = {"SCHEDULER_DISABLE_PLUGINS": "proof_verifiers:detached-signature-ssh"}


def sub(db: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """The real ``scheduler --db DB --json ARGS`` in a subprocess: (exit code, the JSON answer, stderr)."""
    full = {**os.environ, "SCHEDULER_DISABLE_PLUGINS": "", "SCHEDULER_STRICT_PLUGINS": "", **(env or {})}
    done = subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", *args], capture_output=True, text=True, env=full,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [ln for ln in done.stdout.strip().splitlines() if ln.strip()]
    return done.returncode, json.loads(lines[-1]) if lines else {}, done.stderr


def spec(name: str, proof: dict[str, Any], payload: str = "true") -> str:
    return json.dumps({"name": name, "schedule_kind": "manual", "executor": "shell", "payload_message": payload,
                       "authorization_proof": proof})


def test_add_and_validate_refuse_a_job_whose_verifier_is_missing(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    proof = jwt_declaration({"env": "PROOF"}, public_key_file="/etc/idp.pem")
    for command in (["jobs", "add"], ["jobs", "validate"], ["jobs", "add", "--dry-run"]):
        code, doc, _ = sub(db, *command, spec("needs-jwt", proof), env=NO_JWT)
        assert (code, doc["ok"], doc["code"]) == (1, False, CODE), (command, doc)
        assert [(d["field"], d["kind"], d["name"], d["reason"]) for d in doc["details"]] == [
            ("authorization_proof.method", "proof_verifier", "jwt", "disabled")]
        assert "--allow-missing-plugins" in doc["error"]
    assert not db.exists()  # refused before the database is opened
    code, doc, _ = sub(db, "jobs", "add", spec("needs-jwt", proof))  # the verifier installed: accepted
    assert code == 0 and doc["job"]["name"] == "needs-jwt"
    code, doc, _ = sub(db, "jobs", "add", "--allow-missing-plugins", spec("prepared", proof), env=NO_JWT)
    assert code == 0 and doc["job"]["name"] == "prepared"


def test_an_ssh_signature_names_its_own_verifier(tmp_path: Path) -> None:
    """``format: ssh`` is verified by ``detached-signature-ssh`` (scheduler-provider-ssh): the refusal names the format."""
    db = tmp_path / "s.db"
    ssh = {"method": "detached-signature", "source": {"env": "P"}, "format": "ssh", "allowed_signers_file": "/etc/signers",
           "principal": "release@example.test"}
    code, doc, _ = sub(db, "jobs", "validate", spec("ssh-proof", ssh), env=NO_SSH)
    assert (code, doc["code"]) == (1, CODE), doc
    assert [(d["field"], d["name"]) for d in doc["details"]] == [("authorization_proof.format", "detached-signature-ssh")]
    ed = {"method": "detached-signature", "source": {"env": "P"}, "format": "ed25519", "public_key_file": "/etc/ed.pub"}
    code, doc, _ = sub(db, "jobs", "validate", spec("ed-proof", ed), env=NO_SSH)  # the other format's verifier is there
    assert code == 0 and doc["valid"] is True, doc


def test_a_verifier_gone_at_run_time_denies_the_run_before_the_payload(tmp_path: Path) -> None:
    from scheduler.plugins.stores import open_store

    db = tmp_path / "s.db"
    key = rsa_key()
    pub = write_public_pem(key, tmp_path / "idp.pem")
    source, marker = tmp_path / "proof.jwt", tmp_path / "ran"
    proof = jwt_declaration({"file": str(source)}, public_key_file=str(pub))
    code, doc, err = sub(db, "jobs", "add", spec("guarded", proof, f"echo ran >> {marker}"))
    assert code == 0, (doc, err)
    source.write_text(mint_jwt(key, doc["job"]["artifact_digest"], jti="only-once"))

    code, doc, err = sub(db, "jobs", "run", "guarded")
    assert code == 0, (doc, err)
    code, doc, err = sub(db, "run", "--duration", "3s", env=NO_JWT)  # a dispatcher on a host without the verifier
    assert code == 0, (doc, err)
    (run,) = sub(db, "runs", "list", "guarded")[1]["runs"]
    assert (run["status"], run["error_code"]) == ("error", CODE), run
    assert not marker.exists()  # fail closed: the payload never started
    store = open_store(str(db))
    try:
        with store.read() as tx:
            (row,) = tx.all("SELECT proof_json, error_message FROM runs")
            assert tx.scalar("SELECT COUNT(*) FROM authorization_proof_replay") == 0  # nothing claimed
        assert json.loads(row["proof_json"]) == {"status": "denied", "error_code": CODE, "method": "jwt"}
        assert "'jwt'" in row["error_message"] and "SCHEDULER_DISABLE_PLUGINS" in row["error_message"]
    finally:
        store.close()

    code, doc, err = sub(db, "jobs", "run", "guarded")  # the verifier is back: the same proof now verifies and runs
    assert code == 0, (doc, err)
    code, doc, err = sub(db, "run", "--duration", "3s")
    assert code == 0, (doc, err)
    runs = sorted(sub(db, "runs", "list", "guarded")[1]["runs"], key=lambda r: r["started_at"] or 0)
    assert [r["status"] for r in runs] == ["error", "ok"] and marker.read_text() == "ran\n"
