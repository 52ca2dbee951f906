"""A run's delivery checkpoint: where every message of one run stands, part by part (``deliveries checkpoint RUN``).

Seed 000's ``getDeliveryCheckpoint()``: aggregate and per-part status of a run's outbox parts, so
an operator (or a retry) sees what was delivered, what is still to go and when, and what failed.
Parts of one message go out in order, so each message also names the part it resumes at (the
first one not delivered). The run's completion debt (``scheduler.core.debts``) is part of the view.
"""

from __future__ import annotations

from typing import Any

from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.debts import run_debt
from scheduler.core.rows import OutboxPartRow
from scheduler.core.store.base import Tx

#: Part states that may still be sent (``pending`` waits for its due time, ``claimed`` is being sent).
UNSETTLED = ("pending", "claimed")


def run_checkpoint(tx: Tx, run_id: str, *, now: int | None = None) -> dict[str, Any]:
    """The checkpoint of run ``run_id``: counts by state, the next due time, each message and each part.

    ``complete`` is true once no part may be sent any more (all delivered, failed or cancelled);
    ``next_due_at`` is the earliest due time of a pending part (None when none waits).
    """
    now = now_ms() if now is None else now
    parts = [OutboxPartRow.from_row(r) for r in tx.all(
        "SELECT * FROM delivery_outbox WHERE run_id = ? ORDER BY created_at, group_key, part_index", (run_id,))]
    counts = dict.fromkeys(("delivered", "pending", "claimed", "failed", "cancelled"), 0)
    messages: dict[str, dict[str, Any]] = {}
    for p in parts:
        counts[p.status] += 1
        message = messages.setdefault(p.group_key, {
            "group": p.group_key, "channel": p.channel, "target": p.target, "part_count": p.part_count,
            "delivered": 0, "resume_at_part": None, "parts": []})
        message["delivered"] += p.status == "delivered"
        if p.status != "delivered" and message["resume_at_part"] is None:
            message["resume_at_part"] = p.part_index
        message["parts"].append({
            "id": p.id, "part_index": p.part_index, "status": p.status, "attempts": p.attempts, "max_attempts": p.max_attempts,
            "due_at": to_iso(p.due_at) if p.status in UNSETTLED else None, "delivered_at": to_iso(p.delivered_at),
            "receipt_id": p.receipt_id, "error_code": p.error_code,
        })
    due = [p.due_at for p in parts if p.status == "pending"]
    return {
        "run_id": run_id, "parts": len(parts),
        "delivered": counts["delivered"], "pending": counts["pending"] + counts["claimed"], "claimed": counts["claimed"],
        "failed": counts["failed"], "cancelled": counts["cancelled"],
        "complete": not any(p.status in UNSETTLED for p in parts),
        "next_due_at": to_iso(min(due)) if due else None,
        "messages": list(messages.values()),
        "debt": run_debt(tx, run_id, now=now),
    }
