"""Post-success verification (audit-only record, error/warn policy, timeout) and watchdog checks."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from scheduler.testing import LocalRunControl

VERIFY_KEYS = {
    "status",
    "exit_code",
    "started_at",
    "finished_at",
    "duration_ms",
    "stdout_bytes",
    "stdout_sha256",
    "stderr_bytes",
    "stderr_sha256",
}


def test_verify_pass_records_hashes_only(run_job, tmp_path: Path) -> None:
    ran = run_job(
        "touch made",
        executor_options={"working_dir": str(tmp_path)},
        verify_shell="test -f made && echo verified-secret-text && echo warn-text >&2",
    )
    r = ran.result
    assert r.status == "ok"
    v = r.verification
    assert set(v) == VERIFY_KEYS
    assert v["status"] == "passed" and v["exit_code"] == 0
    assert v["stdout_bytes"] == len(b"verified-secret-text\n")
    assert v["stdout_sha256"] == hashlib.sha256(b"verified-secret-text\n").hexdigest()
    assert v["stderr_sha256"] == hashlib.sha256(b"warn-text\n").hexdigest()
    assert v["finished_at"] >= v["started_at"] and v["duration_ms"] >= 0
    assert "verified-secret-text" not in repr(r)  # no verification output anywhere in the result
    assert not any(p.name.startswith("verify") for p in ran.request.artifacts_dir.iterdir())
    assert len(ran.control.handles) == 2  # the check's process identity is recorded too


def test_verify_failure_turns_run_into_error(run_job) -> None:
    r = run_job("echo ok", verify_shell="exit 4").result
    assert (r.status, r.error_code) == ("error", "VERIFY_FAILED")
    assert r.verification["status"] == "failed" and r.verification["exit_code"] == 4
    assert r.stdout.excerpt == "ok\n"


def test_verify_failure_warn_keeps_success(run_job) -> None:
    r = run_job("echo ok", verify_shell="exit 4", verify_on_failure="warn").result
    assert r.status == "ok" and r.error_code is None
    assert r.verification["status"] == "failed"
    assert "VERIFY_FAILED" in r.details["verification_warning"]


def test_verify_timeout(run_job) -> None:
    ran = run_job("true", verify_shell="sleep 30", verify_timeout_s=1)
    r = ran.result
    assert (r.status, r.error_code) == ("error", "VERIFY_TIMEOUT")
    assert r.verification["status"] == "timeout"
    assert ran.control.terminations == ["SIGTERM"]
    assert ran.elapsed < 6


def test_verify_not_run_after_failure(run_job, tmp_path: Path) -> None:
    r = run_job("exit 1", executor_options={"working_dir": str(tmp_path)}, verify_shell="touch verified").result
    assert r.error_code == "EXIT_NONZERO" and r.verification is None
    assert not (tmp_path / "verified").exists()


def test_verify_cancelled(run_job) -> None:
    control = LocalRunControl()
    timer = threading.Timer(0.3, control.cancel)
    timer.start()
    try:
        r = run_job("true", control=control, verify_shell="sleep 30").result
    finally:
        timer.cancel()
    assert r.status == "cancelled"
    assert r.verification["status"] == "cancelled"
    assert control.terminations == ["SIGTERM"]


def test_verify_uses_same_env_policy(run_job, monkeypatch) -> None:
    monkeypatch.setenv("HARMLESS", "1")
    r = run_job("true", verify_shell='test -z "$HARMLESS" && test -n "$SCHEDULER_RUN_ID"').result
    assert r.verification["status"] == "passed"


WATCHDOG = {
    "job_type": "watchdog",
    "watchdog_alert_channel": "slack",
    "watchdog_alert_to": "#ops",
    "watchdog_self_destruct": True,
}


def test_watchdog_check_is_reported_like_any_command(run_job) -> None:
    """Whether a failed check alerts is the kernel's decision (completion), not the executor's."""
    r = run_job("echo disk full; exit 2", **WATCHDOG).result
    assert (r.status, r.error_code, r.exit_code) == ("error", "EXIT_NONZERO", 2)
    assert "alert" not in r.details and r.summary == "disk full\n"
    timed_out = run_job("sleep 30", run_timeout_ms=300, **WATCHDOG).result
    assert (timed_out.status, timed_out.error_code) == ("timeout", "RUN_TIMEOUT")
