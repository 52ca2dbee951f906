"""The approval gate across real processes: ``kill -9`` while waiting, three PostgreSQL dispatchers, other OS accounts."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, scheduler_cmd, wait_for
from test_dispatcher_process import Proc
from test_file_modes import GROUP, MEMBER, OTHER, OWNER, SITE_PACKAGES, SYSTEM_PYTHON, as_user, shared_dir  # noqa: F401
from test_multihost import Dispatchers

from scheduler.approvals.decisions import list_approvals
from scheduler.core.filemodes import FILE_MODE_ENV
from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store


def pending_ids(store: Any, job_id: str) -> list[str]:
    with store.read() as tx:
        return [a["id"] for a in list_approvals(tx, job_id=job_id) if a["status"] == "pending"]


def cli(db: str, *args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run([*scheduler_cmd(), "--db", db, "--json", *args], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_kill9_while_a_run_awaits_approval_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "scheduler.db"
    marker = tmp_path / "ran"
    store = open_store(db)
    job = add_job(store, payload_message=f"touch:{marker}", approval_required=True)
    enqueue_manual(store, job["id"])
    first = Proc(db, log=tmp_path / "first.log")
    try:
        first.wait_ready()
        (approval_id,) = wait_for(lambda: pending_ids(store, job["id"]), what="gate opened")
        first.kill()
        first.p.wait(10)
    finally:
        first.close()
    assert [r["status"] for r in run_rows(store, job["id"])] == ["awaiting_approval"]
    code, decided = cli(str(db), "approvals", "approve", approval_id, "--note", "after the crash")
    assert code == 0 and decided["approval"]["status"] == "approved"
    time.sleep(0.3)
    assert not marker.exists()  # approved is not executed: no dispatcher runs
    second = Proc(db, log=tmp_path / "second.log")
    try:
        second.wait_ready()
        wait_for(lambda: [r["status"] for r in run_rows(store, job["id"])] == ["ok"], what="approved run after restart")
    finally:
        second.kill(15)
        second.p.wait(20)
        second.close()
    assert marker.read_text().count("\n") == 1
    with store.read() as tx:
        assert [a["status"] for a in list_approvals(tx, job_id=job["id"])] == ["dispatched"]
    store.close()


@pytest.mark.postgres
def test_three_postgres_dispatchers_run_one_approved_run_exactly_once(pg_url: str, tmp_path: Path) -> None:
    store = open_store(pg_url)
    fleet = Dispatchers(pg_url, tmp_path)
    marker = tmp_path / "ran"
    try:
        for _ in range(3):
            fleet.start()
        job = add_job(store, payload_message=f"touch:{marker}", approval_required=True)
        enqueue_manual(store, job["id"])
        (approval_id,) = wait_for(lambda: pending_ids(store, job["id"]), what="one gate")
        code, _ = cli(pg_url, "approvals", "approve", approval_id)
        assert code == 0
        wait_for(lambda: [r["status"] for r in run_rows(store, job["id"])] == ["ok"], timeout=20, what="approved run")
        time.sleep(1.0)  # long enough for a second dispatcher to (wrongly) start it again
        runs = run_rows(store, job["id"])
        assert len(runs) == 1 and marker.read_text().count("\n") == 1
        with store.read() as tx:
            assert tx.scalar("SELECT COUNT(*) FROM approvals WHERE job_id = ?", (job["id"],)) == 1
    finally:
        fleet.stop_all()
        store.close()


def test_a_scoped_gate_refuses_other_local_accounts(shared_dir: Path) -> None:  # noqa: F811 - the fixture imported above
    """The decision is the invoking account's: the owner and ``nobody`` (both with access) are refused; the member decides."""
    env = {FILE_MODE_ENV: "group"}
    db = shared_dir / "team" / "scheduler.db"
    spec = json.dumps({"name": "gated", "schedule_kind": "manual", "payload_message": "true", "approval_required": True,
                       "approval_approver_scope": f"uid:{MEMBER}"})
    assert as_user(OWNER, GROUP, [], db, "jobs", "add", spec, env=env)[0] == 0
    assert as_user(OWNER, GROUP, [], db, "jobs", "run", "gated", env=env)[0] == 0
    code = (f"import site, sys; site.addsitedir({str(SITE_PACKAGES)!r}); "
            "from scheduler.cli.main import main; sys.exit(main(sys.argv[1:]))")

    def switch() -> None:
        os.setgroups([])
        os.setgid(GROUP)
        os.setuid(OWNER)
        os.umask(0o022)

    log = shared_dir / "dispatcher.log"
    with open(log, "wb") as fh:
        dispatcher = subprocess.Popen([str(SYSTEM_PYTHON), "-c", code, "--db", str(db), "run", "--duration", "60s"], stdout=fh,
                                      stderr=subprocess.STDOUT, cwd="/", preexec_fn=switch,  # noqa: PLW1509 - the user switch
                                      env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **env})
    try:
        def pending_gate() -> list[dict[str, Any]]:
            status, listed = as_user(OWNER, GROUP, [], db, "approvals", "list", "--pending", env=env)
            return listed["approvals"] if status == 0 else []

        (gate,) = wait_for(pending_gate, timeout=30, interval=0.2, what=f"gate opened ({log.read_text(errors='replace')[-500:]})")
        for uid, gid, groups in ((OWNER, GROUP, []), (OTHER, OTHER, [GROUP])):  # the owner, then nobody in the group
            status, refused = as_user(uid, gid, groups, db, "approvals", "approve", gate["id"], env={**env, "USER": "member"})
            assert status != 0 and refused["code"] == "APPROVAL_SCOPE_MISMATCH", refused
        status, still = as_user(OWNER, GROUP, [], db, "approvals", "show", gate["id"], env=env)
        assert (still["approval"]["status"], still["approval"]["version"]) == ("pending", 1)
        status, approved = as_user(MEMBER, MEMBER, [GROUP], db, "approvals", "approve", gate["id"], env=env)
        assert status == 0 and approved["approval"]["decided_uid"] == MEMBER, approved

        def finished() -> list[str]:
            status, runs = as_user(OWNER, GROUP, [], db, "runs", "list", env=env)
            return [r["status"] for r in runs["runs"]] if status == 0 else []

        assert wait_for(lambda: finished() == ["ok"] and finished(), timeout=30, interval=0.2, what="approved run") == ["ok"]
    finally:
        dispatcher.terminate()
        dispatcher.wait(30)
