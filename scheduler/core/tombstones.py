"""What a job's runs leave behind when the job is deleted: a ``run_tombstones`` row each, and their evidence per its retention.

Deleting a job deletes its runs (``runs.job_id`` cascades), but not its audit trail: in the same
transaction every run of the job gets a tombstone (as pruning leaves one for a run with evidence),
naming the run's evidence row while that row's retention runs (``runs evidence RUN_ID`` still
verifies it from history alone). Evidence whose retention has ended is deleted with its run, as
pruning does, and its tombstone records that. The runs' settled outbox parts (delivered or
cancelled) go with them, as pruning takes them: a delivered part is immutable, so the foreign key
could not set its ``run_id`` NULL and the delete used to fail (``OUTBOX_DELIVERED``); parts that
may still be sent stay and are sent (their ``run_id`` becomes NULL). Approvals are not touched
here: the job's open ones were cancelled first and stay (``scheduler.core.jobs.delete_job``).
"""

from __future__ import annotations

import attrs

from scheduler.core.store.base import Tx

#: Evidence whose ``retention_until`` is within this many ms of now counts as still retained (the database's
#: ``evidence_records_retained`` guard judges by its own clock, which may be a little behind ours; as pruning).
RETENTION_SKEW_MS = 5_000
#: The tombstone reasons of a deleted job's runs: no evidence, evidence retained, expired evidence deleted.
REASON, REASON_RETAINED, REASON_EXPIRED = "job deleted", "job deleted; evidence retained", "job deleted; evidence expired and deleted"


@attrs.frozen
class JobTombstones:
    """What ``tombstone_job_runs`` wrote: tombstones, the runs' evidence rows kept and deleted, settled parts deleted."""

    tombstones: int
    evidence_retained: int
    evidence_deleted: int
    outbox: int


def tombstone_job_runs(tx: Tx, job_id: str, job_name: str, *, now: int) -> JobTombstones:
    """Give every run of ``job_id`` its tombstone, delete the evidence whose retention has ended and the runs'
    settled outbox parts, inside ``tx``.

    Called by ``delete_job`` before the job's row (and with it its runs) is deleted. Four
    statements whatever the number of runs; a run that already has a tombstone keeps it.
    """
    expired_before = now - RETENTION_SKEW_MS
    tombstones = tx.execute(
        "INSERT INTO run_tombstones(run_id, job_id, job_name, status, artifact_digest, evidence_id, finished_at, pruned_at,"
        " reason) SELECT r.id, r.job_id, ?, r.status, r.artifact_digest,"
        " CASE WHEN e.id IS NOT NULL AND (e.retention_until IS NULL OR e.retention_until > ?) THEN e.id END,"
        " r.finished_at, ?,"
        " CASE WHEN e.id IS NULL THEN ? WHEN e.retention_until IS NULL OR e.retention_until > ? THEN ? ELSE ? END"
        " FROM runs r LEFT JOIN evidence_records e ON e.run_id = r.id WHERE r.job_id = ?"
        " ON CONFLICT (run_id) DO NOTHING",
        (job_name, expired_before, now, REASON, expired_before, REASON_RETAINED, REASON_EXPIRED, job_id),
    )
    retained = tx.scalar(
        "SELECT COUNT(*) FROM evidence_records e JOIN runs r ON r.id = e.run_id WHERE r.job_id = ?"
        " AND (e.retention_until IS NULL OR e.retention_until > ?)", (job_id, expired_before))
    deleted = tx.execute(
        "DELETE FROM evidence_records WHERE retention_until IS NOT NULL AND retention_until <= ?"
        " AND run_id IN (SELECT id FROM runs WHERE job_id = ?)", (expired_before, job_id))
    outbox = tx.execute(
        "DELETE FROM delivery_outbox WHERE status IN ('delivered', 'cancelled') AND run_id IN (SELECT id FROM runs"
        " WHERE job_id = ?)", (job_id,))
    return JobTombstones(tombstones=tombstones, evidence_retained=int(retained or 0), evidence_deleted=deleted,
                         outbox=outbox)


__all__ = ["JobTombstones", "tombstone_job_runs"]
