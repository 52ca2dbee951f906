"""Several real dispatcher processes sharing one PostgreSQL database (skipped where none runs).

Each dispatcher is its own process with its own fenced lease, exactly as on separate hosts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from kernel_testing import add_job, run_rows, scheduler_cmd, wait_for

from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.jobs import create_jobs
from scheduler.core.queue import enqueue_manual
from scheduler.core.spec import validate_spec
from scheduler.plugins.stores import open_store

TTL_MS = 1500


class Dispatchers:
    """Start and stop ``scheduler run --shared`` processes on one database."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url, self.tmp = url, tmp_path
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, concurrency: int = 4) -> subprocess.Popen:
        log = self.tmp / f"dispatcher{len(self.procs)}.log"
        fh = open(log, "wb")  # noqa: SIM115 - the child's log, open for its life
        p = subprocess.Popen(
            [*scheduler_cmd(), "--db", self.url, "run", "--shared", "--lease-ttl", f"{TTL_MS}ms", "--grace", "1s",
             "--concurrency", str(concurrency)],
            stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "SCHEDULER_ARTIFACTS_DIR": str(self.tmp / "artifacts")},
        )
        self.procs.append((p, log))
        wait_for(lambda: "holds lease" in log.read_text(errors="replace") or p.poll() is not None, timeout=20, what="ready")
        assert p.poll() is None, log.read_text()
        return p

    def stop_all(self) -> None:
        for p, _log in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p, _log in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def pg_store(pg_url):
    s = open_store(pg_url)
    yield s
    s.close()


@pytest.fixture
def fleet(pg_url, tmp_path):
    f = Dispatchers(pg_url, tmp_path)
    yield f
    f.stop_all()


def test_three_dispatchers_run_each_of_1000_due_jobs_exactly_once(pg_store, fleet, tmp_path):
    marks = tmp_path / "marks.log"
    for _ in range(3):
        fleet.start()
    due = to_iso(now_ms() + 1500)
    specs = [validate_spec({"name": f"job-{i:04d}", "schedule_kind": "at", "schedule_at": due, "executor": "testkit",
                            "payload_message": f"touch:{marks}"}) for i in range(1000)]
    create_jobs(pg_store, specs)

    def finished() -> int:
        with pg_store.read() as tx:
            return tx.scalar("SELECT COUNT(*) FROM runs WHERE status = 'ok'")

    wait_for(lambda: finished() >= 1000, timeout=120, interval=0.2, what="1000 runs")
    time.sleep(1.0)
    with pg_store.read() as tx:
        per_job = tx.all("SELECT job_id, COUNT(*) AS n FROM runs GROUP BY job_id")
        owners = tx.all("SELECT dispatcher_owner, COUNT(*) AS n FROM runs GROUP BY dispatcher_owner")
        other = tx.scalar("SELECT COUNT(*) FROM runs WHERE status <> 'ok'")
    assert len(per_job) == 1000 and all(r["n"] == 1 for r in per_job)
    assert other == 0
    lines = marks.read_text().splitlines()
    assert len(lines) == 1000 and len(set(lines)) == 1000  # each executed once, by one process
    assert len(owners) >= 2, f"work was not shared: {owners}"


def test_kill9_dispatcher_runs_recovered_by_another_within_ttl(pg_store, fleet, tmp_path):
    marks = tmp_path / "marks.log"
    victim = fleet.start(concurrency=8)
    jobs = [add_job(pg_store, name=f"long-{i}", payload_message=f"touch:{marks};spawn:30",
                    delivery_guarantee="at-least-once" if i % 2 else "at-most-once") for i in range(4)]
    for j in jobs:
        enqueue_manual(pg_store, j["id"])
    wait_for(lambda: all(any(r["status"] == "running" and r["executor_handle"] for r in run_rows(pg_store, j["id"])) for j in jobs),
             what="all running on the victim")
    survivor = fleet.start(concurrency=8)
    victim_runs = {j["id"]: run_rows(pg_store, j["id"])[0] for j in jobs}
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = time.monotonic()

    def all_crashed() -> bool:
        return all(run_rows(pg_store, j["id"])[0]["status"] == "crashed" for j in jobs)

    wait_for(all_crashed, timeout=TTL_MS / 1000 + 5, what="victim's runs recovered")
    took = time.monotonic() - killed_at
    assert took <= TTL_MS / 1000 + 2.5, f"recovery took {took:.2f}s"
    replayed = [j for j in jobs if j["delivery_guarantee"] == "at-least-once"]
    wait_for(lambda: all(len(run_rows(pg_store, j["id"])) == 2 for j in replayed), what="replays started")
    time.sleep(0.5)
    for j in jobs:
        runs = run_rows(pg_store, j["id"])
        assert runs[0]["error_code"] == "DISPATCHER_LOST" and runs[0]["process_state"] in ("terminated", "gone")
        replays = [r for r in runs[1:] if r["replay_of_run_id"] == victim_runs[j["id"]]["id"]]
        if j["delivery_guarantee"] == "at-least-once":
            assert len(replays) == 1 and replays[0]["dispatcher_owner"] != victim_runs[j["id"]]["dispatcher_owner"]
        else:
            assert runs[1:] == []  # at-most-once: never run twice
    assert survivor.poll() is None


def test_sigstopped_dispatcher_resumed_after_takeover_commits_nothing(pg_store, fleet, tmp_path):
    stale = fleet.start()
    job = add_job(pg_store, name="held", payload_message="spawn:30", max_retries=3, retry_backoff_ms=0)
    enqueue_manual(pg_store, job["id"])
    run = wait_for(lambda: next((r for r in run_rows(pg_store, job["id"]) if r["status"] == "running" and r["executor_handle"]), None),
                   what="running")
    fleet.start()
    os.kill(stale.pid, signal.SIGSTOP)
    wait_for(lambda: run_rows(pg_store, job["id"])[0]["status"] == "crashed", timeout=TTL_MS / 1000 + 6, what="taken over")
    with pg_store.read() as tx:
        lease = tx.one("SELECT * FROM dispatcher_leases WHERE name = ?", (f"dispatcher:{run['dispatcher_owner']}",))
        before = tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE actor = ?", (run["dispatcher_owner"],))
    assert lease["owner"] is None and lease["token"] > run["dispatcher_token"]  # fenced out
    os.kill(stale.pid, signal.SIGCONT)
    assert stale.wait(20) != 0  # it learns it lost its lease and stops
    with pg_store.read() as tx:
        after = tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE actor = ?", (run["dispatcher_owner"],))
        by_stale = tx.scalar("SELECT COUNT(*) FROM runs WHERE dispatcher_owner = ? AND id <> ?", (run["dispatcher_owner"], run["id"]))
    assert after == before and by_stale == 0
    assert run_rows(pg_store, job["id"])[0]["status"] == "crashed"


def test_cli_change_reaches_idle_dispatcher_within_100ms(pg_store, pg_url, fleet):
    fleet.start()
    job = add_job(pg_store, name="wake", payload_message="ok")
    time.sleep(0.5)
    out = subprocess.run([*scheduler_cmd(), "--db", pg_url, "jobs", "run", job["id"]], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out
    run = wait_for(lambda: run_rows(pg_store, job["id"]), what="run")[0]
    with pg_store.read() as tx:
        created = tx.scalar("SELECT created_at FROM job_dispatch_queue WHERE job_id = ?", (job["id"],))
    assert run["started_at"] - created < 100, f"{run['started_at'] - created} ms"
