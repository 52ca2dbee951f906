"""``scheduler apply`` and ``scheduler export``: jobs as code (see ``scheduler.ops.declarative``)."""

from __future__ import annotations

from typing import Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, table


def _short(value: Any) -> str:
    """A value for the diff table: compact JSON, cut at 40 characters."""
    import json

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


@click.command("apply")
@click.argument("path", type=click.Path())
@click.option("--prune", "prune", type=click.Choice(["disable", "delete"]), default=None,
              help="Disable or delete stored jobs the file no longer lists.")
@click.option("--dry-run", is_flag=True, help="Show the plan (create/update/unchanged/prune with changed fields); change nothing.")
@click.option("--allow-missing-plugins", "allow_missing_plugins", is_flag=True,
              help="Accept jobs naming an executor, channel or provider that is not installed here.")
def apply_cmd(path: str, prune: str | None, dry_run: bool, allow_missing_plugins: bool) -> None:
    """Make the stored jobs match a job file or directory (TOML or JSON), in one transaction."""
    from scheduler.ops.declarative import apply, read_sources, validate_sources

    desired = validate_sources(read_sources(path))
    store = open_ctx_store()
    if not allow_missing_plugins:
        from scheduler.core.spec import spec_from_row
        from scheduler.plugins.refs import require_plugins

        with store.read() as tx:
            stored = {r["name"]: spec_from_row(r) for r in tx.all("SELECT * FROM jobs")}
        require_plugins([j.spec for j in desired], previous=[stored.get(j.spec.name) for j in desired], indexed=True)
    actions = apply(store, desired, prune=prune, dry_run=dry_run)
    counts = {k: sum(a.action == k for a in actions) for k in ("create", "update", "unchanged", "prune")}

    def human() -> None:
        rows = []
        for a in actions:
            if a.changes:
                for c in a.changes:
                    rows.append((a.action, a.name, c["field"], _short(c["old"]), _short(c["new"])))
            else:
                rows.append((a.action, a.name, a.prune or "", "", ""))
        table(rows, ["action", "job", "field", "old", "new"])
        head = "dry run: would create" if dry_run else "created"
        click.echo(f"{head} {counts['create']}, {'update' if dry_run else 'updated'} {counts['update']},"
                   f" {'prune' if dry_run else 'pruned'} {counts['prune']}; {counts['unchanged']} unchanged")

    emit({"dry_run": dry_run, "summary": counts, "actions": [a.to_json() for a in actions]}, human)


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(["toml", "json"]), default="toml", help="File format (default toml).")
@click.option("--output", "output", type=click.Path(dir_okay=False), default=None, help="Write to this file instead of stdout.")
def export_cmd(fmt: str, output: str | None) -> None:
    """Write the stored jobs as a job file (non-default fields only) that ``apply`` takes back unchanged."""
    from scheduler.ops.declarative import export_document, render

    with open_ctx_store().read() as tx:
        doc = export_document(tx)
    text = render(doc, fmt)
    if output is not None:
        import os

        from scheduler.core.filemodes import replace_file

        try:  # every job spec is in it: private (file_mode(), 0600) whatever the umask and an existing file's mode
            replace_file(output, text.encode("utf-8"))
        except OSError as exc:
            raise SchedulerError("EXPORT_WRITE_FAILED", f"cannot write {output}: {exc.strerror or exc}") from None
        emit({"format": fmt, "output": os.path.abspath(output), "count": len(doc["jobs"])},
             lambda: click.echo(f"exported {len(doc['jobs'])} job(s) to {output}"))
        return
    emit({"format": fmt, "output": None, "count": len(doc["jobs"]), "document": doc, "text": text},
         lambda: click.echo(text, nl=False))
