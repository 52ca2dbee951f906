"""Credential cleanup failures in ``status``, ``status --check`` and ``doctor``, their retry by the recovery sweep, and
the partial indexes those reads use; on SQLite and PostgreSQL.

A real shell run presents a file credential through a real dispatcher; its presentation is then put in the state
the kernel leaves when it cannot remove a file (``failed``, ``CREDENTIAL_CLEANUP_FAILED: ...``, the run's private
directory still on disk), which a test cannot provoke for real as root. A run ``recovery_blocked`` on a credential
cleanup is written the way recovery writes it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from kernel_testing import add_job, run_job_once


def _finished_run_with_a_file(store: Any, dispatcher: Any, cred_dir: Path) -> dict[str, Any]:
    job = add_job(store, executor="shell", payload_message='test -s "$CREDENTIAL_KEYFILE_FILE"',
                  credentials=[{"name": "keyfile", "provider": "env", "ref": "HEALTH_CRED_SRC", "present": {"medium": "file"}}])
    run = run_job_once(store, dispatcher, job)
    assert run["status"] == "ok", run
    return run


def _leave_behind(store: Any, run: dict[str, Any], cred_dir: Path) -> Path:
    """What ``_Presentation._mark_rows`` records when a file could not be removed, with the file still there."""
    directory = cred_dir / f"scheduler-cred-{run['id']}"
    directory.mkdir(mode=0o700)
    (directory / "keyfile").write_text("left over")
    with store.transaction() as tx:
        tx.execute("UPDATE credential_presentations SET status = 'failed', last_error = ? WHERE run_id = ?",
                   (f"CREDENTIAL_CLEANUP_FAILED: cannot remove {directory}/keyfile: Operation not permitted", run["id"]))
    return directory


def test_a_failed_cleanup_fails_status_check_and_doctor_until_the_sweep_cleans_it(
        store: Any, dispatcher: Any, cli: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from scheduler.pipeline.credentials.step import DIR_ENV, sweep_presentations

    cred_dir = tmp_path / "cred"
    cred_dir.mkdir()
    monkeypatch.setenv(DIR_ENV, str(cred_dir))
    monkeypatch.setenv("HEALTH_CRED_SRC", "health-" + uuid.uuid4().hex)
    run = _finished_run_with_a_file(store, dispatcher, cred_dir)
    status = cli("--json", "status").json["status"]
    assert status["credentials"] == {"cleanup_failed": 0, "runs_blocked": []}
    doctor = cli("--json", "doctor")
    checks = {c["check"]: c for c in (doctor.json.get("checks") or doctor.json.get("details"))}
    assert checks["credentials"]["ok"] is True

    directory = _leave_behind(store, run, cred_dir)
    status = cli("--json", "status").json["status"]
    assert status["credentials"] == {"cleanup_failed": 1, "runs_blocked": []}
    # (no dispatcher now: its recovery pass would retry the cleanup at once; "dispatcher" is the other reason)
    reasons = cli("--json", "status", "--check").json
    assert reasons["code"] == "HEALTH_CHECK_FAILED"
    assert [(r["check"], r.get("count")) for r in reasons["details"]] == [("dispatcher", None), ("credentials", 1)]
    out = cli("status", "--check")
    assert out.code == 1 and "1 credential presentation(s) not cleaned up" in out.err
    doctor = cli("--json", "doctor")
    assert doctor.code != 0 and doctor.json["code"] == "UNHEALTHY"
    failing = {c["check"]: c for c in doctor.json["details"]}
    assert failing["credentials"]["ok"] is False and "1 presentation(s) failed cleanup" in failing["credentials"]["detail"]
    human = cli("status")
    assert "credential cleanup" in human.out and "1 failed" in human.out

    assert run["id"] in sweep_presentations(store)  # the cause is gone now (root can remove it): the sweep retries
    assert not directory.exists()
    with store.read() as tx:
        (row,) = tx.all("SELECT status, cleaned_at FROM credential_presentations WHERE run_id = ?", (run["id"],))
    assert row["status"] == "recovery_cleaned" and row["cleaned_at"]
    assert cli("--json", "status").json["status"]["credentials"] == {"cleanup_failed": 0, "runs_blocked": []}


def test_a_run_blocked_on_credential_cleanup_is_named(store: Any, dispatcher: Any, cli: Any) -> None:
    job = add_job(store, name="blocked", payload_message="ok")
    now = int(time.time() * 1000)
    cred_run, other_run = str(uuid.uuid4()), str(uuid.uuid4())
    with store.transaction() as tx:  # as recovery leaves them (transitions.block_recovery)
        for run_id, message in ((cred_run, "CREDENTIAL_CLEANUP_FAILED: /tmp/scheduler-cred-x is on host elsewhere.invalid"),
                                (other_run, "process group still alive and cannot be signalled")):
            tx.execute("INSERT INTO runs (id, job_id, status, attempt, created_at, started_at, error_code, error_message)"
                       " VALUES (?, ?, 'recovery_blocked', 1, ?, ?, 'RECOVERY_BLOCKED', ?)", (run_id, job["id"], now, now, message))
    assert cli("--json", "status").json["status"]["credentials"] == {"cleanup_failed": 0, "runs_blocked": [cred_run]}
    dispatcher()
    reasons = {r["check"]: r for r in cli("--json", "status", "--check").json["details"]}
    assert set(reasons) == {"recovery_blocked", "credentials"}
    assert reasons["credentials"]["runs"] == [cred_run] and sorted(reasons["recovery_blocked"]["runs"]) == sorted(
        [cred_run, other_run])
    failing = {c["check"]: c for c in cli("--json", "doctor").json["details"]}
    assert failing["credentials"]["ok"] is False and "1 run(s) blocked" in failing["credentials"]["detail"]


def test_the_sweep_reads_use_partial_indexes(store: Any) -> None:
    with store.read() as tx:
        if store.dialect == "sqlite":
            sweep = ("SELECT DISTINCT r.id FROM credential_presentations p JOIN runs r ON r.id = p.run_id"
                     " WHERE p.status = '{}' AND r.status IN ('ok', 'error')")
            for query, index in ((sweep.format("materialized"), "credential_presentations_materialized_idx"),
                                 (sweep.format("failed"), "credential_presentations_failed_idx"),
                                 ("SELECT COUNT(*) FROM credential_presentations WHERE status = 'failed'",
                                  "credential_presentations_failed_idx")):
                plan = " ".join(str(dict(r)) for r in tx.all("EXPLAIN QUERY PLAN " + query))
                assert index in plan, (query, plan)
            rows = tx.all("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'credential_presentations'")
            defs = {r["name"]: r["sql"] for r in rows}
        else:
            rows = tx.all("SELECT indexname AS name, indexdef AS sql FROM pg_indexes WHERE tablename = 'credential_presentations'"
                          " AND schemaname = current_schema()")
            defs = {r["name"]: r["sql"] for r in rows}
    assert "status = 'materialized'" in defs["credential_presentations_materialized_idx"].replace("(", "").replace(")", "") \
        .replace("::text", "")
    assert "status = 'failed'" in defs["credential_presentations_failed_idx"].replace("(", "").replace(")", "").replace("::text", "")
