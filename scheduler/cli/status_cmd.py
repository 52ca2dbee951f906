"""``scheduler status`` and ``scheduler doctor``: what the runtime is doing, and whether it is healthy."""

from __future__ import annotations

from typing import Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, json_mode, kv, local_time, table
from scheduler.ops.health import check_reasons, collect_status, plugin_check, store_checks
from scheduler.plugins.health import provider_checks


@click.command("status")
@click.option("--check", is_flag=True,
              help="Health check for monitors: exit 0 printing `ok`, else non-zero with a one-line reason (HEALTH_CHECK_FAILED).")
def status_cmd(check: bool) -> None:
    """Lease, queue, runs and recovery state at a glance."""
    status = collect_status(open_ctx_store())
    if check:
        reasons = check_reasons(status)
        if reasons:
            raise SchedulerError("HEALTH_CHECK_FAILED", "; ".join(r["reason"] for r in reasons), details=reasons)
        emit({"healthy": True, "reasons": []}, lambda: click.echo("ok"))
        return

    def human() -> None:
        live = [lease for lease in status["leases"] if lease["live"] and lease["name"] != "maintenance"]
        kv([
            ("database", status["database"]),
            ("dispatcher", ", ".join(f"pid {lease['pid']} on {lease['host']}: {lease['owner']} (token {lease['token']},"
                                     f" until {local_time(lease['expires_at'])})" for lease in live) or "not running"),
            ("jobs", ", ".join(f"{n} {k}" for k, n in status["jobs"].items()) or "none"),
            ("next run", local_time(status["next_run_at"])),
            ("queue", ", ".join(f"{n} {k}" for k, n in status["queue"].items()) or "empty"),
            ("runs", ", ".join(f"{n} {k}" for k, n in status["runs"].items()) or "none"),
            ("recovery blocked", len(status["recovery_blocked"])),
            ("credential cleanup", (f"{status['credentials']['cleanup_failed']} failed, "
                                    f"{len(status['credentials']['runs_blocked'])} run(s) blocked")),
            ("outbox", ", ".join(f"{n} {k}" for k, n in status["outbox"].items()) or "empty"),
            ("completion debts", "{open} open, {overdue} overdue, {failed} failed".format(**status["completion_debts"])),
            ("approvals", ", ".join(f"{n} {k}" for k, n in status["approvals"].items() if n) or "none"),
            ("evidence", ", ".join(f"{n} {k}" for k, n in status["evidence"]["records"].items())
             + (f", {status['evidence']['missing']} missing" if status["evidence"]["missing"] else "") or "none"),
            ("disk full", (f"last {local_time(full['since'])} for {full['seconds']}s, waited out"
                           if (full := status["db_disk_full"]) else "never")
             + (f"; {status['free_bytes']} bytes free" if status["free_bytes"] is not None else "")),
        ])
        if status["recent_skips"]:
            click.echo("recent skipped slots:")
            for s in status["recent_skips"]:
                click.echo(f"  {local_time(s['created_at'])}  {s['skip_reason']}")

    emit({"status": status}, human)


@click.command("doctor")
def doctor_cmd() -> None:
    """Database integrity, foreign keys, tables, writable paths, plugin load failures; exit 1 when unhealthy."""
    checks: list[dict[str, Any]] = []
    try:
        checks.extend(store_checks(open_ctx_store()))
    except SchedulerError as exc:
        checks.append({"check": "open", "ok": False, "detail": f"{exc.code}: {exc.message}"})
    checks.append(plugin_check())
    checks.extend(provider_checks())  # what providers report of this host (the shell executor's containment)
    healthy = all(c["ok"] for c in checks)
    if not healthy:
        if not json_mode():
            table([("ok" if c["ok"] else "FAIL", c["check"], c["detail"]) for c in checks], ["", "check", "detail"])
        failing = [c for c in checks if not c["ok"]]
        raise SchedulerError("UNHEALTHY", "doctor found problems: " + ", ".join(c["check"] for c in failing), details=checks)
    emit({"healthy": True, "checks": checks},
         lambda: table([("ok" if c["ok"] else "FAIL", c["check"], c["detail"]) for c in checks], ["", "check", "detail"]))
