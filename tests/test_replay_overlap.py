"""Issue 30 defect 1: an at-least-once replay is never dropped by the job's overlap policy.

A real ``scheduler run`` subprocess runs a ``* * * * * *`` at-least-once shell job whose
command outlasts its interval, so a slot is always running; it is killed with SIGKILL.
The next dispatcher recovers the interrupted run and creates its replay dispatch while a
newer slot of the job starts. The replay must wait for the overlap to clear (``skip``,
``queue`` with any ``queue_limit``) or run beside it (``allow``), never end ``skipped``,
and every run row of a replay dispatch names the run it replays.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, scheduler_cmd, wait_for

from scheduler.plugins.stores import open_store

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="process groups")]


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """``(url, store)`` on a fresh SQLite file or PostgreSQL schema."""
    url = str(tmp_path / "scheduler.db") if request.param == "sqlite" else request.getfixturevalue("pg_url")
    s = open_store(url)
    yield url, s
    s.close()


def dispatcher(url: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """A ``scheduler run`` subprocess with its output in ``log``."""
    with open(log, "wb") as fh:
        return subprocess.Popen([*scheduler_cmd(), "--db", url, "run", "--lease-ttl", "1500ms", "--grace", "5s", *extra],
                                stdout=fh, stderr=subprocess.STDOUT)


def running(store: Any, job_id: str) -> int:
    """How many runs of the job are running now."""
    with store.read() as tx:
        return int(tx.scalar("SELECT COUNT(*) FROM runs WHERE job_id = ? AND status = 'running'", (job_id,)))


def replay_rows(store: Any, job_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the job's replay dispatches, the runs of those dispatches)."""
    with store.read() as tx:
        dispatches = tx.all("SELECT id, status, source_run_id FROM job_dispatch_queue WHERE job_id = ? AND replay_count > 0",
                            (job_id,))
        runs = tx.all("SELECT id, dispatch_id, status, skip_reason, started_at, replay_of_run_id FROM runs"
                      " WHERE job_id = ? AND dispatch_id LIKE '%:replay:%'", (job_id,))
    return dispatches, runs


@pytest.mark.parametrize(("policy", "queue_limit"), [("skip", None), ("queue", 1), ("queue", 2), ("allow", None)])
def test_replay_after_kill9_waits_for_overlap_and_keeps_lineage(target: Any, tmp_path: Path, policy: str,
                                                                 queue_limit: int | None) -> None:
    url, store = target
    limit = {} if queue_limit is None else {"queue_limit": queue_limit}  # 1 is the smallest queue_limit a spec takes
    job = add_job(store, name="B", executor="shell", schedule_kind="cron", schedule_cron="* * * * * *",
                  delivery_guarantee="at-least-once", max_consecutive_failures=0, max_retries=0,
                  overlap_policy=policy, payload_message="sleep 1.4", **limit)
    first = dispatcher(url, tmp_path / "first.log")
    try:
        wait_for(lambda: "holds lease" in (tmp_path / "first.log").read_text(errors="replace"), timeout=20, what="first ready")
        wait_for(lambda: running(store, job["id"]), timeout=20, what="a running slot")
        time.sleep(1.0)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    second = dispatcher(url, tmp_path / "second.log", "--duration", "8s")
    try:
        second.wait(40)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait(10)
    log = (tmp_path / "second.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-2000:]
    dispatches, runs = replay_rows(store, job["id"])
    assert dispatches, f"no replay was created (the kill did not interrupt a run): {log[-2000:]}"
    by_dispatch: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_dispatch.setdefault(r["dispatch_id"], []).append(r)
    for d in dispatches:
        produced = by_dispatch.get(d["id"], [])
        assert produced, f"replay {d['id']} ({d['status']}) produced no run"
        assert all(r["status"] != "skipped" for r in produced), produced
        assert any(r["started_at"] is not None and r["status"] == "ok" for r in produced), produced
    for r in runs:
        assert r["replay_of_run_id"] is not None, r
    assert {r["replay_of_run_id"] for r in runs} <= {d["source_run_id"] for d in dispatches}


def _replay_of_first_run(store: Any, **spec: Any) -> tuple[Any, dict[str, Any], str, str]:
    """A job with one running run (claimed by lease ``D``) and a replay dispatch of that run due now."""
    from scheduler.base.timeutil import now_ms
    from scheduler.core import lease as leases
    from scheduler.core.queue import claim_and_start, enqueue_manual
    from scheduler.core.transitions import insert_dispatch

    job = add_job(store, delivery_guarantee="at-least-once", payload_message="ok", **spec)
    lease = leases.acquire(store, "dispatcher", "D", 60_000)
    enqueue_manual(store, job["id"])
    [first] = claim_and_start(store, lease, limit=4)
    replay_id = f"{first.dispatch_id}:replay:1"
    now = now_ms()
    with store.transaction() as tx:
        insert_dispatch(tx, id=replay_id, job_id=job["id"], kind="manual", due_at=now, now=now, source_run_id=first.run_id,
                        replay_count=1)
    return lease, job, first.run_id, replay_id


def test_a_pending_replay_waits_under_queue_and_does_not_count_against_queue_limit(store: Any) -> None:
    from scheduler.core.queue import claim_and_start, enqueue_manual

    lease, job, _source, replay_id = _replay_of_first_run(store, overlap_policy="queue", queue_limit=1)
    enqueue_manual(store, job["id"])  # one ordinary slot waits too: with the replay counted, the limit of 1 is passed
    assert claim_and_start(store, lease, limit=4) == []
    with store.read() as tx:
        queued = tx.all("SELECT id, status FROM job_dispatch_queue WHERE job_id = ? AND status = 'pending'", (job["id"],))
        skipped = tx.all("SELECT dispatch_id, skip_reason FROM runs WHERE job_id = ? AND status = 'skipped'", (job["id"],))
    assert skipped == []
    assert len(queued) == 2 and replay_id in {q["id"] for q in queued}


def test_a_replay_skipped_by_a_veto_keeps_its_lineage(store: Any) -> None:
    from scheduler.core.queue import claim_and_start

    lease, _job, source, replay_id = _replay_of_first_run(store, overlap_policy="allow")
    assert claim_and_start(store, lease, limit=4, veto=lambda _job, _kind: "maintenance") == []
    with store.read() as tx:
        row = tx.one("SELECT status, skip_reason, replay_of_run_id FROM runs WHERE dispatch_id = ?", (replay_id,))
    assert row is not None and row["status"] == "skipped" and row["skip_reason"] == "veto: maintenance"
    assert row["replay_of_run_id"] == source
