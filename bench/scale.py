"""Figure 4: per-wake-up cost and dispatcher memory with 10k, 100k and 1M stored jobs.

Job rows are bulk-inserted with ``executemany`` straight into the kernel's schema
(``create_jobs`` validates and audits every job, far too slow for a million):
interval jobs (``every 1d``, testkit ``ok``) whose ``next_run_at`` lies days ahead,
so nothing is due. Then, on the store the dispatcher uses:

* per wake-up: ``Dispatcher._tick()`` itself (propagate cancels, materialise due
  slots, claim, find the next due time), after ``start()`` took the lease, timed over
  N calls with nothing due; and, separately, the two queries it is built on:
  ``scheduler.core.queue.materialize_due`` (a write transaction) and ``next_due`` (a read);
* memory: a real ``scheduler --db FILE run --duration Ns`` subprocess on the same file
  (with a handful of jobs made due right before it starts, so it does real work),
  its peak RSS read from ``os.wait4`` (``ru_maxrss`` of that child only).

The baseline is the smallest database: the goal is growth <= 2x from 10k to 1M jobs,
and RSS <= 200 MB at 1M. An empty database's dispatcher RSS is shown for reference.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    Context,
    bench_env,
    fmt,
    fresh_db,
    kernel_schema_db,
    md_table,
    pyplot,
    ratio,
    save_plot,
    scheduler_cmd,
    verdict,
)

NAME = "scale"
TITLE = "4. Scale: 10k / 100k / 1M stored jobs"
GOAL_GROWTH = 2.0
GOAL_RSS_MB = 200.0
DUE_JOBS = 20


def params(ctx: Context) -> dict[str, Any]:
    return {
        "sizes": [10_000, 100_000] if ctx.quick else [10_000, 100_000, 1_000_000],
        "calls": 300 if ctx.quick else 1000,
        "warmup": 10,
        "rss_duration_s": 1 if ctx.quick else 3,
    }


def bulk_load(path: Path, count: int, now: int) -> float:
    """Insert ``count`` interval jobs due days from now (one ``INSERT ... SELECT``); returns seconds taken.

    The rows are generated inside SQLite from a recursive CTE: the same direct bulk
    insert as ``executemany``, about three times faster for a million wide rows.
    """
    kernel_schema_db(path)
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")
    start = time.perf_counter()
    base = now + 7 * 86_400_000
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < ?)"
        " INSERT INTO jobs(id, name, schedule_kind, schedule_every, executor, payload_message, created_at, updated_at,"
        " next_run_at, schedule_anchor_at)"
        " SELECT printf('00000000-0000-4000-8000-%012d', i), printf('scale-%07d', i), 'every', '1d', 'testkit', 'ok', ?, ?,"
        " ? + i * 7, ? + i * 7 - 86400000 FROM seq",
        (count - 1, now, now, base, base),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - start


def _timed(fn: Any, calls: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e6)
    return {"mean_us": statistics.fmean(samples), "median_us": statistics.median(samples), "p90_us": sorted(samples)[int(0.9 * (len(samples) - 1))]}


def wake_cost(path: Path, calls: int, warmup: int) -> dict[str, Any]:
    """Time ``Dispatcher._tick()`` and its queries on an idle database of stored jobs."""
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.queue import materialize_due, next_due
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    store = open_store(str(path))
    dispatcher = Dispatcher(store, DispatcherConfig(concurrency=4, artifacts_root=path.parent / "artifacts"), say=None)
    dispatcher.start()
    try:
        created = []

        def tick() -> None:
            timeout = dispatcher._tick()
            if timeout == 0.0:
                raise RuntimeError("a job was due during the idle wake-up measurement")

        def nd() -> None:
            with store.read() as tx:
                next_due(tx)

        def mat() -> None:
            created.append(materialize_due(store))

        out = {"tick": _timed(tick, calls, warmup), "next_due": _timed(nd, calls, warmup), "materialize_due": _timed(mat, calls, warmup)}
        if any(created):
            raise RuntimeError("materialize_due created dispatches: the scale database has due jobs")
    finally:
        dispatcher._shutdown()
        store.close()
    return out


#: Runs the dispatcher and reports *its* peak RSS. A direct child of the bench would not do: on Linux a child's
#: ``ru_maxrss`` starts from the forking parent's high-water mark (``exec`` keeps it), and this process holds the
#: bulk-loaded rows. This helper is a fresh interpreter (~10 MB), so the figure is the dispatcher's own peak
#: whenever that is above ~10 MB.
_RSS_HELPER = """
import json, os, subprocess, sys, time
cmd = json.loads(sys.argv[1])
t = time.perf_counter()
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = p.stderr.read()
_pid, status, usage = os.wait4(p.pid, 0)
print(json.dumps({"maxrss_kb": usage.ru_maxrss, "code": os.waitstatus_to_exitcode(status),
                  "stderr": err.decode(errors="replace")[-800:], "wall_s": time.perf_counter() - t}))
"""


def peak_rss(cmd: list[str]) -> dict[str, Any]:
    """Peak RSS (MB) of ``cmd`` run to completion through the helper above."""
    done = subprocess.run([sys.executable, "-c", _RSS_HELPER, json.dumps(cmd)], capture_output=True, text=True, env=bench_env(),
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"RSS helper failed: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout)
    if out["code"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out['code']}: {out['stderr'].strip()}")
    return {"peak_rss_mb": out["maxrss_kb"] / 1024, "wall_s": round(out["wall_s"], 2)}


def dispatcher_rss(path: Path, duration_s: int, now_ms_fn: Any) -> dict[str, Any]:
    """Peak RSS of ``scheduler run --duration`` on ``path`` (a few jobs made due first)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    due = now_ms_fn() + 300
    conn.execute("UPDATE jobs SET next_run_at = ? WHERE rowid IN (SELECT rowid FROM jobs ORDER BY rowid LIMIT ?)", (due, DUE_JOBS))
    conn.close()
    out = peak_rss(scheduler_cmd() + ["--db", str(path), "--json", "run", "--duration", f"{duration_s}s"])
    conn = sqlite3.connect(str(path))
    out["runs_ok"] = conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'ok'").fetchone()[0]
    conn.close()
    return out


def run(ctx: Context) -> dict[str, Any]:
    from scheduler.base.timeutil import now_ms

    p = params(ctx)
    directory = ctx.scratch(NAME)
    rows: list[dict[str, Any]] = []
    ctx.say("scale: dispatcher RSS on an empty database")
    empty = fresh_db(directory, "empty.db")
    kernel_schema_db(empty)
    empty_rss = dispatcher_rss(empty, p["rss_duration_s"], now_ms)
    for size in p["sizes"]:
        path = fresh_db(directory, f"jobs-{size}.db")
        ctx.say(f"scale: bulk-loading {size:,} jobs")
        load_s = bulk_load(path, size, now_ms())
        ctx.say(f"scale: {size:,} jobs loaded in {load_s:.1f} s; timing {p['calls']} idle wake-ups")
        cost = wake_cost(path, p["calls"], p["warmup"])
        ctx.say(f"scale: _tick {cost['tick']['median_us']:.0f} us; dispatcher RSS run")
        rss = dispatcher_rss(path, p["rss_duration_s"], now_ms)
        rows.append({"jobs": size, "load_s": round(load_s, 2), "db_mb": round(os.path.getsize(path) / 2**20, 1), **cost, "rss": rss})
        ctx.say(f"scale: {size:,} jobs: peak RSS {rss['peak_rss_mb']:.0f} MB, {rss['runs_ok']} runs ok")
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(str(path) + suffix)  # a 1M-job file is large; free the space before the next size
            except FileNotFoundError:
                pass
    first, last = rows[0], rows[-1]
    growth = ratio(last["tick"]["median_us"], first["tick"]["median_us"])
    growth_queries = ratio(last["next_due"]["median_us"] + last["materialize_due"]["median_us"],
                           first["next_due"]["median_us"] + first["materialize_due"]["median_us"])
    largest_rss = last["rss"]["peak_rss_mb"]
    res: dict[str, Any] = {
        "params": p,
        "rows": rows,
        "empty_rss": empty_rss,
        "growth": growth,
        "growth_queries": growth_queries,
        "growth_span": f"{first['jobs']:,} -> {last['jobs']:,}",
        "full_span": last["jobs"] >= 1_000_000,
        "goal_growth": GOAL_GROWTH,
        "goal_rss_mb": GOAL_RSS_MB,
    }
    # The goals are stated at 1M jobs: the quick form (up to 100k) reports the numbers but gives no verdict.
    res["met_growth"] = (growth is not None and growth <= GOAL_GROWTH) if res["full_span"] else None
    res["met_rss"] = largest_rss <= GOAL_RSS_MB if res["full_span"] else None
    res["plot"] = _plot(ctx, res)
    return res


def _plot(ctx: Context, res: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    rows = res["rows"]
    xs = [r["jobs"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.6, 3.4))
    for key, label, style in (("tick", "Dispatcher._tick()", "o-"), ("materialize_due", "materialize_due()", "s--"),
                              ("next_due", "next_due()", "^--")):
        a.plot(xs, [r[key]["median_us"] for r in rows], style, label=label)
    a.plot(xs, [rows[0]["tick"]["median_us"] * GOAL_GROWTH] * len(xs), color="#d62728", ls=":", lw=1, label=f"goal: {GOAL_GROWTH:g}x the 10k tick")
    a.set_xscale("log")
    a.set_ylim(bottom=0)
    a.set_xlabel("stored jobs")
    a.set_ylabel("µs per idle wake-up (median)")
    a.set_title("Per-wake-up cost")
    a.legend(fontsize=7)
    b.plot([1] + xs, [res["empty_rss"]["peak_rss_mb"]] + [r["rss"]["peak_rss_mb"] for r in rows], "o-", color="#2ca02c",
           label="scheduler run: peak RSS")
    b.axhline(GOAL_RSS_MB, color="#d62728", ls="--", lw=1, label=f"goal at 1M: <= {GOAL_RSS_MB:g} MB")
    b.set_xscale("log")
    b.set_ylim(0, max(GOAL_RSS_MB * 1.1, max(r["rss"]["peak_rss_mb"] for r in rows) * 1.1))
    b.set_xlabel("stored jobs (1 = empty database)")
    b.set_ylabel("MB")
    b.set_title("Dispatcher memory")
    b.legend(fontsize=7)
    return save_plot(ctx, fig, "scale")


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    rows = res["rows"]
    suffix = "" if res["full_span"] else " (quick form: 1M not measured)"
    return [
        ("4a. idle wake-up cost growth",
         f"_tick {rows[0]['tick']['median_us']:,.0f} -> {rows[-1]['tick']['median_us']:,.0f} µs ({res['growth_span']}) = {res['growth']:.2f}x{suffix}",
         f"<= {GOAL_GROWTH:g}x from 10k to 1M", res["met_growth"]),
        ("4b. dispatcher peak RSS",
         f"{rows[-1]['rss']['peak_rss_mb']:,.0f} MB at {rows[-1]['jobs']:,} jobs (empty db {res['empty_rss']['peak_rss_mb']:,.0f} MB){suffix}",
         f"<= {GOAL_RSS_MB:g} MB at 1M", res["met_rss"]),
    ]


def render(res: dict[str, Any]) -> str:
    p = res["params"]
    table_rows = []
    for r in res["rows"]:
        table_rows.append((
            fmt(r["jobs"]), fmt(r["db_mb"], 1), fmt(r["load_s"], 1),
            fmt(r["tick"]["median_us"], 0), fmt(r["tick"]["mean_us"], 0),
            fmt(r["materialize_due"]["median_us"], 0), fmt(r["next_due"]["median_us"], 0),
            fmt(r["rss"]["peak_rss_mb"], 0), fmt(r["rss"]["runs_ok"]),
        ))
    out = [
        (f"Idle wake-ups timed over {p['calls']} calls (after {p['warmup']} warm-up calls) on the SQLite store the dispatcher "
         f"uses, nothing due. RSS: `scheduler --db FILE --json run --duration {p['rss_duration_s']}s` as a subprocess, "
         f"{DUE_JOBS} jobs made due just before it starts; peak RSS from `os.wait4` (`ru_maxrss`). "
         f"Empty database: {res['empty_rss']['peak_rss_mb']:,.0f} MB."),
        "",
        md_table(["stored jobs", "db MB", "bulk load s", "_tick µs (median)", "_tick µs (mean)", "materialize_due µs (median)",
                  "next_due µs (median)", "peak RSS MB", "runs in RSS run"], table_rows),
        "",
        "Medians are the figure (a shared machine adds rare long outliers to the means, shown for completeness). "
        f"Growth of median `_tick()` {res['growth_span']}: **{res['growth']:.2f}x** (the two queries alone: {res['growth_queries']:.2f}x), "
        f"goal <= {GOAL_GROWTH:g}x from 10k to 1M: {verdict(res['met_growth'])}"
        + (" (below 1x: differences of a few µs are machine noise and caching; the cost does not grow)"
           if res["growth"] is not None and res["growth"] < 1 else "")
        + ("" if res["full_span"] else " (no verdict: the quick form stops at 100k)") + ". "
        f"Peak RSS at {res['rows'][-1]['jobs']:,} jobs: **{res['rows'][-1]['rss']['peak_rss_mb']:,.0f} MB**, "
        f"goal <= {GOAL_RSS_MB:g} MB at 1M: {verdict(res['met_rss'])}"
        + ("" if res["full_span"] else " (no verdict: quick form)") + ".",
    ]
    if res.get("plot"):
        out += ["", f"![scale]({res['plot']})"]
    return "\n".join(out)
