"""Run rows: statuses, reads and the JSON view.

Every write of a run's status (and every fenced write on a running run) is in
``scheduler.core.transitions``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import to_iso
from scheduler.core.rows import RunRow
from scheduler.core.store.base import Tx

if TYPE_CHECKING:
    from scheduler.core.rows import JSONObject, JSONValue

RUN_STATUSES = (
    "pending", "running", "ok", "error", "timeout", "cancelled", "crashed", "skipped",
    "awaiting_approval", "approved", "recovery_blocked",
)
TERMINAL = frozenset({"ok", "error", "timeout", "cancelled", "crashed", "skipped"})
#: Statuses that count as a failure for retries, auto-pause and failure chains.
FAILURES = frozenset({"error", "timeout", "crashed"})
#: Statuses a cancel request finishes directly, without any executor involved.
CANCEL_DIRECTLY = frozenset({"pending", "awaiting_approval", "approved"})

_TIME_FIELDS = ("scheduled_for", "created_at", "started_at", "finished_at", "terminal_at", "process_terminated_at",
                "cancel_requested_at", "agent_abort_requested_at")


class StaleFence(SchedulerError):
    """A transition was refused because the caller no longer owns the run."""

    def __init__(self, message: str) -> None:
        super().__init__("STALE_FENCE", message)


def get_run(tx: Tx, run_id: str) -> RunRow:
    """A run row by id; ``NOT_FOUND`` otherwise."""
    row = tx.one("SELECT * FROM runs WHERE id = ?", (run_id,))
    if row is None:
        raise SchedulerError("NOT_FOUND", f"Run not found: {run_id}")
    return RunRow.from_row(row)


def list_runs(tx: Tx, *, job_id: str | None = None, status: str | None = None, limit: int = 50,
              before: tuple[int, str] | None = None, since_ms: int | None = None,
              until_ms: int | None = None) -> list[RunRow]:
    """Most recent runs first, optionally of one job and/or one status.

    ``before`` is a keyset cursor, the ``(created_at, id)`` of the last run of the previous page:
    only older runs follow, so a page costs the same however deep it is. ``since_ms`` and
    ``until_ms`` keep runs created in ``[since_ms, until_ms)``.
    """
    where: list[str] = []
    params: list[object] = []
    if before is not None:
        where.append("(created_at < ? OR (created_at = ? AND id < ?))")
        params += [before[0], before[0], before[1]]
    if since_ms is not None:
        where.append("created_at >= ?")
        params.append(since_ms)
    if until_ms is not None:
        where.append("created_at < ?")
        params.append(until_ms)
    if job_id:
        where.append("job_id = ?")
        params.append(job_id)
    if status:
        if status not in RUN_STATUSES:
            raise SchedulerError("INVALID_ARGUMENT", f"unknown run status {status!r}; one of {', '.join(RUN_STATUSES)}")
        where.append("status = ?")
        params.append(status)
    # The page's ids first, then their rows: sorting only (created_at, id) instead of whole rows is what keeps a
    # page of 100,000 runs without a created_at index at tens of milliseconds (bench/web.py), on both stores.
    inner = "SELECT id FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
    inner += " ORDER BY created_at DESC, id DESC LIMIT ?"
    sql = f"SELECT * FROM runs WHERE id IN ({inner}) ORDER BY created_at DESC, id DESC"
    params.append(limit)
    return [RunRow.from_row(row) for row in tx.all(sql, params)]


def _parsed(column: str | None) -> JSONValue:
    """A JSON column of a run, parsed (None when it is empty)."""
    return json.loads(column) if column else None


def run_to_json(row: RunRow | Mapping[str, Any], *, full: bool = False) -> JSONObject:
    """JSON view of a run; ``full`` adds output excerpts, structured output and verification."""
    keys = [
        "id", "job_id", "status", "dispatch_id", "dispatch_kind", "attempt", "scheduled_for", "started_at", "finished_at",
        "duration_ms", "dispatcher_owner", "dispatcher_token", "exit_code", "error_code", "error_message", "skip_reason",
        "parent_run_id", "retry_of_run_id", "replay_of_run_id", "executor", "delivery_guarantee",
        "cancel_requested_at", "cancel_requested_by", "cancel_reason", "process_state",
        "stdout_bytes", "stderr_bytes", "stdout_sha256", "stderr_sha256", "output_format", "output_valid",
        "verify_status", "created_at", "terminal_at", "artifact_digest", "source_run_id", "source_artifact_digest",
        "principal", "trust_level",
    ]
    if full:
        keys += [
            "stdout_excerpt", "stderr_excerpt", "stdout_artifact", "stderr_artifact", "stdout_truncated", "stderr_truncated",
            "output_warning", "output_bytes", "output_sha256", "output_artifact",
            "process_terminated_at", "process_signal", "agent_abort_requested_at", "agent_abort_outcome", "summary",
            "env_policy_warning",
        ]
    run = row if isinstance(row, RunRow) else RunRow.from_row(row)
    # Every column of a run is a JSON scalar (text, integer or NULL); the time columns are integers or NULL.
    out = cast("JSONObject", {k: run.get(k) for k in keys})
    for k in _TIME_FIELDS:
        if k in out:
            out[k] = to_iso(cast("int | None", run.get(k)))
    if out.get("output_valid") is not None:
        out["output_valid"] = bool(out["output_valid"])
    if full:
        out["output_parsed"] = _parsed(run.output_parsed)
        out["verification"] = _parsed(run.verify_json)
        out["executor_handle"] = _parsed(run.executor_handle)
        out["usage"] = _parsed(run.usage_json)
        out["identity"] = _parsed(run.identity_json)
        out["delegation"] = _parsed(run.delegation_json)
        # The authorization_ref decision (docs/authorization.md): provider, policy ref, decision, reason, code.
        out["authorization"] = _parsed(run.authorization_json)
        # The credentials summary (docs/credentials.md): per binding name, medium, status, digest, redaction counts; no value.
        out["credentials"] = _parsed(run.credentials_json)
        for k in ("stdout_truncated", "stderr_truncated"):
            out[k] = bool(out[k])
    return out
