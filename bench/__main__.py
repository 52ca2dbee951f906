"""``python -m bench``: run the benchmarks and write ``docs/benchmarks.md`` plus ``docs/bench/*.png``.

    python -m bench                 # everything, full size (several minutes; 1M-job scale test)
    python -m bench --quick         # short form, < 60 s (CI smoke)
    python -m bench --only latency  # one benchmark (comma-separated list allowed); others keep their last results
    python -m bench --list          # benchmark names

Exit status: 0 when every selected benchmark ran (missed goals are reported, not
failed; add ``--strict`` to exit 1 on a missed goal), 1 when one crashed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench import report
from bench.common import BENCH_DISABLED_PLUGINS, REPO_ROOT, Context, machine_facts

#: name -> module, in report order.
BENCHMARKS = {
    "throughput": "bench.throughput",
    "history": "bench.history",
    "apscheduler": "bench.peer_apscheduler",
    "latency": "bench.latency",
    "scale": "bench.scale",
    "cli": "bench.cli_start",
    "postgres": "bench.postgres",
    "procrastinate": "bench.peer_procrastinate",
    "soak": "bench.soak",
    "delivery": "bench.delivery",
    "agent": "bench.agent",
    "evidence": "bench.evidence",
    "shell": "bench.shell",
    "web": "bench.web",
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description="Scheduler benchmarks (tables and plots into docs/benchmarks.md).")
    ap.add_argument("--quick", action="store_true", help="short form for CI smoke runs (< 60 s)")
    ap.add_argument("--only", metavar="NAME[,NAME]", help=f"run only these: {', '.join(BENCHMARKS)}")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "benchmarks.md", help="report path (plots go to <dir>/bench/)")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch directory for databases (default: a temp dir, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is not met")
    ap.add_argument("--list", action="store_true", help="list benchmark names and exit")
    ap.add_argument("--render-only", action="store_true",
                    help="run nothing: re-render the report from the results stored in it (after editing bench/*.py)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return ap.parse_args(argv)


def _render_only(out: Path) -> int:
    """Re-render ``out`` from its stored results (plots are left as they are)."""
    results = {k: v for k, v in report.load_results(out).items() if k in BENCHMARKS}
    if not results:
        print(f"no stored results in {out}", file=sys.stderr)
        return 1
    first = max(results.values(), key=lambda e: e.get("run") or "")  # the latest run's machine and selection
    facts = first.get("machine") or machine_facts()
    run_ids = {e.get("run") for e in results.values()}
    quick = all(e.get("quick") for e in results.values())
    total = sum(e.get("seconds", 0) for e in results.values() if e.get("run") == first.get("run"))
    order = [n for n in BENCHMARKS if n in results]
    text = report.render(results, facts=facts, order=list(BENCHMARKS), modules=BENCHMARKS, quick=quick, total_s=total,
                         selected=order if len(run_ids) == 1 else [n for n in order if results[n].get("run") == first.get("run")])
    out.write_text(text)
    print(f"re-rendered {out} from stored results")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for name, mod in BENCHMARKS.items():
            print(f"{name:12} {importlib.import_module(mod).TITLE}")
        return 0
    selected = list(BENCHMARKS)
    if args.only:
        selected = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in selected if n not in BENCHMARKS]
        if unknown:
            print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
    out: Path = args.out.resolve()
    if args.render_only:
        return _render_only(out)
    # The figures are the kernel's with the plugins their workloads use. A development venv also holds the example
    # plugins, whose hook implementations (an observer and a dispatch veto) would run on every run's transitions; they
    # are switched off here (and in every process the bench starts), as a deployment without them would be.
    if not os.environ.get("SCHEDULER_DISABLE_PLUGINS"):
        os.environ["SCHEDULER_DISABLE_PLUGINS"] = BENCH_DISABLED_PLUGINS
    plot_dir = out.parent / "bench"
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scheduler-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = Context(quick=args.quick, workdir=workdir, plot_dir=plot_dir, verbose=not args.quiet)
    facts = machine_facts()
    previous = report.load_results(out) if args.only else {}
    results: dict[str, Any] = {k: v for k, v in previous.items() if k in BENCHMARKS}
    crashed = False
    started = time.monotonic()
    try:
        for name in selected:
            module = importlib.import_module(BENCHMARKS[name])
            ctx.say(f"== {name}: {module.TITLE}")
            t0 = time.monotonic()
            entry: dict[str, Any] = {"quick": args.quick, "machine": facts, "run": facts["date_utc"],
                                     "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
            try:
                entry["result"] = module.run(ctx)
            except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
                crashed = True
                entry["error"] = f"{type(exc).__name__}: {exc}"
                ctx.say(f"!! {name} failed: {entry['error']}")
                if not args.quiet:
                    traceback.print_exc()
            entry["seconds"] = round(time.monotonic() - t0, 1)
            results[name] = entry
            ctx.say(f"== {name} done in {entry['seconds']} s")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    total = round(time.monotonic() - started, 1)
    text = report.render(results, facts=facts, order=list(BENCHMARKS), modules=BENCHMARKS, quick=args.quick, total_s=total,
                         selected=selected)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    ctx.say(f"wrote {out} ({total} s)")
    missed = report.missed_goals(results, BENCHMARKS, selected)
    for line in report.summary_lines(results, BENCHMARKS, selected):
        print(line)
    if crashed:
        return 1
    if args.strict and missed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
