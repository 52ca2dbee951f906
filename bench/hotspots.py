"""What-if experiments behind the kernel hot spots found by the benchmarks (not part of the report).

    python -m bench.hotspots              # throughput (2,000 jobs) and lateness (500 runs) per variant
    python -m bench.hotspots --jobs 1000 --runs 300 --variants none,wake,all

Each variant applies a proposed kernel fix *in this process only* (monkeypatching,
or an extra index in the benchmark's own database) and re-runs figure 1 and figure 3
with it; the kernel's files are never touched. The patched functions copy the kernel
code as it stood when they were written, changing only what the fix changes:

* ``wake``: ``Dispatcher._wait`` returns as soon as a worker sets ``_wake`` (today it
  only looks between 50 ms slices and the SQLite store polls ``data_version`` with
  20 ms sleeps, so a freed worker slot is noticed up to 20 ms late);
* ``lock``: ``SQLiteStore.transaction`` serialises this process's writers on a
  ``threading.Lock`` (today threads collide on ``BEGIN IMMEDIATE`` and wait in SQLite's
  busy handler, which sleeps 1, 2, 5, 10 ... 100 ms between retries);
* ``index``: ``job_dispatch_queue(due_at, id) WHERE status = 'pending'``, so the claim
  query's ``ORDER BY due_at, id LIMIT n`` stops after n rows instead of sorting every
  due dispatch (today: "USE TEMP B-TREE FOR RIGHT PART OF ORDER BY");
* ``tick``: ``Dispatcher._tick`` takes one ``now`` for the whole pass; today a slot that
  falls due between ``materialize_due`` and ``next_due`` makes the pass return the
  0.5 s "blocked" sleep, although nothing is blocked;
* ``all``: every fix above together.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from bench import latency, throughput
from bench.common import Context, md_table, summary

VARIANTS = ("none", "wake", "lock", "index", "tick", "all")


@contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _wake_fix() -> Any:
    import scheduler.dispatcher as D
    from scheduler.store.sqlite import CHANGE_POLL_S

    def _wait(self: Any, timeout: float) -> None:
        end = time.monotonic() + timeout
        conn = self.store._conn()
        start = conn.execute("PRAGMA data_version").fetchone()[0]
        while not self._wake.is_set():
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            if self._wake.wait(min(CHANGE_POLL_S, remaining)):
                break
            if conn.execute("PRAGMA data_version").fetchone()[0] != start:
                break
        self._wake.clear()

    return _patched(D.Dispatcher, "_wait", _wait)


def _lock_fix() -> Any:
    from scheduler.store.sqlite import SQLiteStore, _SQLiteTx

    locks: dict[int, threading.Lock] = {}
    guard = threading.Lock()

    @contextmanager
    def transaction(self: Any) -> Iterator[Any]:
        conn = self._conn()
        if self._local.depth:
            self._local.depth += 1
            try:
                yield _SQLiteTx(conn)
            finally:
                self._local.depth -= 1
            return
        with guard:
            lock = locks.setdefault(id(self), threading.Lock())
        with lock:
            conn.execute("BEGIN IMMEDIATE")
            self._local.depth = 1
            try:
                yield _SQLiteTx(conn)
            except BaseException:
                self._local.depth = 0
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self._local.depth = 0
            conn.execute("COMMIT")

    return _patched(SQLiteStore, "transaction", transaction)


def _tick_fix() -> Any:
    import scheduler.dispatcher as D
    from scheduler.queue import claim_and_start, materialize_due, next_due
    from scheduler.timeutil import now_ms

    def _tick(self: Any) -> float:
        assert self.lease is not None
        tick_now = now_ms()
        self._propagate_cancels()
        if materialize_due(self.store, now=tick_now):
            self.store.notify_change()
        with self._active_lock:
            free = self.config.concurrency - len(self._active)
        started = claim_and_start(self.store, self.lease, limit=free, now=tick_now,
                                  veto=self.hooks.dispatch_veto if self.hooks else None) if free > 0 else []
        for s in started:
            self._submit(s)
        if started:
            return 0.0
        with self.store.read() as tx:
            due = next_due(tx)
        if due is None:
            return D.MAX_SLEEP_S
        if due <= tick_now:  # due before this pass began and still not started: really blocked
            return D.MAX_SLEEP_S / 2
        return max(0.0, min((due - now_ms()) / 1000, D.MAX_SLEEP_S))

    return _patched(D.Dispatcher, "_tick", _tick)


def _add_index(store: Any) -> None:
    with store.transaction() as tx:
        tx.execute("CREATE INDEX IF NOT EXISTS bench_dispatch_pending_due_id ON job_dispatch_queue(due_at, id) WHERE status = 'pending'")


def _variant(name: str) -> tuple[contextlib.ExitStack, Any]:
    stack = contextlib.ExitStack()
    parts = {"wake", "lock", "index", "tick"} if name == "all" else ({name} - {"none"})
    if "wake" in parts:
        stack.enter_context(_wake_fix())
    if "lock" in parts:
        stack.enter_context(_lock_fix())
    if "tick" in parts:
        stack.enter_context(_tick_fix())
    return stack, (_add_index if "index" in parts else None)


def claim_plan() -> str:
    """The query plan of the claim query on the kernel's schema, as evidence for ``index``."""
    from bench.common import kernel_schema_db

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.db"
        kernel_schema_db(path)
        conn = sqlite3.connect(str(path))
        rows = conn.execute("EXPLAIN QUERY PLAN SELECT * FROM job_dispatch_queue WHERE status = 'pending' AND due_at <= 0"
                            " ORDER BY due_at, id LIMIT 4").fetchall()
        conn.close()
    return "; ".join(r[-1] for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hotspots", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        print(f"unknown variant(s) {bad}; choose from {VARIANTS}", file=sys.stderr)
        return 2
    print(f"claim query plan today: {claim_plan()}")
    with tempfile.TemporaryDirectory(prefix="scheduler-hotspots-") as d:
        ctx = Context(quick=False, workdir=Path(d), plot_dir=Path(d) / "plots", verbose=False)
        raw = [throughput.run_raw(Path(d), args.jobs, batch=throughput.MATERIALISE_BATCH, tag=f"raw-{i}")["jobs_per_s"]
               for i in range(args.reps + 1)][1:]
        raw_js = sorted(raw)[len(raw) // 2]
        print(f"raw SQLite kernel-shaped loop: {raw_js:,.0f} jobs/s")
        rows = []
        lat_params = {"runs": args.runs, "gap_ms": [5, 20], "lead_ms": 1500, "concurrency": 4}
        for name in names:
            tputs, lats = [], []
            for rep in range(args.reps):
                stack, prepare = _variant(name)
                with stack:
                    tdir = ctx.scratch(f"t-{name}-{rep}")
                    tputs.append(throughput.run_kernel(ctx, tdir, args.jobs, tag=name, prepare=prepare)["jobs_per_s"])
                    lats.extend(latency.run_kernel(ctx, lat_params, prepare=prepare)["executor_start"])
            t = sorted(tputs)[len(tputs) // 2]
            s = summary(lats)
            rows.append((name, f"{t:,.0f}", f"{t / raw_js:.0%}", f"{s['p50']:.1f}", f"{s['p90']:.1f}", f"{s['p99']:.1f}", f"{s['max']:.1f}"))
            print(f"{name:6} {t:7,.0f} jobs/s ({t / raw_js:.0%} of raw)  lateness p50 {s['p50']:.1f} p90 {s['p90']:.1f} "
                  f"p99 {s['p99']:.1f} max {s['max']:.1f} ms", flush=True)
    print()
    print(md_table(["variant", "jobs/s", "of raw loop", "lateness p50 ms", "p90 ms", "p99 ms", "max ms"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
