"""Completion debts: who owns a run's completion delivery, until every outbox part of the run is settled.

Seed 000 ("Delivery and Attachments") scopes completion-delivery ownership to the tuple of task
label, session and run. Here the completion transaction (``scheduler.core.completion``) that
enqueues a run's messages (its delivery, notifications, a watchdog alert) opens one debt for
that run in the same transaction (``open_debt``): ``task_label`` is the job's id, ``session_key``
its session target, so a debt is per run and survives a rename. A claim-store error there fails
the completion closed (``COMPLETION_CLAIM_UNAVAILABLE``): nothing of the completion commits, no
message is enqueued without its owner, and the run ends ``COMPLETION_FAILED`` naming it.

The debt stays ``open`` until reconciliation (``reconcile``, run by every recovery pass, so also
right after a restart that follows a ``kill -9``) finds no part of the run pending or claimed:
``reconciled`` when every part was delivered, ``failed`` when one failed for good (or was
cancelled); a failed debt whose part is re-armed (``deliveries retry``) is ``open`` again.
An open debt is **overdue** once it is older than the whole retry budget of the run's parts
(``budget_ms``): ``status`` and ``doctor`` report open, overdue and failed debts.
"""

from __future__ import annotations

import uuid
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core import state
from scheduler.core.events import append_event
from scheduler.core.rows import CompletionDebtRow
from scheduler.core.store.base import Store, Tx
from scheduler.settings import current_settings
from scheduler.settings.kernel import DeliverySettings

#: The most debts one reconciliation pass looks at (the oldest first); the next pass takes the rest.
RECONCILE_BATCH = 500
#: The factor of the consumer's backoff jitter (±20 %): the budget counts its longest wait.
_JITTER = 1.2


def open_debt(tx: Tx, *, job_id: str, session_key: str, run_id: str, outbox_group: str | None, owner: str | None,
              now: int) -> None:
    """Open the completion debt of ``run_id`` in the completion transaction ``tx`` (once: a second call is a no-op).

    Fails closed: a store error while claiming is ``COMPLETION_CLAIM_UNAVAILABLE`` (the caller's
    transaction rolls back, so no message of the run is enqueued without its owner); a busy or
    vanished database (``DB_*``) propagates as it is, for the dispatcher's own handling.
    """
    try:
        state.execute(tx, "open_completion_debt", id=str(uuid.uuid4()), task_label=job_id, session_key=session_key,
                      run_id=run_id, outbox_group=outbox_group, claim_owner=owner, now=now)
    except SchedulerError as exc:
        if exc.code.startswith("DB_"):
            raise
        raise SchedulerError("COMPLETION_CLAIM_UNAVAILABLE", f"COMPLETION_CLAIM_UNAVAILABLE: the completion debt of run {run_id}"
                             f" could not be claimed ({exc.code}: {exc.message}): nothing of its completion was committed") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the claim store fails closed
        raise SchedulerError("COMPLETION_CLAIM_UNAVAILABLE", f"COMPLETION_CLAIM_UNAVAILABLE: the completion debt of run {run_id}"
                             f" could not be claimed ({type(exc).__name__}: {exc}): nothing of its completion was committed") from None


def budget_ms(parts: int, max_attempts: int, delivery: DeliverySettings) -> int:
    """How long delivering ``parts`` parts may take before their debt is overdue.

    A part waits at most the consumer's backoffs between its ``max_attempts`` attempts (each
    ``retry_base_ms`` doubling up to ``retry_max_ms``, +20 % jitter) plus one claim TTL (a
    dispatcher that died holding it); a run's parts go out one after the other, so the budgets add up.
    """
    waits = sum(min(delivery.retry_max_ms, delivery.retry_base_ms * 2 ** (k - 1)) for k in range(1, max(1, max_attempts)))
    return max(1, parts) * (int(waits * _JITTER) + delivery.claim_ttl_ms)


#: Each unsettled debt with what its run's parts are: counts by settledness and the largest attempt budget.
_UNSETTLED_SQL = (
    "SELECT d.id, d.task_label, d.session_key, d.run_id, d.status, d.outbox_group, d.claim_owner, d.created_at,"
    " d.updated_at, COUNT(o.id) AS parts,"
    " SUM(CASE WHEN o.status IN ('pending', 'claimed') THEN 1 ELSE 0 END) AS unsettled,"
    " SUM(CASE WHEN o.status = 'delivered' THEN 1 ELSE 0 END) AS delivered,"
    " MAX(o.max_attempts) AS max_attempts"
    " FROM completion_debts d LEFT JOIN delivery_outbox o ON o.run_id = d.run_id"
    " WHERE d.status <> 'reconciled'"
    " GROUP BY d.id, d.task_label, d.session_key, d.run_id, d.status, d.outbox_group, d.claim_owner, d.created_at, d.updated_at"
    " ORDER BY d.created_at"
)


def reconcile(store: Store, *, now: int | None = None, actor: str | None = None, limit: int = RECONCILE_BATCH) -> dict[str, int]:
    """Bring every debt not yet reconciled to what its run's parts say: ``open`` while a part may still be sent,
    ``reconciled`` once every part was delivered, ``failed`` once none may be sent and one was not delivered (so a
    failed debt whose part was re-armed by ``deliveries retry`` is open again, or reconciled once it went out).

    Read first (most passes change nothing and take no write lock), then one write transaction in which each
    debt's parts are counted again and its status compare-and-swapped, with a ``delivery.debt_settled`` /
    ``delivery.debt_reopened`` event. Returns the counts changed.
    """
    now = now_ms() if now is None else now
    counts = {"reconciled": 0, "failed": 0, "reopened": 0}
    with store.read() as tx:
        changes = [row for row in tx.all(f"{_UNSETTLED_SQL} LIMIT ?", (int(limit),)) if _target(row) != row["status"]]
    if not changes:
        return counts
    with store.transaction() as tx:
        for row in changes:
            now_row = tx.one(_PARTS_SQL, (row["run_id"],)) or {}
            to = _target(now_row)
            if to == row["status"]:
                continue
            if state.execute(tx, "settle_completion_debt", debt_id=row["id"], status=to, from_status=row["status"], now=now):
                counts["reopened" if to == "open" else to] += 1
                append_event(tx, "delivery.debt_reopened" if to == "open" else "delivery.debt_settled", job_id=row["task_label"],
                             run_id=row["run_id"], actor=actor, at=now,
                             data={"debt_id": row["id"], "status": to, "parts": int(now_row.get("parts") or 0),
                                   "delivered": int(now_row.get("delivered") or 0)})
    return counts


#: A run's parts counted as ``_UNSETTLED_SQL`` counts them (read again under the write).
_PARTS_SQL = (
    "SELECT COUNT(*) AS parts, SUM(CASE WHEN status IN ('pending', 'claimed') THEN 1 ELSE 0 END) AS unsettled,"
    " SUM(CASE WHEN status = 'delivered' THEN 1 ELSE 0 END) AS delivered FROM delivery_outbox WHERE run_id = ?"
)


def _target(row: dict[str, Any]) -> str:
    """The status a debt's parts call for: ``open`` while one may be sent, else ``reconciled`` or ``failed``."""
    if int(row.get("unsettled") or 0):
        return "open"
    return "reconciled" if int(row.get("delivered") or 0) == int(row.get("parts") or 0) else "failed"


def debt_view(row: dict[str, Any], now: int, delivery: DeliverySettings) -> dict[str, Any]:
    """JSON view of a debt row (as ``_UNSETTLED_SQL`` or a plain read gives it), with ``overdue`` for an open one."""
    debt = CompletionDebtRow.from_row(row)
    parts = int(row.get("parts") or 0)
    due = debt.created_at + budget_ms(parts, int(row.get("max_attempts") or delivery.max_attempts), delivery)
    return {"id": debt.id, "job_id": debt.task_label, "session": debt.session_key, "run_id": debt.run_id,
            "status": debt.status, "outbox_group": debt.outbox_group, "claim_owner": debt.claim_owner,
            "opened_at": to_iso(debt.created_at), "updated_at": to_iso(debt.updated_at),
            "overdue_at": to_iso(due) if debt.status == "open" else None,
            "overdue": debt.status == "open" and now >= due}


def debt_summary(tx: Tx, *, now: int | None = None, sample: int = 5) -> dict[str, Any]:
    """What ``status`` and ``doctor`` show: open, overdue and failed debts, and the oldest overdue ones (up to ``sample``)."""
    now = now_ms() if now is None else now
    delivery = current_settings().delivery
    views = [debt_view(r, now, delivery) for r in tx.all(_UNSETTLED_SQL)]
    overdue = [v for v in views if v["overdue"]]
    return {"open": sum(v["status"] == "open" for v in views), "overdue": len(overdue),
            "failed": sum(v["status"] == "failed" for v in views), "overdue_debts": overdue[:sample]}


def run_debt(tx: Tx, run_id: str, *, now: int | None = None) -> dict[str, Any] | None:
    """The debt of one run (any status) as ``debt_view`` shows it, or None when its completion opened none."""
    now = now_ms() if now is None else now
    row = tx.one(
        "SELECT d.*, (SELECT COUNT(*) FROM delivery_outbox o WHERE o.run_id = d.run_id) AS parts,"
        " (SELECT MAX(o.max_attempts) FROM delivery_outbox o WHERE o.run_id = d.run_id) AS max_attempts"
        " FROM completion_debts d WHERE d.run_id = ? ORDER BY d.created_at LIMIT 1", (run_id,))
    return None if row is None else debt_view(row, now, current_settings().delivery)
