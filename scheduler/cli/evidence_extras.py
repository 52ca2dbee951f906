"""``runs evidence --all [--since T]`` and ``runs evidence RUN_ID --export in-toto [--output FILE]``.

Kept apart from ``runs_cmd`` so the plain ``runs evidence RUN_ID`` path imports nothing of
this, and the export libraries are imported only when exporting.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.cli.output import emit, json_mode, kv


def evidence_extras(store: Any, run_id: str | None, *, all_runs: bool, since: str | None, export_format: str | None,
                    output: str | None, resolve: Callable[[str], str]) -> None:
    """Check the option combination, then run ``--all`` or ``--export`` (``INVALID_ARGUMENT`` for a bad mix)."""
    if all_runs and export_format is not None:
        raise SchedulerError("INVALID_ARGUMENT", "--all and --export cannot be combined (export one run at a time)")
    if all_runs:
        if run_id is not None:
            raise SchedulerError("INVALID_ARGUMENT", "--all takes no RUN_ID")
        if output is not None:
            raise SchedulerError("INVALID_ARGUMENT", "--output goes with --export")
        check_all(store, since)
        return
    if since is not None:
        raise SchedulerError("INVALID_ARGUMENT", "--since goes with --all")
    if export_format is None:
        raise SchedulerError("INVALID_ARGUMENT", "--output goes with --export")
    if run_id is None:
        raise SchedulerError("INVALID_ARGUMENT", "--export needs a RUN_ID")
    export(store, resolve(run_id), output)


def check_all(store: Any, since: str | None) -> None:
    """Re-verify many runs with a progress bar on a terminal's stderr, print the summary, fail if any is invalid."""
    from scheduler.base.timeutil import now_ms
    from scheduler.evidence.batch import parse_since, verify_all

    start = parse_since(since, now=now_ms()) if since is not None else None
    tty = sys.stderr.isatty()

    def progress(ids: list[str]) -> Any:
        return click.progressbar(ids, label="re-verifying evidence", file=sys.stderr, show_pos=True) if tty and ids else None

    summary = verify_all(store, since=start, progress=progress)
    view = summary.to_json()
    if not summary.ok:
        raise SchedulerError(
            "EVIDENCE_CHECK_FAILED",
            f"{summary.invalid_total} of {summary.checked} run(s) have invalid evidence and {summary.missing} are missing it",
            details=view,
        )

    def human() -> None:
        kv([("checked", summary.checked), ("verified", summary.verified), ("invalid", summary.invalid_total),
            ("missing", summary.missing), ("unattested", summary.unattested)])

    emit(view, human)


def export(store: Any, run_id: str, output: str | None) -> None:
    """Export one run's verified evidence as a signed in-toto DSSE envelope (to ``output`` or stdout)."""
    from scheduler.evidence.export import export_in_toto, write_export

    result = export_in_toto(store, run_id)
    envelope = result.pop("envelope")
    if output is not None:
        path = write_export(envelope, output)
        emit({**result, "path": str(path)}, lambda: click.echo(
            f"wrote the in-toto attestation of run {run_id} to {path} (DSSE, signed by key {result['keyid'][:16]})"))
        return
    if json_mode():
        emit({**result, "envelope": envelope})
    else:
        click.echo(json.dumps(envelope, indent=2, sort_keys=True))
