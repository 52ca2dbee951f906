"""Figure 1b: no-op throughput on a database that already holds a long history of runs, beside an empty one.

Every other no-op figure starts from an empty database; a scheduler that has run for a while
holds tens of thousands of finished runs and their events. What a commit writes depends on
that: each new run's key goes into the indexes keyed by run id (the runs primary key, the
events' run index), and where it lands decides how many pages the commit dirties.

Workload: N one-shot no-op jobs (testkit ``ok``) due at once through an in-process dispatcher
(``concurrency=4``), as the in-process row of figure 1, on three databases, alternating in
each repetition:

* **empty**: a new database;
* **history**: the same after H finished runs, each with its ``run.started`` and
  ``run.finished`` events, made with the kernel's run ids (time-ordered, version 7:
  ``scheduler.base.run_ids``) at instants spread over the hours before;
* **history, random ids** (reference): the same history with random (version 4) ids, and
  the dispatcher making random ids too (``scheduler.core.queue.new_run_id`` replaced in
  this process): what run ids were before issue 34 made them time-ordered.

The history is built fast: 200 real runs through a dispatcher, then their first run row and
its two events copied H times under new ids in one transaction; the WAL is checkpointed and
truncated before every measurement. The clock runs from the dispatcher thread's start to the
moment every new run has ended; the poll counts new runs by rowid and the active ones by the
kernel's partial status index, never scanning the history. The goal: the history costs at
most 15% of the empty database's throughput (random ids cost about a quarter to a third).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ACTIVE_SQL,
    Context,
    at_job_specs,
    dispatcher_thread,
    fmt,
    fresh_db,
    md_table,
    median,
    pyplot,
    ratio,
    save_plot,
    sqlite_synchronous,
    verdict,
)

NAME = "history"
TITLE = "1b. Throughput with a long history of runs"
GOAL_RATIO = 0.85
CONCURRENCY = 4
#: The three databases, in the order the first repetition runs them (later ones rotate it).
SIDES = ("empty", "history", "history_v4")


def params(ctx: Context) -> dict[str, Any]:
    return {"jobs": 1000 if ctx.quick else 2000, "history": 20_000 if ctx.quick else 100_000,
            "reps": 1 if ctx.quick else 5, "concurrency": CONCURRENCY}


def _v4_run_id(at_ms: int | None = None) -> str:
    """A random (version 4) run id, as the kernel made them before: the reference side's ids (``at_ms`` unused)."""
    import uuid

    return str(uuid.uuid4())


def build_history(directory: Path, name: str, runs: int, *, random_ids: bool) -> Path:
    """A database holding ``runs`` finished no-op runs with their two events each; returns its path."""
    from scheduler.base.run_ids import new_run_id
    from scheduler.base.timeutil import now_ms
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.jobs import create_jobs
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    path = fresh_db(directory, name)
    store = open_store(str(path))
    create_jobs(store, at_job_specs(200, at_ms=now_ms(), prefix="history"))
    seeder = Dispatcher(store, DispatcherConfig(concurrency=CONCURRENCY, lease_ttl_ms=15_000,
                                                artifacts_root=directory / f"artifacts-{name}"), say=None)
    thread = threading.Thread(target=lambda: seeder.run(duration_s=120), name="history-seed", daemon=True)
    thread.start()
    conn = sqlite3.connect(str(path))
    deadline = time.monotonic() + 120
    while conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'ok'").fetchone()[0] < 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the history's seed runs did not finish")
        time.sleep(0.02)
    seeder.request_stop()
    thread.join(timeout=60)
    store.close()
    run_cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    event_cols = [r[1] for r in conn.execute("PRAGMA table_info(runtime_events)") if r[1] != "id"]
    start = now_ms() - runs * 100  # one run every 100 ms, ending now
    ids = [(i, _v4_run_id() if random_ids else new_run_id(start + i * 100)) for i in range(runs)]
    conn.execute("BEGIN")
    conn.execute("CREATE TEMP TABLE history_ids (i INTEGER PRIMARY KEY, id TEXT NOT NULL)")
    conn.executemany("INSERT INTO history_ids VALUES (?, ?)", ids)
    template = conn.execute("SELECT rowid FROM runs WHERE status = 'ok' ORDER BY rowid LIMIT 1").fetchone()[0]
    select = ", ".join("x.id" if c == "id" else f"r.{c}" for c in run_cols)
    conn.execute(f"INSERT INTO runs({', '.join(run_cols)}) SELECT {select} FROM history_ids x, runs r"
                 f" WHERE r.rowid = {template} ORDER BY x.i")
    select = ", ".join("x.id" if c == "run_id" else f"e.{c}" for c in event_cols)
    for kind in ("run.started", "run.finished"):
        row = conn.execute("SELECT e.rowid FROM runtime_events e JOIN runs r ON r.id = e.run_id"
                           " WHERE e.kind = ? AND r.rowid = ?", (kind, template)).fetchone()[0]
        conn.execute(f"INSERT INTO runtime_events({', '.join(event_cols)}) SELECT {select} FROM history_ids x,"
                     f" runtime_events e WHERE e.rowid = {row} ORDER BY x.i")
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path


def run_on(directory: Path, base: Path | None, jobs: int, *, tag: str, random_ids: bool,
           timeout_s: float = 300.0) -> dict[str, Any]:
    """N due no-op jobs through an in-process dispatcher on a copy of ``base`` (None: a new database)."""
    import scheduler.core.queue as queue
    from scheduler.base.timeutil import now_ms
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.jobs import create_jobs
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    path = fresh_db(directory, f"run-{tag}.db")
    if base is not None:
        shutil.copyfile(base, path)
    store = open_store(str(path))
    create_jobs(store, at_job_specs(jobs, at_ms=now_ms(), prefix=f"due-{tag}"))
    conn = sqlite3.connect(str(path))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    first_rowid = conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM runs").fetchone()[0]
    history = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    kernel_ids = queue.new_run_id
    if random_ids:
        queue.new_run_id = _v4_run_id
    dispatcher = Dispatcher(store, DispatcherConfig(concurrency=CONCURRENCY, lease_ttl_ms=15_000,
                                                    artifacts_root=directory / f"artifacts-{tag}"), say=None)
    thread, failure = dispatcher_thread(dispatcher, duration_s=timeout_s, name="bench-dispatcher")
    try:
        start, cpu_start = time.perf_counter(), time.process_time()
        thread.start()
        while thread.is_alive() and time.perf_counter() - start < timeout_s:
            made = conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM runs").fetchone()[0] - first_rowid
            if made >= jobs and not conn.execute(f"SELECT COUNT(*) FROM runs WHERE status IN {ACTIVE_SQL}").fetchone()[0]:
                break
            time.sleep(0.01)
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        dispatcher.request_stop()
        thread.join(timeout=60)
    finally:
        queue.new_run_id = kernel_ids
    ok, versions = conn.execute(
        "SELECT COUNT(*), COUNT(DISTINCT substr(id, 15, 1)) FROM runs WHERE rowid > ? AND status = 'ok'",
        (first_rowid,)).fetchone()
    version = conn.execute("SELECT substr(id, 15, 1) FROM runs WHERE rowid > ? LIMIT 1", (first_rowid,)).fetchone()[0]
    conn.close()
    store.close()
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    if failure:
        raise RuntimeError(f"dispatcher failed: {failure[0]!r}")
    if ok != jobs or versions != 1 or version != ("4" if random_ids else "7"):
        raise RuntimeError(f"history run {tag}: {ok} of {jobs} ok, run id versions {versions} ({version})")
    return {"jobs_per_s": jobs / elapsed, "cpu_ms_per_job": cpu_s * 1000 / jobs, "history": history}


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx)
    directory = ctx.scratch(NAME)
    ctx.say(f"history: building {p['history']:,} runs with time-ordered ids and with random ids")
    built = time.perf_counter()
    bases = {"empty": None,
             "history": build_history(directory, "base-v7.db", p["history"], random_ids=False),
             "history_v4": build_history(directory, "base-v4.db", p["history"], random_ids=True)}
    build_s = time.perf_counter() - built
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    run_on(directory, None, 200, tag="warm-up", random_ids=False)  # first-use costs (imports, page cache), discarded
    for rep in range(p["reps"]):
        order = SIDES[rep % len(SIDES):] + SIDES[:rep % len(SIDES)]
        for side in order:
            results[side].append(run_on(directory, bases[side], p["jobs"], tag=f"{side}-{rep}",
                                        random_ids=side == "history_v4"))
        ctx.say(f"  rep {rep + 1}/{p['reps']}: " + ", ".join(
            f"{side} {results[side][-1]['jobs_per_s']:,.0f} jobs/s" for side in SIDES))
    res: dict[str, Any] = {"params": p, "synchronous": sqlite_synchronous(), "build_s": round(build_s, 1)}
    for side in SIDES:
        res[side] = {"jobs_per_s": median(r["jobs_per_s"] for r in results[side]),
                     "reps": [r["jobs_per_s"] for r in results[side]],
                     "cpu_ms_per_job": median(r["cpu_ms_per_job"] for r in results[side]),
                     "history": results[side][0]["history"]}
    reps = list(zip(*(results[s] for s in SIDES), strict=True))
    res["ratio"] = ratio(res["history"]["jobs_per_s"], res["empty"]["jobs_per_s"])
    res["ratio_reps"] = [ratio(h["jobs_per_s"], e["jobs_per_s"]) for e, h, _v4 in reps]
    res["ratio_v4"] = ratio(res["history_v4"]["jobs_per_s"], res["empty"]["jobs_per_s"])
    res["ids_gain"] = ratio(res["history"]["jobs_per_s"], res["history_v4"]["jobs_per_s"])
    res["ids_gain_reps"] = [ratio(h["jobs_per_s"], v4["jobs_per_s"]) for _e, h, v4 in reps]
    res["goal"] = GOAL_RATIO
    res["met"] = res["ratio"] is not None and res["ratio"] >= GOAL_RATIO
    res["load_avg_at_end"] = list(os.getloadavg())
    res["plot"] = _plot(ctx, res)
    return res


def _plot(ctx: Context, res: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    h = res["params"]["history"]
    labels = ["empty database", f"{h:,} runs of history", f"{h:,} runs of history,\nrandom ids (before)"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, side in enumerate(SIDES):
        reps = res[side]["reps"]
        ax.bar(i, res[side]["jobs_per_s"], color=["#7f7f7f", "#1f77b4", "#bbbbbb"][i])
        ax.scatter([i] * len(reps), reps, color="black", s=12, zorder=3)
        ax.annotate(f"{res[side]['jobs_per_s']:,.0f}", (i, res[side]["jobs_per_s"]), ha="center", va="bottom",
                    xytext=(0, 4), textcoords="offset points")
    ax.axhline(res["empty"]["jobs_per_s"] * GOAL_RATIO, color="#d62728", ls="--", lw=1,
               label=f"goal: {GOAL_RATIO:.0%} of the empty database")
    ax.set_xticks(range(len(SIDES)), labels)
    ax.set_ylim(0, max(max(res[s]["reps"]) for s in SIDES) * 1.2)
    ax.set_ylabel("no-op jobs per second (median, dots: each)")
    ax.set_title(f"In-process dispatcher, {res['params']['jobs']:,} jobs, synchronous={res['synchronous']}")
    ax.legend(loc="upper right")
    return save_plot(ctx, fig, "history")


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    return [(
        f"1b. no-op throughput with {res['params']['history']:,} runs of history vs an empty database",
        (f"{res['history']['jobs_per_s']:,.0f} vs {res['empty']['jobs_per_s']:,.0f} jobs/s = {res['ratio']:.2f}x "
         f"(random ids: {res['ratio_v4']:.2f}x)"),
        f">= {GOAL_RATIO:.2f}x",
        res["met"],
    )]


def render(res: dict[str, Any]) -> str:
    p = res["params"]
    labels = {"empty": "empty database", "history": f"{p['history']:,} runs of history (time-ordered ids)",
              "history_v4": f"{p['history']:,} runs of history, random ids (reference: before)"}
    rows = []
    for side in SIDES:
        r = res[side]
        rows.append((labels[side], fmt(r["jobs_per_s"], 0), ", ".join(f"{v:,.0f}" for v in r["reps"]),
                     fmt(r["cpu_ms_per_job"], 2), "—" if side == "empty" else f"{ratio(r['jobs_per_s'], res['empty']['jobs_per_s']):.2f}x"))
    table = md_table(["database", "jobs/s (median)", "each repetition", "CPU ms/job", "/ empty"], rows)
    out = [
        (f"{p['jobs']:,} one-shot no-op jobs due at once (testkit `ok`), an in-process dispatcher with concurrency "
         f"{p['concurrency']}, {p['reps']} repetition(s) with the three databases alternating, SQLite "
         f"`synchronous={res['synchronous']}` (WAL). The histories ({p['history']:,} finished runs with two events each, "
         f"built in {res['build_s']:.0f} s) are described in `bench/history.py`."),
        "",
        table,
        "",
        (f"History / empty: **{res['ratio']:.2f}x** (each repetition "
         + ", ".join(f"{v:.2f}x" for v in res["ratio_reps"]) + f"), goal >= {GOAL_RATIO:.2f}x: {verdict(res['met'])}. "
         f"Time-ordered / random ids on the same history: **{res['ids_gain']:.2f}x** (each repetition "
         + ", ".join(f"{v:.2f}x" for v in res["ids_gain_reps"]) + "). "
         "Why: a commit writes every page it dirtied to the WAL. A random id lands on a random leaf of each index keyed "
         "by run id, so with random ids each of a commit's runs dirtied a leaf of its own in the runs primary key and "
         "in the events' run index, and the more history, the more distinct leaves. Time-ordered ids all land on the "
         "last leaf. Load average at the end: " + ", ".join(f"{v:.2f}" for v in res["load_avg_at_end"]) + "."),
    ]
    if res.get("plot"):
        out += ["", f"![history]({res['plot']})"]
    return "\n".join(out)
