"""``scheduler approvals ...`` (list, show, approve, reject) and the ``jobs approve`` / ``jobs reject`` shortcuts."""

from __future__ import annotations

from typing import Any

import click

from scheduler.base.run_ids import short_run_id
from scheduler.cli.input import AsciiIntRange
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, kv, local_time, table

_note_option = click.option("--note", default=None, help="Why (recorded with your OS identity and the approved artifact).")


@click.group("approvals")
def approvals_group() -> None:
    """List and decide approval gates (the decision is recorded as the invoking OS account)."""


@approvals_group.command("list")
@click.option("--pending", is_flag=True, help="Only approvals waiting for a decision.")
@click.option("--job", "job", default=None, help="Only this job's approvals (id or name).")
@click.option("--limit", type=AsciiIntRange(1, 100000), default=100, show_default=True, help="At most N approvals.")
def approvals_list(pending: bool, job: str | None, limit: int) -> None:
    """Approvals, newest first."""
    from scheduler.ops.queries import list_approvals

    views = list_approvals(open_ctx_store(), pending=pending, job=job, limit=limit)
    emit({"approvals": views}, lambda: table(
        [(v["id"][:8], v["job_name"] or v["job_id"][:8], _status(v), v["risk_level"], v["approver_scope"] or "-",
          local_time(v["created_at"]), local_time(v["expires_at"])) for v in views],
        ["id", "job", "status", "risk", "approver", "requested", "expires"]))


def _status(view: dict[str, Any]) -> str:
    return "pending (expired)" if view["expired"] else view["status"]


@approvals_group.command("show")
@click.argument("approval_id")
def approvals_show(approval_id: str) -> None:
    """Everything about one approval (id or a unique prefix or suffix of at least 8 characters)."""
    from scheduler.ops.queries import get_approval

    view = get_approval(open_ctx_store(), approval_id)
    emit({"approval": view}, lambda: kv(view.items()))


def _decide(approval_id: str, decision: str, note: str | None) -> None:
    from scheduler.ops.actions import decide_approval

    _print_decision(decide_approval(open_ctx_store(), approval_id, decision, note=note), decision)


def _print_decision(view: dict[str, Any], decision: str) -> None:
    """What ``approvals approve`` / ``reject`` and ``jobs approve`` / ``reject`` print about the decided approval."""
    verb = "approved" if decision == "approved" else "rejected"
    emit({"approval": view}, lambda: click.echo(f"{verb} approval {view['id']} of job {view['job_name'] or view['job_id']}"
                                                f" (run {short_run_id(view['run_id']) if view['run_id'] else '-'})"))


@approvals_group.command("approve")
@click.argument("approval_id")
@_note_option
def approvals_approve(approval_id: str, note: str | None) -> None:
    """Approve a pending approval: its run starts at once (an idle dispatcher is woken)."""
    _decide(approval_id, "approved", note)


@approvals_group.command("reject")
@click.argument("approval_id")
@_note_option
def approvals_reject(approval_id: str, note: str | None) -> None:
    """Reject a pending approval: its run ends cancelled (APPROVAL_REJECTED) and nothing of it executes."""
    _decide(approval_id, "rejected", note)


def decide_for_job(job: str, decision: str, note: str | None) -> None:
    """``jobs approve`` / ``jobs reject``: decide the job's one pending approval."""
    from scheduler.ops.actions import decide_for_job as decide_job_approval

    _print_decision(decide_job_approval(open_ctx_store(), job, decision, note=note), decision)
