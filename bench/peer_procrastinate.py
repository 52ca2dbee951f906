"""Figure 6b: the same PostgreSQL jobs through Procrastinate, beside the scheduler's dispatchers in the same run.

Runs when a server answers at 127.0.0.1:5432 (database ``test``), ``scheduler-store-postgres`` is installed and
``procrastinate`` is (``pip install -r bench/requirements.txt``); otherwise the report says "skipped: <reason>".

Each side works in a database of its own, made for this run and dropped after (``bench_peer_sched_<pid>`` for the
scheduler, ``bench_peer_procr_<pid>``, made anew for each Procrastinate row): the statistics PostgreSQL keeps per
database (``pg_stat_database``) then count that side's work alone, and no other test's tables are touched.

- Scheduler: ``bench.postgres.run_dispatchers`` (figure 6): k ``scheduler run --shared --concurrency 4`` processes,
  N one-shot jobs due now created in one transaction, timed from that commit to the last run's ``finished_at``.
- Procrastinate: k worker processes (``bench._procrastinate_worker``: ``concurrency=4``, LISTEN/NOTIFY, jobs kept),
  N jobs deferred in one ``batch_defer`` (one transaction), timed from its commit to the last ``succeeded`` event.

Both with the no-op job and the 50 ms job, k = 1 and 3 (the 1-vs-3 figure), the two sides alternating within each
repetition; each row shows its median and every repetition. Where the time goes, per job, from the same runs:
transactions committed and rows written in that side's database (the bench's own progress polls subtracted),
buffer accesses, the CPU of the side's processes and of their PostgreSQL backends. ``pg_stat_statements`` would
count statements, but it needs ``shared_preload_libraries`` and so a restart of the shared server, which the bench
does not do. No goal is set: the issue asks for the ratio and where the time goes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.parse
from typing import Any

from bench import postgres
from bench.common import REPO_ROOT, Context, bench_env, fmt, md_table, median, pyplot, ratio, save_plot

NAME = "procrastinate"
TITLE = "6b. Peer: Procrastinate on the same PostgreSQL server"
CONCURRENCY = postgres.CONCURRENCY
SLEEP_S = postgres.SLEEP_S
#: The statistics read per side, from ``pg_stat_database``.
STAT_COLUMNS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "blks_hit", "blks_read")
#: How long an idle backend may keep its counters before it reports them (PostgreSQL's PGSTAT_MIN_INTERVAL is 1 s).
STATS_SETTLE_S = 1.2
WORKLOADS = ("sleep", "noop")


def params(ctx: Context) -> dict[str, Any]:
    return {"jobs": {"sleep": 60 if ctx.quick else 400, "noop": 100 if ctx.quick else 1000},
            "processes": [1] if ctx.quick else [1, 3], "concurrency": CONCURRENCY, "sleep_s": SLEEP_S,
            "repetitions": 1 if ctx.quick else 3}


def _why_not() -> tuple[str | None, str | None]:
    """(reason to skip, the ``test`` database's URL)."""
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return "procrastinate is not installed (pip install -r bench/requirements.txt)", None
    return postgres._why_not()


def _db_url(base_url: str, database: str, **query: str) -> str:
    """``base_url`` pointed at another database of the same server, with ``query`` parameters added."""
    parts = urllib.parse.urlsplit(base_url)
    q = urllib.parse.parse_qsl(parts.query) + list(query.items())
    return urllib.parse.urlunsplit(parts._replace(path=f"/{database}", query=urllib.parse.urlencode(q)))


def _admin(base_url: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on the ``test`` database in autocommit (the server-wide views and CREATE/DROP DATABASE)."""
    import psycopg

    with psycopg.connect(base_url, connect_timeout=5, autocommit=True) as conn:
        cur = conn.execute(sql, args or None)
        return list(cur.fetchall()) if cur.description else []


def _fresh_database(base_url: str, name: str) -> None:
    _admin(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _admin(base_url, f'CREATE DATABASE "{name}"')


def _drop_database(base_url: str, name: str) -> None:
    import psycopg

    try:
        _admin(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error:
        pass


def _db_stats(base_url: str, database: str, *, settle: bool) -> dict[str, int]:
    """``pg_stat_database`` counters of ``database``. ``settle``: wait until its sessions have reported theirs (an
    idle backend reports at most 1 s late; one that has exited has reported at its exit)."""
    if settle:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait for the side's backends to have exited after its processes
            if not _admin(base_url, "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
                          (database,)):
                break
            time.sleep(0.05)
    rows = _admin(base_url, f"SELECT {', '.join(STAT_COLUMNS)} FROM pg_stat_database WHERE datname = %s", (database,))
    return dict(zip(STAT_COLUMNS, (int(v or 0) for v in rows[0]), strict=True)) if rows else {}


def _backend_cpu(base_url: str, application_name: str) -> dict[int, float]:
    """CPU seconds of each backend whose connection carries ``application_name`` (local server only)."""
    pids = [int(r[0]) for r in _admin(base_url, "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                      (application_name,))]
    return {pid: postgres._proc_cpu_s(pid) for pid in pids if postgres._is_local_postgres(pid)}


def _per_job(before: dict[str, int], after: dict[str, int], jobs: int, bench_reads: int) -> dict[str, float]:
    """Counter deltas per job; the bench's own read transactions are taken off the commits."""
    if not before or not after:
        return {}
    d = {k: after[k] - before[k] for k in STAT_COLUMNS}
    d["xact_commit"] -= bench_reads
    out = {k: v / jobs for k, v in d.items()}
    out["rows_written"] = (d["tup_inserted"] + d["tup_updated"] + d["tup_deleted"]) / jobs
    out["buffers"] = (d["blks_hit"] + d["blks_read"]) / jobs
    return out


async def _defer(conninfo: str, task: str, jobs: int) -> None:
    from bench._procrastinate_worker import make_app

    app = make_app(conninfo)
    async with app.open_async():
        await app.configure_task(task).batch_defer_async(*({} for _ in range(jobs)))


async def _apply_schema(conninfo: str) -> None:
    from bench._procrastinate_worker import make_app

    app = make_app(conninfo)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


def run_procrastinate(ctx: Context, base_url: str, k: int, jobs: int, task: str) -> dict[str, Any]:
    """k Procrastinate worker processes of ``CONCURRENCY`` run ``jobs`` jobs of ``task`` in a fresh database."""
    import psycopg

    database = f"bench_peer_procr_{os.getpid()}"
    _fresh_database(base_url, database)
    url = _db_url(base_url, database)
    app_name = f"{database}_workers"
    worker_url = _db_url(base_url, database, application_name=app_name)
    procs: list[subprocess.Popen[bytes]] = []
    polls = 0
    try:
        asyncio.run(_apply_schema(url))
        cmd = [sys.executable, "-m", "bench._procrastinate_worker", worker_url, str(CONCURRENCY)]
        for _ in range(k):
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=bench_env(),
                                          cwd=str(REPO_ROOT)))
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            live = 0
            while time.monotonic() < deadline:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a Procrastinate worker exited early: {postgres._stop(procs)}")
                live = int(conn.execute("SELECT COUNT(*) FROM procrastinate_workers").fetchone()[0])  # type: ignore[index]
                if live >= k:
                    break
                time.sleep(0.05)
            if live < k:
                raise RuntimeError(f"only {live} of {k} Procrastinate workers registered within 60 s")
            ctx.say(f"  {k} Procrastinate worker(s) registered after {time.monotonic() - deadline + 60:.1f} s")
            time.sleep(0.3 + STATS_SETTLE_S)  # idle, as the scheduler's dispatchers are before their jobs
            before = _db_stats(base_url, database, settle=False)
            asyncio.run(_defer(url, task, jobs))
            start = time.time()
            cpu_before = sum(postgres._proc_cpu_s(p.pid) for p in procs)
            pg_before = _backend_cpu(base_url, app_name)
            busy_before, total_before = postgres._machine_cpu()
            end = time.monotonic() + jobs * (SLEEP_S if task == "sleep" else 0.01) / CONCURRENCY / k + 60
            while time.monotonic() < end:
                polls += 1
                done = int(conn.execute("SELECT COUNT(*) FROM procrastinate_jobs WHERE status NOT IN ('todo', 'doing')"
                                        ).fetchone()[0])  # type: ignore[index]
                if done >= jobs or all(p.poll() is not None for p in procs):
                    break
                time.sleep(0.05)
            cpu_used = sum(postgres._proc_cpu_s(p.pid) for p in procs) - cpu_before
            pg_after = _backend_cpu(base_url, app_name)
            pg_used = sum(cpu - pg_before.get(pid, 0.0) for pid, cpu in pg_after.items())
            busy_after, total_after = postgres._machine_cpu()
            summary = conn.execute(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE status = 'succeeded'), SUM(attempts),"
                " (SELECT EXTRACT(EPOCH FROM MAX(at)) FROM procrastinate_events WHERE type = 'succeeded') FROM procrastinate_jobs"
            ).fetchone()
            shares = [int(r[0]) for r in conn.execute(
                "SELECT COUNT(*) FROM procrastinate_jobs GROUP BY worker_id ORDER BY 1 DESC").fetchall()]
            polls += 2
        t_stop = time.monotonic()
        tails = postgres._stop(procs)
        procs = []
        ctx.say(f"  stopped in {time.monotonic() - t_stop:.1f} s")
        after = _db_stats(base_url, database, settle=True)
    finally:
        if procs:
            postgres._stop(procs)
        _drop_database(base_url, database)
    assert summary is not None
    total, ok, _attempts, last = summary
    if total != jobs or ok != jobs:
        raise RuntimeError(f"Procrastinate, {k} worker(s): {ok} of {total} jobs succeeded for {jobs}; stderr: {tails}")
    elapsed = max(0.001, float(last) - start)
    return {"processes": k, "jobs": jobs, "elapsed_s": round(elapsed, 3), "jobs_per_s": jobs / elapsed, "shares": shares,
            "process_cpu_ms_per_job": cpu_used * 1000 / jobs, "postgres_cpu_ms_per_job": pg_used * 1000 / jobs if pg_after else None,
            "machine_busy": (busy_after - busy_before) / (total_after - total_before) if total_after > total_before else None,
            "per_job": _per_job(before, after, jobs, polls)}


def run_scheduler(ctx: Context, base_url: str, database: str, k: int, jobs: int, task: str) -> dict[str, Any]:
    """Figure 6's dispatchers on ``jobs`` jobs of ``task``, in a schema of ``database``, with its statistics read."""
    def before_jobs() -> dict[str, int]:
        time.sleep(STATS_SETTLE_S)  # the dispatchers' backends report what their start-up did
        return _db_stats(base_url, database, settle=False)

    r = postgres.run_dispatchers(
        ctx, _db_url(base_url, database), k, jobs, payload="ok" if task == "noop" else f"sleep:{SLEEP_S}",
        before_jobs=before_jobs, after_stop=lambda: _db_stats(base_url, database, settle=True))
    return {"processes": k, "jobs": jobs, "elapsed_s": r["elapsed_s"], "jobs_per_s": r["jobs_per_s"], "shares": r["shares"],
            "process_cpu_ms_per_job": r["dispatcher_cpu_ms_per_job"], "postgres_cpu_ms_per_job": r["postgres_cpu_ms_per_job"],
            "machine_busy": r["machine_busy"],
            "per_job": _per_job(r.get("before_jobs") or {}, r.get("after_stop") or {}, jobs, r["bench_reads"])}


def _median_of(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The repetition with the median jobs/s (its other columns are that run's), listing every repetition."""
    ranked = sorted(reps, key=lambda r: r["jobs_per_s"])
    row = dict(ranked[(len(ranked) - 1) // 2])
    row["reps"] = [r["jobs_per_s"] for r in reps]
    return row


def run(ctx: Context) -> dict[str, Any]:
    why, base_url = _why_not()
    if why:
        return {"skipped": why}
    assert base_url is not None
    from importlib.metadata import version

    p = params(ctx)
    sched_db = f"bench_peer_sched_{os.getpid()}"
    raw: dict[str, list[dict[str, Any]]] = {}
    _fresh_database(base_url, sched_db)
    try:
        for rep in range(p["repetitions"]):
            for task in WORKLOADS:
                for k in p["processes"]:
                    n = p["jobs"][task]
                    for side in ("scheduler", "procrastinate"):
                        ctx.say(f"procrastinate rep {rep + 1}/{p['repetitions']}: {side}, {k} process(es), {n} {task} jobs")
                        r = (run_scheduler(ctx, base_url, sched_db, k, n, task) if side == "scheduler"
                             else run_procrastinate(ctx, base_url, k, n, task))
                        raw.setdefault(f"{side}/{task}/{k}", []).append(r)
                        ctx.say(f"  {r['jobs_per_s']:.1f} jobs/s (per process: {r['shares']})")
    finally:
        _drop_database(base_url, sched_db)
    rows = []
    for task in WORKLOADS:
        for k in p["processes"]:
            ours, theirs = raw[f"scheduler/{task}/{k}"], raw[f"procrastinate/{task}/{k}"]
            a, b = _median_of(ours), _median_of(theirs)
            rows.append({"task": task, "processes": k, "scheduler": a, "procrastinate": b,
                         "ratio": ratio(median(a["reps"]), median(b["reps"])),
                         "ratio_reps": [ratio(x["jobs_per_s"], y["jobs_per_s"]) for x, y in zip(ours, theirs, strict=True)]})
    res: dict[str, Any] = {"params": p, "server": postgres._server_version(base_url, __import__("psycopg")),
                           "procrastinate_version": version("procrastinate"), "cores": os.cpu_count(), "rows": rows,
                           "load_avg_at_end": [round(v, 2) for v in os.getloadavg()]}
    res["plot"] = _plot(ctx, res)
    return res


def _plot(ctx: Context, res: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    labels = [f"{'50 ms' if r['task'] == 'sleep' else 'no-op'}\n{r['processes']} process(es)" for r in rows]
    xs = list(range(len(rows)))
    w = 0.38
    for off, side, color in ((-w / 2, "scheduler", "#1f77b4"), (w / 2, "procrastinate", "#2ca02c")):
        bars = ax.bar([x + off for x in xs], [r[side]["jobs_per_s"] for r in rows], w, color=color,
                      label="scheduler run --shared" if side == "scheduler" else f"Procrastinate {res['procrastinate_version']}")
        for bar, r in zip(bars, rows, strict=True):
            ax.annotate(f"{r[side]['jobs_per_s']:,.0f}", (bar.get_x() + bar.get_width() / 2, r[side]["jobs_per_s"]),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels)
    ax.set_ylabel("jobs per second (median)")
    ax.set_title(f"PostgreSQL {res['server']}: {CONCURRENCY} workers per process")
    ax.legend(fontsize=7)
    return save_plot(ctx, fig, "procrastinate")


def _task_label(task: str) -> str:
    return f"{SLEEP_S * 1000:.0f} ms" if task == "sleep" else "no-op"


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    return [(f"6b. PostgreSQL: scheduler vs Procrastinate, {_task_label(r['task'])} jobs, {r['processes']} process(es)",
             f"{r['scheduler']['jobs_per_s']:,.1f} vs {r['procrastinate']['jobs_per_s']:,.1f} jobs/s = {r['ratio']:.2f}x",
             "ratio stated (no goal)", None) for r in res["rows"]]


#: What each side sends per job, established apart from the figure (a Procrastinate worker whose connector's query
#: methods were wrapped to count calls, 200 jobs deferred while it listened) and from the two libraries' code.
CALLS_NOTE = (
    "Procrastinate's worker makes two calls per job: `procrastinate_fetch_job_v2` (claims the oldest job with `FOR UPDATE "
    "SKIP LOCKED`, sets it `doing`; a trigger adds a `started` event row) and `procrastinate_finish_job_v1` (sets it "
    "`succeeded`, another event row): counted by wrapping its connector's query methods, 201 fetches and 200 finishes "
    "for 200 jobs, with or without the NOTIFY per deferred job. Each call checks a pooled connection out, which "
    "psycopg_pool first tests with an empty query (Procrastinate passes `check=check_connection`), and runs in a "
    "transaction of its own: about 4 round trips and 4 commits per job, 2 of them write commits waiting for their WAL "
    "flush (`synchronous_commit=on`). The scheduler's dispatcher claims in a pass (the dispatch row and the run row) "
    "and completes in a pass (the run's terminal update, the job's counters, the start and finish events), grouping "
    "several runs in each commit, and its rows carry the audit facts Procrastinate does not keep (the durable claim, "
    "events, the job's definition and counters); its worker threads run each job through the run pipeline (artifact "
    "check, policy and trust steps) where Procrastinate calls the coroutine."
)


def _where_note(res: dict[str, Any]) -> str:
    """Where the time goes, from the per-job columns of the median repetitions."""
    parts = [CALLS_NOTE]
    for r in res["rows"]:
        a, b = r["scheduler"], r["procrastinate"]
        pa, pb = a.get("per_job") or {}, b.get("per_job") or {}
        if not pa or not pb or a.get("postgres_cpu_ms_per_job") is None or b.get("postgres_cpu_ms_per_job") is None:
            continue
        ca = a["process_cpu_ms_per_job"] + a["postgres_cpu_ms_per_job"]
        cb = b["process_cpu_ms_per_job"] + b["postgres_cpu_ms_per_job"]
        parts.append(
            f"{_task_label(r['task'])} jobs, {r['processes']} process(es): the scheduler committed {pa['xact_commit']:.1f} "
            f"times and wrote {pa['rows_written']:.1f} rows per job against Procrastinate's {pb['xact_commit']:.1f} and "
            f"{pb['rows_written']:.1f}, touching {pa['buffers']:.0f} against {pb['buffers']:.0f} buffers, and used "
            f"{ca:.2f} ms of CPU per job ({a['process_cpu_ms_per_job']:.2f} in the dispatchers, "
            f"{a['postgres_cpu_ms_per_job']:.2f} in their backends) against {cb:.2f} ({b['process_cpu_ms_per_job']:.2f} "
            f"in the workers, {b['postgres_cpu_ms_per_job']:.2f} in theirs): {ca / cb:.1f}x the CPU for "
            f"{r['ratio']:.2f}x the throughput.")
    parts.append(
        "So the scheduler commits less often than Procrastinate (its passes group runs) but writes more rows, touches "
        "several times the buffers and spends more CPU per job, in its processes and in PostgreSQL; whenever the cores "
        "are the limit (a loaded machine, or no-op jobs) that CPU per job sets the ratio. What remains and the next "
        "step: the slimmer write set of this issue (start and finish read from the run row, lineage indexes only where "
        "a query needs them) and the per-job plan cache are aimed at the rows, buffers and dispatcher CPU this table "
        "shows beyond Procrastinate's (not measured yet whether they close the gap); the 50 ms rows, where a quiet machine's slot waits on the pass "
        "rather than the CPU (figure 6's note), are then to be re-measured on a quiet machine.")
    return " ".join(parts)


def render(res: dict[str, Any]) -> str:
    p = res["params"]
    reps = lambda r: " / ".join(f"{v:,.1f}" for v in r["reps"])  # noqa: E731
    table = []
    for r in res["rows"]:
        for side in ("scheduler", "procrastinate"):
            s = r[side]
            table.append((_task_label(r["task"]), fmt(r["processes"]),
                          "`scheduler run --shared`" if side == "scheduler" else f"Procrastinate {res['procrastinate_version']}",
                          fmt(s["jobs"]), fmt(s["jobs_per_s"], 1), reps(s), " / ".join(str(v) for v in s["shares"]),
                          f"**{r['ratio']:.2f}x** ({', '.join(f'{v:.2f}x' for v in r['ratio_reps'] if v is not None)})"
                          if side == "scheduler" else ""))
    cost = []
    for r in res["rows"]:
        for side in ("scheduler", "procrastinate"):
            s, pj = r[side], r[side].get("per_job") or {}
            cost.append((_task_label(r["task"]), fmt(r["processes"]), side, fmt(pj.get("xact_commit"), 2),
                         fmt(pj.get("tup_inserted"), 2), fmt(pj.get("tup_updated"), 2), fmt(pj.get("tup_deleted"), 2),
                         fmt(pj.get("buffers"), 0), fmt(s.get("process_cpu_ms_per_job"), 2),
                         fmt(s.get("postgres_cpu_ms_per_job"), 2),
                         f"{s['machine_busy']:.0%}" if s.get("machine_busy") is not None else "—"))
    out = [
        (f"PostgreSQL {res['server']} at {postgres.HOST}:{postgres.PORT}, each side in a database of its own made for the run. "
         f"Scheduler: k `scheduler run --shared --concurrency {p['concurrency']}` processes (figure 6's procedure), one-shot "
         "jobs due now created in one transaction, timed from that commit to the last run's `finished_at`. Procrastinate "
         f"{res['procrastinate_version']}: k worker processes, each one `Worker(concurrency={p['concurrency']})` with "
         "LISTEN/NOTIFY, its tasks `async` (a no-op, and `await asyncio.sleep(0.05)`: Procrastinate runs a worker's jobs "
         "concurrently only as coroutines), the jobs deferred in one `batch_defer` transaction while the workers were "
         "idle, timed from that commit to the last `succeeded` event. Every job ran exactly once on both sides (checked). "
         f"{p['repetitions']} repetition(s), the two sides alternating within each; a row shows the median repetition "
         "and every repetition in the order they ran; the ratio is scheduler / Procrastinate of the medians (each "
         "repetition's in brackets)."),
        "",
        md_table(["job", "processes", "side", "jobs", "jobs/s (median)", "every repetition", "jobs per process",
                  "scheduler / Procrastinate"], table),
        "",
        ("Where the time goes, per job, in the median repetition: transactions committed and rows written in that side's "
         "database (`pg_stat_database`, read while the side was idle before its jobs and after its processes had exited; "
         "the bench's progress polls taken off; it includes creating or deferring the jobs and the processes' own "
         "housekeeping meanwhile: leases, heartbeats), buffer accesses (shared-buffer hits and reads), the CPU of the "
         "side's processes (`/proc/<pid>/stat`) and of their PostgreSQL backends (by `application_name`), and the share "
         "of the machine's cores busy meanwhile (anything else running included)."),
        "",
        md_table(["job", "processes", "side", "commits/job", "rows inserted/job", "rows updated/job", "rows deleted/job",
                  "buffers/job", "process CPU ms/job", "PostgreSQL CPU ms/job", "machine busy"], cost),
    ]
    out += ["", _where_note(res)]
    out += ["", f"Load average (1, 5, 15 min) at the end: {res['load_avg_at_end']} ({res.get('cores', '?')} cores)."]
    if res.get("plot"):
        out += ["", f"![procrastinate]({res['plot']})"]
    return "\n".join(out)
