"""``scheduler deliveries ...``: the delivery outbox (list, show, a run's checkpoint, retry) and a test message through a channel."""

from __future__ import annotations

import click

from scheduler.base.errors import SchedulerError
from scheduler.cli.input import AsciiIntRange
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, kv, local_time, table

_STATUSES = ("pending", "claimed", "delivered", "failed", "cancelled")


@click.group("deliveries")
def deliveries_group() -> None:
    """Inspect the delivery outbox and re-arm failed parts."""


@deliveries_group.command("list")
@click.option("--status", type=click.Choice(_STATUSES), default=None, help="Only parts in this state.")
@click.option("--job", "job", default=None, help="Only this job's parts (id or name).")
@click.option("--limit", type=AsciiIntRange(1, 100000), default=100, show_default=True, help="At most N parts.")
def deliveries_list(status: str | None, job: str | None, limit: int) -> None:
    """Outbox parts, newest first, with their state, attempts and last error."""
    from scheduler.ops.queries import list_deliveries

    views = list_deliveries(open_ctx_store(), status=status, job=job, limit=limit)
    emit({"deliveries": views}, lambda: table(
        [(v["id"][-28:], v["job_name"] or "-", v["channel"], f"{v['part_index']}/{v['part_count']}", v["status"],
          f"{v['attempts']}/{v['max_attempts']}", local_time(v["delivered_at"] or v["due_at"]), v["error_code"] or "")
         for v in views],
        ["part", "job", "channel", "part", "status", "attempts", "at", "error"]))


@deliveries_group.command("show")
@click.argument("part_id")
def deliveries_show(part_id: str) -> None:
    """One part: its body, receipt, attempts and last error (id or a unique prefix or suffix, such as the end `deliveries list` shows)."""
    from scheduler.ops.queries import get_delivery

    view = get_delivery(open_ctx_store(), part_id)
    emit({"delivery": view}, lambda: kv(view.items()))


@deliveries_group.command("checkpoint")
@click.argument("run_id")
def deliveries_checkpoint(run_id: str) -> None:
    """Where every message of one run stands: parts delivered / pending / failed, the next due time, each part's state,
    and the run's completion debt (RUN_ID: id or a unique prefix or suffix)."""
    from scheduler.delivery.checkpoint import run_checkpoint
    from scheduler.ops.queries import resolve_run

    with open_ctx_store().read() as tx:
        view = run_checkpoint(tx, resolve_run(tx, run_id).id)

    def human() -> None:
        debt = view["debt"]
        kv([("run", view["run_id"]), ("parts", view["parts"]), ("delivered", view["delivered"]),
            ("pending", view["pending"]), ("failed", view["failed"]), ("complete", view["complete"]),
            ("next due", local_time(view["next_due_at"])),
            ("debt", f"{debt['status']}{' (overdue)' if debt['overdue'] else ''}" if debt else "-")])
        table([(m["group"], m["channel"], f"{p['part_index']}/{m['part_count']}", p["status"],
                f"{p['attempts']}/{p['max_attempts']}", local_time(p["delivered_at"] or p["due_at"]), p["error_code"] or "")
               for m in view["messages"] for p in m["parts"]],
              ["message", "channel", "part", "status", "attempts", "at", "error"])

    emit({"checkpoint": view}, human)


@deliveries_group.command("retry")
@click.argument("part_id")
def deliveries_retry(part_id: str) -> None:
    """Re-arm a failed part (and the later parts of its message) with fresh attempts; the dispatcher sends it at once."""
    from scheduler.ops.actions import retry_delivery

    view = retry_delivery(open_ctx_store(), part_id)
    emit({"delivery": view}, lambda: click.echo(f"re-armed {view['id']} ({view['channel']})"))


@deliveries_group.command("test")
@click.argument("channel")
@click.argument("target", required=False)
@click.option("--message", default="Test message from scheduler.", show_default=True, help="The text to send.")
def deliveries_test(channel: str, target: str | None, message: str) -> None:
    """Send one message through CHANNEL to TARGET now (not through the outbox): checks settings, secrets and route."""
    import uuid

    from scheduler.delivery.outbox import send_part

    part = {"channel": channel, "target": target, "idempotency_key": f"test:{uuid.uuid4()}:part:1/1", "part_index": 1,
            "part_count": 1, "body": message, "run_id": None, "job_id": None, "attachments": [], "delivery_options": None}
    result = send_part(part)
    if result["outcome"] != "delivered":
        raise SchedulerError(result["code"], f"channel {channel!r} did not deliver: {result['error']}",
                             details={"transient": result["outcome"] == "retry", "retry_after_s": result.get("retry_after_s")})
    emit({"delivered": True, "channel": channel, "receipt_id": result.get("receipt_id")},
         lambda: click.echo(f"delivered through {channel} (receipt {result.get('receipt_id') or '-'})"))
