"""The named statements that change a completion debt (table ``completion_debts``): its one INSERT and every UPDATE.

A debt is the run-scoped ownership of a run's completion delivery (issue 28, seed 000's "Delivery
and Attachments"): opened by the completion transaction that enqueued the run's messages, closed
by reconciliation once every outbox part of the run is settled.
"""

from __future__ import annotations

SOURCE = """
-- name: open_completion_debt
-- (new) -> open: the completion of run_id enqueued its messages; one debt per (task label, session, run).
INSERT INTO completion_debts(id, task_label, session_key, run_id, status, outbox_group, claim_owner, created_at, updated_at)
VALUES (:id, :task_label, :session_key, :run_id, 'open', :outbox_group, :claim_owner, :now, :now)
ON CONFLICT (task_label, session_key, run_id) DO NOTHING

-- name: settle_completion_debt
-- open -> reconciled|failed (every part of the run settled), or failed -> open (a failed part was re-armed).
UPDATE completion_debts SET status = :status, updated_at = :now
WHERE id = :debt_id AND status = :from_status
"""
