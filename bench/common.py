"""Shared helpers: machine facts, fresh databases, statistics, job fixtures, plots.

Nothing here measures anything by itself; each benchmark module measures its
figure and its baseline in the same process, so the ratio survives a noisy or
slow machine even when the absolute numbers do not.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]

#: ``SCHEDULER_DISABLE_PLUGINS`` for the bench's processes: hook plugins (the venv's examples; no workload uses one).
BENCH_DISABLED_PLUGINS = "hooks:*"

#: Terminal run statuses (mirrors ``scheduler.core.runs.TERMINAL``; repeated here so the poller needs no kernel import).
TERMINAL_SQL = "('ok', 'error', 'timeout', 'cancelled', 'crashed', 'skipped')"


@dataclass
class Context:
    """What every benchmark gets: mode, scratch directory, where plots go, a progress printer."""

    quick: bool
    workdir: Path
    plot_dir: Path
    verbose: bool = True
    #: Plot file names are given relative to the report (``bench/xyz.png``).
    plot_prefix: str = "bench"
    notes: list[str] = field(default_factory=list)

    def say(self, msg: str) -> None:
        if self.verbose:
            print(f"  {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    def scratch(self, name: str) -> Path:
        """A fresh directory for one benchmark's databases."""
        path = self.workdir / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path


# -- machine facts --------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_mb() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_facts() -> dict[str, Any]:
    """Cores, CPU, memory, OS, Python, SQLite and the versions of everything compared."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_mb": _mem_total_mb(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
        "sqlite_synchronous": sqlite_synchronous(),
        "load_avg_1m_at_start": round(load, 2) if load is not None else None,
        "disabled_plugins": os.environ.get("SCHEDULER_DISABLE_PLUGINS", ""),
        "versions": {
            d: _version(d)
            for d in ("scheduler-kernel", "scheduler-executor-testkit", "scheduler-store-postgres", "APScheduler", "SQLAlchemy",
                      "psycopg", "matplotlib")
        },
    }


def sqlite_synchronous() -> str:
    """The synchronous setting the kernel's SQLite store uses (and every raw baseline copies): ``[storage]`` of the settings."""
    from scheduler.settings import current_settings

    return str(current_settings().storage.sqlite_synchronous).upper()


# -- statistics ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of nothing")
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (k - lo))


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": float(max(values)),
        "min": float(min(values)),
        "mean": float(statistics.fmean(values)),
    }


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# -- databases and jobs ----------------------------------------------------------------------------


def fresh_db(directory: Path, name: str) -> Path:
    """A path for a new SQLite database (any leftover file and its WAL removed)."""
    path = directory / name
    for suffix in ("", "-wal", "-shm", ".dispatcher.pid"):
        try:
            os.remove(str(path) + suffix)
        except FileNotFoundError:
            pass
    return path


def kernel_schema_db(path: Path) -> None:
    """Create the kernel's schema (tables, indexes, triggers) in ``path`` through the kernel itself, then close."""
    from scheduler.plugins.stores import open_store

    store = open_store(str(path))
    store.close()


def at_job_specs(count: int, *, at_ms: int | Callable[[int], int], payload: str = "ok", executor: str = "testkit",
                 prefix: str = "bench") -> list[Any]:
    """Validated one-shot (``at``) specs; ``at_ms`` is one instant or a function of the job index."""
    from scheduler.base.timeutil import to_iso
    from scheduler.core.spec import validate_spec

    specs = []
    for i in range(count):
        when = at_ms(i) if callable(at_ms) else at_ms
        specs.append(validate_spec({
            "name": f"{prefix}-{i:07d}",
            "schedule_kind": "at",
            "schedule_at": to_iso(when),
            "allow_past_at": True,
            "executor": executor,
            "payload_message": payload,
        }))
    return specs


#: The statuses of runs not yet ended: exactly the kernel's partial index ``runs_status_idx``.
ACTIVE_SQL = "('pending', 'running', 'awaiting_approval', 'approved', 'recovery_blocked')"


def dispatcher_thread(dispatcher: Any, *, duration_s: float, name: str = "bench-dispatcher"
                      ) -> tuple[threading.Thread, list[BaseException]]:
    """A thread (not started) that runs ``dispatcher.run(duration_s=...)``, and the list its failure lands in.

    The caller starts and joins the thread and raises what the list holds: a dispatcher that
    failed is reported with its exception, never read as a slow run.
    """
    failure: list[BaseException] = []

    def target() -> None:
        try:
            dispatcher.run(duration_s=duration_s)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller, never swallowed
            failure.append(exc)

    return threading.Thread(target=target, name=name, daemon=True), failure


def count_terminal(conn: sqlite3.Connection) -> int:
    """Runs that have ended, as all runs minus the active ones.

    Benchmarks poll this every few milliseconds while the scheduler works on the same
    two cores: both counts walk an index (microseconds), where counting the terminal
    statuses directly scans every run row (tens of microseconds per thousand runs),
    CPU taken from the scheduler being measured.
    """
    return int(conn.execute(f"SELECT (SELECT COUNT(*) FROM runs) - (SELECT COUNT(*) FROM runs WHERE status IN {ACTIVE_SQL})"
                            ).fetchone()[0])


class CountingStore:
    """Wraps a store's ``transaction`` to count commits: outermost write transactions only.

    A nested ``transaction()`` joins the open one (no commit of its own), so it is not
    counted; the nesting depth is read from the SQLite store's thread-local connection
    slot (bench-only peek at an internal).
    """

    def __init__(self, store: Any) -> None:
        self.count = 0
        original = store.transaction

        def counted() -> Any:
            slot = getattr(store._local, "slot", None)
            if slot is None or not slot.depth:
                self.count += 1
            return original()

        store.transaction = counted


# -- subprocess helpers ----------------------------------------------------------------------------


def scheduler_cmd() -> list[str]:
    """The ``scheduler`` console script next to this interpreter, else ``python -m scheduler``."""
    candidate = Path(sys.executable).parent / "scheduler"
    if candidate.exists() and os.access(candidate, os.X_OK):
        return [str(candidate)]
    return [sys.executable, "-m", "scheduler"]


def bench_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: ours, minus anything that would point the CLI at another database."""
    env = {k: v for k, v in os.environ.items() if k != "SCHEDULER_DB"}
    env.update(extra)
    return env


# -- output ----------------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: numbers with thousands separators, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub-flavoured Markdown table (``align``: one char per column, l or r)."""
    rows = [list(r) for r in rows]
    align = align or "l" + "r" * (len(headers) - 1)
    seps = ["---:" if a == "r" else ":---" for a in align]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(seps) + " |"]
    for r in rows:
        out.append("| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in r) + " |")
    return "\n".join(out)


def verdict(met: bool | None) -> str:
    if met is None:
        return "n/a"
    return "**met**" if met else "**not met**"


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    plt.rcParams.update({"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3, "font.size": 9})
    return plt


def save_plot(ctx: Context, fig: Any, name: str) -> str:
    """Save a figure as ``<plot_dir>/<name>.png``; returns the path relative to the report."""
    ctx.plot_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.plot_dir / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return f"{ctx.plot_prefix}/{name}.png"


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
