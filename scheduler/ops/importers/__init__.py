"""Importers: bring existing jobs in from OpenClaw cron (``openclaw.py``) and a crontab (``crontab.py``).

Each importer turns its source into ``ImportItem``s (a job spec object, or a reason it has
none) and hands them to ``run_import``, which validates every spec as ``jobs add`` does,
skips what was imported before, creates the rest in ONE transaction and returns a per-job
report. A job that cannot be imported fails alone: the others are imported, and the command
exits non-zero (``IMPORT_FAILED``) with the report, so the source can be fixed and imported
again (what was imported is skipped the second time).
"""

from __future__ import annotations

import shlex
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core import state
from scheduler.core.jobs import create_jobs
from scheduler.core.spec import validate_spec
from scheduler.core.store.base import Store
from scheduler.core.transitions import committing
from scheduler.plugins.refs import require_plugins


@attrs.define
class ImportItem:
    """One job of a source on its way in, and what became of it."""

    source_id: str
    name: str | None = None
    spec: dict[str, Any] | None = None
    job_id: str | None = None
    status: str = "pending"  # imported | would_import | skipped | failed
    code: str | None = None
    error: str | None = None
    details: list[dict[str, Any]] | None = None
    warnings: list[str] = attrs.Factory(list)
    exact_schedule: bool | None = None
    #: ``every`` slots on the source's phase: ``anchor + k * every`` (epoch ms, interval ms).
    phase: tuple[int, int] | None = None
    extra: dict[str, Any] = attrs.Factory(dict)

    def fail(self, code: str, error: str, details: list[dict[str, Any]] | None = None) -> ImportItem:
        """Mark the item failed with a stable code (it will not be imported)."""
        self.status, self.code, self.error, self.details = "failed", code, error, details
        return self

    def to_json(self) -> dict[str, Any]:
        """The item's line of the report."""
        out: dict[str, Any] = {"id": self.source_id, "name": self.name, "status": self.status, "job_id": self.job_id,
                               "warnings": self.warnings, "exact_schedule": self.exact_schedule, **self.extra}
        if self.code is not None:
            out["code"], out["error"] = self.code, self.error
        if self.details:
            out["details"] = self.details
        return out


def export_prefix(env: dict[str, str]) -> str:
    """``export K='v' ...; `` so a shell command runs with these variables (quoted, order kept); '' for none."""
    if not env:
        return ""
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + "; "


def run_import(store: Store, items: list[ImportItem], *, dry_run: bool, same_name_is_import: bool,
               allow_missing_plugins: bool = False) -> None:
    """Validate, de-duplicate and (unless ``dry_run``) create the pending items in one transaction.

    An item whose ``job_id`` already exists was imported before (``skipped``,
    ``ALREADY_IMPORTED``, checked before the conversion's or validation's verdict counts); with ``same_name_is_import`` so is one whose derived name exists
    (crontab names are derived from the line), otherwise a taken name is ``NAME_CONFLICT``.
    Items are updated in place (status, code, job id).
    """
    with store.read() as tx:
        known = {r["id"] for r in tx.all("SELECT id FROM jobs")}
    for item in items:
        # Imported before, whatever the conversion or validation says today (an `--allow-inexact-every`
        # import, a one-shot now past): that job is already here, so it is skipped, never a failure.
        if item.job_id is not None and item.job_id in known and item.status in ("pending", "failed"):
            item.status, item.code, item.error, item.details = "skipped", "ALREADY_IMPORTED", f"imported before: job {item.job_id}", None
    specs: dict[int, Any] = {}
    for index, item in enumerate(items):
        if item.status != "pending" or item.spec is None:
            continue
        try:
            spec = validate_spec(item.spec)
            if not allow_missing_plugins:
                require_plugins([spec])
        except SchedulerError as exc:
            code = exc.details[0]["code"] if exc.code == "VALIDATION_FAILED" and len(exc.details or []) == 1 else exc.code
            item.fail(code, exc.message, exc.details)
            continue
        specs[index] = spec
    with store.read() as tx:
        ids = {r["id"] for r in tx.all("SELECT id FROM jobs")}
        names = {r["name"]: r["id"] for r in tx.all("SELECT id, name FROM jobs")}
    batch: set[str] = set()
    for index in list(specs):
        item, spec = items[index], specs[index]
        if (item.job_id is not None and item.job_id in ids) or (same_name_is_import and spec.name in names):
            item.status, item.code = "skipped", "ALREADY_IMPORTED"
            item.error = "imported before: job " + (item.job_id if item.job_id in ids else names[spec.name])  # type: ignore[operator]
            del specs[index]
        elif spec.name in names or spec.name in batch:
            item.fail("NAME_CONFLICT", f"a job named {spec.name!r} already exists")
            del specs[index]
        else:
            batch.add(spec.name)
    if dry_run:
        for index in specs:
            items[index].status = "would_import"
        return
    if not specs:
        return
    now = now_ms()
    order = list(specs)
    with committing(store) as tx:
        rows = create_jobs(store, [specs[i] for i in order], now=now, job_ids=[items[i].job_id for i in order])
        for index, row in zip(order, rows, strict=True):
            item = items[index]
            item.status, item.job_id = "imported", row.id
            if item.phase is not None and row.schedule_kind == "every":
                anchor, every = item.phase
                k = max(0, (now - anchor) // every + 1)
                first = anchor + k * every  # the source's next slot: same cadence, same phase
                state.execute(tx, "set_imported_phase", job_id=row.id, next_run_at=first, schedule_anchor_at=first - every)


def report(kind: str, location: str, items: list[ImportItem], *, dry_run: bool, **extra: Any) -> dict[str, Any]:
    """The structured report: source, summary counts and one result per item."""
    summary = {"total": len(items), "imported": 0, "would_import": 0, "skipped": 0, "failed": 0,
               "warnings": sum(len(i.warnings) for i in items)}
    for item in items:
        summary[item.status] = summary.get(item.status, 0) + 1
    return {"source": {"kind": kind, "location": location}, "dry_run": dry_run, **extra, "summary": summary,
            "results": [i.to_json() for i in items]}
