"""``scheduler schedule ...``: preview a schedule (no database) and quick cron jobs (add/list/show/remove)."""

from __future__ import annotations

import hashlib

import click

from scheduler.base.errors import SchedulerError
from scheduler.cli.output import emit, table


@click.group("schedule")
def schedule_group() -> None:
    """Preview schedules; quick cron jobs."""


@schedule_group.command("preview")
@click.argument("expr")
@click.option("--tz", default="UTC", show_default=True, help="IANA zone the expression is evaluated in.")
@click.option("-n", "count", type=click.IntRange(1, 1000), default=5, show_default=True)
@click.option("--dst-gap", type=click.Choice(["shift", "skip"]), default="shift", show_default=True)
@click.option("--dst-fold", type=click.Choice(["once", "twice"]), default="once", show_default=True)
@click.option("--from", "start", default=None, help="Start after this ISO-8601 instant instead of now.")
def schedule_preview(expr: str, tz: str, count: int, dst_gap: str, dst_fold: str, start: str | None) -> None:
    """The next N fire times of a cron expression (or an interval like 'every 90m'), with UTC offsets. No database."""
    from scheduler.base.timeutil import now_ms, parse_iso
    from scheduler.core.schedules import Schedule, describe_fire, next_fires

    after = parse_iso(start, field="--from") if start else now_ms()
    text = expr.strip()
    try:
        if text.startswith("every "):
            schedule = Schedule(kind="every", every_ms=text[len("every "):].strip(), tz=tz)
            fires = next_fires(schedule, after, count, anchor_ms=after)
        else:
            schedule = Schedule(kind="cron", cron=text, tz=tz, dst_gap=dst_gap, dst_fold=dst_fold)
            fires = next_fires(schedule, after, count)
        views = [describe_fire(ms, tz) for ms in fires]
    except (OverflowError, ValueError) as exc:  # fire times past year 9999
        raise SchedulerError("OUT_OF_RANGE", f"the next {count} fire times run past 9999-12-31T23:59:59Z ({exc})") from None
    emit({"expression": text, "tz": tz, "fires": views},
         lambda: table([(v["local"], v["offset"], v["utc"]) for v in views], ["local", "offset", "utc"]))


@schedule_group.command("add")
@click.argument("cron")
@click.argument("payload")
@click.option("--name", default=None, help="Job name (default: derived from a hash of the payload).")
@click.option("--tz", default="UTC", show_default=True)
@click.option("--target", type=click.Choice(["shell", "isolated", "main"]), default="shell", show_default=True)
@click.option("--allow-missing-plugins", "allow_missing_plugins", is_flag=True,
              help="Accept the job although its executor is not installed here.")
def schedule_add(cron: str, payload: str, name: str | None, tz: str, target: str, allow_missing_plugins: bool) -> None:
    """Add a cron job in one line: CRON PAYLOAD (the same missing-plugin rule as `jobs add`)."""
    from scheduler.cli.main import open_ctx_store
    from scheduler.core.jobs import create_jobs, job_to_json
    from scheduler.core.spec import validate_spec

    name = name or "job-" + hashlib.sha256(payload.encode()).hexdigest()[:10]
    spec = validate_spec({"name": name, "schedule_kind": "cron", "schedule_cron": cron, "schedule_tz": tz,
                          "session_target": target, "payload_message": payload})
    if not allow_missing_plugins:
        from scheduler.plugins.refs import require_plugins

        require_plugins([spec])
    view = job_to_json(create_jobs(open_ctx_store(), [spec])[0])
    emit({"job": view}, lambda: click.echo(f"added {view['name']} ({view['id']})"))


@schedule_group.command("list")
def schedule_list() -> None:
    """Cron jobs (same as ``jobs list`` filtered to cron)."""
    from scheduler.cli.main import open_ctx_store
    from scheduler.cli.output import local_time
    from scheduler.core.jobs import job_to_json, list_jobs

    with open_ctx_store().read() as tx:
        views = [job_to_json(r) for r in list_jobs(tx) if r.schedule_kind == "cron"]
    emit({"jobs": views}, lambda: table([(v["name"], v["schedule_cron"], v["schedule_tz"], v["state"], local_time(v["next_run_at"]))
                                         for v in views], ["name", "cron", "tz", "state", "next run"]))


@schedule_group.command("show")
@click.argument("job")
def schedule_show(job: str) -> None:
    """Show one job (same as ``jobs get``)."""
    from scheduler.cli.jobs_cmd import jobs_get

    click.get_current_context().invoke(jobs_get, job=job)


@schedule_group.command("remove")
@click.argument("job")
@click.option("--yes", "-y", "yes", is_flag=True, help="Do not ask for confirmation (asked only when stdin is a terminal).")
def schedule_remove(job: str, yes: bool) -> None:
    """Remove one job (same as ``jobs delete``, confirmation on a terminal included)."""
    from scheduler.cli.jobs_cmd import jobs_delete

    click.get_current_context().invoke(jobs_delete, job=job, cascade=False, yes=yes)


__all__ = ["SchedulerError", "schedule_group"]
