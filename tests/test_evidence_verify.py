"""``runs evidence RUN_ID`` / ``verify_run``: re-verification from history alone, and each failure's own code.

Every case runs a real shell command through a real dispatcher (SQLite and PostgreSQL), then
changes one thing as someone with database or file-system access would (guards dropped where
the database refuses), and checks the exact code ``runs evidence`` exits with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from evidence_support import (
    EVIDENCE_GUARDS,
    artifacts_dir,  # noqa: F401  (the autouse artifacts-root fixture)
    evidence_row,
    run_job,
    run_row,
    unguarded,
    use_settings,
)

from scheduler.evidence.verify import verify_run

BIG = "head -c 100000 /dev/zero | tr '\\0' b; printf 'warn' >&2"


@pytest.fixture
def two_runs(store: Any, dispatcher: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two verified checksum-evidence runs of two jobs, with offloaded stdout and inline stderr."""
    d = dispatcher()
    _a, first = run_job(store, name="first", payload_message=BIG, evidence={})
    _b, second = run_job(store, name="second", payload_message=BIG.replace("b;", "c;"), evidence={})
    d.stop()
    assert first["status"] == second["status"] == "ok"
    assert verify_run(store, first["id"]).verified and verify_run(store, second["id"]).verified
    return first, second


def _set(store: Any, store_url: str, sql: str, params: tuple[Any, ...]) -> None:
    with store.transaction() as tx:
        unguarded(tx, store_url, *EVIDENCE_GUARDS, ("execution_artifacts_no_update", "execution_artifacts"))
        tx.execute(sql, params)


def _tamper(case: str, store: Any, store_url: str, first: dict[str, Any], second: dict[str, Any], root: Path,
            monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = evidence_row(store, first["id"]), evidence_row(store, second["id"])
    out = root / first["stdout_artifact"]
    if case == "EVIDENCE_DIGEST_MISMATCH":
        _set(store, store_url, "UPDATE evidence_records SET canonical_payload = ? WHERE run_id = ?",
             (a["canonical_payload"].replace('"attempt":1', '"attempt":2'), first["id"]))
    elif case == "EVIDENCE_TRANSPLANTED":  # the other run's envelope moved onto this row
        _set(store, store_url, "UPDATE evidence_records SET envelope = ? WHERE run_id = ?", (b["envelope"], first["id"]))
    elif case == "EVIDENCE_TRANSPLANTED:payload":  # the other run's payload, digest and envelope, all consistent
        _set(store, store_url, "UPDATE evidence_records SET canonical_payload = ?, payload_sha256 = ?, envelope = ?"
             " WHERE run_id = ?", (b["canonical_payload"], b["payload_sha256"], b["envelope"], first["id"]))
    elif case == "EVIDENCE_ARTIFACT_STALE":
        with store.read() as tx:
            text = tx.scalar("SELECT payload FROM execution_artifacts WHERE digest = ?", (first["artifact_digest"],))
        _set(store, store_url, "UPDATE execution_artifacts SET payload = ? WHERE digest = ?",
             (text.replace('"timeout_ms":300000', '"timeout_ms":300001'), first["artifact_digest"]))
    elif case == "EVIDENCE_PAYLOAD_MISMATCH":  # the run row no longer says what the evidence says
        _set(store, store_url, "UPDATE runs SET exit_code = 3 WHERE id = ?", (first["id"],))
    elif case == "EVIDENCE_PAYLOAD_MISMATCH:digest":  # the recorded stdout digest rewritten to match a forged file
        _set(store, store_url, "UPDATE runs SET stdout_sha256 = ? WHERE id = ?", ("0" * 64, first["id"]))
    elif case == "EVIDENCE_OUTPUT_DIGEST_MISMATCH":
        data = bytearray(out.read_bytes())
        data[5000] ^= 1
        out.write_bytes(bytes(data))
    elif case == "EVIDENCE_OUTPUT_DIGEST_MISMATCH:inline":
        _set(store, store_url, "UPDATE runs SET stderr_excerpt = 'WARN' WHERE id = ?", (first["id"],))
    elif case == "EVIDENCE_OUTPUT_SIZE_MISMATCH":
        out.write_bytes(out.read_bytes()[:-1])
    elif case == "EVIDENCE_OUTPUT_UNAVAILABLE":
        out.unlink()
    elif case == "EVIDENCE_PROVIDER_NOT_LOADED":
        monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", "scheduler.evidence_providers:checksum")
        from scheduler.evidence.providers import PROVIDERS

        PROVIDERS.forget()  # this process loaded it for the run; a verifying process would start without it
    elif case == "EVIDENCE_RECORD_MISSING":
        _set(store, store_url, "DELETE FROM evidence_records WHERE run_id = ?", (first["id"],))
    elif case == "EVIDENCE_NOT_VERIFIED":
        _set(store, store_url, "UPDATE evidence_records SET status = 'failed', error_code = 'EVIDENCE_SSH_KEY_MISSING'"
             " WHERE run_id = ?", (first["id"],))
    elif case == "EVIDENCE_SIGNER:checksum-envelope":  # the envelope's recorded size changed: the provider says no
        env = json.loads(a["envelope"])
        env["data"]["payload_bytes"] += 1
        from scheduler.base.canonical import canonical_json

        _set(store, store_url, "UPDATE evidence_records SET envelope = ? WHERE run_id = ?", (canonical_json(env), first["id"]))
    else:  # pragma: no cover
        raise AssertionError(case)


CASES = [
    "EVIDENCE_DIGEST_MISMATCH", "EVIDENCE_TRANSPLANTED", "EVIDENCE_TRANSPLANTED:payload", "EVIDENCE_ARTIFACT_STALE",
    "EVIDENCE_PAYLOAD_MISMATCH", "EVIDENCE_PAYLOAD_MISMATCH:digest", "EVIDENCE_OUTPUT_DIGEST_MISMATCH",
    "EVIDENCE_OUTPUT_DIGEST_MISMATCH:inline", "EVIDENCE_OUTPUT_SIZE_MISMATCH", "EVIDENCE_OUTPUT_UNAVAILABLE",
    "EVIDENCE_PROVIDER_NOT_LOADED", "EVIDENCE_RECORD_MISSING", "EVIDENCE_NOT_VERIFIED", "EVIDENCE_SIGNER:checksum-envelope",
]
EXPECTED = {"EVIDENCE_SIGNER:checksum-envelope": "EVIDENCE_PAYLOAD_MISMATCH"}


@pytest.mark.parametrize("case", CASES)
def test_each_failure_has_its_own_code(case: str, store: Any, store_url: str, cli: Any, two_runs: Any, artifacts_dir: Path,  # noqa: F811 - the fixture imported above
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = two_runs
    _tamper(case, store, store_url, first, second, artifacts_dir, monkeypatch)
    code = EXPECTED.get(case, case.split(":")[0])
    check = verify_run(store, first["id"])
    assert not check.verified and check.code == code, check
    out = cli("--json", "runs", "evidence", first["id"])
    assert out.code != 0 and out.json["ok"] is False and out.json["code"] == code, out
    assert "Traceback" not in out.err and "Traceback" not in out.out
    human = cli("runs", "evidence", first["id"])
    assert human.code != 0 and code in human.err and "Traceback" not in human.err
    if case != "EVIDENCE_PROVIDER_NOT_LOADED" and not case.startswith("EVIDENCE_ARTIFACT"):
        assert verify_run(store, second["id"]).verified  # the other run is untouched


def test_a_transplant_names_the_run_it_came_from(store: Any, store_url: str, two_runs: Any, artifacts_dir: Path,  # noqa: F811 - the fixture imported above
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = two_runs
    _tamper("EVIDENCE_TRANSPLANTED", store, store_url, first, second, artifacts_dir, monkeypatch)
    assert verify_run(store, first["id"]).details["from_run_id"] == second["id"]


def test_a_pruned_runs_retained_evidence_still_verifies(store: Any, store_url: str, cli: Any, two_runs: Any) -> None:
    from scheduler.base.timeutil import now_ms

    first, _second = two_runs
    with store.transaction() as tx:
        tx.execute("INSERT INTO run_tombstones(run_id, job_id, job_name, status, artifact_digest, evidence_id, finished_at,"
                   " pruned_at, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (first["id"], first["job_id"], "first", first["status"], first["artifact_digest"],
                    evidence_row(store, first["id"])["id"], first["finished_at"], now_ms(), "test"))
        tx.execute("DELETE FROM runs WHERE id = ?", (first["id"],))
        tx.execute("DELETE FROM jobs WHERE name = 'first'")
    check = verify_run(store, first["id"])
    assert check.verified and not check.run_present, check
    assert check.checks["run_row"].startswith("skipped: the run was pruned") and check.checks["envelope"] == "ok"
    out = cli("--json", "runs", "evidence", first["id"])
    assert out.code == 0 and out.json["run_present"] is False and out.json["verified"] is True, out
    # ... and a pruned run's evidence changed afterwards is still caught
    with store.transaction() as tx:
        unguarded(tx, store_url, *EVIDENCE_GUARDS)
        row = evidence_row(store, first["id"])
        tx.execute("UPDATE evidence_records SET canonical_payload = ? WHERE run_id = ?",
                   (row["canonical_payload"].replace('"exit_code":0', '"exit_code":1'), first["id"]))
    assert verify_run(store, first["id"]).code == "EVIDENCE_DIGEST_MISMATCH"


def test_unknown_run_is_not_found(cli: Any) -> None:
    out = cli("--json", "runs", "evidence", "00000000-0000-0000-0000-000000000000")
    assert out.code != 0 and out.json["code"] == "NOT_FOUND"


def test_ssh_evidence_reverifies_only_with_this_hosts_trust(store: Any, dispatcher: Any, cli: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from evidence_support import SshKeys

    keys = SshKeys(tmp_path / "keys")
    use_settings(monkeypatch, tmp_path, {"providers.ssh": keys.settings()})
    dispatcher()
    _job, run = run_job(store, payload_message="echo signed", evidence={"provider": "ssh"})
    assert run["evidence_status"] == "attested" and verify_run(store, run["id"]).verified
    other = SshKeys(tmp_path / "other")  # the host now trusts another key only
    use_settings(monkeypatch, tmp_path, {"providers.ssh": other.settings()})
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_SIGNER_UNTRUSTED", check
    use_settings(monkeypatch, tmp_path, {"providers.ssh": keys.settings(trust=False)})
    out = cli("--json", "runs", "evidence", run["id"])
    assert out.code != 0 and out.json["code"] == "EVIDENCE_TRUST_NOT_CONFIGURED", out
    assert run_row(store, run["id"])["status"] == "ok"
