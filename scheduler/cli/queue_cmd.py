"""``scheduler queue ...``: the dispatch queue (list, show) with attempts, claims and the error history of each row."""

from __future__ import annotations

from typing import Any

import click

from scheduler.cli.input import AsciiIntRange
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, kv, local_time, table

#: ``job_dispatch_queue.status`` values (``scheduler.ops.queries.DISPATCH_STATUSES``, repeated so ``--help`` imports nothing).
_STATUSES = ("pending", "claimed", "awaiting_approval", "done", "cancelled", "failed")
#: How many trailing characters of a dispatch id the table shows (``queue show`` takes them back as a suffix).
_SHORT = 28


@click.group("queue")
def queue_group() -> None:
    """Inspect the dispatch queue: due work, its attempts, claims and errors."""


def _claim(view: dict[str, Any]) -> str:
    """``owner until TIME`` (``expired`` once the claim ran out), ``-`` for an unclaimed row."""
    if view["claim_owner"] is None:
        return "-"
    until = "expired" if view["claim_expired"] else f"until {local_time(view['claim_expires_at'])}"
    return f"{view['claim_owner']} {until}"


@queue_group.command("list")
@click.option("--status", type=click.Choice(_STATUSES), default=None, help="Only dispatches in this state.")
@click.option("--job", "job", default=None, help="Only this job's dispatches (id or name).")
@click.option("--limit", type=AsciiIntRange(1, 100000), default=100, show_default=True, help="At most N dispatches.")
def queue_list(status: str | None, job: str | None, limit: int) -> None:
    """Dispatch rows, latest due first: kind, state, due time, attempts, claim and last error."""
    from scheduler.ops.queries import list_queue

    views: list[dict[str, Any]] = list_queue(open_ctx_store(), status=status, job=job, limit=limit)
    emit({"dispatches": views}, lambda: table(
        [(v["id"][-_SHORT:], v["job_name"] or "-", v["kind"], v["status"], local_time(v["due_at"]), v["attempts"],
          _claim(v), v["last_error"] or "") for v in views],
        ["dispatch", "job", "kind", "status", "due", "attempts", "claim", "last error"]))


@queue_group.command("show")
@click.argument("dispatch_id")
def queue_show(dispatch_id: str) -> None:
    """One dispatch (id, a unique prefix, or the suffix `queue list` shows) with its events and error history."""
    from scheduler.ops.queries import get_dispatch

    view: dict[str, Any] = get_dispatch(open_ctx_store(), dispatch_id)

    def human() -> None:
        kv((k, v) for k, v in view.items() if k not in ("events", "errors"))
        click.echo("")
        click.echo("errors:" if view["errors"] else "errors: none recorded")
        if view["errors"]:
            table([(local_time(e["at"]), e["kind"], e["run_id"] or "-", e["error"]) for e in view["errors"]],
                  ["at", "event", "run", "error"])
        click.echo("")
        click.echo("events:")
        table([(local_time(e["at"]), e["kind"], e["actor"] or "-", e["data"] or "") for e in view["events"]],
              ["at", "event", "actor", "data"])

    emit({"dispatch": view}, human)
