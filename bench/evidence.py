"""Figure 10: run throughput with checksum and with SSH evidence, beside the same jobs without evidence.

Workload: N one-shot (``at``) jobs due now, testkit payload ``ok`` (returns at once), one
dispatcher with ``concurrency=4``, as in figure 1; the three variants differ only in the
jobs' ``evidence`` block: none, ``{"provider": "checksum"}``, ``{"provider": "ssh"}``.
The SSH provider is configured as an operator would: a real ed25519 key made by
``ssh-keygen``, a principal and an allowed-signers file, so every run pays
``ssh-keygen -lf`` (fingerprint), ``-Y sign`` and the provider's self-check ``-Y verify``
(three processes). The clock starts when the dispatcher thread starts and stops at the
last run's ``finished_at``; every run must end ``ok`` with an evidence row (``attested``).
The result is each variant's jobs/s and its ratio to the no-evidence run of the same
repetition (variants interleaved per repetition, so a busy machine hurts all alike).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import Context, dispatcher_thread, fmt, fresh_db, md_table, median, pyplot, save_plot

NAME = "evidence"
TITLE = "10. Evidence: run throughput with checksum and SSH evidence vs. none"
CONCURRENCY = 4
VARIANTS = ("none", "checksum", "ssh")


def params(ctx: Context) -> dict[str, Any]:
    return {"jobs": 100 if ctx.quick else 400, "reps": 1 if ctx.quick else 3, "concurrency": CONCURRENCY}


def _specs(count: int, provider: str | None, at_ms: int) -> list[Any]:
    from scheduler.base.timeutil import to_iso
    from scheduler.core.spec import validate_spec

    extra = {"evidence": {"provider": provider}} if provider else {}
    return [validate_spec({"name": f"ev-{i:06d}", "schedule_kind": "at", "schedule_at": to_iso(at_ms), "allow_past_at": True,
                           "executor": "testkit", "payload_message": "ok", **extra}) for i in range(count)]


def _ssh_settings(directory: Path) -> Path:
    """A settings file with ``[providers.ssh]``: a fresh ed25519 key, its principal and an allowed-signers file."""
    keys = directory / "ssh"
    keys.mkdir(mode=0o700, exist_ok=True)
    key = keys / "signer"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f", str(key)], check=True,
                       capture_output=True, timeout=30)
    (keys / "allowed_signers").write_text(f"bench@example.org {(keys / 'signer.pub').read_text().strip()}\n")
    config = directory / "scheduler.toml"
    config.write_text(f'[providers.ssh]\nkey = "{key}"\nprincipal = "bench@example.org"\n'
                      f'allowed_signers = "{keys / "allowed_signers"}"\n')
    return config


def run_variant(ctx: Context, directory: Path, jobs: int, provider: str | None, *, tag: str,
                timeout_s: float = 300.0) -> dict[str, Any]:
    """N due no-op jobs (with ``provider``'s evidence, or none) through a real ``Dispatcher``; jobs/s."""
    from scheduler.base.timeutil import now_ms
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.jobs import create_jobs
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    path = fresh_db(directory, f"evidence-{tag}.db")
    store = open_store(str(path))
    create_jobs(store, _specs(jobs, provider, now_ms()))
    dispatcher = Dispatcher(store, DispatcherConfig(concurrency=CONCURRENCY, lease_ttl_ms=15_000,
                                                    artifacts_root=directory / f"artifacts-{tag}"), say=None)
    poll = sqlite3.connect(str(path))
    thread, failure = dispatcher_thread(dispatcher, duration_s=timeout_s, name="bench-evidence")
    start_ms = now_ms()
    start = time.perf_counter()
    thread.start()
    while thread.is_alive() and time.perf_counter() - start < timeout_s:
        if poll.execute("SELECT COUNT(*) FROM runs WHERE terminal_at IS NOT NULL").fetchone()[0] >= jobs:
            break
        time.sleep(0.01)
    dispatcher.request_stop()
    thread.join(timeout=60)
    ok, last = poll.execute("SELECT SUM(status = 'ok'), MAX(finished_at) FROM runs").fetchone()
    attested = poll.execute("SELECT COUNT(*) FROM evidence_records WHERE status = 'attested'").fetchone()[0]
    poll.close()
    store.close()
    if failure:
        raise RuntimeError(f"dispatcher failed: {failure[0]!r}")
    want = jobs if provider else 0
    if ok != jobs or attested != want:
        raise RuntimeError(f"{provider or 'no'} evidence run incomplete: {ok} ok, {attested} attested of {jobs}")
    elapsed = max(0.001, (last - start_ms) / 1000)
    return {"jobs": jobs, "elapsed_s": round(elapsed, 3), "jobs_per_s": jobs / elapsed}


def run(ctx: Context) -> dict[str, Any]:
    from scheduler.settings import reload_settings

    p = params(ctx)
    directory = ctx.scratch(NAME)
    saved = os.environ.get("SCHEDULER_CONFIG")
    os.environ["SCHEDULER_CONFIG"] = str(_ssh_settings(directory))
    reload_settings()
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS if v != "none"}
    try:
        run_variant(ctx, directory, 50, "ssh", tag="warm-up")  # imports, entry points, page cache: discarded
        for rep in range(p["reps"]):
            for variant in VARIANTS:
                r = run_variant(ctx, directory, p["jobs"], None if variant == "none" else variant, tag=f"{variant}-{rep}")
                per[variant].append(r["jobs_per_s"])
            for variant in ratios:
                ratios[variant].append(per[variant][-1] / per["none"][-1])
            ctx.say(f"evidence rep {rep + 1}/{p['reps']}: " + ", ".join(f"{v} {per[v][-1]:.0f}/s" for v in VARIANTS))
    finally:
        if saved is None:
            os.environ.pop("SCHEDULER_CONFIG", None)
        else:
            os.environ["SCHEDULER_CONFIG"] = saved
        reload_settings()
    res: dict[str, Any] = {"params": p, "variants": {}}
    for variant in VARIANTS:
        entry = {"jobs_per_s": median(per[variant]), "reps": per[variant]}
        if variant != "none":
            entry["ratio"] = median(ratios[variant])
            entry["ratio_reps"] = ratios[variant]
        res["variants"][variant] = entry
    res["ratio_checksum"] = res["variants"]["checksum"]["ratio"]
    res["ratio_ssh"] = res["variants"]["ssh"]["ratio"]
    res["plot"] = _plot(ctx, res)
    return res


def _plot(ctx: Context, res: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    values = [res["variants"][v]["jobs_per_s"] for v in VARIANTS]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    bars = ax.bar(["no evidence", "checksum", "ssh (sign + self-check)"], values, color=["#7f7f7f", "#1f77b4", "#ff7f0e"])
    for bar, v, variant in zip(bars, values, VARIANTS, strict=True):
        share = "" if variant == "none" else f"\n({res['variants'][variant]['ratio']:.0%})"
        ax.annotate(f"{v:,.0f}{share}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom")
    ax.set_ylim(0, max(values) * 1.25)
    ax.set_ylabel("runs per second (median)")
    ax.set_title(f"Run throughput with evidence, {res['params']['jobs']:,} jobs, concurrency {CONCURRENCY}")
    return save_plot(ctx, fig, "evidence")


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    return [("10. evidence: runs/s vs no evidence",
             f"checksum {res['ratio_checksum']:.0%}, ssh {res['ratio_ssh']:.0%}", "reported (no goal)", None)]


def render(res: dict[str, Any]) -> str:
    p = res["params"]
    labels = {"none": "no evidence", "checksum": "`checksum` (SHA-256 envelope)",
              "ssh": "`ssh` (ssh-keygen -lf, -Y sign, self-check -Y verify)"}
    rows = []
    for variant in VARIANTS:
        r = res["variants"][variant]
        rows.append((labels[variant], fmt(r["jobs_per_s"], 0), ", ".join(f"{v:,.0f}" for v in r["reps"]),
                     "—" if variant == "none" else f"{r['ratio']:.1%}",
                     "—" if variant == "none" else ", ".join(f"{v:.0%}" for v in r["ratio_reps"])))
    table = md_table(["jobs declare", "runs/s (median)", "each repetition", "ratio to none (median)", "each repetition"], rows)
    out = [
        (f"{p['jobs']:,} one-shot jobs due now, testkit payload `ok`, concurrency {CONCURRENCY}, {p['reps']} repetition(s); "
         "the three variants run one after another within each repetition and each ratio is taken within its repetition."),
        "",
        table,
        "",
        (f"With a no-op payload the attestation is the whole cost of a run's evidence: the checksum provider keeps "
         f"**{res['ratio_checksum']:.0%}** of the throughput, the SSH provider **{res['ratio_ssh']:.0%}** (three "
         "`ssh-keygen` processes per run). A job that runs for a second or more pays the same absolute cost per run."),
    ]
    if res.get("plot"):
        out += ["", f"![evidence]({res['plot']})"]
    return "\n".join(out)
