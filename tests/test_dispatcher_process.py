"""Real dispatcher processes on one SQLite file: kill -9 and restart, two dispatchers, SIGSTOP takeover,
graceful SIGTERM, wake-up from another process's CLI command."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, scheduler_cmd, wait_for

from scheduler.core.processes import group_alive
from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store

TTL = "1500ms"


class Proc:
    """A ``scheduler run`` subprocess with its output in a file."""

    def __init__(self, db: Path | str, *extra: str, log: Path, grace: str = "1s", ttl: str = TTL,
                 env: dict[str, str] | None = None) -> None:
        self.log = log
        self.fh = open(log, "wb")  # noqa: SIM115 - the child's log, open for its life
        self.p = subprocess.Popen([*scheduler_cmd(), "--db", str(db), *extra, "run", "--lease-ttl", ttl, "--grace", grace],
                                  stdout=self.fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        wait_for(lambda: "holds lease" in self.output() or self.p.poll() is not None, timeout=20, what="dispatcher ready")
        assert self.p.poll() is None, self.output()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        self.fh.close()


@pytest.fixture
def procs():
    started: list[Proc] = []
    yield started
    for p in started:
        if p.p.poll() is None:
            os.kill(p.p.pid, signal.SIGCONT)
        p.close()


@pytest.fixture
def sqlite_store(db_path):
    s = open_store(db_path)
    yield s
    s.close()


def start(db_path, procs, tmp_path, *extra: str, **options: Any) -> Proc:
    p = Proc(db_path, *extra, log=tmp_path / f"dispatcher{len(procs)}.log", **options)
    procs.append(p)
    return p


def handle(run):
    """The process identity a run recorded: its executor handle (JSON), or the older pid/pgid columns."""
    raw = run.get("executor_handle")
    if raw:
        return json.loads(raw)
    return {"pid": run["pid"], "pgid": run["pgid"]} if run.get("pgid") else None


def running_with_process(store, job_id):
    rows = [r for r in run_rows(store, job_id) if r["status"] == "running" and handle(r)]
    return rows[0] if rows else None


def test_kill9_mid_run_then_restart_ends_runs_and_replays_per_guarantee(sqlite_store, db_path, tmp_path, procs):
    once, twice = tmp_path / "once.log", tmp_path / "twice.log"
    most = add_job(sqlite_store, name="at-most-once", payload_message=f"touch:{once};spawn:30")
    least = add_job(sqlite_store, name="at-least-once", payload_message=f"touch:{twice};spawn:30", delivery_guarantee="at-least-once")
    # A long lease: the restart must take it over from the dead holder, not merely find it expired (a busy machine is slow).
    a = start(db_path, procs, tmp_path, ttl="60s")
    a.wait_ready()
    enqueue_manual(sqlite_store, most["id"])
    enqueue_manual(sqlite_store, least["id"])
    run_most = wait_for(lambda: running_with_process(sqlite_store, most["id"]), what="process recorded")
    run_least = wait_for(lambda: running_with_process(sqlite_store, least["id"]), what="process recorded")
    a.kill(signal.SIGKILL)
    a.p.wait(10)
    assert group_alive(handle(run_most)["pgid"])  # the orphaned `sleep 30` outlives its dispatcher
    b = start(db_path, procs, tmp_path)
    b.wait_ready()
    crashed = wait_for(lambda: [r for r in run_rows(sqlite_store, most["id"]) if r["status"] == "crashed"], what="crashed")[0]
    assert crashed["id"] == run_most["id"] and crashed["error_code"] == "DISPATCHER_LOST"
    assert f"process {a.p.pid} no longer runs on this host" in crashed["error_message"], crashed["error_message"]
    assert crashed["process_state"] == "terminated" and crashed["terminal_at"]
    wait_for(lambda: [r for r in run_rows(sqlite_store, least["id"]) if r["id"] == run_least["id"] and r["status"] == "crashed"],
             what="second orphan crashed")
    assert not group_alive(handle(run_most)["pgid"]) and not group_alive(handle(run_least)["pgid"])  # confirmed gone
    # at-least-once: replayed by the new dispatcher; at-most-once: never run again
    replay = wait_for(lambda: [r for r in run_rows(sqlite_store, least["id"]) if r["replay_of_run_id"] == run_least["id"]],
                      what="replay")[0]
    assert replay["dispatcher_owner"] != run_least["dispatcher_owner"]
    wait_for(lambda: len(twice.read_text().splitlines()) == 2, what="second execution")
    time.sleep(0.5)
    assert len(once.read_text().splitlines()) == 1
    assert "took over its lease" in b.output()
    with sqlite_store.read() as tx:
        stuck = tx.scalar("SELECT COUNT(*) FROM runs WHERE status = 'running' AND dispatcher_owner = ?", (run_most["dispatcher_owner"],))
    assert stuck == 0


def test_recovery_never_kills_a_reused_pid(sqlite_store, db_path, tmp_path, procs):
    job = add_job(sqlite_store, payload_message="ok")
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with sqlite_store.transaction() as tx:  # a run of a dead dispatcher whose recorded PID now belongs to someone else
            handle = {"pid": bystander.pid, "pgid": bystander.pid, "start_time": "ticks:1", "host": os.uname().nodename}
            tx.execute(
                "INSERT INTO runs(id, job_id, status, created_at, started_at, dispatcher_owner, dispatcher_token, executor,"
                " executor_handle, process_state) VALUES ('orphan', ?, 'running', 1, 1, ?, 1, 'testkit', ?, 'running')",
                (job["id"], f"{os.uname().nodename}:999999:dead", json.dumps(handle)),
            )
        start(db_path, procs, tmp_path).wait_ready()
        wait_for(lambda: run_rows(sqlite_store, job["id"])[0]["status"] == "crashed", what="orphan ended")
        assert bystander.poll() is None  # identity mismatch: left alone
    finally:
        bystander.kill()
        bystander.wait()


def test_second_dispatcher_refused_and_each_slot_runs_once(sqlite_store, db_path, tmp_path, procs):
    marks = tmp_path / "marks.log"
    job = add_job(sqlite_store, schedule_kind="every", schedule_every="1s", payload_message=f"touch:{marks}", overlap_policy="allow")
    a = start(db_path, procs, tmp_path)
    a.wait_ready()
    b = subprocess.run([*scheduler_cmd(), "--db", str(db_path), "--json", "run", "--lease-ttl", TTL], capture_output=True,
                       text=True, timeout=30)
    assert b.returncode != 0
    err = json.loads(b.stdout.strip().splitlines()[-1])
    assert err["ok"] is False and err["code"] == "DISPATCHER_ALREADY_RUNNING"
    wait_for(lambda: marks.exists() and len(marks.read_text().splitlines()) >= 3, timeout=10, what="three slots")
    runs = [r for r in run_rows(sqlite_store, job["id"]) if r["status"] != "skipped"]
    slots = [r["scheduled_for"] for r in runs]
    assert len(slots) == len(set(slots))
    with sqlite_store.read() as tx:
        dispatches = tx.all("SELECT id FROM job_dispatch_queue WHERE job_id = ?", (job["id"],))
    assert len(dispatches) == len({d["id"] for d in dispatches})


def test_sigstop_past_lease_then_resume_commits_nothing(sqlite_store, db_path, tmp_path, procs):
    job = add_job(sqlite_store, payload_message="spawn:30", max_retries=2, retry_backoff_ms=0)
    a = start(db_path, procs, tmp_path)
    a.wait_ready()
    enqueue_manual(sqlite_store, job["id"])
    run = wait_for(lambda: running_with_process(sqlite_store, job["id"]), what="process recorded")
    _stall_outside_a_write(a.p.pid, db_path)
    time.sleep(2.0)  # past the 1.5 s lease
    b = start(db_path, procs, tmp_path)
    b.wait_ready()
    assert "stalled process" in b.output()
    crashed = wait_for(lambda: [r for r in run_rows(sqlite_store, job["id"]) if r["id"] == run["id"] and r["status"] == "crashed"],
                       what="run crashed by the new owner")[0]
    assert f"process {a.p.pid} was still alive" in crashed["error_message"], crashed["error_message"]
    with sqlite_store.read() as tx:
        lease = tx.one("SELECT * FROM dispatcher_leases WHERE name = 'dispatcher'")
    assert lease["token"] > run["dispatcher_token"] and lease["owner"] != run["dispatcher_owner"]
    with sqlite_store.read() as tx:
        events_before = tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE actor = ?", (run["dispatcher_owner"],))
    os.kill(a.p.pid, signal.SIGCONT)
    a.p.wait(20)
    assert a.p.returncode != 0 and "LEASE_LOST" in a.output() + "LEASE LOST"
    after = run_rows(sqlite_store, job["id"])
    same = next(r for r in after if r["id"] == run["id"])
    assert same["status"] == "crashed" and same["finished_at"] == crashed["finished_at"]
    with sqlite_store.read() as tx:
        events_after = tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE actor = ?", (run["dispatcher_owner"],))
        retries_by_a = tx.scalar("SELECT COUNT(*) FROM runs WHERE dispatcher_owner = ? AND id <> ?", (run["dispatcher_owner"], run["id"]))
    assert events_after == events_before and retries_by_a == 0
    assert b.p.poll() is None  # the new owner carries on


def test_sigterm_lets_runs_finish_then_releases_lease(sqlite_store, db_path, tmp_path, procs):
    quick = add_job(sqlite_store, name="quick", payload_message="sleep:0.4")
    slow = add_job(sqlite_store, name="slow", payload_message="sleep:30")
    a = start(db_path, procs, tmp_path, ttl="60s")  # a drain, not a takeover: a stalled renewal must not end it
    a.wait_ready()
    enqueue_manual(sqlite_store, quick["id"])
    enqueue_manual(sqlite_store, slow["id"])
    wait_for(lambda: len([r for j in (quick, slow) for r in run_rows(sqlite_store, j["id"]) if r["status"] == "running"]) == 2,
             what="both running")
    a.kill(signal.SIGTERM)
    assert a.p.wait(20) == 0, a.output()
    assert run_rows(sqlite_store, quick["id"])[0]["status"] == "ok"  # finished within the grace period
    assert run_rows(sqlite_store, slow["id"])[0]["status"] == "cancelled"  # past grace: cancelled, not left running
    with sqlite_store.read() as tx:
        lease = tx.one("SELECT * FROM dispatcher_leases WHERE name = 'dispatcher'")
    assert lease["owner"] is None and lease["token"] >= 1


def test_executor_ignoring_its_deadline_is_cut_loose_and_grace_is_honoured(sqlite_store, db_path, tmp_path, procs):
    """Issue 8: `time.sleep(30)` with `run_timeout_ms: 2000` was recorded `ok` after 30 s, `--grace 1s` took 31 s."""
    job = add_job(sqlite_store, payload_message="ignore-cancel:30", run_timeout_ms=2000)
    # A long lease: this test is about deadlines and grace, and a loaded CI machine once stalled a 1.5 s lease's
    # renewal long enough to lose it during the drain (then nothing is committed and the exit code is LEASE_LOST).
    a = start(db_path, procs, tmp_path, ttl="60s")
    a.wait_ready()
    enqueue_manual(sqlite_store, job["id"])
    # deadline 2 s, cancelled 0.5 s later, abandoned kill grace (2 s) + 1 s after that
    first = wait_for(lambda: [r for r in run_rows(sqlite_store, job["id"]) if r["status"] != "running"], timeout=10,
                     what="run ended by the dispatcher")[0]
    assert first["status"] == "timeout" and first["error_code"] == "EXECUTOR_DEADLINE_EXCEEDED", first
    assert first["duration_ms"] < 7000
    enqueue_manual(sqlite_store, job["id"])
    wait_for(lambda: [r for r in run_rows(sqlite_store, job["id"]) if r["status"] == "running"], what="second run running")
    stopping = time.monotonic()
    a.kill(signal.SIGTERM)
    assert a.p.wait(15) == 0, a.output()
    took = time.monotonic() - stopping
    assert took < 10, f"stop took {took:.1f}s"  # grace 1 s + kill grace 2 s + 1 s slack, never the 30 s sleep
    second = next(r for r in run_rows(sqlite_store, job["id"]) if r["id"] != first["id"])
    assert second["status"] == "cancelled" and second["error_code"] == "EXECUTOR_ABANDONED", second
    with sqlite_store.read() as tx:
        lease = tx.one("SELECT * FROM dispatcher_leases WHERE name = 'dispatcher'")
    assert lease["owner"] is None  # committed its runs, then released the lease
    b = start(db_path, procs, tmp_path)
    b.wait_ready()
    time.sleep(0.3)
    assert "recovered run" not in b.output()  # nothing was left for recovery to guess about
    assert run_rows(sqlite_store, job["id"])[0]["status"] == "timeout"


def test_second_signal_stops_waiting_for_the_grace_period(sqlite_store, db_path, tmp_path, procs):
    job = add_job(sqlite_store, payload_message="ignore-cancel:30")
    a = start(db_path, procs, tmp_path, grace="60s", ttl="60s")  # a drain, not a takeover (see the deadline test)
    a.wait_ready()
    enqueue_manual(sqlite_store, job["id"])
    wait_for(lambda: [r for r in run_rows(sqlite_store, job["id"]) if r["status"] == "running"], what="running")
    stopping = time.monotonic()
    a.kill(signal.SIGINT)
    time.sleep(0.5)
    assert a.p.poll() is None  # first signal: waiting out the grace period
    a.kill(signal.SIGINT)
    assert a.p.wait(10) == 0, a.output()
    assert time.monotonic() - stopping < 10  # kill grace 2 s + 1 s slack after the second signal, not the 60 s grace
    run = run_rows(sqlite_store, job["id"])[0]
    assert run["status"] == "cancelled" and run["error_code"] == "EXECUTOR_ABANDONED"


@pytest.fixture(params=["sqlite", "postgres"])
def target(request, tmp_path):
    """``(url, store)`` on a fresh SQLite file or PostgreSQL schema."""
    url = str(tmp_path / "scheduler.db") if request.param == "sqlite" else request.getfixturevalue("pg_url")
    s = open_store(url)
    yield url, s
    s.close()


def test_finished_run_commits_during_grace_and_survives_kill9_unreplayed(target, tmp_path, procs):
    """Issue 9 defect 2: a run that finished during the grace period was replayed after a kill -9."""
    url, store = target
    marks = tmp_path / "quick.log"
    quick = add_job(store, name="quick", payload_message=f"touch:{marks};sleep:1", delivery_guarantee="at-least-once")
    slow = add_job(store, name="slow", payload_message="sleep:60", delivery_guarantee="at-least-once")
    a = start(url, procs, tmp_path, grace="60s")
    a.wait_ready()
    enqueue_manual(store, quick["id"])
    enqueue_manual(store, slow["id"])
    wait_for(lambda: len([r for j in (quick, slow) for r in run_rows(store, j["id"]) if r["status"] == "running"]) == 2,
             what="both running")
    a.kill(signal.SIGTERM)
    done = wait_for(lambda: [r for r in run_rows(store, quick["id"]) if r["status"] == "ok"], timeout=5,
                    what="the quick run committed while the slow one still runs")[0]
    assert done["duration_ms"] < 3000
    a.kill(signal.SIGKILL)
    a.p.wait(10)
    b = start(url, procs, tmp_path)
    b.wait_ready()
    wait_for(lambda: [r for r in run_rows(store, slow["id"]) if r["status"] == "crashed"], what="slow run recovered")
    time.sleep(1.0)
    runs = run_rows(store, quick["id"])
    assert [(r["id"], r["status"]) for r in runs] == [(done["id"], "ok")]  # not crashed, not replayed
    assert len(marks.read_text().splitlines()) == 1


#: Holds ``BEGIN EXCLUSIVE`` on a SQLite file for a while, like the adversarial run's lock holder.
LOCKER = (
    "import sqlite3, sys, time\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)\n"
    "c.execute('BEGIN EXCLUSIVE')\n"
    "print('locked', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "c.execute('ROLLBACK')\n"
)
#: A short busy timeout, so a lock of a few seconds outlasts it (the default is 10 s).
SHORT_BUSY = {"SCHEDULER_STORAGE_SQLITE_BUSY_TIMEOUT_MS": "300"}


def hold_lock(db_path: Path, seconds: float) -> subprocess.Popen[str]:
    """Start a process holding an exclusive lock on the database; returns once it holds it."""
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db_path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
    return locker


def test_database_locked_past_the_busy_timeout_is_waited_out(sqlite_store, db_path, tmp_path, procs):
    """Issue 9 defect 1: a lock held past the busy timeout crashed the dispatcher (exit 70 / 139), leaving a run running."""
    job = add_job(sqlite_store, payload_message="sleep:1")
    a = start(db_path, procs, tmp_path, ttl="8s", env=SHORT_BUSY)
    a.wait_ready()
    enqueue_manual(sqlite_store, job["id"])
    wait_for(lambda: run_rows(sqlite_store, job["id"]), what="run started")
    locker = hold_lock(db_path, 3.0)  # the run finishes while the database is locked
    try:
        time.sleep(1.5)
        assert a.p.poll() is None, a.output()
        assert run_rows(sqlite_store, job["id"])[0]["status"] == "running"  # its completion is waiting for the lock
    finally:
        locker.wait(10)
    run = wait_for(lambda: [r for r in run_rows(sqlite_store, job["id"]) if r["status"] == "ok"], timeout=5,
                   what="completion committed once the lock is gone")[0]
    assert run["finished_at"] - run["started_at"] >= 1000
    assert a.p.poll() is None and "database busy" in a.output()
    a.kill(signal.SIGTERM)
    assert a.p.wait(20) == 0, a.output()
    assert "Traceback" not in a.output() and "OperationalError" not in a.output()


def test_database_locked_longer_than_the_lease_steps_down_cleanly(sqlite_store, db_path, tmp_path, procs):
    """The lease ran out while the database was locked: step down (LEASE_LOST), commit nothing, never crash."""
    job = add_job(sqlite_store, payload_message="sleep:30")
    a = start(db_path, procs, tmp_path, env=SHORT_BUSY)  # lease TTL 1.5 s
    a.wait_ready()
    enqueue_manual(sqlite_store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(sqlite_store, job["id"]) if r["status"] == "running"], what="running")[0]
    locker = hold_lock(db_path, 4.0)
    try:
        code = a.p.wait(10)  # steps down while the lock is still held
    finally:
        locker.wait(10)
    out = a.output()
    assert code == 1, out  # a coded error: not 70 (INTERNAL_ERROR), not 139 / -11 (segfault)
    assert "LEASE_LOST" in out or "LEASE LOST" in out, out
    assert "Traceback" not in out and "OperationalError" not in out
    assert run_rows(sqlite_store, job["id"])[0]["status"] == "running"  # nothing committed without the lease
    b = start(db_path, procs, tmp_path)
    b.wait_ready()
    crashed = wait_for(lambda: [r for r in run_rows(sqlite_store, job["id"]) if r["status"] == "crashed"], what="recovered")[0]
    assert crashed["id"] == run["id"] and "no longer runs on this host" in crashed["error_message"]


#: Holds an exclusive lock on the lease table of a PostgreSQL schema for a while (statements on it block).
PG_LOCKER = (
    "import sys, time, psycopg\n"
    "from psycopg import sql\n"
    "with psycopg.connect(sys.argv[1]) as c:\n"
    "    c.execute(sql.SQL('LOCK TABLE {}.dispatcher_leases IN ACCESS EXCLUSIVE MODE').format(sql.Identifier(sys.argv[2])))\n"
    "    print('locked', flush=True)\n"
    "    time.sleep(float(sys.argv[3]))\n"
    "    c.rollback()\n"
)


@pytest.mark.postgres
def test_postgres_lock_outlasting_the_lease_steps_down_cleanly(pg_url, tmp_path, procs):
    """On PostgreSQL a blocked renewal just waits; once the lock is gone the expired lease is not renewed: step down."""
    base_url, schema = pg_url.split("?schema=", 1)
    store = open_store(pg_url)
    try:
        job = add_job(store, payload_message="sleep:30")
        a = start(pg_url, procs, tmp_path)  # shared mode, lease TTL 1.5 s
        a.wait_ready()
        enqueue_manual(store, job["id"])
        run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running"], what="running")[0]
        locker = subprocess.Popen([sys.executable, "-c", PG_LOCKER, base_url, schema, "4"], stdout=subprocess.PIPE, text=True)
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        try:
            time.sleep(2.5)  # past the lease while the renewal waits for the lock
            assert a.p.poll() is None, a.output()  # waiting, not crashed
            code = a.p.wait(15)  # the lock goes at 4 s; the lease is not renewed after it ran out
        finally:
            locker.wait(15)
        out = a.output()
        assert code == 1 and "LEASE" in out and "Traceback" not in out, out
        assert run_rows(store, job["id"])[0]["status"] == "running"  # nothing committed without the lease
        b = start(pg_url, procs, tmp_path)
        b.wait_ready()
        crashed = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "crashed"], what="recovered")[0]
        assert crashed["id"] == run["id"] and "no longer runs on this host" in crashed["error_message"]
    finally:
        store.close()


def _flock_held(path: Path) -> bool:
    import fcntl

    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def _stall_outside_a_write(pid: int, db_path: Path) -> None:
    """SIGSTOP ``pid`` at a moment it holds no SQLite write lock (a process stopped inside its write transaction
    blocks every writer on the file for as long as it is stopped: a takeover cannot happen then, by design)."""
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(db_path, timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            probe.close()
    raise AssertionError("the dispatcher never left its write transaction")


def test_pid_file_names_the_lease_holder_after_takeover(sqlite_store, db_path, tmp_path, procs):
    """Issue 9 defect 10: after a takeover the pid file kept the stalled PID, then a refused dispatcher wrote its own."""
    pidfile = Path(f"{db_path}.dispatcher.pid")
    a = start(db_path, procs, tmp_path)
    a.wait_ready()
    assert pidfile.read_text().strip() == str(a.p.pid)
    _stall_outside_a_write(a.p.pid, db_path)
    time.sleep(2.0)  # past the 1.5 s lease
    b = start(db_path, procs, tmp_path)
    b.wait_ready()
    assert "stalled process" in b.output()
    assert pidfile.read_text().strip() == str(b.p.pid)  # the lease holder, although A still holds the flock
    os.kill(a.p.pid, signal.SIGCONT)
    a.p.wait(20)
    assert a.p.returncode != 0
    assert pidfile.read_text().strip() == str(b.p.pid)  # the stepping-down holder leaves it alone
    wait_for(lambda: _flock_held(pidfile), timeout=5, what="the new holder takes the pid-file lock")
    c = subprocess.run([*scheduler_cmd(), "--db", str(db_path), "--json", "run", "--lease-ttl", TTL], capture_output=True,
                       text=True, timeout=30)
    assert json.loads(c.stdout.strip().splitlines()[-1])["code"] == "DISPATCHER_ALREADY_RUNNING"
    assert pidfile.read_text().strip() == str(b.p.pid)  # a refused dispatcher never writes it
    out = subprocess.run([*scheduler_cmd(), "--db", str(db_path), "--json", "status"], capture_output=True, text=True, timeout=30)
    lease = next(row for row in json.loads(out.stdout)["status"]["leases"] if row["name"] == "dispatcher")
    assert lease["pid"] == b.p.pid and lease["live"]
    b.kill(signal.SIGTERM)
    assert b.p.wait(20) == 0
    assert pidfile.read_text().strip() == ""  # a clean stop leaves no PID behind


def test_cli_run_reaches_idle_dispatcher_within_250ms(sqlite_store, db_path, tmp_path, procs):
    job = add_job(sqlite_store, payload_message="ok")
    start(db_path, procs, tmp_path).wait_ready()
    time.sleep(0.5)
    out = subprocess.run([*scheduler_cmd(), "--db", str(db_path), "--json", "jobs", "run", job["id"]], capture_output=True,
                         text=True, timeout=30)
    done = int(time.time() * 1000)
    assert out.returncode == 0, out
    run = wait_for(lambda: run_rows(sqlite_store, job["id"]), what="run")[0]
    assert run["started_at"] - done < 250
    with sqlite_store.read() as tx:
        created = tx.scalar("SELECT created_at FROM job_dispatch_queue WHERE job_id = ?", (job["id"],))
    assert run["started_at"] - created < 250


def test_duration_flag_stops_cleanly(sqlite_store, db_path):
    out = subprocess.run([*scheduler_cmd(), "--db", str(db_path), "--json", "run", "--duration", "500ms"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out
    assert json.loads(out.stdout.strip().splitlines()[-1])["ok"] is True


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("process identity uses /proc")
