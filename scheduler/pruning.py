"""Run pruning: delete old terminal runs, keep the evidence that must outlive them, leave a tombstone.

``runs prune --older-than D [--job J] [--dry-run]`` deletes runs that

* are terminal (``ok``, ``error``, ``timeout``, ``cancelled``, ``crashed``, ``skipped``),
* ended (``finished_at``, else ``created_at``) more than ``D`` ago, and
* that nothing pending references: no pending/claimed/awaiting dispatch naming it as its run
  or source, no unfinished run naming it as parent, retry, replay or source, no
  pending/claimed delivery part, no open approval, no materialised credential
  presentation still waiting for its cleanup.

Per pruned run, in ONE transaction with every other pruned run and one runtime event
(``runs.pruned``) saying what was pruned:

* an evidence row whose retention is still running (``retention_until`` NULL, i.e. kept
  forever, or in the future) is KEPT and a ``run_tombstones`` row is written (the run's id,
  job, job name, status, artifact, evidence id, finish time), so ``runs evidence RUN_ID``
  still verifies the retained payload and envelope after the run is gone;
* an evidence row whose retention has passed is deleted with its run (the database guard
  ``evidence_records_retained`` refuses anything else);
* before a run with evidence is pruned its evidence row's binding is checked (its payload
  hashes to ``payload_sha256`` and names this run); a row that fails is left alone together
  with its run (``skipped``), because deleting the run would destroy what an investigation
  of that evidence needs.

After the transaction commits, the runs' offloaded output files (``artifacts/runs/<id>/``
and any ``*_artifact`` path) are removed; a file that cannot be removed is reported, never
fatal (the database no longer references it).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from scheduler.errors import SchedulerError
from scheduler.timeutil import now_ms

#: Terminal run statuses (a run in any other status is never pruned).
TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")
#: Runs deleted per transaction.
BATCH = 500
#: Evidence whose ``retention_until`` is within this many ms of now is treated as still retained
#: (the database guard judges by the database's clock, which may be a little behind ours).
RETENTION_SKEW_MS = 5_000
#: How many run ids the runtime event lists (the counts are always complete).
EVENT_IDS = 200
#: The runtime event a prune records.
EVENT_KIND = "runs.pruned"

_ARTIFACT_COLUMNS = ("stdout_artifact", "stderr_artifact", "output_artifact")

_PENDING_REFERENCE = """
  AND NOT EXISTS (SELECT 1 FROM job_dispatch_queue d WHERE (d.run_id = r.id OR d.source_run_id = r.id)
                  AND d.status IN ('pending', 'claimed', 'awaiting_approval'))
  AND NOT EXISTS (SELECT 1 FROM runs o WHERE (o.parent_run_id = r.id OR o.retry_of_run_id = r.id
                  OR o.replay_of_run_id = r.id OR o.source_run_id = r.id) AND o.status NOT IN ({terminal}))
  AND NOT EXISTS (SELECT 1 FROM delivery_outbox b WHERE b.run_id = r.id AND b.status IN ('pending', 'claimed'))
  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = r.id AND a.status IN ('pending', 'approved'))
  AND NOT EXISTS (SELECT 1 FROM credential_presentations c WHERE c.run_id = r.id AND c.status = 'materialized')
"""


@attrs.define
class PruneReport:
    """What a prune did (or, with ``dry_run``, would do)."""

    cutoff: int
    job_id: str | None
    dry_run: bool
    pruned: list[str] = attrs.Factory(list)
    tombstoned: list[str] = attrs.Factory(list)
    evidence_deleted: list[str] = attrs.Factory(list)
    skipped: list[dict[str, str]] = attrs.Factory(list)
    files_removed: int = 0
    file_errors: list[str] = attrs.Factory(list)

    def to_json(self) -> dict[str, Any]:
        """The report as the CLI's JSON object."""
        from scheduler.timeutil import to_iso

        return {
            "dry_run": self.dry_run,
            "cutoff": to_iso(self.cutoff),
            "job_id": self.job_id,
            "pruned": len(self.pruned),
            "tombstoned": len(self.tombstoned),
            "evidence_deleted": len(self.evidence_deleted),
            "skipped": self.skipped,
            "files_removed": self.files_removed,
            "file_errors": self.file_errors,
            "run_ids": self.pruned,
        }


def _in(values: Iterable[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def candidates(tx: Any, cutoff: int, *, job_id: str | None = None, limit: int = BATCH,
               after: str | None = None) -> list[dict[str, Any]]:
    """Terminal runs that ended before ``cutoff`` and that nothing pending references, oldest id order."""
    sql = (f"SELECT r.* FROM runs r WHERE r.status IN ({_in(TERMINAL)})"
           " AND COALESCE(r.finished_at, r.created_at) < ?" + _PENDING_REFERENCE.format(terminal=_in(TERMINAL)))
    params: list[Any] = [cutoff]
    if job_id is not None:
        sql += " AND r.job_id = ?"
        params.append(job_id)
    if after is not None:
        sql += " AND r.id > ?"
        params.append(after)
    sql += " ORDER BY r.id LIMIT ?"
    params.append(limit)
    return tx.all(sql, tuple(params))


def binding_problem(run: dict[str, Any], evidence: dict[str, Any]) -> str | None:
    """Why an evidence row is not bound to ``run`` (its payload's hash or its run id), or None when it is."""
    payload = evidence.get("canonical_payload")
    if not isinstance(payload, str):
        return "the evidence row has no payload"
    if hashlib.sha256(payload.encode("utf-8")).hexdigest() != evidence.get("payload_sha256"):
        return "the evidence payload does not hash to its recorded payload_sha256"
    try:
        document = json.loads(payload)
    except ValueError:
        return "the evidence payload is not JSON"
    if not isinstance(document, dict) or document.get("run_id") != run["id"]:
        return "the evidence payload names another run"
    return None


def _retained(evidence: dict[str, Any], now: int) -> bool:
    until = evidence.get("retention_until")
    return until is None or int(until) > now - RETENTION_SKEW_MS


def _prune_batch(tx: Any, runs: list[dict[str, Any]], report: PruneReport, now: int) -> list[dict[str, Any]]:
    """Delete one batch of runs inside ``tx`` (or only plan it on a dry run); the runs actually pruned."""
    ids = [r["id"] for r in runs]
    marks = ", ".join("?" for _ in ids)
    evidence = {e["run_id"]: e for e in tx.all(f"SELECT * FROM evidence_records WHERE run_id IN ({marks})", tuple(ids))}
    names = {}
    job_ids = sorted({r["job_id"] for r in runs})
    if job_ids:
        jmarks = ", ".join("?" for _ in job_ids)
        names = {j["id"]: j["name"] for j in tx.all(f"SELECT id, name FROM jobs WHERE id IN ({jmarks})", tuple(job_ids))}
    done: list[dict[str, Any]] = []
    for run in runs:
        record = evidence.get(run["id"])
        if record is not None:
            problem = binding_problem(run, record)
            if problem is not None:
                report.skipped.append({"run_id": run["id"], "reason": problem})
                continue
            if _retained(record, now):
                report.tombstoned.append(run["id"])
                if not report.dry_run:
                    tx.execute(
                        "INSERT INTO run_tombstones(run_id, job_id, job_name, status, artifact_digest, evidence_id,"
                        " finished_at, pruned_at, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (run["id"], run["job_id"], names.get(run["job_id"]), run["status"], run.get("artifact_digest"),
                         record["id"], run.get("finished_at"), now, "pruned; evidence retained"),
                    )
            else:
                report.evidence_deleted.append(run["id"])
                if not report.dry_run:
                    tx.execute("DELETE FROM evidence_records WHERE id = ?", (record["id"],))
        if not report.dry_run:
            tx.execute("DELETE FROM runs WHERE id = ? AND status IN (" + _in(TERMINAL) + ")", (run["id"],))
        report.pruned.append(run["id"])
        done.append(run)
    return done


def _remove_files(root: Path, run: dict[str, Any], report: PruneReport) -> None:
    """Remove a pruned run's offloaded output files; problems are reported, not raised."""
    from scheduler.artifacts import resolve_artifact, run_dir

    for column in _ARTIFACT_COLUMNS:
        relative = run.get(column)
        if not relative:
            continue
        try:
            path = resolve_artifact(root, str(relative))
            path.unlink()
            report.files_removed += 1
        except FileNotFoundError:
            pass
        except (OSError, SchedulerError) as exc:
            report.file_errors.append(f"{relative}: {exc}")
    try:
        directory = run_dir(root, run["id"], create=False)
    except SchedulerError as exc:
        report.file_errors.append(str(exc))
        return
    if directory.is_dir():
        removed = sum(1 for p in directory.rglob("*") if p.is_file())
        try:
            shutil.rmtree(directory)
            report.files_removed += removed
        except OSError as exc:
            report.file_errors.append(f"{directory}: {exc}")


def prune_runs(store: Any, *, older_than_ms: int, job_id: str | None = None, dry_run: bool = False,
               artifacts_root: Path | None = None, actor: str | None = None, now: int | None = None) -> PruneReport:
    """Prune terminal runs that ended more than ``older_than_ms`` ago (see the module docstring); the report.

    One transaction: the deletions, tombstones, deleted expired evidence and the one
    ``runs.pruned`` event commit together or not at all. A dry run reads the same plan
    and changes nothing (no rows, no files, no event). Files go after the commit.
    """
    from scheduler.events import append_event, os_identity

    if older_than_ms <= 0:
        raise SchedulerError("INVALID_DURATION", "--older-than must be positive")
    at = now_ms() if now is None else now
    report = PruneReport(cutoff=at - older_than_ms, job_id=job_id, dry_run=dry_run)
    done: list[dict[str, Any]] = []
    with (store.read() if dry_run else store.transaction()) as tx:
        after: str | None = None
        while True:
            batch = candidates(tx, report.cutoff, job_id=job_id, after=after)
            if not batch:
                break
            done += _prune_batch(tx, batch, report, at)
            after = batch[-1]["id"]
        if done and not dry_run:
            append_event(tx, EVENT_KIND, job_id=job_id, actor=actor or os_identity(), at=at, data={
                "cutoff": report.cutoff,
                "job_id": job_id,
                "pruned": len(report.pruned),
                "tombstoned": report.tombstoned[:EVENT_IDS],
                "evidence_deleted": report.evidence_deleted[:EVENT_IDS],
                "skipped": len(report.skipped),
                "run_ids": report.pruned[:EVENT_IDS],
            })
    if artifacts_root is not None and not dry_run:
        for run in done:
            _remove_files(artifacts_root, run, report)
    return report
