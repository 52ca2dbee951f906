"""The shell executor end to end: a real ``scheduler run`` process, real shell jobs, the CLI reading the results.

Also: with the distribution switched off (``SCHEDULER_DISABLE_PLUGINS=executors:shell``,
which the loader treats exactly like "not installed"), the kernel still works and a
shell job's run fails with ``EXECUTOR_NOT_AVAILABLE`` instead of a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCHEDULER = [sys.executable, "-m", "scheduler"]


def cli(db: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> dict:
    out = subprocess.run([*SCHEDULER, "--db", str(db), "--json", *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})})
    assert "Traceback" not in out.stdout + out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    if check:
        assert out.returncode == 0 and data["ok"], out
    return data


def dispatch(db: Path, seconds: str, env: dict[str, str] | None = None) -> None:
    out = subprocess.run([*SCHEDULER, "--db", str(db), "run", "--duration", seconds, "--lease-ttl", "2s"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def runs_of(db: Path, name: str) -> list[dict]:
    return cli(db, "runs", "list", name)["runs"]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "scheduler.db"


def test_shell_jobs_run_through_the_dispatcher(db: Path, tmp_path: Path) -> None:
    big = 300_000  # above the 64 KiB offload threshold
    cli(db, "jobs", "add", json.dumps([
        {"name": "hello", "schedule_kind": "manual", "payload_message": "echo hello; echo oops >&2"},
        {"name": "big", "schedule_kind": "manual", "payload_message": f"head -c {big} /dev/zero | tr '\\0' x"},
        {"name": "json", "schedule_kind": "manual", "payload_message": "echo '{\"a\": [1, 2]}'", "output_format": "json",
         "verify_shell": "true"},
        {"name": "fails", "schedule_kind": "manual", "payload_message": "exit 3"},
    ]))
    for name in ("hello", "big", "json", "fails"):
        cli(db, "jobs", "run", name)
    dispatch(db, "4s")
    hello = cli(db, "runs", "get", runs_of(db, "hello")[0]["id"])["run"]
    assert hello["status"] == "ok" and hello["exit_code"] == 0
    handle = hello["executor_handle"]
    assert handle["pid"] and handle["pgid"] == handle["pid"] and handle["start_time"].startswith("ticks:")
    assert hello["process_state"] == "exited"  # final on a finished run, never "running"
    assert hello["stdout_sha256"] == hashlib.sha256(b"hello\n").hexdigest() and hello["stderr_bytes"] == 5
    out = subprocess.run([*SCHEDULER, "--db", str(db), "runs", "output", hello["id"], "stderr"], capture_output=True, timeout=30)
    assert out.stdout == b"oops\n"

    big_run = cli(db, "runs", "get", runs_of(db, "big")[0]["id"])["run"]
    assert big_run["stdout_bytes"] == big and big_run["stdout_artifact"]
    full = subprocess.run([*SCHEDULER, "--db", str(db), "runs", "output", big_run["id"]], capture_output=True, timeout=30)
    assert full.returncode == 0 and full.stdout == b"x" * big
    artifact = db.parent / "artifacts" / big_run["stdout_artifact"]
    artifact.write_bytes(b"x" * (big - 1) + b"y")  # tamper with the offloaded stream
    refused = cli(db, "runs", "output", big_run["id"], check=False)
    assert refused["ok"] is False and refused["code"] == "ARTIFACT_TAMPERED"

    js = cli(db, "runs", "get", runs_of(db, "json")[0]["id"])["run"]
    assert js["output_valid"] is True and js["output_parsed"] == {"a": [1, 2]} and js["verify_status"] == "passed"
    fails = runs_of(db, "fails")[0]
    assert fails["status"] == "error" and fails["exit_code"] == 3 and fails["error_code"] == "EXIT_NONZERO"


def test_kernel_without_the_shell_executor_gives_a_coded_error(db: Path) -> None:
    off = {"SCHEDULER_DISABLE_PLUGINS": "executors:shell"}
    refused = cli(db, "jobs", "add", json.dumps({"name": "hello", "schedule_kind": "manual", "payload_message": "echo hi"}),
                  env=off, check=False)
    assert refused["code"] == "EXECUTOR_NOT_AVAILABLE"  # one rule for missing plugins
    cli(db, "jobs", "add", "--allow-missing-plugins",
        json.dumps({"name": "hello", "schedule_kind": "manual", "payload_message": "echo hi"}), env=off)
    cli(db, "jobs", "run", "hello", env=off)
    listed = cli(db, "plugins", "list", env=off)["plugins"]
    assert [p["status"] for p in listed if p["name"] == "shell" and p["group"] == "scheduler.executors"] == ["disabled"]
    dispatch(db, "1500ms", env=off)
    run = runs_of(db, "hello")[0]
    assert run["status"] == "error" and run["error_code"] == "EXECUTOR_NOT_AVAILABLE"
    assert cli(db, "status", env=off)["status"]["runs"] == {"error": 1}


def test_cancel_a_running_shell_job_kills_its_group(db: Path, tmp_path: Path) -> None:
    cli(db, "jobs", "add", json.dumps({"name": "long", "schedule_kind": "manual", "payload_message": "sh -c 'sleep 100 & sleep 100'"}))
    cli(db, "jobs", "run", "long")
    proc = subprocess.Popen([*SCHEDULER, "--db", str(db), "run", "--lease-ttl", "2s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            runs = runs_of(db, "long")
            if runs and runs[0]["status"] == "running" and cli(db, "runs", "get", runs[0]["id"])["run"]["executor_handle"]:
                break
            time.sleep(0.1)
        run = cli(db, "runs", "get", runs_of(db, "long")[0]["id"])["run"]
        pgid = run["executor_handle"]["pgid"]
        assert pgid
        cli(db, "runs", "cancel", run["id"], "--reason", "enough")
        while time.monotonic() < deadline and runs_of(db, "long")[0]["status"] == "running":
            time.sleep(0.1)
        done = cli(db, "runs", "get", run["id"])["run"]
        assert done["status"] == "cancelled" and done["cancel_reason"] == "enough" and done["process_state"] == "terminated"
        from scheduler_toolkit.process import group_alive

        assert not group_alive(pgid)
    finally:
        proc.terminate()
        proc.wait(30)
