"""The durable dispatch queue: materialising due slots, manual runs, claiming and starting work.

Scheduled slots get deterministic ids (``job:kind:slot``), so materialising the
same slot twice, from two dispatchers or after a crash, inserts one row. Claiming
a dispatch and creating its run happen in one transaction under the claimer's
fence: there is never a claim without its run, or a run without its claim.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import attrs

from scheduler.errors import SchedulerError
from scheduler.events import append_event, os_identity
from scheduler.jobs import resolve_job
from scheduler.lease import Lease, assert_live
from scheduler.settings import current_settings
from scheduler.spec import executor_name_of, spec_from_row
from scheduler.store.base import Store, Tx
from scheduler.timeutil import now_ms

#: How long a claim is valid before recovery may return it to pending (when no run is active).
CLAIM_TTL_MS = 60_000


def slot_dispatch_id(job_id: str, kind: str, slot_ms: int) -> str:
    """Deterministic id of a scheduled slot."""
    return f"{job_id}:{kind}:{slot_ms}"


def _insert_dispatch(tx: Tx, *, id: str, job_id: str, kind: str, due_at: int, now: int, source_run_id: str | None = None,
                     requested_by: str | None = None, replay_count: int = 0) -> bool:
    """Insert a pending dispatch; False if that id already exists (idempotent)."""
    changed = tx.execute(
        "INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, source_run_id, requested_by, replay_count)"
        " VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        (id, job_id, kind, due_at, now, now, source_run_id, requested_by, replay_count),
    )
    return changed == 1


def insert_dispatch(tx: Tx, **kwargs: Any) -> bool:
    """Public, idempotent insert of a pending dispatch (used by completion for retries and chains)."""
    return _insert_dispatch(tx, **kwargs)


def next_due(tx: Tx) -> int | None:
    """Earliest time anything is due: a job's next run or a pending dispatch (two index lookups)."""
    a = tx.scalar("SELECT MIN(next_run_at) FROM jobs WHERE enabled = 1 AND next_run_at IS NOT NULL")
    b = tx.scalar("SELECT MIN(due_at) FROM job_dispatch_queue WHERE status = 'pending'")
    values = [v for v in (a, b) if v is not None]
    return min(values) if values else None


def materialize_due(store: Store, *, now: int | None = None, limit: int = 200) -> int:
    """Turn every due job slot into a dispatch row and advance the job's next run (misfires per policy)."""
    from scheduler.schedules import missed_slots, next_fire

    now = now_ms() if now is None else now
    created = 0
    with store.transaction() as tx:
        # SKIP LOCKED (PostgreSQL): dispatchers materialise disjoint jobs instead of queueing behind each other.
        rows = tx.all(
            "SELECT * FROM jobs WHERE enabled = 1 AND next_run_at IS NOT NULL AND next_run_at <= ? ORDER BY next_run_at LIMIT ?"
            + tx.skip_locked,
            (now, limit),
        )
        for job in rows:
            slot = job["next_run_at"]
            kind = "at" if job["schedule_kind"] == "at" else "schedule"
            next_run, anchor = None, job["schedule_anchor_at"]
            missed: list[int] = []
            if job["schedule_kind"] in ("cron", "every"):
                spec = spec_from_row(job)
                schedule = spec.schedule()
                anchor_ms = slot if spec.schedule_kind == "every" else None
                next_run = next_fire(schedule, now, anchor_ms=anchor_ms)
                if spec.schedule_kind == "every":
                    anchor = slot
                if now - slot > current_settings().dispatcher.misfire_grace_ms:  # a misfire, not just a busy loop
                    missed = [slot] + missed_slots(schedule, slot, now, limit=10_000, anchor_ms=anchor_ms)
            elif now - slot > current_settings().dispatcher.misfire_grace_ms:
                missed = [slot]  # a one-shot reached late
            changed = tx.execute(
                "UPDATE jobs SET next_run_at = ?, schedule_anchor_at = ?, updated_at = ? WHERE id = ? AND next_run_at = ?",
                (next_run, anchor, now, job["id"], slot),
            )
            if changed != 1:
                continue  # another dispatcher advanced it first
            if missed:
                latest = missed[-1]
                if job["misfire_policy"] == "skip":
                    _record_skip(tx, job, slot_ms=latest, reason=f"misfire: {len(missed)} slot(s) missed while down", now=now,
                                 dispatch_kind=kind)
                    continue
                append_event(tx, "slot.misfire_coalesced", job_id=job["id"], at=now,
                             data={"missed": len(missed), "first": missed[0], "last": latest})
                slot = latest
            if _insert_dispatch(tx, id=slot_dispatch_id(job["id"], kind, slot), job_id=job["id"], kind=kind, due_at=slot, now=now):
                created += 1
    return created


def _record_skip(tx: Tx, job: dict[str, Any], *, slot_ms: int | None, reason: str, now: int, dispatch_id: str | None = None,
                 dispatch_kind: str | None = None) -> str:
    """A ``skipped`` run that says why a slot did not run (nothing is dropped silently)."""
    run_id = str(uuid.uuid4())
    tx.execute(
        "INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, scheduled_for, created_at, finished_at, terminal_at,"
        " skip_reason, delivery_guarantee) VALUES (?, ?, ?, ?, 'skipped', ?, ?, ?, ?, ?, ?)",
        (run_id, job["id"], dispatch_id, dispatch_kind, slot_ms, now, now, now, reason, job["delivery_guarantee"]),
    )
    append_event(tx, "run.skipped", job_id=job["id"], run_id=run_id, dispatch_id=dispatch_id, at=now, data={"reason": reason})
    return run_id


def record_skip(tx: Tx, job: dict[str, Any], **kwargs: Any) -> str:
    """Public form of ``_record_skip``."""
    return _record_skip(tx, job, **kwargs)


def enqueue_manual(store: Store, ref: str, *, now: int | None = None) -> dict[str, Any]:
    """``jobs run``: a manual dispatch due now. Refused for a disabled job or a running job under ``skip``."""
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        job = resolve_job(tx, ref)
        if not job["enabled"]:
            raise SchedulerError("JOB_DISABLED", f"job {job['name']!r} is {'paused' if job['paused_at'] else 'disabled'}; enable it first")
        running = tx.scalar("SELECT COUNT(*) FROM runs WHERE job_id = ? AND status = 'running'", (job["id"],))
        if running and job["overlap_policy"] == "skip":
            raise SchedulerError("JOB_ALREADY_RUNNING", f"job {job['name']!r} is running and its overlap_policy is skip")
        dispatch_id = f"{job['id']}:manual:{uuid.uuid4().hex}"
        _insert_dispatch(tx, id=dispatch_id, job_id=job["id"], kind="manual", due_at=now, now=now, requested_by=os_identity())
        append_event(tx, "dispatch.manual", job_id=job["id"], dispatch_id=dispatch_id, actor=os_identity(), at=now)
        row = tx.one("SELECT id, job_id, kind, status, due_at FROM job_dispatch_queue WHERE id = ?", (dispatch_id,))
    store.notify_change()
    return row  # type: ignore[return-value]


@attrs.frozen
class StartedRun:
    """A claimed dispatch whose run row now exists in ``running`` under our fence."""

    run_id: str
    dispatch_id: str
    dispatch_kind: str
    job: dict[str, Any]
    attempt: int
    scheduled_for: int
    started_at: int
    parent_run_id: str | None


def claim_and_start(
    store: Store, lease: Lease, *, limit: int, now: int | None = None, veto: Any = None, check_lease: bool = True
) -> list[StartedRun]:
    """Claim up to ``limit`` due dispatches and create their runs, in one fenced transaction.

    Dispatches that must not run become records instead: a disabled job's
    non-manual dispatch is cancelled; an overlapping slot under ``skip`` (or past the
    ``queue`` limit) becomes a ``skipped`` run; under ``queue`` it waits.
    """
    now = now_ms() if now is None else now
    started: list[StartedRun] = []
    if limit <= 0:
        return started
    with store.transaction() as tx:
        if check_lease:  # False: the caller asserted it in this same transaction
            assert_live(tx, lease, now=now)
        candidates = tx.all(
            "SELECT id, job_id, kind, due_at, source_run_id, replay_count FROM job_dispatch_queue"
            " WHERE status = 'pending' AND due_at <= ? ORDER BY due_at, id LIMIT ?" + tx.skip_locked,
            (now, limit * 4),
        )
        deferred_jobs: set[str] = set()
        for d in candidates:
            if len(started) >= limit:
                break
            job = tx.one("SELECT * FROM jobs WHERE id = ?" + tx.for_update, (d["job_id"],))
            if job is None:
                continue
            if not job["enabled"] and d["kind"] != "manual":
                tx.execute(
                    "UPDATE job_dispatch_queue SET status = 'cancelled', cancel_reason = ?, updated_at = ? WHERE id = ? AND status = 'pending'",
                    ("job disabled", now, d["id"]),
                )
                append_event(tx, "dispatch.cancelled", job_id=job["id"], dispatch_id=d["id"], at=now, data={"reason": "job disabled"})
                continue
            if job["id"] in deferred_jobs:
                continue
            running = tx.scalar("SELECT COUNT(*) FROM runs WHERE job_id = ? AND status = 'running'", (job["id"],))
            policy = job["overlap_policy"]
            if running and policy != "allow" and d["kind"] not in ("retry",):
                waiting = tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE job_id = ? AND status = 'pending'", (job["id"],))
                if policy == "queue" and waiting <= job["queue_limit"]:
                    deferred_jobs.add(job["id"])
                    continue
                reason = "overlap: job already running" if policy == "skip" else f"overlap: queue limit {job['queue_limit']} reached"
                _finish_dispatch(tx, d["id"], "done", now)
                _record_skip(tx, job, slot_ms=d["due_at"], reason=reason, now=now, dispatch_id=d["id"], dispatch_kind=d["kind"])
                continue
            reason = veto(job, d["kind"]) if veto is not None else None
            if reason:
                _finish_dispatch(tx, d["id"], "done", now)
                _record_skip(tx, job, slot_ms=d["due_at"], reason=f"veto: {reason}", now=now, dispatch_id=d["id"], dispatch_kind=d["kind"])
                continue
            started.append(_start(tx, lease, d, job, now))
            if policy != "allow":
                deferred_jobs.add(job["id"])
    return started


def _finish_dispatch(tx: Tx, dispatch_id: str, status: str, now: int) -> None:
    tx.execute("UPDATE job_dispatch_queue SET status = ?, updated_at = ? WHERE id = ?", (status, now, dispatch_id))


def _start(tx: Tx, lease: Lease, d: dict[str, Any], job: dict[str, Any], now: int) -> StartedRun:
    run_id = str(uuid.uuid4())
    attempt, parent_run_id, retry_of = 1, None, None
    if d["kind"] == "retry" and d["source_run_id"]:
        src = tx.one("SELECT attempt FROM runs WHERE id = ?", (d["source_run_id"],))
        attempt = (src["attempt"] if src else 0) + 1
        retry_of = d["source_run_id"]
    elif d["kind"] == "chain":
        parent_run_id = d["source_run_id"]
    replay_of = d["source_run_id"] if d["replay_count"] else None
    tx.execute(
        "UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = ?, claim_token = ?, claim_fence = ?, claim_expires_at = ?,"
        " attempts = attempts + 1, run_id = ?, updated_at = ? WHERE id = ? AND status = 'pending'",
        (lease.owner, secrets.token_hex(8), lease.token, now + CLAIM_TTL_MS, run_id, now, d["id"]),
    )
    tx.execute(
        "INSERT INTO runs(id, job_id, dispatch_id, dispatch_kind, status, attempt, scheduled_for, created_at, started_at,"
        " dispatcher_owner, dispatcher_token, parent_run_id, retry_of_run_id, replay_of_run_id, delivery_guarantee, executor, output_format)"
        " VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (run_id, job["id"], d["id"], d["kind"], attempt, d["due_at"], now, now, lease.owner, lease.token, parent_run_id, retry_of,
         replay_of, job["delivery_guarantee"], executor_name_of(job), job["output_format"]),
    )
    append_event(tx, "run.started", job_id=job["id"], run_id=run_id, dispatch_id=d["id"], actor=lease.owner, at=now,
                 data={"kind": d["kind"], "attempt": attempt, "token": lease.token})
    return StartedRun(run_id=run_id, dispatch_id=d["id"], dispatch_kind=d["kind"], job=job, attempt=attempt,
                      scheduled_for=d["due_at"], started_at=now, parent_run_id=parent_run_id)


def release_expired_claims(store: Store, *, now: int | None = None) -> int:
    """Return expired claims with no active run to pending (attempts and last error stay)."""
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        return tx.execute(
            "UPDATE job_dispatch_queue SET status = 'pending', claim_owner = NULL, claim_token = NULL, claim_fence = NULL,"
            " claim_expires_at = NULL, last_error = 'claim expired', updated_at = ?"
            " WHERE status = 'claimed' AND claim_expires_at <= ? AND NOT EXISTS ("
            "   SELECT 1 FROM runs r WHERE r.dispatch_id = job_dispatch_queue.id"
            "   AND r.status IN ('running', 'pending', 'awaiting_approval', 'approved', 'recovery_blocked'))",
            (now, now),
        )
