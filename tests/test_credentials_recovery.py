"""Recovery of credential presentations after a real ``kill -9`` of ``scheduler run``, on SQLite and PostgreSQL.

A run with a file, an env and a stdin credential is running ``sleep 60`` when its
dispatcher is killed; the next dispatcher's recovery removes the file and its private
directory and marks every row ``recovery_cleaned``. When cleanup cannot be proven (the
file is on another host), the run becomes ``recovery_blocked`` and its job is paused with
the reason, and the file is left for the operator.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from kernel_testing import add_job, run_rows, wait_for
from test_dispatcher_process import Proc

from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store

SECRET = "rc-" + "9f8e7d6c5b4a"


def _bindings() -> list[dict[str, Any]]:
    return [{"name": "keyfile", "provider": "env", "ref": "CRED_SRC", "present": {"medium": "file"}},
            {"name": "tok", "provider": "env", "ref": "CRED_SRC", "present": {"medium": "env", "key": "API_TOKEN"}},
            {"name": "pipe", "provider": "env", "ref": "CRED_SRC", "present": {"medium": "stdin"}}]


def _killed_mid_run(store_url: str, tmp_path: Path) -> tuple[Any, dict[str, Any], dict[str, str], Path]:
    """A job whose run is running with its credential file when its dispatcher is killed with SIGKILL."""
    cred_dir = tmp_path / "cred"
    cred_dir.mkdir()
    env = {"CRED_SRC": SECRET, "SCHEDULER_CREDENTIALS_DIR": str(cred_dir), "SCHEDULER_ARTIFACTS_DIR": str(tmp_path / "art")}
    store = open_store(store_url)
    job = add_job(store, executor="shell", payload_message="sleep 60", credentials=_bindings())
    first = Proc(store_url, log=tmp_path / "first.log", env=env)
    try:
        first.wait_ready()
        enqueue_manual(store, job["id"])
        run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running" and r["executor_handle"]]
                       and any(cred_dir.iterdir()) and run_rows(store, job["id"])[0], timeout=30, what="the running run")
        first.kill(signal.SIGKILL)
        first.p.wait(10)
    finally:
        first.close()
    return store, run, env, cred_dir


def _presentations(store: Any, run_id: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT * FROM credential_presentations WHERE run_id = ? ORDER BY binding_name", (run_id,))


def _kill_group(run: dict[str, Any]) -> None:
    handle = json.loads(run["executor_handle"])
    try:
        os.killpg(int(handle["pgid"]), signal.SIGKILL)
    except (ProcessLookupError, KeyError, PermissionError):
        pass


def test_recovery_after_kill_9_removes_the_file_and_marks_the_rows(store_url: str, tmp_path: Path) -> None:
    store, run, env, cred_dir = _killed_mid_run(store_url, tmp_path)
    try:
        (directory,) = list(cred_dir.iterdir())
        assert (directory / "keyfile").exists()
        assert {r["status"] for r in _presentations(store, run["id"])} == {"materialized"}
        second = Proc(store_url, log=tmp_path / "second.log", env=env)
        try:
            second.wait_ready()
            wait_for(lambda: run_rows(store, run["job_id"])[0]["status"] == "crashed", timeout=30, what="recovery")
        finally:
            second.kill(signal.SIGTERM)
            second.p.wait(20)
            second.close()
        rows = _presentations(store, run["id"])
        assert [(r["binding_name"], r["status"]) for r in rows] == [
            ("keyfile", "recovery_cleaned"), ("pipe", "recovery_cleaned"), ("tok", "recovery_cleaned")]
        assert all(r["cleaned_at"] for r in rows)
        assert not directory.exists() and list(cred_dir.iterdir()) == []
    finally:
        _kill_group(run)
        store.close()


def test_unprovable_cleanup_blocks_the_run_and_pauses_the_job(store_url: str, tmp_path: Path) -> None:
    store, run, env, cred_dir = _killed_mid_run(store_url, tmp_path)
    try:
        # the dead dispatcher ran on another host: its files cannot be removed (nor proven removed) from here
        with store.transaction() as tx:
            tx.execute("UPDATE runs SET dispatcher_owner = ? WHERE id = ?", (f"elsewhere.invalid:{os.getpid()}:dead", run["id"]))
        second = Proc(store_url, log=tmp_path / "second.log", env=env)
        try:
            second.wait_ready()
            blocked = wait_for(lambda: [r for r in run_rows(store, run["job_id"]) if r["status"] == "recovery_blocked"],
                               timeout=30, what=f"the blocked run ({second.output()[-300:]})")[0]
        finally:
            second.kill(signal.SIGTERM)
            second.p.wait(20)
            second.close()
        assert blocked["error_code"] == "RECOVERY_BLOCKED" and "CREDENTIAL_CLEANUP_FAILED" in blocked["error_message"]
        assert "elsewhere.invalid" in blocked["error_message"]
        with store.read() as tx:
            job = tx.one("SELECT enabled, paused_reason FROM jobs WHERE id = ?", (run["job_id"],))
        assert job["enabled"] in (0, False) and "CREDENTIAL_CLEANUP_FAILED" in job["paused_reason"]
        rows = {r["binding_name"]: r for r in _presentations(store, run["id"])}
        assert rows["keyfile"]["status"] == "failed" and "CREDENTIAL_CLEANUP_FAILED" in rows["keyfile"]["last_error"]
        assert any(cred_dir.iterdir())  # left for the operator: nothing claimed it was removed
    finally:
        _kill_group(run)
        for d in cred_dir.iterdir():
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
        store.close()
