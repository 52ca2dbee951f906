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

- **delivery** (issue 30): every one-shot job delivers its result through the ``webhook`` channel
  (parts of at most 100 characters, so a message has several) to a loopback receiver in the soak
  process that counts each ``webhook-id``: parts not delivered after the drain (goal 0), parts
  delivered but never received (goal 0), and repeats (a part received again with its key after
  a kill), within the bound of docs/delivery.md: ``[delivery] concurrency`` parts per kill.

With ``--dispatchers N`` (PostgreSQL only, where dispatchers share the work) N dispatchers run
at once; each cycle ``kill -9``s one of them and starts its replacement.

Standalone, with options: ``python -m bench.soak --cycles 100 [--jobs-per-cycle 8] [--db URL] [--dispatchers 3]``
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
            "min_run_s": 0.1, "max_run_s": 1.5, "concurrency": 4, "lease_ttl": "2s", "seed": 20260109, "dispatchers": 1,
            "delivery_concurrency": 8, "claim_ttl_ms": 3000, "drain_concurrency": 16}


SECRET_ENV = "SOAK_WEBHOOK_SECRET"
#: A fixed Standard Webhooks secret (the receiver is in this process, on loopback).
SECRET = "whsec_" + __import__("base64").b64encode(b"scheduler-soak-webhook-secret-32").decode()


class Receiver:
    """A loopback webhook receiver in the soak process: answers 200 and counts each ``webhook-id`` it got."""

    def __init__(self) -> None:
        import threading

        from scheduler.testing.http import LoopbackHTTPServer, Recorded, Reply

        self.counts: dict[str, int] = {}
        lock = threading.Lock()

        def answer(request: Recorded) -> Reply:
            with lock:
                key = request.headers.get("webhook-id", "")
                self.counts[key] = self.counts.get(key, 0) + 1
            return Reply(json={"ok": True})

        self.server = LoopbackHTTPServer(answer)
        self.url = f"{self.server.url}/hook"

    def close(self) -> None:
        self.server.close()


def _settings(workdir: Path, p: dict[str, Any]) -> dict[str, str]:
    """The dispatchers' environment: the webhook channel (100-character parts) and short delivery claims."""
    config = workdir / "soak.toml"
    config.write_text(f'[channels.webhook]\nsecret = {{credential = "env:{SECRET_ENV}"}}\nmax_chars = 100\ntimeout_s = 5\n'
                      f"[delivery]\nclaim_ttl_ms = {p['claim_ttl_ms']}\nretry_base_ms = 200\nretry_max_ms = 2000\n"
                      f"concurrency = {p['delivery_concurrency']}\n")
    return bench_env(SCHEDULER_CONFIG=str(config), **{SECRET_ENV: SECRET})


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


def _add_jobs(store: Any, log: Path, p: dict[str, Any], t0_ms: int, span_s: float, rng: random.Random, hook: str) -> list[JobRow]:
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
            # a slot interrupted by three kills in a row is not a failing job: auto-pause would cancel its owed replay
            "max_consecutive_failures": 0,
            "max_retries": 0,
            "run_timeout_ms": 30_000,
            "payload_message": _command(log, rng.uniform(p["min_run_s"], p["max_run_s"])),
            "delivery_mode": "always", "delivery_channel": "webhook", "delivery_to": hook,
        }))
    return create_jobs(store, specs)


def _start(db: str, p: dict[str, Any], out: Path, env: dict[str, str], *, concurrency: int | None = None
           ) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``scheduler run`` with its output appended to ``out``; returns it and where its output begins."""
    offset = out.stat().st_size if out.exists() else 0
    with open(out, "ab") as fh:
        proc = subprocess.Popen(
            [*scheduler_cmd(), "--db", db, "run", "--concurrency", str(concurrency or p["concurrency"]), "--lease-ttl", p["lease_ttl"],
             "--grace", "5s"],
            stdout=fh, stderr=subprocess.STDOUT, env=env,
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
    receiver = Receiver()
    env = _settings(workdir, p)
    many = p.get("dispatchers", 1)
    if many > 1 and store.local_path is not None:
        raise SystemExit("--dispatchers > 1 needs a PostgreSQL --db (SQLite has one dispatcher per database)")
    started = time.monotonic()
    alive: list[subprocess.Popen[bytes]] = []
    try:
        span_s = p["cycles"] * (p["min_alive_s"] + p["max_alive_s"]) / 2
        jobs = _add_jobs(store, log, p, now_ms(), span_s, rng, receiver.url)
        overlap = [j.id for j in _add_overlap_jobs(store)]
        say(f"soak: {len(jobs)} one-shot shell jobs over ~{span_s:.0f}s, {p['cycles']} kill -9 cycles, {many} dispatcher(s)")
        kills_mid_run = 0
        for cycle in range(p["cycles"]):
            while len(alive) < many:
                proc, offset = _start(db, p, out if many == 1 else workdir / f"dispatcher-{cycle}-{len(alive)}.log", env)
                _wait_ready(proc, out if many == 1 else workdir / f"dispatcher-{cycle}-{len(alive)}.log", offset)
                alive.append(proc)
            time.sleep(rng.uniform(p["min_alive_s"], p["max_alive_s"]))
            with store.read() as tx:
                running = tx.scalar("SELECT COUNT(*) FROM runs WHERE status = 'running'")
            kills_mid_run += bool(running)
            victim = alive.pop(rng.randrange(len(alive)))
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            if (cycle + 1) % 10 == 0:
                say(f"soak: {cycle + 1}/{p['cycles']} cycles")
        for proc in alive:  # the survivors go the same way, then one dispatcher drains
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        alive.clear()
        # Drain: a dispatcher that is not killed finishes everything, then stops on SIGTERM. It has more workers: the
        # three cron jobs alone need about 3.4 of the 4 (1.4 s every second each, allow unbounded), so the backlog the
        # kills left (their slots, the replays waiting for their overlap) would never clear at the soak's concurrency.
        drain_started = now_ms()
        proc, offset = _start(db, p, out, env, concurrency=p.get("drain_concurrency"))
        alive.append(proc)
        _wait_ready(proc, out, offset)
        deadline = time.monotonic() + span_s + 120
        marks = ", ".join("?" for _ in TERMINAL)
        while time.monotonic() < deadline:
            runs_left, queued = _unfinished(store, overlap)
            with store.read() as tx:
                never = tx.scalar("SELECT COUNT(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.id)")
                unsent = tx.scalar("SELECT COUNT(*) FROM delivery_outbox WHERE status IN ('pending', 'claimed')")
                # runs a killed dispatcher left (the cron jobs' too): on PostgreSQL they are recovered, and their
                # replays made, only when that dispatcher's lease expires, after the drain has started
                left = tx.scalar(f"SELECT COUNT(*) FROM runs WHERE status NOT IN ({marks}) AND started_at < ?",
                                 (*TERMINAL, drain_started))
            if not runs_left and not queued and not never and not unsent and not left and not _replays_owed(store):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        drain_exit = proc.wait(60)
        alive.clear()
        elapsed = time.monotonic() - started
        return _figures(store, log, jobs, p, kills_mid_run=kills_mid_run, drain_exit=drain_exit, elapsed=elapsed,
                        dispatcher_log=out, delivery=_delivery_figures(store, jobs, receiver.counts),
                        dispatcher_logs=sorted(str(f) for f in workdir.glob("dispatcher-*.log")))
    finally:
        for proc in alive:
            proc.kill()
        receiver.close()
        store.close()


def _delivery_figures(store: Any, jobs: list[JobRow], counts: dict[str, int]) -> dict[str, int]:
    """The one-shot jobs' outbox parts after the drain, against what the receiver got per ``webhook-id``."""
    ids = {j.id for j in jobs}
    with store.read() as tx:
        parts = [r for r in tx.all("SELECT job_id, idempotency_key, status FROM delivery_outbox") if r["job_id"] in ids]
    keys = {r["idempotency_key"] for r in parts}
    delivered = [r for r in parts if r["status"] == "delivered"]
    return {
        "parts": len(parts),
        "delivered": len(delivered),
        "failed": sum(1 for r in parts if r["status"] == "failed"),
        "not_delivered": len(parts) - len(delivered),
        "delivered_not_received": sum(1 for r in delivered if not counts.get(r["idempotency_key"])),
        "received_parts": sum(1 for k in counts if k in keys),
        "received_unknown": sum(1 for k in counts if k not in keys),
        "parts_received_twice_or_more": sum(1 for k, n in counts.items() if k in keys and n > 1),
        "repeats": sum(n - 1 for k, n in counts.items() if k in keys and n > 1),
    }


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
    text = "".join(Path(f).read_text(errors="replace") for f in [dispatcher_log, *extra.pop("dispatcher_logs", [])])
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


def _delivery_ok(res: dict[str, Any]) -> bool:
    """Every part delivered and received, none failed, repeats within ``[delivery] concurrency`` per kill."""
    d = res.get("delivery")
    if d is None:
        return True
    bound = res["params"].get("delivery_concurrency", 1) * res["params"]["cycles"]
    return (d["not_delivered"] == 0 and d["failed"] == 0 and d["delivered_not_received"] == 0 and d["received_unknown"] == 0
            and d["repeats"] <= bound)


def _ok(res: dict[str, Any]) -> bool:
    return (res["lost_slots"] == 0 and res["stuck_runs"] == 0 and res["duplicated_at_most_once"] == 0
            and res["unjustified_duplicates"] == 0 and res["orphaned_process_groups"] == 0 and res["tracebacks"] == 0
            and res["extra_executions_at_least_once"] <= res["interrupted_at_least_once"]
            and res.get("replays_dropped", 0) == 0 and res.get("replay_runs_without_lineage", 0) == 0 and _delivery_ok(res))


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
         f"orphaned groups {res['orphaned_process_groups']}, replays dropped {res.get('replays_dropped', 'n/a')}"
         + (f"; webhook parts not delivered {d['not_delivered']} of {d['parts']}, repeats {d['repeats']}"
            if (d := res.get("delivery")) else "")),
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
    d = res.get("delivery")
    if d:
        rows += [
            ("webhook parts (results of the one-shot jobs)", d["parts"], f"{d['delivered']} delivered, {d['failed']} failed"),
            ("parts not delivered after the drain", d["not_delivered"], "goal 0"),
            ("parts delivered but never received", d["delivered_not_received"], "goal 0"),
            ("parts received more than once (same key)", d["parts_received_twice_or_more"],
             f"{d['repeats']} repeat(s); bound {p.get('delivery_concurrency', 1)} per kill (`[delivery] concurrency`)"),
        ]
    return "\n".join([
        (f"{p['cycles']} cycles: `scheduler run --concurrency {p['concurrency']} --lease-ttl {p['lease_ttl']}` on a fresh SQLite "
         f"file (or the PostgreSQL database given, with {p.get('dispatchers', 1)} dispatcher(s) at once), alive {p['min_alive_s']}–{p['max_alive_s']} s after it holds the lease, then `kill -9`; "
         f"{p['jobs_per_cycle']} one-shot shell jobs per cycle due at random times over the soak, half at-most-once and half "
         f"at-least-once, each sleeping {p['min_run_s']}–{p['max_run_s']} s between a `start` and an `end` line in a "
         "side-effect log; beside them three every-second at-least-once cron jobs (`sleep 1.4`, overlap_policy skip, "
         "queue with queue_limit 1, allow) whose replays meet their overlap. A final dispatcher (`--concurrency "
         f"{p.get('drain_concurrency', p['concurrency'])}`) drains everything and stops on SIGTERM "
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
    ap.add_argument("--dispatchers", type=int, default=1, help="dispatchers at once (PostgreSQL only; each cycle kills one)")
    ap.add_argument("--seed", type=int, default=20260109)
    ap.add_argument("--json", action="store_true", help="print the raw result as JSON")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scheduler-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    p = {**params(Context(quick=True, workdir=workdir, plot_dir=workdir)), "cycles": args.cycles,
         "jobs_per_cycle": args.jobs_per_cycle, "min_alive_s": args.min_alive, "max_alive_s": args.max_alive, "seed": args.seed,
         "dispatchers": args.dispatchers}
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
