"""Retention passes: prune old runs, settled outbox messages, old events, unreferenced artifacts and orphaned files.

One pass (``prune``) applies ``scheduler.ops.retention_rules.Rules`` in bounded batches, each its own
short write transaction (``[retention] batch`` rows, 500 by default), never one long one:

1. **The cutoff row.** An unrestricted pass first writes its ``prune_cutoffs`` row (time,
   actor, rules, and ``events_before`` when ``event_age`` is set). The table is
   append-only; the runtime events' delete guard refuses any event at or after the largest
   ``events_before`` ever recorded, so a plain ``DELETE FROM runtime_events`` stays refused
   and only events older than a recorded cutoff can go. A dispatcher's duty reads the
   newest row to run once per ``interval`` (``PassNotDue`` otherwise).
2. **Runs.** Per job, the terminal runs no rule keeps (``Rules.for_job``: the newest
   ``keep_runs``, or younger than ``max_age``) and that nothing still needs: no open
   dispatch naming it as its run, no dispatch at all naming it as its source (chain,
   retry and replay lineage stays whole), no unfinished run naming it as parent, retry,
   replay or source, no outbox part that may still be sent (pending, claimed, or failed:
   ``deliveries retry`` re-arms those, and their attachments read the run's files), no
   open approval, no credential presentation waiting for its cleanup. Per run: its
   evidence row, when its retention still runs, is KEPT and a ``run_tombstones`` row is
   written (``runs evidence RUN_ID`` still verifies it); expired evidence is deleted with
   the run (the ``evidence_records_retained`` guard refuses anything else) and a tombstone
   without an evidence row records that it had some; evidence whose
   binding is broken keeps its run (``skipped``). The run's finished dispatch row and its
   settled (delivered or cancelled) outbox parts go with it. After each batch commits, the runs' offloaded output files are removed.
3. **Outbox.** With ``delivered_outbox_age``: messages (every part of a group) all
   delivered or cancelled, last changed before the cutoff, with their attachments.
   Pending, claimed and failed parts are never deleted.
4. **Events** older than ``events_before``.
5. **Execution artifacts** no row references (every foreign key to
   ``execution_artifacts`` is checked: jobs, dispatches, runs, approvals, events, evidence,
   tombstones, sessions, presentations, the proof ledger) and older than ``orphan_grace``.
6. **Orphaned files**: directories under ``ARTIFACTS/runs/`` with no run row, older than
   ``orphan_grace`` (a starting run's directory appears only after its row committed, and
   the grace covers clocks and slow commits).
7. **The event.** One ``runs.pruned`` runtime event with the counts per table.

A dry run reads the same plan and changes nothing. With a ``lease`` (the dispatcher's
duty) every batch locks and asserts it first, so a dispatcher that lost it commits nothing
more; deletions are idempotent and counted by rows actually deleted, so two pruners never
double-count or double-delete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core import lease as leases
from scheduler.core.events import append_event, os_identity
from scheduler.core.outputs import resolve_artifact, run_dir
from scheduler.core.store import schema
from scheduler.ops.retention_rules import Rules, settings_rules

#: Terminal run statuses (a run in any other status is never pruned).
TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")
_OPEN_RUN = ("pending", "running", "awaiting_approval", "approved", "recovery_blocked")
#: Rows per transaction when the caller names no batch size.
BATCH = 500
#: Evidence whose ``retention_until`` is within this many ms of now is treated as still retained
#: (the database guard judges by the database's clock, which may be a little behind ours).
RETENTION_SKEW_MS = 5_000
#: How many run ids the runtime event lists (the counts are always complete).
EVENT_IDS = 200
#: The runtime event a pass records.
EVENT_KIND = "runs.pruned"

_ARTIFACT_COLUMNS = ("stdout_artifact", "stderr_artifact", "output_artifact")


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


_NEEDED = f"""
  AND NOT EXISTS (SELECT 1 FROM job_dispatch_queue d WHERE d.job_id = r.job_id AND d.status IN ('pending', 'claimed', 'awaiting_approval')
                  AND d.run_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM job_dispatch_queue d WHERE d.source_run_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.status IN ({_in(_OPEN_RUN)}) AND (o.parent_run_id = r.id
                  OR o.retry_of_run_id = r.id OR o.replay_of_run_id = r.id OR o.source_run_id = r.id))
  AND NOT EXISTS (SELECT 1 FROM delivery_outbox b WHERE b.run_id = r.id AND b.status IN ('pending', 'claimed', 'failed'))
  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = r.id AND a.status IN ('pending', 'approved'))
  AND NOT EXISTS (SELECT 1 FROM credential_presentations c WHERE c.run_id = r.id AND c.status = 'materialized')
"""


class PassNotDue(Exception):
    """The last pass was less than the interval ago (the duty waits ``remaining_ms``)."""

    def __init__(self, remaining_ms: int) -> None:
        super().__init__(f"next retention pass in {remaining_ms} ms")
        self.remaining_ms = remaining_ms


@attrs.define
class PruneReport:
    """What a pass did (or, with ``dry_run``, would do)."""

    cutoff: int | None
    job_id: str | None
    dry_run: bool
    rules: dict[str, Any] = attrs.Factory(dict)
    pruned: list[str] = attrs.Factory(list)
    #: Runs pruned with their evidence retained (a tombstone names the evidence row).
    tombstoned: list[str] = attrs.Factory(list)
    #: Runs pruned with their expired evidence deleted (a tombstone without an evidence row says so).
    evidence_deleted: list[str] = attrs.Factory(list)
    skipped: list[dict[str, str]] = attrs.Factory(list)
    dispatches: int = 0
    outbox: int = 0
    attachments: int = 0
    events: int = 0
    events_before: int | None = None
    artifacts: int = 0
    files_removed: int = 0
    orphans: list[str] = attrs.Factory(list)
    file_errors: list[str] = attrs.Factory(list)
    batches: int = 0

    @property
    def total(self) -> int:
        """Rows and files this pass deleted (or would)."""
        return len(self.pruned) + self.dispatches + self.outbox + self.events + self.artifacts + len(self.orphans)

    def counts(self) -> dict[str, int]:
        """Deleted rows per table (``run_tombstones``: written), files removed and orphaned directories."""
        return {"runs": len(self.pruned), "run_tombstones": len(self.tombstoned) + len(self.evidence_deleted),
                "evidence_records": len(self.evidence_deleted),
                "job_dispatch_queue": self.dispatches, "delivery_outbox": self.outbox, "delivery_attachments": self.attachments,
                "runtime_events": self.events, "execution_artifacts": self.artifacts, "files": self.files_removed,
                "orphaned_dirs": len(self.orphans)}

    def summary(self) -> str:
        """One line for the dispatcher's log."""
        return ", ".join(f"{n} {k}" for k, n in self.counts().items() if n)

    def to_json(self) -> dict[str, Any]:
        """The report as the CLI's JSON object."""
        return {
            "dry_run": self.dry_run,
            "cutoff": to_iso(self.cutoff) if self.cutoff is not None else None,
            "job_id": self.job_id,
            "rules": self.rules,
            "pruned": len(self.pruned),
            "tombstoned": len(self.tombstoned) + len(self.evidence_deleted),
            "evidence_retained": len(self.tombstoned),
            "evidence_deleted": len(self.evidence_deleted),
            "skipped": self.skipped,
            "counts": self.counts(),
            "events_before": to_iso(self.events_before) if self.events_before is not None else None,
            "files_removed": self.files_removed,
            "orphans": self.orphans,
            "file_errors": self.file_errors,
            "run_ids": self.pruned,
        }


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


def candidates(tx: Any, job_id: str, rule: Any, now: int, *, limit: int = BATCH, after: str | None = None) -> list[dict[str, Any]]:
    """Terminal runs of ``job_id`` that ``rule`` does not keep and nothing still needs, in id order after ``after``."""
    if not rule.active:
        return []
    sql = f"SELECT r.* FROM runs r WHERE r.job_id = ? AND r.status IN ({_in(TERMINAL)})"
    params: list[Any] = [job_id]
    if rule.keep_runs is not None:
        newest = tx.one(f"SELECT created_at, id FROM runs WHERE job_id = ? AND status IN ({_in(TERMINAL)})"
                        " ORDER BY created_at DESC, id DESC LIMIT 1 OFFSET ?", (job_id, rule.keep_runs - 1))
        if newest is None:
            return []  # fewer terminal runs than it keeps
        sql += " AND (r.created_at < ? OR (r.created_at = ? AND r.id < ?))"
        params += [newest["created_at"], newest["created_at"], newest["id"]]
    if rule.max_age_ms is not None:
        sql += " AND COALESCE(r.finished_at, r.created_at) < ?"
        params.append(now - rule.max_age_ms)
    sql += _NEEDED
    if after is not None:
        sql += " AND r.id > ?"
        params.append(after)
    sql += " ORDER BY r.id LIMIT ?"
    params.append(limit)
    return tx.all(sql, tuple(params))


def _fence(tx: Any, lease: Any) -> None:
    """Lock and assert the lease the pass runs under (nothing when the pass has none: ``runs prune``)."""
    if lease is None:
        return
    tx.one("SELECT token FROM dispatcher_leases WHERE name = ?" + tx.for_update, (lease.name,))
    leases.assert_live(tx, lease)


def _prune_batch(tx: Any, runs: list[dict[str, Any]], report: PruneReport, now: int) -> list[dict[str, Any]]:
    """Delete one batch of runs inside ``tx`` (or only plan it on a dry run); the runs actually pruned."""
    ids = [r["id"] for r in runs]
    marks = ", ".join("?" for _ in ids)
    evidence = {e["run_id"]: e for e in tx.all(f"SELECT * FROM evidence_records WHERE run_id IN ({marks})", tuple(ids))}
    job_ids = sorted({r["job_id"] for r in runs})
    jmarks = ", ".join("?" for _ in job_ids)
    names = {j["id"]: j["name"] for j in tx.all(f"SELECT id, name FROM jobs WHERE id IN ({jmarks})", tuple(job_ids))}
    done: list[dict[str, Any]] = []
    for run in runs:
        record = evidence.get(run["id"])
        tombstone = False
        if record is not None:
            problem = binding_problem(run, record)
            if problem is not None:
                report.skipped.append({"run_id": run["id"], "reason": problem})
                continue
            tombstone = _retained(record, now)
        if report.dry_run:
            deleted = True
        else:
            if record is not None:
                # Either way the run leaves a tombstone: with retained evidence it names the row that
                # still verifies; with expired evidence (deleted here) it records that the run existed,
                # had evidence and was pruned, so `runs evidence` says so instead of "no such run".
                tx.execute(
                    "INSERT INTO run_tombstones(run_id, job_id, job_name, status, artifact_digest, evidence_id,"
                    " finished_at, pruned_at, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                    (run["id"], run["job_id"], names.get(run["job_id"]), run["status"], run.get("artifact_digest"),
                     record["id"] if tombstone else None, run.get("finished_at"), now,
                     "pruned; evidence retained" if tombstone else "pruned; evidence expired and deleted"),
                )
                if not tombstone:
                    tx.execute("DELETE FROM evidence_records WHERE id = ?", (record["id"],))
            # Its settled delivery history goes with it (a delivered part is immutable, so its run_id could
            # not be set NULL by the foreign key); parts that may still be sent keep the run (see _NEEDED).
            report.outbox += tx.execute("DELETE FROM delivery_outbox WHERE run_id = ? AND status IN ('delivered', 'cancelled')",
                                        (run["id"],))
            # So does its settled completion debt (an open one means parts that may still be sent: the run is kept).
            tx.execute("DELETE FROM completion_debts WHERE run_id = ? AND status <> 'open'", (run["id"],))
            # Its settled approvals go with it, as they did when approvals.run_id cascaded (schema 10 dropped that key
            # so that deleting a job keeps its approvals); a run with an open approval is never a candidate.
            tx.execute("DELETE FROM approvals WHERE run_id = ? AND status NOT IN ('pending', 'approved')"
                       f" AND EXISTS (SELECT 1 FROM runs WHERE id = ? AND status IN ({_in(TERMINAL)}))", (run["id"], run["id"]))
            deleted = tx.execute(f"DELETE FROM runs WHERE id = ? AND status IN ({_in(TERMINAL)})", (run["id"],)) == 1
            if deleted and run.get("dispatch_id"):
                report.dispatches += tx.execute(
                    "DELETE FROM job_dispatch_queue WHERE id = ? AND status IN ('done', 'cancelled', 'failed')"
                    " AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.dispatch_id = job_dispatch_queue.id)",
                    (run["dispatch_id"],))
        if not deleted:
            continue  # another pruner got there first: not counted twice
        if record is not None:
            (report.tombstoned if tombstone else report.evidence_deleted).append(run["id"])
        report.pruned.append(run["id"])
        done.append(run)
    return done


def _remove_files(root: Path, run: dict[str, Any], report: PruneReport) -> None:
    """Remove a pruned run's offloaded output files; problems are reported, not raised."""
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
    _remove_dir(directory, report)


def _remove_dir(directory: Path, report: PruneReport) -> bool:
    if not directory.is_dir():
        return False
    removed = sum(1 for p in directory.rglob("*") if p.is_file())
    try:
        shutil.rmtree(directory)
    except OSError as exc:
        report.file_errors.append(f"{directory}: {exc}")
        return False
    report.files_removed += removed
    return True


class _Pass:
    """One pass's shared state: the store, the fence, the batch size, dry run, the stop flag."""

    def __init__(self, store: Any, report: PruneReport, *, lease: Any, batch: int, stop: threading.Event | None) -> None:
        self.store = store
        self.report = report
        self.lease = lease
        self.batch = batch
        self.stop = stop

    def tx(self) -> Any:
        """A batch's transaction: a read on a dry run, else a write that first locks and asserts the lease."""
        if self.report.dry_run:
            return self.store.read()
        return _FencedTx(self.store, self.lease)

    @property
    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()


class _FencedTx:
    def __init__(self, store: Any, lease: Any) -> None:
        self._cm = store.transaction()
        self._lease = lease

    def __enter__(self) -> Any:
        tx = self._cm.__enter__()
        try:
            _fence(tx, self._lease)
        except BaseException as exc:
            self._cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return tx

    def __exit__(self, *exc: object) -> Any:
        return self._cm.__exit__(*exc)


def _begin(p: _Pass, rules: Rules, at: int, actor: str, min_interval_ms: int | None) -> None:
    """The pass's first transaction: the interval check and the ``prune_cutoffs`` row (an unrestricted, real pass)."""
    report = p.report
    if rules.event_age_ms is not None and report.job_id is None:
        report.events_before = at - rules.event_age_ms
    if report.dry_run or report.job_id is not None:
        return
    with p.tx() as tx:
        if min_interval_ms is not None:
            last = tx.scalar("SELECT MAX(at) FROM prune_cutoffs")
            if last is not None and at - int(last) < min_interval_ms:
                raise PassNotDue(min_interval_ms - (at - int(last)))
        tx.execute("INSERT INTO prune_cutoffs(at, actor, events_before, rules) VALUES (?, ?, ?, ?)",
                   (at, actor, report.events_before, json.dumps(report.rules, sort_keys=True)))


def _prune_runs(p: _Pass, rules: Rules, at: int, artifacts_root: Path | None) -> None:
    report = p.report
    with p.store.read() as tx:
        if report.job_id is not None:
            jobs = tx.all("SELECT id, retention FROM jobs WHERE id = ?", (report.job_id,))
        elif rules.has_global_run_rule:
            jobs = tx.all("SELECT id, retention FROM jobs ORDER BY id")
        else:
            jobs = tx.all("SELECT id, retention FROM jobs WHERE retention IS NOT NULL ORDER BY id")
    for job in jobs:
        rule = rules.for_job(job["retention"])
        after: str | None = None
        while rule.active and not p.stopped:
            with p.tx() as tx:
                batch = candidates(tx, job["id"], rule, at, limit=p.batch, after=after)
                done = _prune_batch(tx, batch, report, at) if batch else []
            if not batch:
                break
            report.batches += 1
            after = batch[-1]["id"]
            if artifacts_root is not None and not report.dry_run:
                for run in done:
                    _remove_files(artifacts_root, run, report)


def _prune_outbox(p: _Pass, cutoff: int) -> None:
    """Settled messages (every part delivered or cancelled) last changed before ``cutoff``, with their attachments."""
    report = p.report
    after = ""
    while not p.stopped:
        with p.tx() as tx:
            groups = [r["group_key"] for r in tx.all(
                "SELECT group_key FROM delivery_outbox WHERE group_key > ? GROUP BY group_key"
                " HAVING SUM(CASE WHEN status IN ('delivered', 'cancelled') THEN 0 ELSE 1 END) = 0 AND MAX(updated_at) < ?"
                " ORDER BY group_key LIMIT ?", (after, cutoff, p.batch))]
            if not groups:
                return
            marks = ", ".join("?" for _ in groups)
            report.attachments += int(tx.scalar(
                f"SELECT COUNT(*) FROM delivery_attachments a JOIN delivery_outbox o ON a.outbox_id = o.id"
                f" WHERE o.group_key IN ({marks})", tuple(groups)) or 0)
            if report.dry_run:
                report.outbox += int(tx.scalar(f"SELECT COUNT(*) FROM delivery_outbox WHERE group_key IN ({marks})",
                                               tuple(groups)) or 0)
            else:
                report.outbox += tx.execute(f"DELETE FROM delivery_outbox WHERE group_key IN ({marks})"
                                            " AND status IN ('delivered', 'cancelled')", tuple(groups))
        report.batches += 1
        after = groups[-1]


def _prune_events(p: _Pass) -> None:
    """Runtime events older than the pass's recorded ``events_before`` (the guard refuses any other)."""
    report = p.report
    before = report.events_before
    if before is None:
        return
    if report.dry_run:
        with p.store.read() as tx:
            report.events = int(tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE at < ?", (before,)) or 0)
        return
    while not p.stopped:
        with p.tx() as tx:
            ids = [r["id"] for r in tx.all("SELECT id FROM runtime_events WHERE at < ? ORDER BY id LIMIT ?", (before, p.batch))]
            if not ids:
                return
            marks = ", ".join("?" for _ in ids)
            report.events += tx.execute(f"DELETE FROM runtime_events WHERE id IN ({marks}) AND at < ?", (*ids, before))
        report.batches += 1


def artifact_references() -> list[tuple[str, str]]:
    """Every ``(table, column)`` with a foreign key to ``execution_artifacts``, read from the schema (never out of date)."""
    return [(t.name, c.name) for t in schema.TABLES for c in t.columns
            if c.references and c.references.startswith("execution_artifacts(")]


def _prune_artifacts(p: _Pass, cutoff: int) -> None:
    """Execution artifacts no row references, created before ``cutoff``."""
    report = p.report
    unreferenced = " AND ".join(f"NOT EXISTS (SELECT 1 FROM {t} x WHERE x.{c} = a.digest)" for t, c in artifact_references())
    after = ""
    while not p.stopped:
        with p.tx() as tx:
            digests = [r["digest"] for r in tx.all(
                f"SELECT a.digest FROM execution_artifacts a WHERE a.digest > ? AND a.created_at < ? AND {unreferenced}"
                " ORDER BY a.digest LIMIT ?", (after, cutoff, p.batch))]
            if not digests:
                return
            if report.dry_run:
                report.artifacts += len(digests)
            else:
                marks = ", ".join("?" for _ in digests)
                report.artifacts += tx.execute(
                    f"DELETE FROM execution_artifacts WHERE digest IN ({marks}) AND digest IN"
                    f" (SELECT a.digest FROM execution_artifacts a WHERE {unreferenced})", tuple(digests))
        report.batches += 1
        after = digests[-1]


def _prune_orphans(p: _Pass, root: Path, cutoff: int) -> None:
    """Output directories under ``ROOT/runs`` with no run row, last changed before ``cutoff``."""
    report = p.report
    base = root / "runs"
    try:
        entries = [e for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return
    except OSError as exc:
        report.file_errors.append(f"{base}: {exc}")
        return
    old = [e for e in entries if e.stat(follow_symlinks=False).st_mtime * 1000 < cutoff]
    for start in range(0, len(old), p.batch):
        chunk = old[start:start + p.batch]
        marks = ", ".join("?" for _ in chunk)
        with p.store.read() as tx:
            known = {r["id"] for r in tx.all(f"SELECT id FROM runs WHERE id IN ({marks})", tuple(e.name for e in chunk))}
        for entry in chunk:
            if entry.name in known:
                continue
            if report.dry_run or _remove_dir(Path(entry.path), report):
                report.orphans.append(entry.name)


def prune(store: Any, rules: Rules, *, job_id: str | None = None, dry_run: bool = False, artifacts_root: Path | None = None,
          lease: Any = None, actor: str | None = None, now: int | None = None, min_interval_ms: int | None = None,
          stop: threading.Event | None = None) -> PruneReport:
    """Apply ``rules`` in one pass of bounded batches; the report (see the module docstring).

    ``job_id`` restricts the pass to that job's runs (no outbox, events, artifacts or
    orphans). ``lease`` fences every batch (the dispatcher's duty); ``min_interval_ms``
    raises ``PassNotDue`` when the newest recorded pass is younger than that.
    """
    at = now_ms() if now is None else now
    who = actor or os_identity()
    age = rules.max_age_flag_ms if rules.max_age_flag_ms is not None else rules.max_age_ms
    report = PruneReport(cutoff=None if age is None else at - age, job_id=job_id, dry_run=dry_run, rules=rules.to_json())
    p = _Pass(store, report, lease=lease, batch=rules.batch, stop=stop)
    _begin(p, rules, at, who, min_interval_ms)
    _prune_runs(p, rules, at, artifacts_root)
    if job_id is None:
        if rules.delivered_outbox_age_ms is not None:
            _prune_outbox(p, at - rules.delivered_outbox_age_ms)
        _prune_events(p)
        _prune_artifacts(p, at - rules.orphan_grace_ms)
        if artifacts_root is not None:
            _prune_orphans(p, artifacts_root, at - rules.orphan_grace_ms)
    if report.total and not dry_run:
        with p.tx() as tx:
            append_event(tx, EVENT_KIND, job_id=job_id, actor=who, data={
                "cutoff": report.cutoff,
                "job_id": job_id,
                "rules": report.rules,
                "counts": report.counts(),
                "events_before": report.events_before,
                "pruned": len(report.pruned),
                "tombstoned": report.tombstoned[:EVENT_IDS],
                "evidence_deleted": report.evidence_deleted[:EVENT_IDS],
                "skipped": len(report.skipped),
                "run_ids": report.pruned[:EVENT_IDS],
                "orphans": report.orphans[:EVENT_IDS],
            })
    return report


def prune_runs(store: Any, *, older_than_ms: int | None = None, keep: int | None = None, job_id: str | None = None,
               dry_run: bool = False, artifacts_root: Path | None = None, actor: str | None = None,
               now: int | None = None) -> PruneReport:
    """``runs prune``: one pass with the settings file's rules, ``older_than_ms`` and ``keep`` winning over them.

    ``INVALID_DURATION`` / ``INVALID_ARGUMENT`` for a non-positive flag; ``RETENTION_NOT_CONFIGURED``
    when neither flags, nor settings, nor (with ``job_id``) the job name any rule for runs.
    """
    if older_than_ms is not None and older_than_ms <= 0:
        raise SchedulerError("INVALID_DURATION", "--older-than must be positive")
    if keep is not None and keep < 1:
        raise SchedulerError("INVALID_ARGUMENT", "--keep must be at least 1")
    rules = settings_rules(keep_runs=keep, older_than_ms=older_than_ms)
    if not rules.has_global_run_rule:
        with store.read() as tx:
            sql = "SELECT COUNT(*) FROM jobs WHERE retention IS NOT NULL" + (" AND id = ?" if job_id else "")
            declared = tx.scalar(sql, (job_id,) if job_id else ())
        if not declared and rules.delivered_outbox_age_ms is None and rules.event_age_ms is None:
            raise SchedulerError("RETENTION_NOT_CONFIGURED",
                                 "nothing says what to prune: give --older-than and/or --keep, or set [retention] rules"
                                 " in the settings file or a job's retention field")
    return prune(store, rules, job_id=job_id, dry_run=dry_run, artifacts_root=artifacts_root, actor=actor, now=now)
