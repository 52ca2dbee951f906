"""``runs evidence --all [--since T]``: re-verify the evidence of many runs and summarise.

Every run that has an evidence record, or whose row says it should have one
(``runs.evidence_status`` set), is re-verified with ``scheduler.evidence.verify.verify_run``
(history alone: the run's own artifact, its output files, its envelope through its
provider). The summary counts

* ``checked``: runs looked at;
* ``verified``: evidence that re-verified;
* ``invalid``: by code, evidence that did not (tampering, a missing provider, a stale
  artifact, ...); any of these makes the command exit non-zero (``EVIDENCE_CHECK_FAILED``);
* ``missing``: runs that should have evidence and have no record (``EVIDENCE_RECORD_MISSING``),
  also a failure;
* ``unattested``: records that say themselves the attestation did not happen (status
  ``failed`` or ``interrupted``, code ``EVIDENCE_NOT_VERIFIED``): the run's recorded outcome,
  not an integrity failure, so they are counted but do not fail the command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import parse_duration_ms, parse_iso, to_iso
from scheduler.evidence.verify import verify_run

#: Codes that are not integrity failures (see the module docstring).
UNATTESTED = "EVIDENCE_NOT_VERIFIED"
MISSING = "EVIDENCE_RECORD_MISSING"
#: How many individual failures the summary lists (the counts are always complete).
MAX_LISTED = 100


@attrs.define
class BatchSummary:
    """The outcome of re-verifying many runs."""

    since: int | None
    checked: int = 0
    verified: int = 0
    missing: int = 0
    unattested: int = 0
    invalid: dict[str, int] = attrs.Factory(dict)
    failures: list[dict[str, Any]] = attrs.Factory(list)

    @property
    def invalid_total(self) -> int:
        """How many runs' evidence is invalid (all codes)."""
        return sum(self.invalid.values())

    @property
    def ok(self) -> bool:
        """True when nothing is invalid or missing."""
        return self.invalid_total == 0 and self.missing == 0

    def add(self, run_id: str, check: Any) -> None:
        """Count one ``EvidenceCheck``."""
        self.checked += 1
        if check.verified:
            self.verified += 1
            return
        code = check.code or "EVIDENCE_VERIFICATION_FAILED"
        if code == UNATTESTED:
            self.unattested += 1
            return
        if code == MISSING:
            self.missing += 1
        else:
            self.invalid[code] = self.invalid.get(code, 0) + 1
        if len(self.failures) < MAX_LISTED:
            self.failures.append({"run_id": run_id, "code": code, "message": check.message})

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON (``invalid`` by code)."""
        return {"since": to_iso(self.since) if self.since is not None else None, "checked": self.checked,
                "verified": self.verified, "invalid": dict(sorted(self.invalid.items())), "invalid_total": self.invalid_total,
                "missing": self.missing, "unattested": self.unattested, "failures": self.failures}


def parse_since(text: str, *, now: int) -> int:
    """``--since``: an ISO-8601 instant, or a duration (``7d``, ``12h``) meaning that long before ``now``."""
    try:
        return now - parse_duration_ms(text, field="--since")
    except SchedulerError:
        pass
    try:
        return parse_iso(text, field="--since")
    except SchedulerError:
        raise SchedulerError("INVALID_TIME", f"--since: {text!r} is neither an ISO-8601 instant nor a duration such as 7d") from None


def run_ids(store: Any, since: int | None) -> list[str]:
    """Every run id with an evidence record (created since ``since``) or that should have one, oldest first."""
    where_record = "" if since is None else " WHERE created_at >= ?"
    where_run = "" if since is None else " AND COALESCE(finished_at, created_at) >= ?"
    params: tuple[Any, ...] = () if since is None else (since,)
    with store.read() as tx:
        records = tx.all(f"SELECT run_id, created_at FROM evidence_records{where_record}", params)
        runs = tx.all(f"SELECT id, COALESCE(finished_at, created_at) AS at FROM runs WHERE evidence_status IS NOT NULL{where_run}",
                      params)
    order: dict[str, int] = {}
    for row in records:
        order[row["run_id"]] = int(row["created_at"])
    for row in runs:
        order.setdefault(row["id"], int(row["at"] or 0))
    return sorted(order, key=lambda rid: (order[rid], rid))


def verify_all(store: Any, *, since: int | None = None, artifacts_root: Path | None = None,
               progress: Callable[[list[str]], Any] | None = None) -> BatchSummary:
    """Re-verify every selected run's evidence; ``progress(ids)`` may wrap the iteration (a progress bar)."""
    summary = BatchSummary(since=since)
    ids = run_ids(store, since)
    iterator = progress(ids) if progress is not None else None
    with (iterator if iterator is not None else _Plain(ids)) as items:
        for run_id in items:
            try:
                check = verify_run(store, run_id, artifacts_root=artifacts_root)
            except SchedulerError as exc:  # the run vanished between listing and checking (pruned meanwhile)
                check = _Failed(exc.code, exc.message)
            summary.add(run_id, check)
    return summary


@attrs.frozen
class _Failed:
    code: str
    message: str
    verified: bool = False


class _Plain:
    """A context manager yielding the ids as they are (no progress bar)."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def __enter__(self) -> list[str]:
        return self.ids

    def __exit__(self, *exc: object) -> None:
        return None
