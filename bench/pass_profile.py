"""``python -m bench.pass_profile``: where the dispatcher's passes spend their time (a diagnostic, not a report figure).

N one-shot jobs due at once go through an in-process dispatcher (testkit ``ok``, or shell ``true``
with ``--shell``; concurrency 4; the same hook plugins off as in every benchmark) and the tool prints,
per run:

* each thread's CPU and context switches (``/proc/self/task``): which thread is the critical path;
* the loop thread's statements ranked by their thread CPU (``time.thread_time`` around each one,
  BEGIN and COMMIT included), with how often each runs per pass that committed.

The statements are timed by wrapping the SQLite store's one statement function and its control
statements for the length of the run (a bench-only peek at internals, as ``CountingStore``'s; about a
microsecond a statement). The prose of figures 2 and 11 quotes this tool. Absolute figures move with
the machine (this AMD EPYC VM has run the same code at 0.57 and at 1.4 ms a no-op run on different
days): compare shares within one run, or two runs side by side.

    python -m bench.pass_profile                # 3,000 no-op runs
    python -m bench.pass_profile --shell -n 1000
    python -m bench.pass_profile --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import BENCH_DISABLED_PLUGINS, at_job_specs, count_terminal, dispatcher_thread, md_table

#: The dispatcher loop's thread (``dispatcher_thread``'s name): the one whose statements are timed.
LOOP_THREAD = "bench-dispatcher"
#: How many characters of a statement's text name it in the table.
STATEMENT_CHARS = 72


class StatementClock:
    """Thread CPU and wall time per statement text, for the statements one thread runs (``install`` .. ``remove``)."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        #: statement text (whitespace folded, cut to ``STATEMENT_CHARS``) -> [calls, CPU seconds, wall seconds]
        self.times: dict[str, list[float]] = {}
        self._undo: list[Callable[[], None]] = []

    def _timed(self, sql: str, call: Callable[[], Any]) -> Any:
        if threading.current_thread().name != self.thread_name:
            return call()
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return call()
        finally:
            key = re.sub(r"\s+", " ", sql).strip()[:STATEMENT_CHARS]
            entry = self.times.setdefault(key, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += time.thread_time() - cpu
            entry[2] += time.perf_counter() - wall

    def install(self) -> None:
        """Wrap the SQLite store's statement function and its BEGIN/COMMIT/PRAGMA runner."""
        from scheduler.core.store import sqlite as sqlite_store
        from scheduler.core.store import sqlite_statements

        statement = sqlite_statements.execute
        control = sqlite_store.SQLiteStore._exec

        def execute(conn: sqlite3.Connection, sql: str, params: Any, location: str, timeout_ms: int) -> Any:
            return self._timed(sql, lambda: statement(conn, sql, params, location, timeout_ms))

        def exec_control(store: Any, conn: sqlite3.Connection, sql: str, what: str) -> Any:
            return self._timed(sql, lambda: control(store, conn, sql, what))

        setattr(sqlite_statements, "execute", execute)  # noqa: B010 - replaced for the run, put back by ``remove``
        setattr(sqlite_store.SQLiteStore, "_exec", exec_control)  # noqa: B010
        self._undo = [lambda: setattr(sqlite_statements, "execute", statement),
                      lambda: setattr(sqlite_store.SQLiteStore, "_exec", control)]

    def remove(self) -> None:
        """Put the store's functions back."""
        for undo in self._undo:
            undo()
        self._undo = []


@contextmanager
def timing_statements(thread_name: str = LOOP_THREAD) -> Iterator[StatementClock]:
    """A ``StatementClock`` installed for the block."""
    clock = StatementClock(thread_name)
    clock.install()
    try:
        yield clock
    finally:
        clock.remove()


def thread_usage() -> dict[str, dict[str, float]]:
    """Per live thread of this process (by name): CPU seconds so far and context switches (``/proc/self/task``)."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, dict[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        switches = dict(re.findall(r"^(voluntary|nonvoluntary)_ctxt_switches:\s+(\d+)", status, re.MULTILINE))
        name = names.get(int(task.name), f"thread {task.name}")
        out[name] = {"cpu_s": (int(stat[11]) + int(stat[12])) / tick, "voluntary": int(switches.get("voluntary", 0)),
                     "involuntary": int(switches.get("nonvoluntary", 0))}
    return out


def profile(runs: int = 3000, *, shell: bool = False, directory: Path | None = None,
            timeout_s: float = 300.0) -> dict[str, Any]:
    """Run ``runs`` due one-shots through an in-process dispatcher with its loop's statements timed; the figures."""
    with hooks_off():
        return _profile(runs, shell=shell, directory=directory, timeout_s=timeout_s)


@contextmanager
def hooks_off() -> Iterator[None]:
    """``SCHEDULER_DISABLE_PLUGINS`` as every benchmark has it (``BENCH_DISABLED_PLUGINS``) for the block unless the
    caller set it, then the environment as it was: a caller's later plugin managers are not affected."""
    if "SCHEDULER_DISABLE_PLUGINS" in os.environ:
        yield
        return
    os.environ["SCHEDULER_DISABLE_PLUGINS"] = BENCH_DISABLED_PLUGINS
    try:
        yield
    finally:
        os.environ.pop("SCHEDULER_DISABLE_PLUGINS", None)


def _profile(runs: int, *, shell: bool, directory: Path | None, timeout_s: float) -> dict[str, Any]:
    """``profile``'s run, with the environment already set."""
    from scheduler.base.timeutil import now_ms
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.jobs import create_jobs
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    scratch = Path(directory or tempfile.mkdtemp(prefix="pass-profile-"))
    path = scratch / "profile.db"
    store = open_store(str(path))
    specs = at_job_specs(runs, at_ms=now_ms(), payload="true" if shell else "ok", executor="shell" if shell else "testkit")
    create_jobs(store, specs)
    dispatcher = Dispatcher(store, DispatcherConfig(concurrency=4, lease_ttl_ms=15_000, artifacts_root=scratch / "artifacts"),
                            say=None)
    poll = sqlite3.connect(str(path))
    thread, failure = dispatcher_thread(dispatcher, duration_s=timeout_s, name=LOOP_THREAD)
    before = thread_usage()
    with timing_statements() as clock:
        start_ms, cpu0 = now_ms(), time.process_time()
        thread.start()
        while thread.is_alive() and count_terminal(poll) < runs:
            time.sleep(0.02)
        cpu_s = time.process_time() - cpu0
        after = thread_usage()
        dispatcher.request_stop()
        thread.join(timeout=60)
    last, ok = poll.execute("SELECT MAX(finished_at), SUM(status = 'ok') FROM runs").fetchone()
    poll.close()
    store.close()
    if failure:
        raise RuntimeError(f"dispatcher failed: {failure[0]!r}")
    if ok != runs:
        raise RuntimeError(f"only {ok} of {runs} runs ended ok")
    threads: list[dict[str, Any]] = []
    for name, now in sorted(after.items(), key=lambda kv: -kv[1]["cpu_s"]):
        was = before.get(name, {"cpu_s": 0.0, "voluntary": 0, "involuntary": 0})
        threads.append({"thread": name, "cpu_ms_per_run": (now["cpu_s"] - was["cpu_s"]) * 1000 / runs,
                        "voluntary_per_run": (now["voluntary"] - was["voluntary"]) / runs,
                        "involuntary_per_run": (now["involuntary"] - was["involuntary"]) / runs})
    passes = int(clock.times.get("BEGIN IMMEDIATE", [0])[0])  # a pass that writes opens one write transaction
    statements: list[dict[str, Any]] = [{"statement": sql, "calls": int(calls), "per_pass": calls / passes if passes else None,
                   "cpu_us_per_call": cpu * 1e6 / calls, "wall_us_per_call": wall * 1e6 / calls,
                   "cpu_us_per_run": cpu * 1e6 / runs}
                  for sql, (calls, cpu, wall) in sorted(clock.times.items(), key=lambda kv: -kv[1][1])]
    loop = next((t for t in threads if t["thread"] == LOOP_THREAD), None)
    return {
        "workload": "shell true" if shell else "testkit ok", "runs": runs, "concurrency": 4,
        "jobs_per_s": runs / max(0.001, (last - start_ms) / 1000),
        "process_cpu_ms_per_run": cpu_s * 1000 / runs,
        "passes_committed": passes, "runs_per_pass": runs / passes if passes else None,
        "loop_cpu_ms_per_run": loop["cpu_ms_per_run"] if loop else None,
        "statements_cpu_ms_per_run": sum(s["cpu_us_per_run"] for s in statements) / 1000,
        "threads": threads, "statements": statements,
    }


def render(res: dict[str, Any], top: int = 15) -> str:
    """The figures as text: a summary line, the threads, and the ``top`` statements by CPU."""
    loop = res["loop_cpu_ms_per_run"] or 0.0
    head = (f"{res['runs']:,} {res['workload']} runs, concurrency {res['concurrency']}: {res['jobs_per_s']:,.0f} jobs/s, "
            f"process CPU {res['process_cpu_ms_per_run']:.3f} ms a run, {res['passes_committed']:,} passes committed "
            f"({res['runs_per_pass'] or 0:.2f} runs each); the loop's statements {res['statements_cpu_ms_per_run']:.3f} "
            f"of its {loop:.3f} ms a run")
    threads = md_table(["thread", "CPU ms/run", "voluntary switches/run", "involuntary/run"],
                       [(t["thread"], f"{t['cpu_ms_per_run']:.3f}", f"{t['voluntary_per_run']:.2f}",
                         f"{t['involuntary_per_run']:.2f}") for t in res["threads"] if t["cpu_ms_per_run"] > 0],
                       align="lrrr")
    statements = md_table(["loop statement", "calls/pass", "CPU us/call", "wall us/call", "CPU us/run", "of the loop"],
                          [(s["statement"], f"{s['per_pass']:.2f}" if s["per_pass"] is not None else "—",
                            f"{s['cpu_us_per_call']:.1f}", f"{s['wall_us_per_call']:.1f}", f"{s['cpu_us_per_run']:.1f}",
                            f"{s['cpu_us_per_run'] / 1000 / loop:.0%}" if loop else "—")
                           for s in res["statements"][:top]], align="lrrrrr")
    return "\n\n".join([head, threads, statements])


def _positive(text: str) -> int:
    """``--runs`` and ``--top``: a whole number above zero (argparse exits 2 with the message otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pass_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--runs", type=_positive, default=3000, help="one-shot jobs due at once (default 3,000)")
    ap.add_argument("--shell", action="store_true", help="shell `true` jobs instead of testkit `ok`")
    ap.add_argument("--top", type=_positive, default=15, help="statements shown (default 15)")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object")
    args = ap.parse_args(argv)
    res = profile(args.runs, shell=args.shell)
    print(json.dumps(res, indent=2) if args.json else render(res, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
