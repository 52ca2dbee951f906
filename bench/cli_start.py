"""Figure 5: CLI cold start of ``scheduler version`` and ``scheduler jobs add``, next to ``python -c pass``.

Each command is a fresh subprocess (the console script next to this interpreter,
or ``python -m scheduler`` when there is none), run N times round-robin after one
warm-up round so the OS file cache is warm for every command alike; wall time from
spawn to exit. ``jobs add`` writes a new cron job (unique name per call) into a
database initialised beforehand, so schema creation is not counted.

The issue sets no numeric goal for this figure: it is tracked, with the interpreter's
own start-up as the baseline. The heaviest imports of ``jobs add`` (``-X importtime``)
are listed to show where the time goes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from bench.common import Context, bench_env, fmt, fresh_db, kernel_schema_db, md_table, pyplot, save_plot, scheduler_cmd, summary

NAME = "cli"
TITLE = "5. CLI cold start"


def params(ctx: Context) -> dict[str, Any]:
    return {"runs": 3 if ctx.quick else 20}


def _spec(i: int) -> str:
    return json.dumps({"name": f"cli-bench-{i}", "schedule_kind": "cron", "schedule_cron": "*/5 * * * *",
                       "payload_message": "echo hello", "description": "cold-start benchmark"})


def _time(cmd: list[str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=bench_env(), check=False)
    elapsed = (time.perf_counter() - t) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.decode(errors='replace').strip()[-400:]}")
    return elapsed


def _top_imports(cmd_args: list[str], limit: int = 8) -> list[dict[str, Any]]:
    """The slowest top-level imports (cumulative µs) of ``python -X importtime -m scheduler ...``."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "scheduler", *cmd_args], capture_output=True, text=True,
                          env=bench_env(), check=False)
    rows = []
    for line in done.stderr.splitlines():
        # "import time: <self us> | <cumulative us> | <2 spaces per nesting level><module>"
        parts = line[len("import time:"):].split("|") if line.startswith("import time:") else []
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        rows.append({"module": name.strip(), "self_us": int(parts[0]), "cumulative_us": int(parts[1]), "depth": depth})
    top = [r for r in rows if r["depth"] == 0]
    top.sort(key=lambda r: -r["cumulative_us"])
    kernel = sorted(r["module"] for r in rows if r["module"] == "scheduler" or r["module"].startswith("scheduler."))
    return [{"module": r["module"], "cumulative_ms": r["cumulative_us"] / 1000} for r in top[:limit]] + [
        {"module": "(all imports)", "cumulative_ms": sum(r["cumulative_us"] for r in top) / 1000, "count": len(rows),
         "kernel_modules": kernel}]


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx)
    directory = ctx.scratch(NAME)
    db = fresh_db(directory, "cli.db")
    kernel_schema_db(db)
    sched = scheduler_cmd()
    counter = iter(range(1_000_000))
    commands: dict[str, Any] = {
        "python -c pass": lambda: [sys.executable, "-c", "pass"],
        "scheduler version": lambda: sched + ["version"],
        "scheduler jobs add": lambda: sched + ["--db", str(db), "jobs", "add", _spec(next(counter))],
        "scheduler jobs list": lambda: sched + ["--db", str(db), "jobs", "list"],
    }
    samples: dict[str, list[float]] = {k: [] for k in commands}
    ctx.say(f"cli: {p['runs']} cold starts of each of {len(commands)} commands")
    for make in commands.values():  # warm-up round (not counted)
        _time(make())
    for _ in range(p["runs"]):
        for k, make in commands.items():
            samples[k].append(_time(make()))
    stats = {k: summary(v) for k, v in samples.items()}
    base = stats["python -c pass"]["p50"]
    res: dict[str, Any] = {
        "params": p,
        "invocation": " ".join(sched) if len(sched) > 1 else sched[0],
        "stats": stats,
        "overhead_ms": {k: stats[k]["p50"] - base for k in stats},
        "ratio": {k: stats[k]["p50"] / base for k in stats},
        "imports_jobs_add": _top_imports(["--db", str(db), "jobs", "add", _spec(next(counter))]),
        "imports_version": _top_imports(["version"])[-1],
        "imports_jobs_list": _top_imports(["--db", str(db), "jobs", "list"])[-1],
    }
    res["plot"] = _plot(ctx, res)
    return res


def _plot(ctx: Context, res: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    names = list(res["stats"])
    med = [res["stats"][n]["p50"] for n in names]
    lo = [res["stats"][n]["p50"] - res["stats"][n]["min"] for n in names]
    hi = [res["stats"][n]["p90"] - res["stats"][n]["p50"] for n in names]
    fig, ax = plt.subplots(figsize=(6.4, 2.6))
    ax.barh(names, med, xerr=[lo, hi], color=["#7f7f7f"] + ["#1f77b4"] * (len(names) - 1), capsize=3)
    for y, v in enumerate(med):
        ax.annotate(f"{v:.0f} ms", (v, y), xytext=(4, 4), textcoords="offset points", va="bottom")
    ax.invert_yaxis()
    ax.set_xlabel("wall time per cold start, ms (median; whiskers min..p90)")
    ax.set_title(f"CLI cold start, {res['params']['runs']} runs each")
    return save_plot(ctx, fig, "cli")


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    s = res["stats"]
    return [(
        "5. CLI cold start (median)",
        (f"version {s['scheduler version']['p50']:.0f} ms, jobs list "
         f"{s['scheduler jobs list']['p50'] if 'scheduler jobs list' in s else float('nan'):.0f} ms, jobs add {s['scheduler jobs add']['p50']:.0f} ms "
         f"(python -c pass {s['python -c pass']['p50']:.0f} ms)"),
        "no numeric goal (tracked)",
        None,
    )]


def render(res: dict[str, Any]) -> str:
    rows = []
    order = ["python -c pass", "scheduler version", "scheduler jobs list", "scheduler jobs add"]
    for name in sorted(res["stats"], key=lambda n: order.index(n) if n in order else len(order)):
        s = res["stats"][name]
        rows.append((f"`{name}`", fmt(s["p50"], 1), fmt(s["min"], 1), fmt(s["p90"], 1),
                     fmt(res["overhead_ms"][name], 1), f"{res['ratio'][name]:.2f}x"))
    imports = res["imports_jobs_add"]
    total = imports[-1]
    imp_rows = [(f"`{r['module']}`", fmt(r["cumulative_ms"], 1)) for r in imports[:-1]]
    out = [
        (f"{res['params']['runs']} cold starts of each command, round-robin after a warm-up round; `scheduler` is "
         f"`{res['invocation']}`. `jobs add` adds one cron job (unique name) to an initialised database."),
        "",
        md_table(["command", "median ms", "min ms", "p90 ms", "over `python -c pass` (median)", "x baseline"], rows),
        "",
        "No numeric goal is set for this figure; it is tracked against the interpreter's own start-up. "
        f"Imports (`python -X importtime`): `version` imports {res['imports_version'].get('count', '?')} modules "
        f"({res['imports_version']['cumulative_ms']:.0f} ms of import time), `jobs add` {total.get('count', '?')} modules "
        f"({total['cumulative_ms']:.0f} ms)"
        + (f", `jobs list` {res['imports_jobs_list'].get('count', '?')} modules ({res['imports_jobs_list']['cumulative_ms']:.0f} ms)"
           if res.get("imports_jobs_list") else "")
        + ". Kernel modules `version` imports: "
        + ", ".join(f"`{m}`" for m in res["imports_version"].get("kernel_modules", [])) + " (command modules are imported"
        " by their command only); the rest of its count is the interpreter's `site` (editable installs' path hooks) and"
        " click. Heaviest top-level imports of `jobs add`:",
        "",
        md_table(["top-level import of `jobs add`", "cumulative ms"], imp_rows),
    ]
    if res.get("plot"):
        out += ["", f"![cli]({res['plot']})"]
    return "\n".join(out)
