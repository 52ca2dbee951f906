"""``scheduler import openclaw`` and ``scheduler import crontab``: bring existing jobs in (see ``scheduler.ops.importers``)."""

from __future__ import annotations

from typing import Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, json_mode, table

_dry_run = click.option("--dry-run", is_flag=True, help="Convert and report; store nothing.")
_allow_missing = click.option("--allow-missing-plugins", "allow_missing_plugins", is_flag=True,
                              help="Import jobs naming an executor or channel that is not installed here.")


@click.group("import")
def import_group() -> None:
    """Import jobs from OpenClaw cron or a crontab."""


def _finish(doc: dict[str, Any]) -> None:
    """Print the report; ``IMPORT_FAILED`` (non-zero exit, the report in ``details``) when any job failed."""
    failed = doc["summary"]["failed"]

    def human() -> None:
        rows = [(r["id"], r["name"], r["status"], r.get("code"), r.get("error") or "; ".join(r["warnings"]))
                for r in doc["results"]]
        table(rows, ["source", "name", "status", "code", "note"])
        s = doc["summary"]
        verb = "would import" if doc["dry_run"] else "imported"
        click.echo(f"{verb} {s['would_import'] if doc['dry_run'] else s['imported']} of {s['total']};"
                   f" {s['skipped']} skipped, {s['failed']} failed, {s['warnings']} warning(s)")

    if failed:
        if not json_mode():
            human()
        raise SchedulerError("IMPORT_FAILED", f"{failed} of {doc['summary']['total']} job(s) could not be imported", details=doc)
    emit(doc, human)


@import_group.command("openclaw")
@click.option("--binary", "binary", default=None, metavar="PATH",
              help="The openclaw program (default $OPENCLAW_BIN, else openclaw on PATH).")
@click.option("--legacy-json", "legacy_json", is_flag=False, flag_value="", default=None, metavar="[PATH]",
              help="Read the legacy jobs file instead (default $OPENCLAW_JOBS_JSON, else ~/.openclaw/cron/jobs.json).")
@click.option("--allow-inexact-every", is_flag=True, help="Import an interval under one second as every 1s, with a warning.")
@_dry_run
@_allow_missing
def import_openclaw(binary: str | None, legacy_json: str | None, allow_inexact_every: bool, dry_run: bool,
                    allow_missing_plugins: bool) -> None:
    """Import OpenClaw Gateway cron jobs (``openclaw cron list/get --json``, or the legacy jobs file)."""
    from scheduler.base.timeutil import now_ms
    from scheduler.ops.importers import report, run_import
    from scheduler.ops.importers.openclaw import convert, default_binary, default_legacy_path, read_cli, read_legacy

    if legacy_json is not None:
        kind, (location, jobs) = "legacy-json", read_legacy(legacy_json or default_legacy_path())
    else:
        kind, (location, jobs) = "openclaw-cli", read_cli(binary or default_binary())
    now = now_ms()
    items = [convert(job, allow_inexact=allow_inexact_every, now=now) for job in jobs]
    run_import(open_ctx_store(), items, dry_run=dry_run, same_name_is_import=False, allow_missing_plugins=allow_missing_plugins)
    _finish(report(kind, location, items, dry_run=dry_run, allow_inexact_every=allow_inexact_every))


@import_group.command("crontab")
@click.argument("source", required=False, metavar="[FILE|-]")
@click.option("--system", is_flag=True,
              help="A system crontab (/etc/crontab format: a user field after the schedule; always so for /etc/crontab"
                   " and /etc/cron.d/*): each job runs as its user.")
@_dry_run
@_allow_missing
def import_crontab(source: str | None, system: bool, dry_run: bool, allow_missing_plugins: bool) -> None:
    """Import a crontab: FILE, - for standard input, or the user's ``crontab -l`` by default."""
    from scheduler.ops.importers import report, run_import
    from scheduler.ops.importers.crontab import is_system_path, local_zone, parse, read_crontab

    system = system or is_system_path(source)
    location, text = read_crontab(source)
    items, extra = parse(text, default_tz=local_zone(), system=system)
    extra["system"] = system
    pending = [i for i in items if i.status == "pending"]
    run_import(open_ctx_store(), pending, dry_run=dry_run, same_name_is_import=True, allow_missing_plugins=allow_missing_plugins)
    _finish(report("crontab", location, items, dry_run=dry_run, **extra))
