"""Figure 2: the same workload through APScheduler 3.x, beside the scheduler in the same run.

APScheduler side: ``BackgroundScheduler`` with a ``SQLAlchemyJobStore`` on a SQLite
file and a ``ThreadPoolExecutor(4)`` (the same worker count as our dispatcher). The
jobs (a module-level no-op function, date trigger, ``run_date`` = now) are written to
the job store while the scheduler is paused, exactly like our jobs exist before the
dispatcher starts; the clock runs from ``resume()`` until an ``EVENT_JOB_EXECUTED``
listener has seen every job. ``misfire_grace_time=None`` so no job is dropped for
being late. For fairness its SQLite connections get the same ``journal_mode=WAL`` and
``synchronous`` setting as ours (APScheduler's defaults, a rollback journal with
``synchronous=FULL``, would be slower).

Scheduler side: ``bench.throughput.run_kernel`` on the same number of jobs.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC
from pathlib import Path
from typing import Any

from bench.common import Context, fmt, fresh_db, md_table, median, pyplot, ratio, save_plot, sqlite_synchronous, verdict
from bench.throughput import CONCURRENCY, MATERIALISE_BATCH, run_kernel, run_raw

NAME = "apscheduler"
TITLE = "2. Peer: APScheduler 3.x (SQLAlchemyJobStore on SQLite)"
GOAL_RATIO = 3.0


def noop() -> None:
    """The job APScheduler runs (must be importable: its job store pickles a reference)."""


def params(ctx: Context) -> dict[str, Any]:
    return {"jobs": 400 if ctx.quick else 2000, "reps": 1 if ctx.quick else 3, "concurrency": CONCURRENCY}


def _available() -> str | None:
    try:
        import apscheduler  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as exc:
        return f"APScheduler 3.x / SQLAlchemy not installed ({exc.name}); pip install -r bench/requirements.txt"
    from importlib.metadata import version

    major = int(version("APScheduler").split(".")[0])
    if major != 3:
        return f"APScheduler {version('APScheduler')} installed; this comparison needs 3.x"
    return None


def run_apscheduler(directory: Path, jobs: int, *, tag: str, timeout_s: float = 300.0) -> dict[str, Any]:
    from datetime import datetime

    from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler
    from sqlalchemy import create_engine, event

    path = fresh_db(directory, f"aps-{tag}.db")
    engine = create_engine(f"sqlite:///{path}")
    sync = sqlite_synchronous()

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute(f"PRAGMA synchronous = {sync}")
        cur.close()

    scheduler = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(engine=engine)},
        executors={"default": ThreadPoolExecutor(CONCURRENCY)},
        job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 1},
        timezone=UTC,
    )
    done = threading.Event()
    lock = threading.Lock()
    seen = {"executed": 0, "errors": 0, "missed": 0, "last": 0.0}

    def listener(ev: Any) -> None:
        with lock:
            if ev.code == EVENT_JOB_EXECUTED:
                seen["executed"] += 1
            elif ev.code == EVENT_JOB_ERROR:
                seen["errors"] += 1
            else:
                seen["missed"] += 1
            if seen["executed"] + seen["errors"] + seen["missed"] >= jobs:
                seen["last"] = time.perf_counter()
                done.set()

    scheduler.add_listener(listener, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED)
    scheduler.start(paused=True)
    now = datetime.now(UTC)
    for i in range(jobs):
        scheduler.add_job(noop, "date", run_date=now, id=f"aps-{i}")
    start = time.perf_counter()
    scheduler.resume()
    finished = done.wait(timeout_s)
    scheduler.shutdown(wait=True)
    engine.dispose()
    if not finished or seen["executed"] != jobs:
        raise RuntimeError(f"APScheduler run incomplete: {seen} of {jobs} after {time.perf_counter() - start:.1f}s")
    elapsed = seen["last"] - start
    return {"jobs": jobs, "elapsed_s": round(elapsed, 3), "jobs_per_s": jobs / elapsed}


def run(ctx: Context) -> dict[str, Any]:
    why = _available()
    if why:
        return {"skipped": why}
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    p = params(ctx)
    directory = ctx.scratch(NAME)
    ours, theirs, ceiling = [], [], []
    for rep in range(p["reps"]):
        ceiling.append(run_raw(directory, p["jobs"], batch=MATERIALISE_BATCH, tag=f"raw-{rep}"))
        ctx.say(f"apscheduler rep {rep + 1}/{p['reps']}: APScheduler, {p['jobs']} jobs")
        theirs.append(run_apscheduler(directory, p["jobs"], tag=str(rep)))
        ctx.say(f"apscheduler rep {rep + 1}/{p['reps']}: scheduler, {p['jobs']} jobs")
        ours.append(run_kernel(ctx, directory, p["jobs"], tag=str(rep)))
        ctx.say(f"  scheduler {ours[-1]['jobs_per_s']:.0f} jobs/s, APScheduler {theirs[-1]['jobs_per_s']:.0f} jobs/s")
    from importlib.metadata import version

    o = median(r["jobs_per_s"] for r in ours)
    t = median(r["jobs_per_s"] for r in theirs)
    res: dict[str, Any] = {
        "params": p,
        "synchronous": sqlite_synchronous(),
        "apscheduler_version": version("APScheduler"),
        "sqlalchemy_version": version("SQLAlchemy"),
        "ours": {"jobs_per_s": o, "reps": [r["jobs_per_s"] for r in ours]},
        "theirs": {"jobs_per_s": t, "reps": [r["jobs_per_s"] for r in theirs]},
        "ceiling": {"jobs_per_s": median(r["jobs_per_s"] for r in ceiling), "reps": [r["jobs_per_s"] for r in ceiling]},
        "ratio": ratio(o, t),
        "goal": GOAL_RATIO,
    }
    res["met"] = res["ratio"] is not None and res["ratio"] >= GOAL_RATIO
    res["plot"] = _plot(ctx, res)
    return res


def _plot(ctx: Context, res: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    labels = ["scheduler", f"APScheduler {res['apscheduler_version']}\n(SQLAlchemyJobStore)",
              "raw SQLite loop of the\nscheduler's row writes"]
    values = [res["ours"]["jobs_per_s"], res["theirs"]["jobs_per_s"], res["ceiling"]["jobs_per_s"]]
    bars = ax.bar(labels, values, color=["#1f77b4", "#ff7f0e", "#bbbbbb"])
    ax.axhline(res["theirs"]["jobs_per_s"] * GOAL_RATIO, color="#d62728", ls="--", lw=1, label=f"goal: {GOAL_RATIO:g}x APScheduler")
    for bar, v in zip(bars, values, strict=True):
        ax.annotate(f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom")
    ax.set_ylim(0, max(values + [res["theirs"]["jobs_per_s"] * GOAL_RATIO]) * 1.12)
    ax.set_ylabel("jobs per second (median)")
    ax.set_title(f"{res['params']['jobs']:,} no-op jobs due now, 4 workers, SQLite file")
    ax.legend(loc="upper right")
    return save_plot(ctx, fig, "apscheduler")


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    return [(
        "2. throughput vs APScheduler 3.x",
        f"{res['ours']['jobs_per_s']:,.0f} vs {res['theirs']['jobs_per_s']:,.0f} jobs/s = {res['ratio']:.2f}x",
        f">= {GOAL_RATIO:g}x",
        res["met"],
    )]


def render(res: dict[str, Any]) -> str:
    p = res["params"]
    rows = [
        ("scheduler dispatcher (testkit `ok`)", fmt(res["ours"]["jobs_per_s"], 0), ", ".join(f"{v:,.0f}" for v in res["ours"]["reps"])),
        (f"APScheduler {res['apscheduler_version']} + SQLAlchemy {res['sqlalchemy_version']} (no-op function)",
         fmt(res["theirs"]["jobs_per_s"], 0), ", ".join(f"{v:,.0f}" for v in res["theirs"]["reps"])),
    ]
    rows.append(("raw SQLite loop doing the scheduler's row writes (its ceiling, see figure 1)",
                 fmt(res["ceiling"]["jobs_per_s"], 0), ", ".join(f"{v:,.0f}" for v in res["ceiling"]["reps"])))
    ceiling_ratio = ratio(res["ceiling"]["jobs_per_s"], res["theirs"]["jobs_per_s"])
    out = [
        f"{p['jobs']:,} jobs due now, {p['concurrency']} worker threads each, a SQLite file each (WAL, "
        f"`synchronous={res['synchronous']}`), {p['reps']} repetition(s) alternating. APScheduler: `BackgroundScheduler`, "
        "`SQLAlchemyJobStore`, `ThreadPoolExecutor(4)`, date trigger at now, jobs stored while paused, timed from `resume()` "
        "to the last `EVENT_JOB_EXECUTED`. Scheduler: timed from dispatcher start to the last run's `finished_at` (each run "
        "durably claimed, recorded with its events, and completed).",
        "",
        md_table(["scheduler", "jobs/s (median)", "each repetition"], rows),
        "",
        f"Ratio scheduler / APScheduler: **{res['ratio']:.2f}x**, goal >= {GOAL_RATIO:g}x: {verdict(res['met'])}.",
        "",
        f"For scale: the raw loop that only performs the scheduler's durable row writes (claim, run row, events, completion; "
        f"about 9 row writes in 2 commits per run) reaches {fmt(ceiling_ratio, 2)}x APScheduler, which commits one `DELETE` "
        "per job and keeps no run history."
        + (" The dispatcher already groups completions, new slots and claims into one commit per pass; a goal above that "
           "ceiling would need fewer durable row writes per run than the run history and audit trail the scheduler keeps "
           "(APScheduler keeps neither)."
           if ceiling_ratio is not None and ceiling_ratio < GOAL_RATIO else ""),
    ]
    if res.get("plot"):
        out += ["", f"![apscheduler]({res['plot']})"]
    return "\n".join(out)
