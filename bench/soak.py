"""Figure 7: soak. Repeated ``kill -9`` of a real ``scheduler run`` over at-most-once and at-least-once shell jobs.

Each job is a one-shot (``at``) slot due at a staggered time over the whole soak, so
every cycle has work starting, running and finishing when the dispatcher is killed.
A cycle starts ``scheduler run`` (the console script), lets it work for a random
while, then ``kill -9``s it; the next cycle's dispatcher takes over the dead one's
lease at once and recovers its runs. After the last cycle a final dispatcher drains
everything and stops with SIGTERM.

Every execution of a job's command appends ``start RUN_ID PGID`` (and ``end`` when it
finishes) to one side-effect log, so executions are counted per slot outside the
database. Figures (goals from issue 9):

- **lost slots**: jobs that never reached a terminal run after the drain (goal 0);
- **stuck runs**: runs not terminal after the drain (``running``, ``recovery_blocked``...; goal 0);
- **duplicated at-most-once slots**: executed more than once (goal 0);
- **at-least-once duplicates**: executed more than once, counted against the runs that were
  actually interrupted (ended ``crashed`` by recovery and replayed); a duplicate without an
  interrupted run is *unjustified* (goal 0);
- **orphaned process groups**: a logged command's process group still alive after the drain (goal 0);
- **replays dropped**: a replay dispatch (``...:replay:N``, made by recovery for an interrupted
  at-least-once run) that produced no run that ran, or a run of one without ``replay_of_run_id``
  (goal 0, issue 30). Besides the one-shot jobs, three every-second cron jobs at-least-once
  (``overlap_policy`` ``skip``, ``queue`` with ``queue_limit`` 1, ``allow``) each run a command longer than
  their interval, so a kill always interrupts one while a newer slot is due: their replays must
  wait out (or run beside) the overlap, never end ``skipped``.

Standalone, with options: ``python -m bench.soak --cycles 100 [--jobs-per-cycle 8] [--db URL]``
(prints the figures; ``--json`` for the raw result). Through ``python -m bench --only soak``
it runs 5 cycles with ``--quick`` and 100 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import Context, bench_env, fmt, fresh_db, md_table, scheduler_cmd

if TYPE_CHECKING:
    from scheduler.core.rows import JobRow

NAME = "soak"
TITLE = "7. Soak: kill -9 cycles of a real dispatcher"

#: Statuses after which a run is over (mirrors ``scheduler.core.runs.TERMINAL``).
TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


def params(ctx: Context) -> dict[str, Any]:
    """Cycle count and workload shape for the bench runner's mode."""
    return {"cycles": 5 if ctx.quick else 100, "jobs_per_cycle": 8, "min_alive_s": 0.8, "max_alive_s": 2.5,
            "min_run_s": 0.1, "max_run_s": 1.5, "concurrency": 4, "lease_ttl": "2s", "seed": 20260109}


#: The every-second at-least-once cron jobs whose replays meet their overlap policy: (policy, queue_limit).
OVERLAP_JOBS: tuple[tuple[str, int | None], ...] = (("skip", None), ("queue", 1), ("allow", None))


def _add_overlap_jobs(store: Any) -> list[JobRow]:
    """One ``* * * * * *`` at-least-once job per ``OVERLAP_JOBS`` entry, its command (1.4 s) outliving its interval."""
    from scheduler.core.jobs import create_jobs
    from scheduler.core.spec import validate_spec

    specs = []
    for policy, limit in OVERLAP_JOBS:
        specs.append(validate_spec({
            "name": f"soak-overlap-{policy}", "schedule_kind": "cron", "schedule_cron": "* * * * * *", "executor": "shell",
            "delivery_guarantee": "at-least-once", "overlap_policy": policy, "max_consecutive_failures": 0, "max_retries": 0,
            "run_timeout_ms": 30_000, "payload_message": "sleep 1.4", **({} if limit is None else {"queue_limit": limit}),
        }))
    return create_jobs(store, specs)


def _replays_owed(store: Any) -> int:
    """Replay dispatches still pending or claimed, and runs of replay dispatches not ended (the drain waits for 0)."""
    marks = ", ".join("?" for _ in TERMINAL)
    with store.read() as tx:
        queued = tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE replay_count > 0 AND status IN ('pending', 'claimed')")
        running = tx.scalar(f"SELECT COUNT(*) FROM runs WHERE dispatch_id LIKE '%:replay:%' AND status NOT IN ({marks})",
                            TERMINAL)
    return int(queued) + int(running)


def _replays_dropped(store: Any) -> tuple[int, int, int]:
    """(replay dispatches, those that produced no run that ran, runs of replay dispatches without ``replay_of_run_id``)."""
    with store.read() as tx:
        total = tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE replay_count > 0")
        dropped = tx.scalar(
            "SELECT COUNT(*) FROM job_dispatch_queue d WHERE d.replay_count > 0 AND NOT EXISTS ("
            " SELECT 1 FROM runs r WHERE r.dispatch_id = d.id AND r.started_at IS NOT NULL AND r.status <> 'skipped')")
        unlinked = tx.scalar("SELECT COUNT(*) FROM runs WHERE dispatch_id LIKE '%:replay:%' AND replay_of_run_id IS NULL")
    return int(total), int(dropped), int(unlinked)


def _command(log: Path, seconds: float) -> str:
    """The job's shell command: one side-effect line at the start, one at the end, a sleep between."""
    q = str(log).replace("'", "'\\''")
    return (f"echo \"start $SCHEDULER_RUN_ID $$\" >> '{q}'; sleep {seconds:.2f}; "
            f"echo \"end $SCHEDULER_RUN_ID $$\" >> '{q}'")


def _add_jobs(store: Any, log: Path, p: dict[str, Any], t0_ms: int, span_s: float, rng: random.Random) -> list[JobRow]:
    from scheduler.base.timeutil import to_iso
    from scheduler.core.jobs import create_jobs
    from scheduler.core.spec import validate_spec

    count = p["cycles"] * p["jobs_per_cycle"]
    specs = []
    for i in range(count):
        due = t0_ms + int(1000 + rng.random() * span_s * 1000)
        specs.append(validate_spec({
            "name": f"soak-{i:05d}",
            "schedule_kind": "at",
            "schedule_at": to_iso(due),
            "allow_past_at": True,
            "executor": "shell",
            "delivery_guarantee": "at-least-once" if i % 2 else "at-most-once",
            "max_retries": 0,
            "run_timeout_ms": 30_000,
            "payload_message": _command(log, rng.uniform(p["min_run_s"], p["max_run_s"])),
        }))
    return create_jobs(store, specs)


def _start(db: str, p: dict[str, Any], out: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``scheduler run`` with its output appended to ``out``; returns it and where its output begins."""
    offset = out.stat().st_size if out.exists() else 0
    with open(out, "ab") as fh:
        proc = subprocess.Popen(
            [*scheduler_cmd(), "--db", db, "run", "--concurrency", str(p["concurrency"]), "--lease-ttl", p["lease_ttl"],
             "--grace", "5s"],
            stdout=fh, stderr=subprocess.STDOUT, env=bench_env(),
        )
    return proc, offset


def _wait_ready(proc: subprocess.Popen[bytes], out: Path, offset: int, timeout: float = 30.0) -> None:
    """Wait until the dispatcher holds its lease (it has recovered what the previous one left)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(out, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        if "holds lease" in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"dispatcher exited {proc.returncode}: {text[-600:]}")
        time.sleep(0.02)
    raise RuntimeError(f"dispatcher not ready after {timeout}s")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unfinished(store: Any, excluded: list[str]) -> tuple[int, int]:
    """(runs not terminal, dispatches still pending or claimed), of the jobs not in ``excluded`` (the cron jobs)."""
    marks = ", ".join("?" for _ in TERMINAL)
    skip = " AND job_id NOT IN (" + ", ".join("?" for _ in excluded) + ")" if excluded else ""
    with store.read() as tx:
        runs = tx.scalar(f"SELECT COUNT(*) FROM runs WHERE status NOT IN ({marks}){skip}", (*TERMINAL, *excluded))
        queued = tx.scalar(f"SELECT COUNT(*) FROM job_dispatch_queue WHERE status IN ('pending', 'claimed'){skip}", excluded)
    return int(runs), int(queued)


def soak(db: str, workdir: Path, p: dict[str, Any], say: Any = None) -> dict[str, Any]:
    """Run the soak on database ``db`` (a SQLite path or PostgreSQL URL); returns the figures."""
    from scheduler.base.timeutil import now_ms
    from scheduler.plugins.stores import open_store

    say = say or (lambda _m: None)
    rng = random.Random(p["seed"])
    log = workdir / "side-effects.log"
    log.write_text("")
    out = workdir / "dispatchers.log"
    store = open_store(db)
    started = time.monotonic()
    try:
        span_s = p["cycles"] * (p["min_alive_s"] + p["max_alive_s"]) / 2
        jobs = _add_jobs(store, log, p, now_ms(), span_s, rng)
        overlap = [j.id for j in _add_overlap_jobs(store)]
        say(f"soak: {len(jobs)} one-shot shell jobs over ~{span_s:.0f}s, {p['cycles']} kill -9 cycles")
        kills_mid_run = 0
        for cycle in range(p["cycles"]):
            proc, offset = _start(db, p, out)
            _wait_ready(proc, out, offset)
            time.sleep(rng.uniform(p["min_alive_s"], p["max_alive_s"]))
            with store.read() as tx:
                running = tx.scalar("SELECT COUNT(*) FROM runs WHERE status = 'running'")
            kills_mid_run += bool(running)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            if (cycle + 1) % 10 == 0:
                say(f"soak: {cycle + 1}/{p['cycles']} cycles")
        # Drain: a dispatcher that is not killed finishes everything, then stops on SIGTERM.
        proc, offset = _start(db, p, out)
        _wait_ready(proc, out, offset)
        deadline = time.monotonic() + span_s + 120
        while time.monotonic() < deadline:
            runs_left, queued = _unfinished(store, overlap)
            with store.read() as tx:
                never = tx.scalar("SELECT COUNT(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.id)")
            if not runs_left and not queued and not never and not _replays_owed(store):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        drain_exit = proc.wait(60)
        elapsed = time.monotonic() - started
        return _figures(store, log, jobs, p, kills_mid_run=kills_mid_run, drain_exit=drain_exit, elapsed=elapsed,
                        dispatcher_log=out)
    finally:
        store.close()


def _figures(store: Any, log: Path, jobs: list[JobRow], p: dict[str, Any], **extra: Any) -> dict[str, Any]:
    replay_dispatches, replays_dropped, replays_unlinked = _replays_dropped(store)
    with store.read() as tx:
        runs = tx.all("SELECT id, job_id, status, error_code, replay_of_run_id, delivery_guarantee FROM runs")
    by_run = {r["id"]: r for r in runs}
    guarantee = {j.id: j.delivery_guarantee for j in jobs}
    starts: dict[str, int] = {j.id: 0 for j in jobs}
    pgids: set[int] = set()
    unknown_runs = 0
    begun: dict[str, int] = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        kind, run_id, pgid = parts
        pgids.add(int(pgid))
        run = by_run.get(run_id)
        if run is None:
            unknown_runs += 1
            continue
        if kind == "start":
            starts[run["job_id"]] += 1
            begun[run_id] = begun.get(run_id, 0) + 1
        elif kind == "end":
            begun[run_id] = begun.get(run_id, 0) - 1
    unfinished_execs = sum(1 for v in begun.values() if v > 0)
    terminal_jobs = {r["job_id"] for r in runs if r["status"] in TERMINAL}
    stuck = [r for r in runs if r["status"] not in TERMINAL]
    crashed = [r for r in runs if r["status"] == "crashed"]
    crashed_jobs = {r["job_id"] for r in crashed}
    most = [j for j in jobs if guarantee[j.id] == "at-most-once"]
    least = [j for j in jobs if guarantee[j.id] == "at-least-once"]
    dup_most = [j.id for j in most if starts[j.id] > 1]
    dup_least = [j.id for j in least if starts[j.id] > 1]
    unjustified = [jid for jid in dup_least if jid not in crashed_jobs]
    extra_least = sum(starts[jid] - 1 for jid in dup_least)
    orphans = sorted(g for g in pgids if _group_alive(g))
    dispatcher_log = extra.pop("dispatcher_log")
    text = Path(dispatcher_log).read_text(errors="replace")
    return {
        "params": p,
        "slots": len(jobs),
        "slots_at_most_once": len(most),
        "slots_at_least_once": len(least),
        "runs": len(runs),
        "executions": sum(starts.values()),
        "lost_slots": len([j for j in jobs if j.id not in terminal_jobs]),
        "never_executed_slots": len([j for j in jobs if starts[j.id] == 0]),
        "stuck_runs": len(stuck),
        "stuck_statuses": sorted({r["status"] for r in stuck}),
        "interrupted_runs": len(crashed),
        "interrupted_at_most_once": len([r for r in crashed if guarantee.get(r["job_id"]) == "at-most-once"]),
        "interrupted_at_least_once": len([r for r in crashed if guarantee.get(r["job_id"]) == "at-least-once"]),
        "replays": len([r for r in runs if r["replay_of_run_id"]]),
        "replay_dispatches": replay_dispatches,
        "replays_dropped": replays_dropped,
        "replay_runs_without_lineage": replays_unlinked,
        "duplicated_at_most_once": len(dup_most),
        "duplicated_at_least_once": len(dup_least),
        "extra_executions_at_least_once": extra_least,
        "unjustified_duplicates": len(unjustified),
        "executions_cut_short": unfinished_execs,
        "orphaned_process_groups": len(orphans),
        "log_lines_of_unknown_runs": unknown_runs,
        "tracebacks": text.count("Traceback"),
        **extra,
    }


def _ok(res: dict[str, Any]) -> bool:
    return (res["lost_slots"] == 0 and res["stuck_runs"] == 0 and res["duplicated_at_most_once"] == 0
            and res["unjustified_duplicates"] == 0 and res["orphaned_process_groups"] == 0 and res["tracebacks"] == 0
            and res["extra_executions_at_least_once"] <= res["interrupted_at_least_once"]
            and res.get("replays_dropped", 0) == 0 and res.get("replay_runs_without_lineage", 0) == 0)


def run(ctx: Context) -> dict[str, Any]:
    """``python -m bench`` entry point: a fresh SQLite database in the scratch directory."""
    p = params(ctx)
    directory = ctx.scratch(NAME)
    db = fresh_db(directory, "soak.db")
    return soak(str(db), directory, p, say=ctx.say)


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    return [(
        "7. soak: kill -9 cycles",
        (f"{res['params']['cycles']} cycles, {fmt(res['slots'])} slots: lost {res['lost_slots']}, stuck {res['stuck_runs']}, "
         f"at-most-once duplicated {res['duplicated_at_most_once']}, at-least-once duplicated "
         f"{res['duplicated_at_least_once']} of {res['interrupted_at_least_once']} interrupted, "
         f"orphaned groups {res['orphaned_process_groups']}, replays dropped {res.get('replays_dropped', 'n/a')}"),
        "all 0; at-least-once duplicates only for interrupted runs",
        _ok(res),
    )]


def render(res: dict[str, Any]) -> str:
    p = res["params"]
    rows = [
        ("slots (one-shot jobs)", res["slots"], f"{res['slots_at_most_once']} at-most-once, {res['slots_at_least_once']} at-least-once"),
        ("runs / executions (side-effect log)", f"{fmt(res['runs'])} / {fmt(res['executions'])}", "a replay is a second run of its slot"),
        ("lost slots", res["lost_slots"], "goal 0: every slot ends with a terminal run"),
        ("stuck runs", res["stuck_runs"], "goal 0: nothing left running or blocked after the drain"),
        ("interrupted runs (recovered `crashed`)", res["interrupted_runs"],
         f"{res['interrupted_at_most_once']} at-most-once (not run again), {res['interrupted_at_least_once']} at-least-once (replayed)"),
        ("executions cut short by a kill", res["executions_cut_short"], "started, never reached their `end` line"),
        ("duplicated at-most-once slots", res["duplicated_at_most_once"], "goal 0"),
        ("duplicated at-least-once slots", res["duplicated_at_least_once"],
         f"{res['extra_executions_at_least_once']} extra execution(s); allowed only for interrupted runs"),
        ("unjustified duplicates", res["unjustified_duplicates"], "goal 0: a duplicate without an interrupted run"),
        ("orphaned process groups", res["orphaned_process_groups"], "goal 0: command groups alive after the drain"),
        ("replays dropped", res.get("replays_dropped", "n/a"),
         (f"goal 0: of {res.get('replay_dispatches', 'n/a')} replay dispatches, none without a run that ran "
          f"({res.get('replay_runs_without_lineage', 'n/a')} replay runs without replay_of_run_id, goal 0)")),
        ("tracebacks in dispatcher output", res["tracebacks"], "goal 0"),
        ("dispatchers killed while runs were running", res["kills_mid_run"], f"of {p['cycles']} cycles"),
    ]
    return "\n".join([
        (f"{p['cycles']} cycles: `scheduler run --concurrency {p['concurrency']} --lease-ttl {p['lease_ttl']}` on a fresh SQLite "
         f"file, alive {p['min_alive_s']}–{p['max_alive_s']} s after it holds the lease, then `kill -9`; "
         f"{p['jobs_per_cycle']} one-shot shell jobs per cycle due at random times over the soak, half at-most-once and half "
         f"at-least-once, each sleeping {p['min_run_s']}–{p['max_run_s']} s between a `start` and an `end` line in a "
         "side-effect log; beside them three every-second at-least-once cron jobs (`sleep 1.4`, overlap_policy skip, "
         "queue with queue_limit 1, allow) whose replays meet their overlap. A final dispatcher drains everything and stops on SIGTERM "
         f"(exit {res['drain_exit']}); {res['elapsed']:.0f} s in all. Counts come from the log and the database after the drain."),
        "",
        md_table(["figure", "count", "meaning"], rows, align="lrl"),
        "",
        f"Verdict: **{'met' if _ok(res) else 'not met'}**.",
    ])


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.soak``: run the soak standalone with explicit options; exit 1 when a goal is missed."""
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=5, help="kill -9 cycles (default 5)")
    ap.add_argument("--jobs-per-cycle", type=int, default=8, help="one-shot jobs per cycle (default 8)")
    ap.add_argument("--min-alive", type=float, default=0.8, help="shortest life of a dispatcher before kill -9, s")
    ap.add_argument("--max-alive", type=float, default=2.5, help="longest life of a dispatcher before kill -9, s")
    ap.add_argument("--db", default=None, help="database (default: a fresh SQLite file in the work directory); a PostgreSQL URL works")
    ap.add_argument("--workdir", type=Path, default=None, help="where the database and logs go (default: a temporary directory)")
    ap.add_argument("--seed", type=int, default=20260109)
    ap.add_argument("--json", action="store_true", help="print the raw result as JSON")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scheduler-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    p = {**params(Context(quick=True, workdir=workdir, plot_dir=workdir)), "cycles": args.cycles,
         "jobs_per_cycle": args.jobs_per_cycle, "min_alive_s": args.min_alive, "max_alive_s": args.max_alive, "seed": args.seed}
    db = args.db or str(fresh_db(workdir, "soak.db"))
    res = soak(db, workdir, p, say=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(res, sort_keys=True))
    else:
        print(headline(res)[0][1])
        print(f"workdir: {workdir}")
    return 0 if _ok(res) else 1


if __name__ == "__main__":
    sys.exit(main())
