"""Job storage: create (one or all-or-nothing many), read, update, enable/disable/pause, delete, chain tree, state.

Every write happens in one store transaction with its runtime event, and every
job leaves here with a stored ``next_run_at`` computed from its schedule: a
missing next run never means "fire now". Disable, delete and update cancel the
job's pending work through ``transitions.cancel_pending_work`` (auto-pause and
``jobs cancel`` use the same function); observers installed in this process hear
of waiting runs cancelled that way once the transaction committed.

Rows leave here as ``JobRow`` (built once at the read); JSON views (``job_to_json``,
``job_tree``) are ``JSONObject`` documents, and columns written go as ``dict[str, SQLValue]``.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import TYPE_CHECKING

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core import state, submissions
from scheduler.core.artifact import check_job, native_payload, put_artifact
from scheduler.core.events import append_event, os_identity
from scheduler.core.id_refs import ids_with_end
from scheduler.core.rows import JobRow
from scheduler.core.run_as import stamp_adder
from scheduler.core.schedules import next_fire
from scheduler.core.spec import (
    JSON_KINDS,
    SPEC_FIELD_NAMES,
    SPEC_FIELDS,
    JobSpec,
    spec_from_row,
    spec_to_input,
    spec_to_row,
    validate_spec,
)
from scheduler.core.store.base import Store, Tx
from scheduler.core.tombstones import tombstone_job_runs
from scheduler.core.transitions import cancel_pending_work, committing
from scheduler.settings import current_settings

if TYPE_CHECKING:
    from scheduler.core.observers import Observers
    from scheduler.core.rows import JSONObject, SQLValue
    from scheduler.core.submissions import Submission

#: A job id: what ``uuid4`` gives, or what a handoff v4 artifact was compiled for.
_JOB_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: Longest chain from a root job to a descendant.
MAX_CHAIN_DEPTH = 10
#: Most direct children a job may trigger.
MAX_CHAIN_FANOUT = 20

_SCHEDULE_FIELDS = frozenset(
    {"schedule_kind", "schedule_cron", "schedule_every", "schedule_at", "schedule_tz", "dst_gap_policy", "dst_fold_policy"}
)
_TIME_COLUMNS = ("schedule_at", "created_at", "updated_at", "next_run_at", "schedule_anchor_at", "last_run_at", "paused_at")


def initial_schedule(spec: JobSpec, now: int) -> tuple[int | None, int | None]:
    """``(next_run_at, schedule_anchor_at)`` for a job (re)starting its schedule at ``now``."""
    kind = spec.schedule_kind
    if kind == "at":
        return spec.schedule_at, None
    if kind in ("manual", "chain"):
        return None, None
    schedule = spec.schedule()
    if kind == "every" and schedule.every_ms is not None:  # (an every schedule always has its period)
        return next_fire(schedule, now, anchor_ms=now + schedule.every_ms), now
    return next_fire(schedule, now), None


def repair_missing_next_runs(store: Store, *, now: int | None = None, limit: int = 500) -> int:
    """Recompute and store the next run of recurring jobs that have none.

    A missing next run never means "fire now": it is computed from the schedule
    (from now, so nothing fires for the gap) and stored, with an event.
    """
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        rows = [JobRow.from_row(r) for r in tx.all(
            "SELECT * FROM jobs WHERE enabled = 1 AND next_run_at IS NULL AND schedule_kind IN ('cron', 'every') LIMIT ?", (limit,)
        )]
        for row in rows:
            next_run, anchor = initial_schedule(spec_from_row(row), now)
            state.execute(tx, "repair_next_run", job_id=row.id, next_run_at=next_run, schedule_anchor_at=anchor, now=now)
            append_event(tx, "job.next_run_repaired", job_id=row.id, at=now, data={"next_run_at": next_run})
    return len(rows)


#: The shortest piece of a job id (its start or its end) that ``resolve_job`` accepts, and that ``short_job_ids`` shows.
JOB_REF_MIN = 8


def resolve_job(tx: Tx, ref: str) -> JobRow:
    """A job row by id, by name, or by a unique prefix or suffix of its id of at least ``JOB_REF_MIN`` characters.

    The id pieces are what ``jobs list`` shows (``short_job_ids``): a uuid's first characters,
    an imported job's distinguishing end. A piece two jobs share is ``INVALID_ARGUMENT``
    (never the first of them); nothing matching is ``NOT_FOUND``.
    """
    row = tx.one("SELECT * FROM jobs WHERE id = ?", (ref,)) or tx.one("SELECT * FROM jobs WHERE name = ?", (ref,))
    if row is None and len(ref) >= JOB_REF_MIN:
        matches = ids_with_end(tx, "jobs", ref)
        if len(matches) > 1:
            raise SchedulerError("INVALID_ARGUMENT", f"job id prefix or suffix {ref!r} is ambiguous: give more of the id, or the name")
        row = tx.one("SELECT * FROM jobs WHERE id = ?", (matches[0],)) if matches else None
    if row is None:
        raise SchedulerError("NOT_FOUND", f"Job not found: {ref}")
    return JobRow.from_row(row)


def short_job_ids(tx: Tx) -> dict[str, str]:
    """Each job's id as ``jobs list`` shows it: the shortest start or end of at least ``JOB_REF_MIN`` characters
    that ``resolve_job`` takes back to this job alone (``unique_id_pieces``; no other job's name either)."""
    rows = tx.all("SELECT id, name FROM jobs")
    return unique_id_pieces([r["id"] for r in rows], minimum=JOB_REF_MIN, reserved={r["name"] for r in rows})


def unique_id_pieces(ids: list[str], *, minimum: int, reserved: set[str] | frozenset[str] = frozenset()) -> dict[str, str]:
    """For each of ``ids``, its shortest prefix or suffix (at least ``minimum`` long, a prefix on a tie) that is the
    start or end of no other id and is not in ``reserved``; the whole id when there is none.

    Why both ends: uuids differ at once (the first 8 characters, as ever), imported ids share
    their source's prefix (``openclaw-cron:...``) and time-ordered ids share their start, so
    their end tells them apart. Sorted neighbours give each id's shortest unique prefix (and,
    reversed, suffix) in O(n log n); a candidate is then checked against the other end.
    """
    unique = set(ids)
    starts, ends = _unique_lengths(unique), {s[::-1]: n for s, n in _unique_lengths({s[::-1] for s in unique}).items()}
    by_len: dict[tuple[str, int], dict[str, int]] = {}

    def count(side: str, k: int) -> dict[str, int]:
        """How many ids start (or end) with each ``k``-character piece."""
        key = (side, k)
        if key not in by_len:
            counts: dict[str, int] = {}
            for s in unique:
                if len(s) >= k:
                    piece = s[:k] if side == "start" else s[-k:]
                    counts[piece] = counts.get(piece, 0) + 1
            by_len[key] = counts
        return by_len[key]

    def first_free(s: str, k: int, side: str) -> str | None:
        """The shortest piece from length ``k`` on that no other id has at its other end, nor a name is."""
        other = "end" if side == "start" else "start"
        for n in range(max(k, minimum), len(s)):
            piece = s[:n] if side == "start" else s[-n:]
            own = (s.endswith(piece) if side == "start" else s.startswith(piece))
            if count(other, n).get(piece, 0) - own == 0 and piece not in reserved:
                return piece
        return None

    out: dict[str, str] = {}
    for s in unique:
        candidates = [p for p in (first_free(s, starts[s], "start"), first_free(s, ends[s], "end")) if p is not None]
        out[s] = min(candidates, key=len) if candidates else s
    return out


def _unique_lengths(ids: set[str]) -> dict[str, int]:
    """Each id's shortest prefix length no other id shares (past its length when it is another's prefix)."""
    order = sorted(ids)
    out: dict[str, int] = {}
    for i, s in enumerate(order):
        need = 1
        for j in (i - 1, i + 1):
            if 0 <= j < len(order):
                other, common = order[j], 0
                while common < min(len(s), len(other)) and s[common] == other[common]:
                    common += 1
                need = max(need, common + 1)
        out[s] = need
    return out


def _read_job(tx: Tx, job_id: str) -> JobRow:
    """The stored row of job ``job_id``, which this transaction has just written."""
    row = tx.one("SELECT * FROM jobs WHERE id = ?", (job_id,))
    if row is None:  # (only if the job went in this very transaction, which no caller does)
        raise SchedulerError("NOT_FOUND", f"Job not found: {job_id}")
    return JobRow.from_row(row)


def _insert(tx: Tx, spec: JobSpec, now: int, parent_id: str | None, submission: Submission | None = None,
            job_id: str | None = None) -> JobRow:
    if tx.one("SELECT id FROM jobs WHERE name = ?", (spec.name,)):
        raise SchedulerError("NAME_CONFLICT", f"a job named {spec.name!r} already exists")
    spec = stamp_adder(spec)  # a job naming executor_options.user records (and must be allowed for) its adder
    row = spec_to_row(spec)
    row["parent_id"] = parent_id
    next_run, anchor = initial_schedule(spec, now)
    if job_id is not None and not _JOB_ID_RE.fullmatch(job_id):
        raise SchedulerError("INVALID_ARGUMENT", f"job id {job_id!r} must be 1-128 characters of [A-Za-z0-9_.:-]")
    explicit = submission is not None or job_id is not None
    job_id = _submitted_job_id(submission) if submission is not None else job_id or str(uuid.uuid4())
    if explicit and tx.one("SELECT id FROM jobs WHERE id = ?", (job_id,)):
        why = " (the artifact's compiled.job_id)" if submission is not None else ""
        raise SchedulerError("JOB_ID_CONFLICT", f"a job with id {job_id!r}{why} already exists")
    row.update(id=job_id, created_at=now, updated_at=now, next_run_at=next_run, schedule_anchor_at=anchor)
    row.update(_bind_artifact(tx, spec, job_id, submission, now))
    state.execute(tx, "insert_job", **row)
    append_event(tx, "job.created", job_id=job_id, actor=os_identity(), data={"name": spec.name}, at=now)
    return _read_job(tx, job_id)


def _submitted_job_id(submission: Submission) -> str:
    """The job id a handoff v4 artifact was compiled for (``compiled.job_id``)."""
    compiled = submission.payload.get("compiled") if isinstance(submission.payload, dict) else None
    job_id = compiled.get("job_id") if isinstance(compiled, dict) else None
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise SchedulerError("HANDOFF_ARTIFACT_INVALID", "compiled.job_id must be 1-128 characters of [A-Za-z0-9_.:-]",
                             details=[{"field": "compiled.job_id", "code": "HANDOFF_ARTIFACT_INVALID", "error": "invalid job id"}])
    return job_id


def _bind_artifact(tx: Tx, spec: JobSpec, job_id: str, submission: Submission | None, now: int) -> dict[str, SQLValue]:
    """Store the job's execution artifact (native, or the submitted handoff v4 one once it agrees exactly).

    Returns the job columns that record the binding. Nothing is stored when a v4 artifact is refused.
    """
    if submission is None:
        digest = put_artifact(tx, native_payload(spec, job_id), kind="native", job_id=job_id, now=now)
        return {"artifact_digest": digest, "handoff_version": None, "effective_task_hash": None}
    digest = submission.verify(spec, job_id=job_id)
    put_artifact(tx, submission.payload, kind=f"handoff-v{submission.version}", job_id=job_id, now=now)
    return {"artifact_digest": digest, "handoff_version": submission.version, "effective_task_hash": submission.effective_task_hash}


def _check_chain(tx: Tx, job_id: str | None, parent_id: str) -> None:
    """Refuse cycles, chains deeper than ``MAX_CHAIN_DEPTH`` and fan-out above ``MAX_CHAIN_FANOUT``."""
    depth, seen = 1, set()
    cursor: str | None = parent_id
    while cursor is not None:
        if cursor == job_id or cursor in seen:
            raise SchedulerError("CHAIN_CYCLE", "parent_id would create a cycle in the job chain")
        seen.add(cursor)
        row = tx.one("SELECT parent_id FROM jobs WHERE id = ?", (cursor,))
        cursor = row["parent_id"] if row else None
        depth += 1
    if job_id is not None:
        depth += _subtree_depth(tx, job_id)
    if depth - 1 > MAX_CHAIN_DEPTH:
        raise SchedulerError("CHAIN_TOO_DEEP", f"chains are limited to depth {MAX_CHAIN_DEPTH}")
    children = tx.scalar("SELECT COUNT(*) FROM jobs WHERE parent_id = ? AND id <> ?", (parent_id, job_id or ""))
    if children >= MAX_CHAIN_FANOUT:
        raise SchedulerError("CHAIN_FANOUT_EXCEEDED", f"a job may trigger at most {MAX_CHAIN_FANOUT} children")


def _subtree_depth(tx: Tx, job_id: str) -> int:
    level, frontier = 0, [job_id]
    while frontier and level <= MAX_CHAIN_DEPTH + 1:
        marks = ", ".join("?" for _ in frontier)
        frontier = [r["id"] for r in tx.all(f"SELECT id FROM jobs WHERE parent_id IN ({marks})", frontier)]
        if frontier:
            level += 1
    return level


def check_job_cap(tx: Tx, *, adding: int = 0) -> None:
    """``JOB_LIMIT_REACHED`` when the stored jobs plus ``adding`` would pass ``[jobs] max_jobs`` (unset or 0: no cap).

    Called in the transaction that inserts the jobs, so nothing of a refused change is
    stored. It first locks the newest ``schema_migrations`` row (``Tx.for_update``): every
    transaction adding jobs under a cap takes that one lock, so on PostgreSQL (READ
    COMMITTED) a concurrent add waits and then counts the other's committed jobs, and two
    adds can never both see room for one; SQLite's write transaction is exclusive already.
    """
    cap = current_settings().jobs.max_jobs
    if not cap:
        return
    tx.one("SELECT version FROM schema_migrations ORDER BY version DESC LIMIT 1" + tx.for_update)
    total = int(tx.scalar("SELECT COUNT(*) FROM jobs") or 0) + adding
    if total > cap:
        raise SchedulerError("JOB_LIMIT_REACHED", f"the change would leave {total} jobs; [jobs] max_jobs is {cap}",
                             details={"max_jobs": cap, "jobs": total})


def create_jobs(store: Store, specs: list[JobSpec], *, now: int | None = None,
                submissions: list[Submission | None] | None = None,
                job_ids: list[str | None] | None = None, check_cap: bool = True) -> list[JobRow]:
    """Insert jobs all-or-nothing in one transaction; a chain parent may be named earlier in the batch.

    Each job gets its execution artifact first (``submissions[i]``, a handoff v4 artifact
    submitted with spec ``i``, is accepted only when it agrees exactly with that spec).
    ``job_ids[i]`` gives spec ``i`` a chosen id instead of a random one (an importer's
    ``openclaw-cron:<id>``, so a second import recognises it); ``JOB_ID_CONFLICT`` if taken.
    The batch is refused whole past ``[jobs] max_jobs`` (``check_job_cap``); a caller that
    also deletes jobs in its transaction (``apply --prune delete``) passes ``check_cap=False``
    and checks once at its end instead.
    """
    now = now_ms() if now is None else now
    created: list[JobRow] = []
    subs = submissions or [None] * len(specs)
    ids = job_ids or [None] * len(specs)
    with store.transaction() as tx:
        if check_cap:
            check_job_cap(tx, adding=len(specs))
        for spec, submission in zip(specs, subs, strict=True):
            parent_id = None
            if spec.parent_id is not None:
                parent_id = resolve_job(tx, spec.parent_id).id
                _check_chain(tx, None, parent_id)
            created.append(_insert(tx, spec, now, parent_id, submission, ids[len(created)]))
    store.notify_change()
    return created


def list_jobs(tx: Tx, *, enabled: bool | None = None, state: str | None = None, limit: int | None = None) -> list[JobRow]:
    """Jobs ordered by name: only those with the ``enabled`` flag given, only those in ``state`` (``job_state``)."""
    check_job_state(state)
    sql, where = "SELECT * FROM jobs", []
    params: list[SQLValue] = []
    if enabled is not None:
        where.append("enabled = ?")
        params.append(int(enabled))
    if state is not None:
        where.append(f"{JOB_STATE_SQL} = ?")
        params.append(state)
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY name"
    if limit:
        sql += " LIMIT ?"
        params.append(limit)
    return [JobRow.from_row(r) for r in tx.all(sql, params)]


def update_job(store: Store, ref: str, patch: JSONObject, *, now: int | None = None, hooks: Observers | None = None) -> JobRow:
    """Apply a partial spec (``null`` resets a field to its default), revalidate, recompute the schedule.

    A change of the job's execution contract binds a new artifact (the old one is kept) and,
    in the same transaction, cancels the pending work bound to the superseded one; so does
    a schedule change (queued slots belong to the old schedule). Other changes (name,
    description, limits on failures) leave queued work alone. A handoff v4 job changes its
    bound fields only with a replacement artifact in the patch (``HANDOFF_ARTIFACT_REQUIRED``)
    and never goes back to a native artifact (``HANDOFF_ARTIFACT_DOWNGRADE_REFUSED``).
    """
    if not isinstance(patch, dict):
        raise SchedulerError("VALIDATION_FAILED", "an update must be a JSON object of spec fields", details=[
            {"field": "", "code": "INVALID_TYPE", "error": "expected an object"}
        ])
    now = now_ms() if now is None else now
    with committing(store, hooks) as tx:
        row = resolve_job(tx, ref)
        bound = row.handoff_version is not None
        kind = submissions.bound_kind(row) if bound else submissions.installed()
        submission = None
        if kind is not None:
            if bound and any(key in patch and patch[key] is None for key in kind.fields):
                raise SchedulerError("HANDOFF_ARTIFACT_DOWNGRADE_REFUSED",
                                     f"job {row.name!r} is bound to a handoff v{kind.version} artifact; it cannot drop it")
            patch, submission = kind.split(patch)
        old = spec_from_row(row)
        merged = spec_to_input(old)
        merged["parent_id"] = row.parent_id
        for key, value in patch.items():
            if value is None and key in merged and key in SPEC_FIELD_NAMES:
                del merged[key]
            else:
                merged[key] = value
        spec = stamp_adder(validate_spec(merged, now=now, check_past="schedule_at" in patch))
        parent_id = None
        if spec.parent_id is not None:
            parent_id = resolve_job(tx, spec.parent_id).id
            if parent_id != row.parent_id:
                _check_chain(tx, row.id, parent_id)
        if spec.name != old.name and tx.one("SELECT id FROM jobs WHERE name = ? AND id <> ?", (spec.name, row.id)):
            raise SchedulerError("NAME_CONFLICT", f"a job named {spec.name!r} already exists")
        values = spec_to_row(spec)
        values["parent_id"] = parent_id
        values["updated_at"] = now
        values.update(_rebind_artifact(tx, row, old, spec, submission, now))
        changed = sorted(k for k in SPEC_FIELD_NAMES if getattr(old, k) != getattr(spec, k))
        schedule_changed = bool(_SCHEDULE_FIELDS & set(changed))
        if schedule_changed:
            values["next_run_at"], values["schedule_anchor_at"] = initial_schedule(spec, now)
        rebound = "handoff_version" in values  # a binding kept as it was leaves the handoff columns alone
        state.execute(tx, "update_job", id=row.id, set_handoff=1 if rebound else 0,
                      set_schedule=1 if schedule_changed else 0, handoff_version=values.pop("handoff_version", None),
                      effective_task_hash=values.pop("effective_task_hash", None),
                      next_run_at=values.pop("next_run_at", None), schedule_anchor_at=values.pop("schedule_anchor_at", None),
                      **values)
        superseded = values["artifact_digest"] != row.artifact_digest
        if superseded:
            append_event(tx, "job.artifact_superseded", job_id=row.id, actor=os_identity(), at=now,
                         data={"previous": row.artifact_digest, "current": values["artifact_digest"]})
        if superseded or schedule_changed:
            reason = "job updated: execution contract changed" if superseded else "job updated: schedule changed"
            # Work queued for the superseded contract goes, manual requests included; a schedule change
            # drops the slots of the old schedule but keeps what an operator asked for by hand.
            cancel_pending_work(tx, row.id, reason=reason, now=now, actor=os_identity(), include_manual=superseded)
        append_event(tx, "job.updated", job_id=row.id, actor=os_identity(), data={"changed": changed}, at=now)
        out = _read_job(tx, row.id)
    store.notify_change()
    return out


def _rebind_artifact(tx: Tx, row: JobRow, old: JobSpec, spec: JobSpec, submission: Submission | None,
                     now: int) -> dict[str, SQLValue]:
    """The artifact columns of an updated job: unchanged, a new native artifact, or a replacement v4 artifact."""
    if submission is not None:  # verified against this job's id: an artifact compiled for another job is refused
        return _bind_artifact(tx, spec, row.id, submission, now)
    if row.handoff_version is not None:
        kind = submissions.bound_kind(row)
        if kind.binding_digest(spec) != kind.binding_digest(old):
            raise SchedulerError("HANDOFF_ARTIFACT_REQUIRED", f"job {row.name!r} is bound to a handoff v{kind.version} artifact:"
                                 " changing its bound fields needs a replacement artifact in the same update")
        return {"artifact_digest": row.artifact_digest}
    return _bind_artifact(tx, spec, row.id, None, now)


def set_enabled(store: Store, ref: str, enabled: bool, *, now: int | None = None, hooks: Observers | None = None) -> JobRow:
    """Enable (clears an auto-pause, recomputes the next run from now) or disable (cancels pending work)."""
    now = now_ms() if now is None else now
    with committing(store, hooks) as tx:
        row = resolve_job(tx, ref)
        if enabled:
            check_job(tx, row)  # re-enabling needs the job to match its artifact exactly (disabling never rewrites it)
            next_run, anchor = initial_schedule(spec_from_row(row), now)
            if row.schedule_kind == "at" and (row.last_run_at is not None or row.next_run_at is None):
                next_run = None  # a one-shot that already ran, or took its slot (here or where it was exported), stays done
            state.execute(tx, "enable_job", job_id=row.id, next_run_at=next_run, schedule_anchor_at=anchor, now=now)
        else:
            state.execute(tx, "disable_job", job_id=row.id, now=now)
            cancel_pending_work(tx, row.id, reason="job disabled", now=now, actor=os_identity())
        append_event(tx, "job.enabled" if enabled else "job.disabled", job_id=row.id, actor=os_identity(), at=now)
        out = _read_job(tx, row.id)
    store.notify_change()
    return out


def pause_job(store: Store, ref: str, *, now: int | None = None, hooks: Observers | None = None) -> JobRow:
    """Pause a job for an operator (``jobs pause``): what disabling does, shown as ``paused``.

    Nothing fires, its pending work is cancelled (as ``jobs disable``), and the row keeps
    ``paused_at`` with no reason, which ``job_state`` reads as the operator's pause (the
    scheduler's own pauses always give one). ``set_enabled(True)`` (``resume``/``enable``) lifts it.
    """
    now = now_ms() if now is None else now
    with committing(store, hooks) as tx:
        row = resolve_job(tx, ref)
        state.execute(tx, "pause_job", job_id=row.id, now=now)
        cancel_pending_work(tx, row.id, reason="job paused", now=now, actor=os_identity())
        append_event(tx, "job.paused", job_id=row.id, actor=os_identity(), at=now)
        out = _read_job(tx, row.id)
    store.notify_change()
    return out


def delete_job(store: Store, ref: str, *, cascade: bool = False, now: int | None = None,
               hooks: Observers | None = None) -> JobRow:
    """Delete a job (and its runs and queue rows); refuse while it has chain children unless ``cascade``.

    Its pending work is cancelled first (events and observers see it end) before the rows go.
    Its audit trail stays: its approvals (open ones now ``cancelled``), a tombstone for each of
    its runs, and their evidence per its retention (``scheduler.core.tombstones``); the
    ``job.deleted`` event counts them.
    """
    now = now_ms() if now is None else now
    with committing(store, hooks) as tx:
        row = resolve_job(tx, ref)
        children = tx.scalar("SELECT COUNT(*) FROM jobs WHERE parent_id = ?", (row.id,))
        if children and not cascade:
            raise SchedulerError("JOB_HAS_CHILDREN", f"job {row.name!r} has {children} chained child job(s); use --cascade")
        active = tx.scalar("SELECT COUNT(*) FROM runs WHERE job_id = ? AND status = 'running'", (row.id,))
        if active:
            raise SchedulerError("JOB_ALREADY_RUNNING", f"job {row.name!r} is running; cancel it first")
        cancel_pending_work(tx, row.id, reason="job deleted", now=now, actor=os_identity(), include_manual=True)
        kept = tombstone_job_runs(tx, row.id, row.name, now=now)
        tx.execute("DELETE FROM jobs WHERE id = ?", (row.id,))
        append_event(tx, "job.deleted", job_id=row.id, actor=os_identity(), at=now, data={
            "name": row.name, "tombstones": kept.tombstones, "evidence_retained": kept.evidence_retained,
            "evidence_deleted": kept.evidence_deleted, "outbox": kept.outbox})
    store.notify_change()
    return row


def job_tree(tx: Tx, ref: str | None = None) -> list[JSONObject]:
    """Chains as nested ``{"id", "name", "trigger_on", "enabled", "state", "children": [...]}``, from one job or every root."""
    rows = [JobRow.from_row(r) for r in
            tx.all("SELECT id, name, parent_id, trigger_on, trigger_condition, enabled, schedule_kind, next_run_at, paused_at,"
                   " paused_reason FROM jobs ORDER BY name")]
    by_parent: dict[str | None, list[JobRow]] = {}
    for r in rows:
        by_parent.setdefault(r.parent_id, []).append(r)

    def build(r: JobRow, depth: int) -> JSONObject:
        kids = by_parent.get(r.id, []) if depth <= MAX_CHAIN_DEPTH else []
        return {
            "id": r.id,
            "name": r.name,
            "trigger_on": r.trigger_on,
            "trigger_condition": r.trigger_condition,
            "enabled": bool(r.enabled),
            "state": job_state(r),
            "children": [build(k, depth + 1) for k in kids],
        }

    if ref is not None:
        return [build(resolve_job(tx, ref), 0)]
    return [build(r, 0) for r in by_parent.get(None, [])]


#: The runtime columns ``job_to_json`` shows after the spec fields, in that order.
_RUNTIME_COLUMNS = ("next_run_at", "last_run_at", "last_status", "last_error", "last_duration_ms", "run_count",
                    "consecutive_failures", "paused_at", "paused_reason", "created_at", "updated_at", "schedule_anchor_at")


def job_to_json(row: JobRow) -> JSONObject:
    """JSON view of a job row: spec fields, runtime state, instants as ISO-8601 ``Z``.

    ``state`` is ``job_state``; ``next_run_at`` is null unless the job is ``enabled``: a paused,
    auto-paused, disabled or done job will not fire, and ``resume``/``enable`` recompute the next
    run from that moment, so a stored slot would only mislead.
    """
    out: JSONObject = {"id": row.id}
    for f in SPEC_FIELDS:
        val = getattr(row, f.name)
        if f.metadata["kind"] == "bool" and val is not None:
            val = bool(val)
        elif f.metadata["kind"] in JSON_KINDS and isinstance(val, str):
            val = json.loads(val)  # a JSON column (options, constraints, credentials, ...) as the value it holds
        out[f.name] = val
    out["artifact_digest"] = row.artifact_digest
    out["handoff_version"] = row.handoff_version
    if row.handoff_version == 4:
        out["effective_task_hash"] = row.effective_task_hash
    for key in _RUNTIME_COLUMNS:
        out[key] = getattr(row, key)
    for key in _TIME_COLUMNS:
        out[key] = to_iso(getattr(row, key))
    out["state"] = shown = job_state(row)
    if not will_fire(shown):
        out["next_run_at"] = None  # a job that will not fire has no next run (resuming recomputes it from then)
    return out


#: Every state a job can be in, as ``job_state`` derives it: the one vocabulary of the CLI, its JSON, the docs
#: and ``scheduler.api.ops`` (``docs/cli.md``, "Job states").
JOB_STATES = ("enabled", "paused", "auto-paused", "disabled", "done")

#: ``job_state`` as one SQL expression over a ``jobs`` row (both stores), for what must count or filter in SQL
#: (``status``, ``jobs list --state``); a test checks the two agree on every combination of the columns read.
JOB_STATE_SQL = (
    "(CASE WHEN jobs.schedule_kind = 'at' AND jobs.next_run_at IS NULL THEN 'done'"
    " WHEN jobs.enabled = 1 THEN 'enabled'"
    " WHEN jobs.paused_at IS NULL THEN 'disabled'"
    " WHEN jobs.paused_reason IS NULL THEN 'paused'"
    " ELSE 'auto-paused' END)"
)


def job_state(row: JobRow) -> str:
    """The job's state, derived from its row (nothing stores it): one of ``JOB_STATES``.

    ``done``: a one-shot (``at``) whose one slot has been taken (it ran, or was skipped as missed):
    no schedule is left, whatever the enabled flag says (``resume`` does not re-arm it; a new
    ``schedule_at`` does). ``enabled``: it fires on its schedule (manual and chain jobs have no next
    run and are enabled too). The others are not enabled: ``paused`` by an operator (``jobs pause``:
    ``paused_at`` with no reason), ``auto-paused`` by the scheduler (``paused_at`` with its reason:
    consecutive failures, a replayed proof, unproven credential cleanup), ``disabled`` (``jobs
    disable``, ``enabled: false`` in its spec, a watchdog's self-destruct). ``JOB_STATE_SQL`` is the
    same rule in SQL.
    """
    if row.schedule_kind == "at" and row.next_run_at is None:
        return "done"
    if row.enabled:
        return "enabled"
    if row.paused_at is None:
        return "disabled"
    return "paused" if row.paused_reason is None else "auto-paused"


def will_fire(state_name: str) -> bool:
    """Whether a job in this state fires on its schedule (only ``enabled`` does): what a shown next run means."""
    return state_name == "enabled"


def check_job_state(name: str | None) -> None:
    """``INVALID_ARGUMENT`` for a state no job has (an empty one too): the ``jobs list --state`` filter."""
    if name is not None and name not in JOB_STATES:
        raise SchedulerError("INVALID_ARGUMENT", f"unknown job state {name!r}; one of {', '.join(JOB_STATES)}",
                             details={"field": "state", "allowed": list(JOB_STATES)})
