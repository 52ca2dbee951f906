"""Figure 1: no-op jobs dispatched and completed per second, beside a raw SQLite loop.

Workload: N one-shot (``at``) jobs, all due now, testkit payload ``ok`` (returns at
once), one dispatcher with ``concurrency=4``. The clock starts when the dispatcher
thread starts (lease, recovery and first wake-up included) and stops at the last
run's ``finished_at``; the main thread polls the database until every run is
terminal.

Baseline: a single-threaded raw ``sqlite3`` loop on the kernel's own schema (same
tables, indexes and triggers, WAL, the same ``synchronous`` setting) that performs
the row writes the kernel performs for each run, grouped into commits the way the
kernel groups them (read from ``scheduler/core/queue.py`` and ``scheduler/core/completion.py``):

* materialise: ``UPDATE jobs`` (next run) + ``INSERT job_dispatch_queue``: the kernel
  does up to 200 slots per transaction (``materialize_due(limit=200)``);
* claim and start: ``UPDATE job_dispatch_queue`` (claimed) + ``INSERT runs`` +
  ``INSERT runtime_events``: one transaction per claim batch (at most the free
  worker slots, usually 1 once the pool is busy);
* completion: ``UPDATE runs`` + ``UPDATE job_dispatch_queue`` + ``INSERT runtime_events``
  + ``UPDATE jobs`` (counters): one transaction per run.

So the "kernel-shaped" loop commits 2 + 1/200 times per job: that is the limit the
goal is measured against. A second loop with 3 commits per job (every phase its own
transaction, as when slots fall due one at a time) is shown for reference.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    REPO_ROOT,
    Context,
    CountingStore,
    at_job_specs,
    bench_env,
    count_terminal,
    dispatcher_thread,
    fmt,
    fresh_db,
    kernel_schema_db,
    md_table,
    median,
    pyplot,
    ratio,
    save_plot,
    sqlite_synchronous,
    verdict,
)

NAME = "throughput"
TITLE = "1. Throughput: no-op jobs vs. raw SQLite commit loop"
GOAL_RATIO = 0.5
CONCURRENCY = 4
MATERIALISE_BATCH = 200


def params(ctx: Context) -> dict[str, Any]:
    return {"jobs": 400 if ctx.quick else 2000, "reps": 1 if ctx.quick else 3, "concurrency": CONCURRENCY}


# -- the kernel ------------------------------------------------------------------------------------


def run_kernel(ctx: Context, directory: Path, jobs: int, *, tag: str, timeout_s: float = 180.0) -> dict[str, Any]:
    """N due no-op jobs through a real ``Dispatcher``; returns jobs/s and what the run looked like."""
    from scheduler.base.timeutil import now_ms
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.jobs import create_jobs
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    path = fresh_db(directory, f"kernel-{tag}.db")
    store = open_store(str(path))
    create_jobs(store, at_job_specs(jobs, at_ms=now_ms()))
    counter = CountingStore(store)
    dispatcher = Dispatcher(
        store, DispatcherConfig(concurrency=CONCURRENCY, lease_ttl_ms=15_000, artifacts_root=directory / f"artifacts-{tag}"),
        say=None,
    )
    poll = sqlite3.connect(str(path))
    thread, failure = dispatcher_thread(dispatcher, duration_s=timeout_s, name="bench-dispatcher")
    start_ms = now_ms()
    start = time.perf_counter()
    cpu_start = time.process_time()
    thread.start()
    done = 0
    while thread.is_alive() and time.perf_counter() - start < timeout_s:
        done = count_terminal(poll)
        if done >= jobs:
            break
        time.sleep(0.01)
    polled_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    commits = counter.count
    dispatcher.request_stop()
    thread.join(timeout=60)
    total, distinct, ok, last = poll.execute(
        "SELECT COUNT(*), COUNT(DISTINCT job_id), SUM(status = 'ok'), MAX(finished_at) FROM runs"
    ).fetchone()
    poll.close()
    store.close()
    if failure:
        raise RuntimeError(f"dispatcher failed: {failure[0]!r}")
    if done < jobs or ok != jobs or distinct != jobs or total != jobs:
        raise RuntimeError(f"kernel run incomplete: {ok} ok / {total} runs / {distinct} jobs of {jobs} after {polled_s:.1f}s")
    elapsed = max(0.001, (last - start_ms) / 1000)
    return {
        "jobs": jobs,
        "elapsed_s": round(elapsed, 3),
        "jobs_per_s": jobs / elapsed,
        "commits": commits,
        "commits_per_job": commits / jobs,
        "cpu_ms_per_job": cpu_s * 1000 / jobs,
        "stats": dict(dispatcher.stats),
    }


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    import os

    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_process(ctx: Context, directory: Path, jobs: int, *, tag: str, synchronous: str | None = None,
                concurrency: int = CONCURRENCY, timeout_s: float = 180.0) -> dict[str, Any]:
    """N no-op jobs due at one instant through a real ``scheduler run`` process; jobs/s from the due time.

    The jobs are created (one transaction) due a few seconds ahead, the process is started
    and given time to take its lease and sleep; the clock runs from the due time to the
    last run's ``finished_at``. ``synchronous`` overrides ``[storage] sqlite_synchronous``
    for the process (None: the setting in force). The process is started through
    ``bench._counted_run`` (the CLI's ``main`` with its commits counted, see there).
    """
    import signal
    import subprocess
    import sys

    from scheduler.base.timeutil import now_ms
    from scheduler.core.jobs import create_jobs
    from scheduler.plugins.stores import open_store

    sync = (synchronous or sqlite_synchronous()).upper()
    for lead_ms in (4_000, 8_000, 16_000):  # the lead must cover creating the jobs and starting the process
        path = fresh_db(directory, f"process-{tag}.db")
        store = open_store(str(path))
        due = now_ms() + lead_ms
        create_jobs(store, at_job_specs(jobs, at_ms=due))
        store.close()
        commits_file = directory / f"process-{tag}.commits"
        log_path = directory / f"process-{tag}.log"
        env = bench_env(SCHEDULER_STORAGE_SQLITE_SYNCHRONOUS=sync, BENCH_COMMITS_FILE=str(commits_file))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "bench._counted_run", "--db", str(path), "run",
                                     "--concurrency", str(concurrency)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=str(REPO_ROOT))
        try:
            while proc.poll() is None and b"holds lease" not in log_path.read_bytes():
                time.sleep(0.01)
            if proc.poll() is not None:
                raise RuntimeError(f"scheduler run exited {proc.returncode}: {log_path.read_text()[-2000:]}")
            if now_ms() > due - 300:  # not ready well before the due time: try again with a longer lead
                continue
            time.sleep(max(0.0, (due - now_ms()) / 1000 - 0.2))
            cpu0 = _proc_cpu_s(proc.pid)
            poll = sqlite3.connect(str(path))
            deadline = time.monotonic() + timeout_s
            done = 0
            while proc.poll() is None and time.monotonic() < deadline:
                done = count_terminal(poll)
                if done >= jobs:
                    break
                time.sleep(0.02)
            cpu_s = _proc_cpu_s(proc.pid) - cpu0
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        total, distinct, ok, last = poll.execute(
            "SELECT COUNT(*), COUNT(DISTINCT job_id), SUM(status = 'ok'), MAX(finished_at) FROM runs").fetchone()
        events = poll.execute("SELECT COUNT(*) FROM runtime_events WHERE run_id IS NOT NULL").fetchone()[0]
        poll.close()
        if done < jobs or ok != jobs or distinct != jobs or total != jobs:
            raise RuntimeError(f"scheduler run incomplete: {ok} ok / {total} runs / {distinct} jobs of {jobs}")
        commits = int(commits_file.read_text()) if commits_file.exists() else None
        elapsed = max(0.001, (last - due) / 1000)
        return {"jobs": jobs, "elapsed_s": round(elapsed, 3), "jobs_per_s": jobs / elapsed, "synchronous": sync,
                "commits": commits, "commits_per_job": commits / jobs if commits is not None else None,
                "events_per_job": events / jobs, "cpu_ms_per_job": cpu_s * 1000 / jobs, "exit": proc.returncode,
                "lead_ms": lead_ms}
    raise RuntimeError("scheduler run was not ready before the jobs fell due, even with a 16 s lead")


# -- the raw SQLite baseline -----------------------------------------------------------------------


def _raw_setup(directory: Path, jobs: int, tag: str) -> tuple[sqlite3.Connection, list[str], int]:
    path = fresh_db(directory, f"raw-{tag}.db")
    kernel_schema_db(path)
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(f"PRAGMA synchronous = {sqlite_synchronous()}")
    now = int(time.time() * 1000)
    ids = [str(uuid.uuid4()) for _ in range(jobs)]
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO jobs(id, name, schedule_kind, schedule_at, executor, payload_message, created_at, updated_at, next_run_at)"
        " VALUES (?, ?, 'at', ?, 'testkit', 'ok', ?, ?, ?)",
        [(job_id, f"raw-{i}", now, now, now, now) for i, job_id in enumerate(ids)],
    )
    conn.execute("COMMIT")
    return conn, ids, now


def _raw_result(conn: sqlite3.Connection, jobs: int, commits: int, start: float, cpu_start: float) -> dict[str, Any]:
    """A raw loop's figures, once it wrote every run ``ok`` (else it raises); closes ``conn``."""
    elapsed = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    ok = conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'ok'").fetchone()[0]
    conn.close()
    if ok != jobs:
        raise RuntimeError(f"raw loop wrote {ok} ok runs, expected {jobs}")
    return {"jobs": jobs, "elapsed_s": round(elapsed, 3), "jobs_per_s": jobs / elapsed, "commits": commits,
            "commits_per_job": commits / jobs, "commits_per_s": commits / elapsed, "cpu_ms_per_job": cpu_s * 1000 / jobs}


def run_raw(directory: Path, jobs: int, *, batch: int, tag: str) -> dict[str, Any]:
    """The kernel's row writes per run in plain ``sqlite3``: materialise (``batch`` per commit), claim, complete."""
    conn, ids, slot = _raw_setup(directory, jobs, tag)
    owner = "bench:raw"
    commits = 0
    x = conn.execute
    start = time.perf_counter()
    cpu_start = time.process_time()
    for lo in range(0, jobs, batch):
        chunk = ids[lo:lo + batch]
        now = int(time.time() * 1000)
        x("BEGIN IMMEDIATE")
        for job_id in chunk:
            x("UPDATE jobs SET next_run_at = NULL, schedule_anchor_at = NULL, updated_at = ? WHERE id = ? AND next_run_at = ?",
              (now, job_id, slot))
            x("INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at)"
              " VALUES (?, ?, 'at', 'pending', ?, ?, ?) ON CONFLICT (id) DO NOTHING",
              (f"{job_id}:at:{slot}", job_id, slot, now, now))
        x("COMMIT")
        commits += 1
        for job_id in chunk:
            dispatch_id = f"{job_id}:at:{slot}"
            run_id = str(uuid.uuid4())
            now = int(time.time() * 1000)
            x("BEGIN IMMEDIATE")
            x("UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = ?, claim_token = ?, claim_fence = 1,"
              " claim_expires_at = ?, attempts = attempts + 1, run_id = ?, updated_at = ? WHERE id = ? AND status = 'pending'",
              (owner, secrets.token_hex(8), now + 60_000, run_id, now, dispatch_id))
            x("INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, attempt, scheduled_for, created_at, started_at,"
              " dispatcher_owner, dispatcher_token, delivery_guarantee, executor, output_format)"
              " VALUES (?, ?, ?, 'at', 'running', 1, ?, ?, ?, ?, 1, 'at-most-once', 'testkit', 'text')",
              (run_id, job_id, dispatch_id, slot, now, now, owner))
            x("INSERT INTO runtime_events(at, kind, job_id, run_id, dispatch_id, actor, data) VALUES (?, 'run.started', ?, ?, ?, ?, ?)",
              (now, job_id, run_id, dispatch_id, owner, json.dumps({"attempt": 1, "kind": "at", "token": 1})))
            x("COMMIT")
            now = int(time.time() * 1000)
            x("BEGIN IMMEDIATE")
            x("UPDATE runs SET exit_code = 0, status = 'ok', finished_at = ?, terminal_at = ?, duration_ms = 0"
              " WHERE id = ? AND status = 'running' AND dispatcher_owner = ? AND dispatcher_token = 1",
              (now, now, run_id, owner))
            x("UPDATE job_dispatch_queue SET status = 'done', updated_at = ?, last_error = NULL WHERE id = ?", (now, dispatch_id))
            x("INSERT INTO runtime_events(at, kind, job_id, run_id, dispatch_id, actor, data) VALUES (?, 'run.finished', ?, ?, ?, ?, ?)",
              (now, job_id, run_id, dispatch_id, owner, json.dumps({"error_code": None, "status": "ok", "token": 1})))
            x("UPDATE jobs SET run_count = run_count + 1, last_run_at = ?, last_status = 'ok', last_error = NULL,"
              " last_duration_ms = 0, consecutive_failures = 0, updated_at = ? WHERE id = ?", (now, now, job_id))
            x("COMMIT")
            commits += 2
    return _raw_result(conn, jobs, commits, start, cpu_start)


def run_raw_grouped(directory: Path, jobs: int, *, group: int = 4, tag: str) -> dict[str, Any]:
    """The database floor: the kernel's row writes per run, committed as the dispatcher's pass groups them, no logic.

    One-shot slots are materialised ``MATERIALISE_BATCH`` per commit; then each commit completes the previous
    ``group`` runs (terminal UPDATE ... RETURNING of the result columns, dispatch rows ``done``, ``run.finished``
    events, job counters ... RETURNING) and claims and starts the next ``group`` (claim UPDATE ... RETURNING, one
    runs INSERT, ``run.started`` events), in the multi-row statements the kernel uses. Single-threaded plain
    ``sqlite3``: what the scheduler's run history and audit trail cost SQLite alone, with no Python around them.
    """
    conn, ids, slot = _raw_setup(directory, jobs, tag)
    owner = "bench:raw"
    commits = 0
    x = conn.execute
    start = time.perf_counter()
    cpu_start = time.process_time()
    for lo in range(0, jobs, MATERIALISE_BATCH):
        chunk = ids[lo:lo + MATERIALISE_BATCH]
        now = int(time.time() * 1000)
        marks = ", ".join("?" for _ in chunk)
        x("BEGIN IMMEDIATE")
        x(f"UPDATE jobs SET next_run_at = NULL, schedule_anchor_at = NULL, updated_at = ? WHERE id IN ({marks})", (now, *chunk))
        x("INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at) VALUES "
          + ", ".join(["(?, ?, 'at', 'pending', ?, ?, ?)"] * len(chunk)) + " ON CONFLICT (id) DO NOTHING",
          [v for job_id in chunk for v in (f"{job_id}:at:{slot}", job_id, slot, now, now)])
        x("COMMIT")
        commits += 1
    running: list[tuple[str, str, str]] = []
    for lo in range(0, jobs + group, group):
        chunk = ids[lo:lo + group]
        now = int(time.time() * 1000)
        x("BEGIN IMMEDIATE")
        for run_id, job_id, _dispatch_id in running:
            x("UPDATE runs SET exit_code = ?, error_code = ?, summary = ?, env_policy_warning = ?, stdout_excerpt = ?,"
              " stdout_bytes = ?, stdout_sha256 = ?, stdout_truncated = ?, stdout_artifact = ?, stderr_excerpt = ?,"
              " stderr_bytes = ?, stderr_sha256 = ?, stderr_truncated = ?, stderr_artifact = ?, identity_json = ?,"
              " trust_level = ?, principal = ?, finished_at = ?, terminal_at = ?, status = 'ok', error_message = NULL,"
              " duration_ms = ? - started_at, process_state = 'exited'"
              " WHERE id = ? AND status = 'running' AND dispatcher_owner = ? AND dispatcher_token = 1"
              " RETURNING id, job_id, status, attempt, dispatch_id, started_at, finished_at, duration_ms",
              (0, None, "ok", None, "ok", 2, "sha256:" + "0" * 64, 0, None, None, 0, None, 0, None,
               '{"principal": "job:x", "trust_level": "user"}', "user", "job:x", now, now, now, run_id, owner)).fetchall()
            x("UPDATE jobs SET run_count = run_count + 1, last_run_at = ?, last_status = 'ok', last_error = NULL,"
              " last_duration_ms = 0, consecutive_failures = 0, updated_at = ? WHERE id = ?"
              " RETURNING id, name, enabled, max_retries, delivery_mode", (now, now, job_id)).fetchall()
        if running:
            marks = ", ".join("?" for _ in running)
            x(f"UPDATE job_dispatch_queue SET status = 'done', updated_at = ?, last_error = NULL WHERE id IN ({marks})",
              (now, *(d for _r, _j, d in running)))
            x("INSERT INTO runtime_events(at, kind, job_id, run_id, dispatch_id, actor, data, principal, trust_level) VALUES "
              + ", ".join(["(?, 'run.finished', ?, ?, ?, ?, ?, 'job:x', 'user')"] * len(running)),
              [v for r, j, d in running for v in (now, j, r, d, owner, json.dumps({"error_code": None, "status": "ok", "token": 1}))])
        running = [(str(uuid.uuid4()), job_id, f"{job_id}:at:{slot}") for job_id in chunk]
        if running:
            marks = ", ".join("?" for _ in running)
            x("UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = ?, claim_token = ?, claim_fence = 1,"
              " claim_expires_at = ?, attempts = attempts + 1, run_id = CASE id"
              + " WHEN ? THEN ?" * len(running) + f" ELSE run_id END, updated_at = ? WHERE id IN ({marks})"
              " AND status = 'pending' RETURNING id",
              (owner, secrets.token_hex(8), now + 60_000, *(v for r, _j, d in running for v in (d, r)), now,
               *(d for _r, _j, d in running))).fetchall()
            x("INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, attempt, scheduled_for, created_at, started_at,"
              " dispatcher_owner, dispatcher_token, delivery_guarantee, executor, output_format) VALUES "
              + ", ".join(["(?, ?, ?, 'at', 'running', 1, ?, ?, ?, ?, 1, 'at-most-once', 'testkit', 'text')"] * len(running)),
              [v for r, j, d in running for v in (r, j, d, slot, now, now, owner)])
            x("INSERT INTO runtime_events(at, kind, job_id, run_id, dispatch_id, actor, data) VALUES "
              + ", ".join(["(?, 'run.started', ?, ?, ?, ?, ?)"] * len(running)),
              [v for r, j, d in running for v in (now, j, r, d, owner, json.dumps({"attempt": 1, "kind": "at", "token": 1}))])
        x("COMMIT")
        commits += 1
    return _raw_result(conn, jobs, commits, start, cpu_start)


# -- the figure ------------------------------------------------------------------------------------


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx)
    directory = ctx.scratch(NAME)
    kernel, inproc, shaped, three, grouped = [], [], [], [], []
    run_raw(directory, 200, batch=MATERIALISE_BATCH, tag="warm-up")  # first-use costs (imports, page cache), discarded
    for rep in range(p["reps"]):
        ctx.say(f"throughput rep {rep + 1}/{p['reps']}: raw loops")
        shaped.append(run_raw(directory, p["jobs"], batch=MATERIALISE_BATCH, tag=f"shaped-{rep}"))
        three.append(run_raw(directory, p["jobs"], batch=1, tag=f"three-{rep}"))
        grouped.append(run_raw_grouped(directory, p["jobs"], group=CONCURRENCY, tag=f"grouped-{rep}"))
        ctx.say(f"throughput rep {rep + 1}/{p['reps']}: scheduler run process, {p['jobs']} jobs")
        kernel.append(run_process(ctx, directory, p["jobs"], tag=str(rep)))
        inproc.append(run_kernel(ctx, directory, p["jobs"], tag=f"inproc-{rep}"))
        ctx.say(f"  process {kernel[-1]['jobs_per_s']:.0f} jobs/s, in-process {inproc[-1]['jobs_per_s']:.0f} jobs/s,"
                f" raw {shaped[-1]['jobs_per_s']:.0f} / {three[-1]['jobs_per_s']:.0f} / grouped {grouped[-1]['jobs_per_s']:.0f} jobs/s")
    k = median(r["jobs_per_s"] for r in kernel)
    s = median(r["jobs_per_s"] for r in shaped)
    t = median(r["jobs_per_s"] for r in three)
    res: dict[str, Any] = {
        "params": p,
        "synchronous": sqlite_synchronous(),
        "kernel": {"jobs_per_s": k, "reps": [r["jobs_per_s"] for r in kernel],
                   "commits_per_job": median(r["commits_per_job"] for r in kernel),
                   "cpu_ms_per_job": median(r["cpu_ms_per_job"] for r in kernel),
                   "events_per_job": median(r["events_per_job"] for r in kernel), "process": True},
        "inproc": {"jobs_per_s": median(r["jobs_per_s"] for r in inproc), "reps": [r["jobs_per_s"] for r in inproc],
                   "commits_per_job": median(r["commits_per_job"] for r in inproc),
                   "cpu_ms_per_job": median(r["cpu_ms_per_job"] for r in inproc)},
        "raw_shaped": {"jobs_per_s": s, "reps": [r["jobs_per_s"] for r in shaped],
                       "commits_per_job": shaped[0]["commits_per_job"], "commits_per_s": median(r["commits_per_s"] for r in shaped),
                       "cpu_ms_per_job": median(r["cpu_ms_per_job"] for r in shaped)},
        "raw_three": {"jobs_per_s": t, "reps": [r["jobs_per_s"] for r in three],
                      "commits_per_job": three[0]["commits_per_job"], "commits_per_s": median(r["commits_per_s"] for r in three),
                      "cpu_ms_per_job": median(r["cpu_ms_per_job"] for r in three)},
        "raw_grouped": {"jobs_per_s": median(r["jobs_per_s"] for r in grouped), "reps": [r["jobs_per_s"] for r in grouped],
                        "commits_per_job": grouped[0]["commits_per_job"],
                        "commits_per_s": median(r["commits_per_s"] for r in grouped),
                        "cpu_ms_per_job": median(r["cpu_ms_per_job"] for r in grouped)},
        "ratio": ratio(k, s),
        "ratio_three": ratio(k, t),
        "ratio_grouped": ratio(k, median(r["jobs_per_s"] for r in grouped)),
        "goal": GOAL_RATIO,
    }
    res["met"] = res["ratio"] is not None and res["ratio"] >= GOAL_RATIO
    res["plot"] = _plot(ctx, res)
    return res


def _plot(ctx: Context, res: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    labels = ["scheduler run\n(process, 4 workers)", f"raw SQLite\nkernel-shaped\n({res['raw_shaped']['commits_per_job']:.3f} commits/job)",
              "raw SQLite\n3 commits/job"]
    values = [res["kernel"]["jobs_per_s"], res["raw_shaped"]["jobs_per_s"], res["raw_three"]["jobs_per_s"]]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    bars = ax.bar(labels, values, color=["#1f77b4", "#7f7f7f", "#bbbbbb"])
    ax.axhline(res["raw_shaped"]["jobs_per_s"] * GOAL_RATIO, color="#d62728", ls="--", lw=1, label=f"goal: {GOAL_RATIO:.0%} of kernel-shaped raw")
    for bar, v in zip(bars, values, strict=True):
        ax.annotate(f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom")
    ax.set_ylim(0, max(values) * 1.15)
    ax.set_ylabel("jobs per second (median)")
    ax.set_title(f"No-op job throughput, {res['params']['jobs']:,} jobs, synchronous={res['synchronous']}")
    ax.legend(loc="upper left")
    return save_plot(ctx, fig, "throughput")


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    return [(
        "1. no-op throughput vs raw SQLite",
        f"{res['kernel']['jobs_per_s']:,.0f} vs {res['raw_shaped']['jobs_per_s']:,.0f} jobs/s = {res['ratio']:.0%}",
        f">= {GOAL_RATIO:.0%}",
        res["met"],
    )]


def render(res: dict[str, Any]) -> str:
    p = res["params"]
    rows = []
    labelled = [("`scheduler run` process (testkit `ok`, concurrency 4)", "kernel", "—")]
    if res.get("inproc"):
        labelled.append(("in-process dispatcher loop (bench thread; reference)", "inproc", "—"))
    for label, key, share in (*labelled,
                              ("raw SQLite, kernel-shaped commits (baseline)", "raw_shaped", f"{res['ratio']:.1%}"),
                              ("raw SQLite, 3 commits per job (reference)", "raw_three", f"{res['ratio_three']:.1%}"),
                              *(((("raw SQLite, the kernel's writes grouped as a pass groups them: the database floor"
                                   " (reference)"), "raw_grouped", f"{res['ratio_grouped']:.1%}"),) if res.get("raw_grouped") else ())):
        r = res[key]
        rows.append((label, fmt(r["jobs_per_s"], 0), fmt(r["commits_per_job"], 3), fmt(r.get("cpu_ms_per_job"), 2),
                     ", ".join(f"{v:,.0f}" for v in r["reps"]), share))
    table = md_table(["loop", "jobs/s (median)", "commits/job", "CPU ms/job", "each repetition", "scheduler / this"], rows)
    out = [
        (f"{p['jobs']:,} one-shot jobs due now, testkit payload `ok`, {p['reps']} repetition(s), "
         f"SQLite `synchronous={res['synchronous']}` (WAL) for every loop. Raw loops are single-threaded `sqlite3` "
         f"on the kernel's schema doing the kernel's row writes per run (see `bench/throughput.py`); the raw commit rate "
         f"was {res['raw_shaped']['commits_per_s']:,.0f} commits/s (kernel-shaped) and "
         f"{res['raw_three']['commits_per_s']:,.0f} commits/s (3 per job)."),
        "",
        table,
        "",
        (f"Ratio `scheduler run` / kernel-shaped raw loop: **{res['ratio']:.1%}**, goal >= {GOAL_RATIO:.0%}: {verdict(res['met'])}. "
         "The `scheduler run` process is started through `bench._counted_run` (the CLI's `main` with its outermost write "
         "transactions counted: commits/job, including passes that wrote nothing); the jobs are created due a few seconds "
         "ahead and the clock runs from their due time to the last run's `finished_at`; its CPU ms/job is the process's "
         "user+system time (`/proc/<pid>/stat`) over the same span. The in-process row runs the dispatcher on a thread of the "
         "bench (no CLI, no per-run output lines), timed from its start; its CPU is the bench process's. Raw loops' CPU is "
         "`time.process_time`."),
    ]
    if res.get("raw_grouped"):
        g = res["raw_grouped"]
        out += ["", (f"The database floor (last row): the same row writes per run as the kernel's (run row inserted and "
                 f"completed with its result columns and RETURNING, `run.started` and `run.finished` events, the dispatch "
                 f"row inserted, claimed and done, the job's counters), in the kernel's multi-row statements, committed "
                 f"{res['params']['concurrency']} completions and {res['params']['concurrency']} claims at a time as a pass "
                 f"commits them, by a single thread of plain `sqlite3` with no logic around them: {g['jobs_per_s']:,.0f} jobs/s "
                 f"at {g['cpu_ms_per_job']:.2f} ms of CPU per job. The scheduler reaches {res['ratio_grouped']:.0%} of it; "
                 "what keeps the floor itself down is SQLite: the writes of a run touch 4 tables and their indexes and check "
                 "the tables' constraints and triggers, and each commit writes every page it dirtied to the WAL (two `pwrite` "
                 "calls a page) and waits for its fsync. Issue 34, stop 41 (the WAL frames of 342 steady commits of 4 runs): 46 "
                 "distinct pages a commit (53 before schema 13 dropped the events' job index), of which the events' run index "
                 "9.3, the dispatches' (job, status) index 7.2, the runs' dispatch, job and id indexes 5.2, 5.0 and 4.9, the "
                 "run rows 4.3, the dispatch rows 2.4 and the event rows 2.4: keys on random ids, about a page each.")]
    if res.get("plot"):
        out += ["", f"![throughput]({res['plot']})"]
    return "\n".join(out)
