"""Issue 29 defect 6: a post-success verification (``verify_shell``) cut short leaves ``runs.verify_status`` saying so.

When the dispatcher ends a run while its ``verify_shell`` check is still running (``kill -9`` of
``scheduler run`` and the recovery that follows; a check that ignores cancellation past the run's
deadline, so its worker is abandoned), the run's evidence row is ``interrupted`` and the run's
``verify_status`` is ``interrupted`` too (it used to stay NULL). ``runs get`` and ``runs evidence``
say it; the evidence payload binds it. Real ``scheduler`` processes, the real shell executor, both stores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import run_rows, scheduler_cmd, wait_for

JOB = {"schedule_kind": "manual", "executor": "shell", "payload_message": "true", "evidence": {"provider": "checksum"}}


def cli(db: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``scheduler --db DB --json ARGS`` in a real process."""
    return subprocess.run([*scheduler_cmd(), "--db", db, "--json", *args], capture_output=True, timeout=120,
                          env={**os.environ, **(env or {})})


def answer(res: subprocess.CompletedProcess) -> dict[str, Any]:
    """The last JSON line a command printed (its answer or its error object), with no traceback."""
    assert b"Traceback" not in res.stderr, res.stderr[-2000:]
    doc: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    return doc


def assert_interrupted_verification(db: str, run_id: str, code: str) -> None:
    """``runs get`` and ``runs evidence`` both say the verification was interrupted."""
    shown = cli(db, "runs", "get", run_id)
    assert shown.returncode == 0, shown.stderr[-2000:]
    run = answer(shown)["run"]
    assert run["verify_status"] == "interrupted", run
    assert run["verification"] == {"status": "interrupted"}, run
    evidence = cli(db, "runs", "evidence", run_id)
    doc = answer(evidence)
    assert evidence.returncode != 0 and doc["code"] == "EVIDENCE_NOT_VERIFIED", doc
    assert doc["details"]["status"] == "interrupted", doc
    assert doc["details"]["details"] == {"record_error_code": code, "verify_status": "interrupted"}, doc


def verifying(store: Any, job_id: str) -> list[dict[str, Any]]:
    """The job's running runs whose recorded handle is the verification check's process."""
    return [r for r in run_rows(store, job_id)
            if r["status"] == "running" and r["executor_handle"] and json.loads(r["executor_handle"]).get("step") == "verify"]


def test_kill9_during_verification_leaves_verify_status_interrupted(store: Any, store_url: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    added = cli(store_url, "jobs", "add", json.dumps({"name": "checked", **JOB, "verify_shell": "sleep 30"}))
    assert added.returncode == 0, added.stdout[-2000:]
    job_id = answer(added)["job"]["id"]
    assert cli(store_url, "jobs", "run", "checked").returncode == 0
    log = open(tmp_path / "dispatcher.log", "wb")  # noqa: SIM115 - the child's log, open for its life
    proc = subprocess.Popen([*scheduler_cmd(), "--db", store_url, "run", "--lease-ttl", "1500ms"],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        (run,) = wait_for(lambda: verifying(store, job_id), timeout=30, what="the verification check running")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    # PostgreSQL: recovery waits for the dead dispatcher's lease to expire (1.5 s), then runs every 0.5 s.
    recovered = subprocess.run([*scheduler_cmd(), "--db", store_url, "run", "--lease-ttl", "1500ms", "--duration", "5s"],
                               capture_output=True, timeout=120)
    assert recovered.returncode == 0, recovered.stderr[-2000:]
    (after,) = run_rows(store, job_id)
    assert after["status"] == "crashed" and after["evidence_status"] == "interrupted", after
    assert_interrupted_verification(store_url, run["id"], "INTERRUPTED")
    with store.read() as tx:
        payload = json.loads(tx.one("SELECT canonical_payload FROM evidence_records WHERE run_id = ?",
                                    (run["id"],))["canonical_payload"])
    assert payload["verification"] == {"status": "interrupted", "record": {"status": "interrupted"}}, payload


def test_a_verification_abandoned_past_the_deadline_leaves_verify_status_interrupted(
        store: Any, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    # The check ignores SIGTERM and the shell waits 30 s before SIGKILL, so the dispatcher (kill grace 0.2 s)
    # abandons the worker past the run's deadline and ends the run itself.
    env = {"SCHEDULER_DISPATCHER_KILL_GRACE_S": "0.2", "SCHEDULER_EXECUTORS_SHELL_KILL_GRACE_S": "30"}
    monkeypatch.setenv("SCHEDULER_DISPATCHER_KILL_GRACE_S", "0.2")
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_KILL_GRACE_S", "30")
    spec = {"name": "stuck", **JOB, "run_timeout_ms": 1500, "verify_shell": "trap '' TERM; sleep 20"}
    added = cli(store_url, "jobs", "add", json.dumps(spec), env=env)
    assert added.returncode == 0, added.stdout[-2000:]
    job_id = answer(added)["job"]["id"]
    assert cli(store_url, "jobs", "run", "stuck", env=env).returncode == 0
    ran = subprocess.run([*scheduler_cmd(), "--db", store_url, "run", "--duration", "6s"], capture_output=True,
                         timeout=120, env={**os.environ, **env})
    assert ran.returncode == 0, ran.stderr[-2000:]
    (run,) = run_rows(store, job_id)
    assert run["status"] == "timeout" and run["error_code"] == "EXECUTOR_DEADLINE_EXCEEDED", run
    assert run["evidence_status"] == "interrupted", run
    assert_interrupted_verification(store_url, run["id"], "EXECUTOR_DEADLINE_EXCEEDED")


def test_a_check_that_finished_keeps_its_own_status(store: Any, store_url: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    assert cli(store_url, "jobs", "add", json.dumps({"name": "fine", **JOB, "verify_shell": "true"})).returncode == 0
    assert cli(store_url, "jobs", "run", "fine").returncode == 0
    ran = subprocess.run([*scheduler_cmd(), "--db", store_url, "run", "--duration", "3s"], capture_output=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    run = answer(cli(store_url, "runs", "list", "fine"))["runs"][0]
    assert run["status"] == "ok" and run["verify_status"] == "passed", run
    assert answer(cli(store_url, "runs", "evidence", run["id"]))["verified"] is True
