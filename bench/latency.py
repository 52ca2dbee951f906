"""Figure 3: lateness from a run's due time to the moment its executor starts.

N one-shot (``at``) jobs fall due at known instants 5-20 ms apart (seeded random
gaps), the first about 1.5 s after the dispatcher starts. A tiny in-bench executor
stamps ``time.time()`` on entry; lateness = stamp - ``request.scheduled_for_ms``.

Bench-only shortcut: the stamping executor is registered by pre-populating
``Dispatcher._executors["bench-stamp"]`` before ``run()`` instead of installing an
entry point. Everything else (materialise, claim, run row, worker pool, completion)
is the real dispatcher path.

Under load (issue 18): the same measured jobs while 1,000 no-op runs per second (testkit
``ok`` one-shots due 1 ms apart, from half a second before the first measured job to the
last) flow through the same dispatcher; goal p99 <= 25 ms (no load: <= 10 ms).

Baseline, same run: a bare Python thread that ``time.sleep``s until each of the same
instants and stamps its wake-up: the timer jitter of this machine and interpreter,
below which no scheduler written in Python can go.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from typing import Any

from bench.common import (
    Context,
    at_job_specs,
    count_terminal,
    dispatcher_thread,
    fmt,
    fresh_db,
    md_table,
    pyplot,
    save_plot,
    summary,
    verdict,
)

NAME = "latency"
TITLE = "3. Lateness: due time to executor start"
GOAL_P99_MS = 10.0
GOAL_LOADED_P99_MS = 25.0
LOAD_PER_S = 1000
EXECUTOR = "bench-stamp"


class StampExecutor:
    """Records when it was entered relative to the run's due time, and succeeds."""

    capabilities = frozenset()

    def __init__(self) -> None:
        from scheduler import PLUGIN_API_VERSION

        self.plugin_api = PLUGIN_API_VERSION
        self.lateness_ms: list[float] = []
        self._lock = threading.Lock()

    def execute(self, request: Any, control: Any) -> Any:
        from scheduler.core.execution import ExecutionResult

        late = time.time() * 1000 - request.scheduled_for_ms
        with self._lock:
            self.lateness_ms.append(late)
        return ExecutionResult(status="ok")


def params(ctx: Context) -> dict[str, Any]:
    return {"runs": 200 if ctx.quick else 500, "reps": 1 if ctx.quick else 3, "gap_ms": [5, 20],
            "lead_ms": 1000 if ctx.quick else 1500, "concurrency": 4, "load_per_s": LOAD_PER_S,
            "burst": 2000 if ctx.quick else 5000}


def run_burst(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    """Issue 30 defect 8: ``burst`` one-shot jobs due at one instant beside an every-second canary job, one dispatcher.

    Returns the burst's span (first start to last end), the canary's lateness (``started_at`` -
    ``scheduled_for``) for each of its slots due within that span, and how many of those slots did not run.
    """
    from scheduler.base.timeutil import now_ms
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.jobs import create_jobs
    from scheduler.core.spec import validate_spec
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    directory = ctx.scratch(NAME)
    path = fresh_db(directory, "burst.db")
    store = open_store(str(path))
    at = now_ms() + 1000
    create_jobs(store, at_job_specs(p["burst"], at_ms=at, prefix="burst"))
    [canary] = create_jobs(store, [validate_spec({"name": "canary", "schedule_kind": "every", "schedule_every": "1s",
                                                  "executor": "testkit", "payload_message": "ok"})])
    dispatcher = Dispatcher(store, DispatcherConfig(concurrency=p["concurrency"], artifacts_root=directory / "artifacts"), say=None)
    thread = threading.Thread(target=lambda: dispatcher.run(duration_s=300), name="bench-burst", daemon=True)
    thread.start()
    poll = sqlite3.connect(str(path))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and poll.execute(
            "SELECT COUNT(*) FROM runs WHERE job_id <> ? AND status = 'ok'", (canary.id,)).fetchone()[0] < p["burst"]:
        time.sleep(0.2)
    time.sleep(1.2)  # the canary's slot after the burst
    dispatcher.request_stop()
    thread.join(timeout=60)
    first, last, done = poll.execute("SELECT MIN(started_at), MAX(finished_at), COUNT(*) FROM runs WHERE job_id <> ?",
                                     (canary.id,)).fetchone()
    phase = poll.execute("SELECT MIN(scheduled_for) FROM runs WHERE job_id = ?", (canary.id,)).fetchone()[0] % 1000
    slots = poll.execute("SELECT scheduled_for, started_at, status FROM runs WHERE job_id = ? AND scheduled_for BETWEEN ? AND ?"
                         " ORDER BY scheduled_for", (canary.id, first, last)).fetchall()
    poll.close()
    store.close()
    if done != p["burst"]:
        raise RuntimeError(f"burst: {done} of {p['burst']} jobs ran")
    expected = len(range(first + (phase - first) % 1000, last + 1, 1000))  # the canary's slots within the span
    lateness = [float(s[1] - s[0]) for s in slots if s[2] == "ok"]
    return {"jobs": p["burst"], "span_ms": last - first, "canary_slots": expected,
            "canary_lost": expected - len(lateness), "canary_lateness": summary(lateness) if lateness else None}


def _instants(count: int, first: int, gaps: list[int], seed: int = 20260101) -> list[int]:
    rng = random.Random(seed)
    out, t = [], first
    for _ in range(count):
        out.append(t)
        t += rng.randint(gaps[0], gaps[1])
    return out


def run_kernel(ctx: Context, p: dict[str, Any], *, load_per_s: int = 0) -> dict[str, Any]:
    """One repetition; the job creation is retried with a longer lead when it did not finish well before the first due time."""
    for factor in (1, 3, 9):
        try:
            return _run_kernel(ctx, p, load_per_s=load_per_s, lead_factor=factor)
        except _TooSlow:
            ctx.say(f"  creating the jobs took longer than the lead; again with {factor * 3}x the lead")
    raise RuntimeError("creating the jobs took longer than the lead, three times")


class _TooSlow(Exception):
    """The jobs were not all created well before the first of them fell due."""


def _run_kernel(ctx: Context, p: dict[str, Any], *, load_per_s: int, lead_factor: int) -> dict[str, Any]:
    from scheduler.base.timeutil import now_ms
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.jobs import create_jobs
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    directory = ctx.scratch(NAME)
    path = fresh_db(directory, "latency.db")
    store = open_store(str(path))
    span_ms = p["runs"] * (p["gap_ms"][0] + p["gap_ms"][1]) // 2
    load = 0
    lead = p["lead_ms"]
    if load_per_s:
        load = (span_ms + 1000) * load_per_s // 1000
        lead += load  # room to create them (about 0.5 ms per job) before the first falls due
    instants = _instants(p["runs"], now_ms() + lead * lead_factor, p["gap_ms"])
    if load:
        step = 1000 / load_per_s
        start = instants[0] - 500
        create_jobs(store, at_job_specs(load, at_ms=lambda i: start + int(i * step), prefix="load"))
    create_jobs(store, at_job_specs(p["runs"], at_ms=lambda i: instants[i], executor=EXECUTOR, prefix="late"))
    if now_ms() > instants[0] - 500:
        store.close()
        raise _TooSlow()
    total_runs = p["runs"] + load
    dispatcher = Dispatcher(store, DispatcherConfig(concurrency=p["concurrency"], artifacts_root=directory / "artifacts"), say=None)
    stamp = StampExecutor()
    cache = getattr(dispatcher._executors, "_cache", dispatcher._executors)  # a LoadedProviders, or a dict before it
    cache[EXECUTOR] = stamp  # bench-only shortcut, see the module docstring
    span_s = (instants[-1] - now_ms()) / 1000
    thread, failure = dispatcher_thread(dispatcher, duration_s=span_s + 60, name="bench-dispatcher")
    thread.start()
    poll = sqlite3.connect(str(path))
    deadline = time.monotonic() + span_s + 30
    while thread.is_alive() and time.monotonic() < deadline + load / 500 and count_terminal(poll) < total_runs:
        time.sleep(0.1)
    dispatcher.request_stop()
    thread.join(timeout=60)
    recorded = [r[0] for r in poll.execute("SELECT started_at - scheduled_for FROM runs WHERE status = 'ok' AND executor = ?",
                                           (EXECUTOR,))]
    load_info: dict[str, Any] = {}
    if load:
        lo, hi, n_ok, _late = poll.execute(
            "SELECT MIN(started_at), MAX(finished_at), SUM(status = 'ok'), MAX(started_at - scheduled_for) FROM runs"
            " WHERE executor = 'testkit'").fetchone()
        lates = [r[0] for r in poll.execute("SELECT started_at - scheduled_for FROM runs WHERE executor = 'testkit'")]
        load_info = {"load_runs": load, "load_ok": n_ok, "load_per_s_achieved": n_ok / max(0.001, (hi - lo) / 1000),
                     "load_lateness": summary([float(v) for v in lates]) if lates else None}
    poll.close()
    store.close()
    if failure:
        raise RuntimeError(f"dispatcher failed: {failure[0]!r}")
    if len(stamp.lateness_ms) != p["runs"]:
        raise RuntimeError(f"only {len(stamp.lateness_ms)} of {p['runs']} runs reached the executor")
    return {"executor_start": stamp.lateness_ms, "db_started_at": recorded, **load_info}


def run_sleep_baseline(p: dict[str, Any]) -> list[float]:
    """A bare thread sleeping until each instant (same gaps), stamping how late it woke."""
    out: list[float] = []

    def target() -> None:
        instants = _instants(p["runs"], int(time.time() * 1000) + 200, p["gap_ms"])
        for due in instants:
            delay = due / 1000 - time.time()
            if delay > 0:
                time.sleep(delay)
            out.append(time.time() * 1000 - due)

    thread = threading.Thread(target=target, name="bench-sleeper")
    thread.start()
    thread.join()
    return out


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx)
    stamps: list[float] = []
    recorded: list[float] = []
    per_rep: list[dict[str, float]] = []
    for rep in range(p.get("reps", 1)):
        ctx.say(f"latency rep {rep + 1}/{p.get('reps', 1)}: {p['runs']} at-jobs {p['gap_ms'][0]}-{p['gap_ms'][1]} ms apart")
        kernel = run_kernel(ctx, p)
        stamps += kernel["executor_start"]
        recorded += kernel["db_started_at"]
        per_rep.append(summary(kernel["executor_start"]))
        ctx.say(f"  p50 {per_rep[-1]['p50']:.1f} p99 {per_rep[-1]['p99']:.1f} max {per_rep[-1]['max']:.1f} ms")
    loaded: list[float] = []
    loaded_reps: list[dict[str, Any]] = []
    for rep in range(p.get("reps", 1)):
        ctx.say(f"latency under load rep {rep + 1}/{p.get('reps', 1)}: the same jobs with {p['load_per_s']} no-op runs/s")
        kernel = run_kernel(ctx, p, load_per_s=p["load_per_s"])
        loaded += kernel["executor_start"]
        loaded_reps.append({**summary(kernel["executor_start"]), "load_per_s_achieved": kernel["load_per_s_achieved"],
                            "load_ok": kernel["load_ok"], "load_runs": kernel["load_runs"],
                            "load_p99": (kernel.get("load_lateness") or {}).get("p99")})
        ctx.say(f"  p50 {loaded_reps[-1]['p50']:.1f} p99 {loaded_reps[-1]['p99']:.1f} max {loaded_reps[-1]['max']:.1f} ms,"
                f" load {kernel['load_per_s_achieved']:.0f} runs/s")
    ctx.say(f"latency: a burst of {p['burst']:,} one-shot jobs due at once beside an every-second canary")
    burst = run_burst(ctx, p)
    if burst["canary_lateness"]:
        ctx.say(f"  burst {burst['span_ms'] / 1000:.1f} s; canary max {burst['canary_lateness']['max']:.0f} ms late,"
                f" {burst['canary_lost']} of {burst['canary_slots']} slots lost")
    ctx.say("latency: bare time.sleep baseline on the same gaps")
    base = run_sleep_baseline(p)
    res: dict[str, Any] = {
        "params": p,
        "kernel": summary(stamps),
        "kernel_db": summary(recorded),
        "per_rep": per_rep,
        "baseline": summary(base),
        "goal_p99_ms": GOAL_P99_MS,
        "burst": burst,
    }
    res["enough_runs"] = len(stamps) >= 500
    # The goal is stated over >= 500 runs: the quick form reports the numbers but gives no verdict.
    res["met"] = res["kernel"]["p99"] <= GOAL_P99_MS if res["enough_runs"] else None
    res["slow_runs"] = sum(1 for v in stamps if v > 100)
    res["loaded"] = summary(loaded)
    res["loaded_reps"] = loaded_reps
    res["goal_loaded_p99_ms"] = GOAL_LOADED_P99_MS
    res["met_loaded"] = res["loaded"]["p99"] <= GOAL_LOADED_P99_MS if res["enough_runs"] else None
    try:
        import os

        res["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    res["plot"] = _plot(ctx, res, stamps, base)
    return res


def _plot(ctx: Context, res: dict[str, Any], kernel: list[float], base: list[float]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    # Linear bins up to 2.5x the goal; anything later is counted in the last bin (and said so in the legend).
    top = max(GOAL_P99_MS * 2.5, min(max(kernel), res["kernel"]["p99"] * 1.5))
    over = sum(1 for v in kernel if v > top)
    kernel = [min(v, top) for v in kernel]
    base = [min(v, top) for v in base]
    bins = [i * top / 60 for i in range(61)]
    lo = min(0.0, *kernel, *base)
    if lo < 0:
        bins = [lo] + bins
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if over:
        ax.plot([], [], " ", label=f"{over} run(s) > {top:.0f} ms (max {res['kernel']['max']:.0f} ms) in the last bin")
    ax.hist(kernel, bins=bins, alpha=0.75, label=f"scheduler: executor start (p99 {res['kernel']['p99']:.1f} ms)", color="#1f77b4")
    ax.hist(base, bins=bins, alpha=0.6, label=f"bare time.sleep thread (p99 {res['baseline']['p99']:.1f} ms)", color="#7f7f7f")
    ax.axvline(GOAL_P99_MS, color="#d62728", ls="--", lw=1, label=f"goal: p99 <= {GOAL_P99_MS:g} ms")
    ax.axvline(res["kernel"]["p99"], color="#1f77b4", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("lateness after the due instant (ms)")
    ax.set_ylabel("runs")
    ax.set_title(f"Lateness over {res['kernel']['n']:,} runs due {res['params']['gap_ms'][0]}-{res['params']['gap_ms'][1]} ms apart")
    ax.legend(loc="upper right")
    return save_plot(ctx, fig, "latency")


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    k = res["kernel"]
    extra = "" if res["enough_runs"] else f" (only {k['n']} runs: quick form)"
    out = [(
        "3. lateness due -> executor start",
        f"p50 {k['p50']:.1f} / p99 {k['p99']:.1f} / max {k['max']:.1f} ms over {k['n']:,} runs{extra}",
        f"p99 <= {GOAL_P99_MS:g} ms over >= 500 runs",
        res["met"],
    )]
    if res.get("loaded"):
        lk = res["loaded"]
        achieved = ", ".join(f"{r['load_per_s_achieved']:,.0f}" for r in res["loaded_reps"])
        out.append((
            f"3b. lateness while {res['params']['load_per_s']:,} no-op runs/s flow",
            f"p50 {lk['p50']:.1f} / p99 {lk['p99']:.1f} / max {lk['max']:.1f} ms over {lk['n']:,} runs (load achieved {achieved} runs/s)",
            f"p99 <= {GOAL_LOADED_P99_MS:g} ms", res["met_loaded"]))
    b = res.get("burst")
    if b and b["canary_lateness"]:
        out.append((
            f"3c. an every-second job during a burst of {b['jobs']:,} due at once",
            (f"max {b['canary_lateness']['max']:,.0f} ms late over {b['canary_slots']} slots, {b['canary_lost']} lost"
             f" (the burst took {b['span_ms'] / 1000:.1f} s)"),
            "no slot lost (issue 30: 12 s late, 12 slots lost at 5,000)", b["canary_lost"] == 0))
    return out


def render(res: dict[str, Any]) -> str:
    p = res["params"]
    rows = []
    for label, key in (("scheduler: executor entered (stamped in the executor)", "kernel"),
                       ("scheduler: `runs.started_at` as the kernel records it (ms resolution)", "kernel_db"),
                       ("baseline: bare thread `time.sleep` until the instant", "baseline")):
        s = res[key]
        rows.append((label, fmt(s["n"]), fmt(s["p50"], 2), fmt(s["p90"], 2), fmt(s["p99"], 2), fmt(s["max"], 2)))
    if res.get("loaded"):
        s = res["loaded"]
        rows.append((f"scheduler under load ({p['load_per_s']:,} no-op runs/s through the same dispatcher): executor entered",
                     fmt(s["n"]), fmt(s["p50"], 2), fmt(s["p90"], 2), fmt(s["p99"], 2), fmt(s["max"], 2)))
    b = res.get("burst")
    if b and b["canary_lateness"]:
        s = b["canary_lateness"]
        rows.append(((f"every-second canary job while {b['jobs']:,} one-shot jobs due at one instant run "
                      f"({b['span_ms'] / 1000:.1f} s; {b['canary_lost']} of {b['canary_slots']} canary slots lost)"),
                     fmt(s["n"]), fmt(s["p50"], 2), fmt(s["p90"], 2), fmt(s["p99"], 2), fmt(s["max"], 2)))
    reps = res.get("per_rep") or []
    out = [
        (f"{len(reps) or 1} repetition(s) of {p['runs']:,} one-shot jobs due {p['gap_ms'][0]}–{p['gap_ms'][1]} ms apart "
         f"(seeded random gaps), the first {p['lead_ms'] / 1000:g} s after creation, pooled; one dispatcher, concurrency "
         f"{p['concurrency']}, an in-bench executor that stamps its entry (bench-only registration through "
         "`Dispatcher._executors`). Lateness = stamp − `scheduled_for`. The baseline is one repetition."),
        "",
        md_table(["measured", "runs", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows),
        "",
    ]
    if len(reps) > 1:
        out += ["Each repetition (executor entered): " + "; ".join(
            f"p50 {r['p50']:.1f} / p99 {r['p99']:.1f} / max {r['max']:.1f} ms" for r in reps) + ".", ""]
    if res.get("slow_runs"):
        out += [f"{res['slow_runs']} run(s) started more than 100 ms late.", ""]
    out += [
        ("The bare-sleep baseline shows how late this machine wakes any sleeping thread during the run: well above a "
         "fraction of a millisecond at p99, the machine was busy with other work and the scheduler's tail is inflated too."),
        "",
        *(["Under load, each repetition: " + "; ".join(
            f"p50 {r['p50']:.1f} / p99 {r['p99']:.1f} / max {r['max']:.1f} ms with {r['load_per_s_achieved']:,.0f} load runs/s"
            f" achieved ({r['load_ok']:,} of {r['load_runs']:,} ok; their own start lateness p99 {fmt(r['load_p99'], 0)} ms)"
            for r in res["loaded_reps"]) + f". Goal p99 <= {GOAL_LOADED_P99_MS:g} ms: {verdict(res['met_loaded'])}. "
            f"Load average at the end: {res.get('load_avg_1m_after', '?')}.", "",
            (("What changed it (issue 34): a pass that started fewer runs than it had free workers (work arriving one "
              "run at a time, as here) is followed by the next no sooner than 2 ms after it, so one commit takes the "
              "window's finished runs and due work together: at 1,000 runs/s offered, passes per run fell from about 0.8 "
              "to 0.4 and CPU per run from 0.90 to 0.62 ms (in-process A/B), which leaves the dispatcher headroom above "
              "the offered rate; with the worker's per-job-shape caches and the narrower claim reads the loaded p99 "
              "went from seconds to about 10-15 ms per repetition. A repetition's tail still moves with the machine: "
              "one of six repetitions measured this session had p99 39 ms.") if res.get("met_loaded") else
             "Why the loaded goal is missed on this machine (issue 34, stop 45, an AMD EPYC VM): the dispatcher now keeps "
             "up with the 1,000 runs/s offered in every repetition (998-1,000 achieved) and the median stays at about 4 ms, "
             "but the tail moves with the machine from one repetition to the next. This harness in-process, 15 repetitions "
             "in one sitting with nothing changed between them: p99 from 8.4 to 74 ms (median 12.4; 5 of the 15 above 25 "
             "ms). What was looked for and ruled out, with the WAL checkpoints, garbage collections, "
             "commits and passes of each repetition timed: the checkpoint thread (its passive checkpoint takes a median "
             "4-5 ms, at most about 60, but holds the process's writers back only 1.5-3 ms, and a quarter or less of the "
             "runs later than 20 ms overlap one); the cyclic garbage collector (one full collection of 17-62 ms per "
             "repetition); no commit or pass of the loop longer than 14 ms. The late runs come from spells in which the "
             "machine gives the loop less CPU than the offered rate needs: every run of such a spell waits, and the "
             "backlog takes as long again to drain at the spare capacity (in-process the dispatcher does about 1,600-2,100 "
             "no-op runs/s at these hours). The claim order is not it either: oldest-first only, newest-first one pass in "
             "four, and today's alternation gave p99 from 12 to 171 ms each (4 repetitions each), overlapping. So this row needs more headroom "
             "per run (figure 2's CPU), not a different loop."), ""] if res.get("loaded") else []),
        f"Goal p99 <= {GOAL_P99_MS:g} ms over >= 500 runs: {verdict(res['met'])}"
        + ("" if res["enough_runs"] else f" (no verdict: the quick form has {p['runs']} runs, fewer than the goal asks)") + ".",
    ]
    if res.get("plot"):
        out += ["", f"![latency]({res['plot']})"]
    return "\n".join(out)
