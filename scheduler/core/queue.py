"""The durable dispatch queue: materialising due slots, manual runs, claiming and starting work.

Scheduled slots get deterministic ids (``job:kind:slot``), so materialising the
same slot twice, from two dispatchers or after a crash, inserts one row. Claiming
a dispatch and creating its run happen in one transaction under the claimer's
fence: there is never a claim without its run, or a run without its claim. The
status writes themselves (and their events and observer notifications) are
``scheduler.core.transitions``'; this module decides which ones happen.

Every due slot is accounted for. When more than one slot of a job is due at once
(the dispatcher was down, or stalled, for longer than the job's period) only the
latest can run on time; the earlier ones are recorded per ``misfire_policy``
(``coalesce``: one ``slot.misfire_coalesced`` event with the first and last slot and
the count; ``skip``: one ``skipped`` run), however short or long the gap.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Mapping, Sequence

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import new_run_id
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core import state, transitions
from scheduler.core.claimed import ClaimedRun
from scheduler.core.events import append_event, os_identity
from scheduler.core.jobs import job_state, resolve_job
from scheduler.core.lease import Lease, assert_live
from scheduler.core.rows import DispatchRow, JobRow, JSONObject, RunRow, SQLValue
from scheduler.core.schedules import Schedule, missed_slots, next_fire
from scheduler.core.spec import executor_name_of, spec_from_row
from scheduler.core.steps import Gate, Step, registered
from scheduler.core.store.base import Store, Tx
from scheduler.core.transitions import committing, insert_dispatch
from scheduler.settings import current_settings

#: How long a claim is valid before recovery may return it to pending (when no run is active).
CLAIM_TTL_MS = 60_000
#: Slots of one gap enumerated one by one. A longer cron gap is counted up to this many
#: (the count is then a lower bound, flagged ``exact: false``) and its last slot found from its end.
GAP_SCAN_LIMIT = 10_000
#: First window (ms) scanned back from now for the last slot of a very long cron gap.
_TAIL_WINDOW_MS = 3_600_000


def slot_dispatch_id(job_id: str, kind: str, slot_ms: int) -> str:
    """Deterministic id of a scheduled slot."""
    return f"{job_id}:{kind}:{slot_ms}"


def next_due(tx: Tx) -> int | None:
    """Earliest time anything is due: a job's next run, a pending dispatch, an approval's timeout (three index lookups)."""
    values = [v for v in next_due_parts(tx) if v is not None]
    return min(values) if values else None


def next_due_parts(tx: Tx) -> tuple[int | None, int | None, int | None]:
    """``(a job's next run, a pending dispatch, an approval's timeout)``, each the earliest or None (``next_due``'s parts).

    The dispatcher tells them apart: with every worker busy, due dispatches wait for a worker,
    while due jobs and approval timeouts still need a pass.
    """
    row = tx.one(_NEXT_DUE_SQL)
    assert row is not None  # a SELECT of three aggregates always returns its one row
    return row["jobs_due"], row["dispatch_due"], row["approval_due"]


#: ``next_due_parts``' three index lookups in one statement (the dispatcher runs it at the end of every pass).
_NEXT_DUE_SQL = ("SELECT (SELECT MIN(next_run_at) FROM jobs WHERE enabled = 1 AND next_run_at IS NOT NULL) AS jobs_due,"
                 " (SELECT MIN(due_at) FROM job_dispatch_queue WHERE status = 'pending') AS dispatch_due,"
                 " (SELECT MIN(expires_at) FROM approvals WHERE status = 'pending' AND expires_at IS NOT NULL) AS approval_due")


@attrs.frozen
class DueSlots:
    """The slots of one job due at once: ``first`` (its stored next run) up to ``last`` (the latest <= now)."""

    first: int
    last: int
    #: How many slots, ``first`` and ``last`` included (a lower bound when not ``exact``).
    count: int
    #: The slot before ``last`` (None when ``count`` is 1).
    before_last: int | None
    exact: bool = True

    def data(self, *, count: int | None = None, last: int | None = None) -> JSONObject:
        """The gap (or its first ``count`` slots, up to ``last``) as event data: first and last slot, count, exactness."""
        count = self.count if count is None else count
        last = self.last if last is None else last
        return {"missed": count, "first": self.first, "last": last, "first_at": to_iso(self.first), "last_at": to_iso(last),
                "exact": self.exact}


def due_slots(schedule: Schedule, first: int, now: int) -> DueSlots:
    """Every slot of ``schedule`` from ``first`` (a slot, <= ``now``) up to ``now``, without listing a long gap.

    ``every`` slots are counted arithmetically (any downtime costs nothing); cron slots are
    enumerated up to ``GAP_SCAN_LIMIT``, beyond which the last slot is found by scanning
    back from ``now``.
    """
    if schedule.kind == "every":
        every = schedule.every_ms
        assert every is not None  # an ``every`` schedule has its period (validated on construction)
        later = max(0, (now - first) // every)
        last = first + later * every
        return DueSlots(first, last, later + 1, last - every if later else None)
    later_slots = missed_slots(schedule, first, now, limit=GAP_SCAN_LIMIT)
    if len(later_slots) < GAP_SCAN_LIMIT:
        chain = [first, *later_slots]
        return DueSlots(first, chain[-1], len(chain), chain[-2] if len(chain) > 1 else None)
    before_last, last = _tail(schedule, later_slots[-2], later_slots[-1], now)
    return DueSlots(first, last, 1 + len(later_slots), before_last, exact=False)


def _tail(schedule: Schedule, known_prev: int, known: int, now: int) -> tuple[int, int]:
    """``(before_last, last)`` of a cron gap too long to enumerate, given two consecutive slots of it.

    Scans forward from ever earlier starting points (an hour before ``now``, then four
    times as far...) until the window holds two slots or reaches the known ones.
    """
    window = _TAIL_WINDOW_MS
    while True:
        start = max(known, now - window)
        last_two = _last_two(schedule, start, now)
        if start == known:
            chain = [known_prev, known, *last_two]
            return chain[-2], chain[-1]
        if len(last_two) == 2:
            return last_two[0], last_two[1]
        window *= 4


def _last_two(schedule: Schedule, after: int, to: int) -> list[int]:
    """The last (up to) two slots ``t`` with ``after < t <= to``, paging through the schedule."""
    out: list[int] = []
    cursor = after
    while True:
        page = missed_slots(schedule, cursor, to, limit=GAP_SCAN_LIMIT)
        if not page:
            return out
        out = (out + page)[-2:]
        cursor = page[-1]
        if len(page) < GAP_SCAN_LIMIT:
            return out


def materialize_due(store: Store, *, now: int | None = None, limit: int = 200) -> int:
    """Turn every due job slot into a dispatch row and advance the job's next run; account for every slot.

    When several slots of a job are due at once, the latest runs and the earlier ones are
    recorded per ``misfire_policy`` (see the module docstring). A gap whose first slot is
    more than ``[dispatcher] misfire_grace_ms`` old is a misfire: under ``skip`` none of
    its slots runs (one ``skipped`` run says how many); a one-shot reached that late is
    handled the same way.
    """
    now = now_ms() if now is None else now
    with committing(store) as tx:
        return materialize_due_in(tx, now=now, limit=limit)


def materialize_due_in(tx: Tx, *, now: int, limit: int = 200) -> int:
    """``materialize_due`` inside the caller's ``committing`` transaction (the dispatcher's pass); returns the slots created.

    The oldest due first, ``limit`` of them; when more are due than that, up to ``limit // 4`` of the
    newest due too, so a job due after a backlog's oldest is not queued behind all of it. A pass
    with no job due costs one indexed read, a backlog a second one.
    """
    created = 0
    # SKIP LOCKED (PostgreSQL): dispatchers materialise disjoint jobs instead of queueing behind each other. The
    # columns that tell a one-shot reached in time from the others, and all its batch writes need (``_DUE_COLUMNS``):
    # a whole jobs row is read only for the jobs that take the per-job path below.
    found = tx.all(_DUE_SQL + " ORDER BY next_run_at LIMIT ?" + tx.skip_locked, (now, limit))
    if not found:
        return 0
    if len(found) == limit:
        # A backlog (thousands of one-shots due at one instant): the jobs that fell due after its oldest are not queued
        # behind the whole of it, ``limit`` a pass; up to a quarter as many of the newest due go in this pass too (an
        # every-second job behind 4,000 overdue one-shots waited 20 passes, long enough on a loaded machine for its
        # slots to be coalesced as missed). The claim treats its candidates the same way (``claim_candidates``).
        found += tx.all(_DUE_SQL + " AND next_run_at > ? ORDER BY next_run_at DESC LIMIT ?" + tx.skip_locked,
                        (now, found[-1]["next_run_at"], max(1, limit // 4)))
    grace_ms = current_settings().dispatcher.misfire_grace_ms
    # One-shot jobs reached in time (the common bulk case) are materialised together: one UPDATE, one INSERT (a
    # single one too: the writes are the per-job path's for it, and its whole row is not read).
    on_time = [due for due in found if due["schedule_kind"] == "at" and now - (due["next_run_at"] or 0) <= grace_ms]
    if on_time:
        created += _materialize_one_shots(tx, on_time, now)
        batched_ids = {due["id"] for due in on_time}
        found = [due for due in found if due["id"] not in batched_ids]
    for job in _whole_rows(tx, [str(due["id"]) for due in found]):
        slot = job.next_run_at
        assert slot is not None  # selected on next_run_at IS NOT NULL
        kind = "at" if job.schedule_kind == "at" else "schedule"
        next_run, anchor = None, job.schedule_anchor_at
        due = DueSlots(slot, slot, 1, None)
        if job.schedule_kind in ("cron", "every"):
            spec = spec_from_row(job)
            schedule = spec.schedule()
            anchor_ms = slot if spec.schedule_kind == "every" else None
            next_run = next_fire(schedule, now, anchor_ms=anchor_ms)
            if spec.schedule_kind == "every":
                anchor = slot
            due = due_slots(schedule, slot, now)
        misfire = now - slot > grace_ms  # a misfire, not just a busy loop
        changed = state.execute(tx, "advance_next_run", job_id=job.id, slot=slot, next_run_at=next_run,
                                schedule_anchor_at=anchor, now=now)
        if changed != 1:
            continue  # another dispatcher advanced it first
        if job.misfire_policy == "skip":
            if misfire:  # none of the gap runs
                _record_gap_skip(tx, job, due, due.count, due.last, kind, now)
                continue
            if due.count > 1:  # the earlier slots were overtaken by the latest, which runs
                assert due.before_last is not None
                _record_gap_skip(tx, job, due, due.count - 1, due.before_last, kind, now)
        elif misfire or due.count > 1:
            append_event(tx, "slot.misfire_coalesced", job_id=job.id, at=now,
                         data={**due.data(), "not_run": due.count - 1, "run_slot": due.last})
        if insert_dispatch(tx, id=slot_dispatch_id(job.id, kind, due.last), job_id=job.id, kind=kind, due_at=due.last,
                           now=now):
            created += 1
    return created


#: What ``materialize_due_in`` reads of every due job: enough to batch a one-shot reached in time.
_DUE_COLUMNS = "id, schedule_kind, next_run_at, artifact_digest"
#: The due jobs ``materialize_due_in`` reads (``jobs_due_idx``), before its order and limit.
_DUE_SQL = (f"SELECT {_DUE_COLUMNS} FROM jobs WHERE enabled = 1 AND next_run_at IS NOT NULL AND next_run_at <= ?")


def _text(value: SQLValue) -> str | None:
    """A TEXT column's value (None stays None)."""
    return None if value is None else str(value)


def _whole_rows(tx: Tx, ids: list[str]) -> list[JobRow]:
    """The jobs rows of ``ids`` (read, and locked, by this transaction already), in the order of ``ids``."""
    if not ids:
        return []
    marks = ", ".join("?" * len(ids))
    by_id = {str(row["id"]): row for row in tx.all(f"SELECT * FROM jobs WHERE id IN ({marks})", ids)}
    return [JobRow.from_row(by_id[job_id]) for job_id in ids if job_id in by_id]


#: One-shot jobs per multi-row statement of ``_materialize_one_shots`` (12 parameters a dispatch row).
_ONE_SHOT_ROWS = 100


def _materialize_one_shots(tx: Tx, jobs: list[dict[str, SQLValue]], now: int) -> int:
    """``materialize_due`` for one-shot jobs due within the misfire grace: their single slot becomes a dispatch.

    What the per-job path does for them (next run cleared, one ``at`` dispatch bound to the
    job's artifact, idempotent on the slot's id), in one ``clear_next_runs`` ... RETURNING and one
    multi-row ``insert_dispatches`` per chunk. The rows were read in this transaction (SQLite: exclusive;
    PostgreSQL: locked), so their ``next_run_at`` is still the slot read; a job the UPDATE
    does not return is not materialised. ``jobs``: their ``_DUE_COLUMNS``. Returns how many dispatch rows were created.
    """
    created = 0
    for i in range(0, len(jobs), _ONE_SHOT_ROWS):
        chunk = jobs[i:i + _ONE_SHOT_ROWS]
        advanced = {r["id"] for r in state.rows(tx, "clear_next_runs", now=now, rows=[{"job_id": job["id"]} for job in chunk])}
        chunk = [job for job in chunk if job["id"] in advanced]
        if not chunk:
            continue
        created += len(state.rows(tx, "insert_dispatches", rows=[transitions.dispatch_row(
            id=slot_dispatch_id(str(job["id"]), "at", slot), job_id=str(job["id"]), kind="at", due_at=slot, now=now,
            artifact_digest=_text(job["artifact_digest"])) for job in chunk if isinstance(slot := job["next_run_at"], int)]))
    return created


def _record_gap_skip(tx: Tx, job: JobRow, due: DueSlots, count: int, slot_ms: int, kind: str, now: int) -> None:
    """One ``skipped`` run standing for ``count`` slots of a gap (the last of them is its ``scheduled_for``)."""
    more = "" if due.exact else "+"  # a cron gap too long to count: at least this many
    record_skip(tx, job, slot_ms=slot_ms, reason=f"misfire: {count}{more} slot(s) missed while down", now=now, dispatch_kind=kind,
                data=due.data(count=count, last=slot_ms))


def record_skip(tx: Tx, job: JobRow, *, slot_ms: int | None, reason: str, now: int, dispatch_id: str | None = None,
                dispatch_kind: str | None = None, data: JSONObject | None = None, replay_of_run_id: str | None = None) -> str:
    """A ``skipped`` run that says why a slot did not run (nothing is dropped silently); returns its id.

    ``replay_of_run_id``: set for a replay dispatch (a veto can still skip one), so the row keeps its lineage.
    """
    run_id = new_run_id()
    transitions.record_skipped(tx, job, run_id=run_id, slot_ms=slot_ms, reason=reason, now=now, dispatch_id=dispatch_id,
                               dispatch_kind=dispatch_kind, data=data, replay_of_run_id=replay_of_run_id)
    return run_id


def enqueue_manual(store: Store, ref: str, *, now: int | None = None) -> dict[str, SQLValue]:
    """``jobs run``: a manual dispatch due now (its id, job_id, kind, status and due_at, as the view ``jobs run`` prints).

    Refused for a disabled job or a running job under ``skip``.
    """
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        job = resolve_job(tx, ref)
        if not job.enabled:
            shown = job_state(job)
            lift = f"scheduler jobs enable {job.name}" if shown == "disabled" else f"scheduler jobs resume {job.name}"
            raise SchedulerError("JOB_DISABLED", f"job {job.name!r} is {shown}; {lift} first", details={"state": shown})
        running = active_runs(tx, job.id)
        if running and job.overlap_policy == "skip":
            raise SchedulerError("JOB_ALREADY_RUNNING", f"job {job.name!r} is running (or awaiting approval) and its overlap_policy is skip")
        dispatch_id = f"{job.id}:manual:{uuid.uuid4().hex}"
        insert_dispatch(tx, id=dispatch_id, job_id=job.id, kind="manual", due_at=now, now=now, requested_by=os_identity())
        append_event(tx, "dispatch.manual", job_id=job.id, dispatch_id=dispatch_id, actor=os_identity(), at=now)
        row = tx.one("SELECT id, job_id, kind, status, due_at FROM job_dispatch_queue WHERE id = ?", (dispatch_id,))
    store.notify_change()
    assert row is not None  # inserted above (or already there: the id is new) in this transaction
    return dict(row)


#: A claimed dispatch whose run row now exists in ``running`` under our fence: the claim builds the very ``ClaimedRun``
#: its worker gets (one object per run, not a copy per layer).
StartedRun = ClaimedRun


#: Dispatches a claim reads per free worker, oldest due first (a job's waiting slots are passed over among them).
CANDIDATES_PER_WORKER = 4
_CANDIDATE_SQL = ("SELECT id, job_id, kind, due_at, created_at, source_run_id, replay_count, artifact_digest, source_artifact_digest,"
                  " run_id FROM job_dispatch_queue WHERE status = 'pending' AND due_at <= ?")


#: Only a job's earliest pending dispatch may be taken from the newest: a job's newer slot never overtakes its own older
#: work (a replay waiting for the job's run to end, a queued slot), which would keep that job busy and its replay waiting.
_EARLIEST_OF_ITS_JOB = (" AND NOT EXISTS (SELECT 1 FROM job_dispatch_queue e WHERE e.job_id = job_dispatch_queue.job_id"
                        " AND e.status = 'pending' AND (e.due_at < job_dispatch_queue.due_at"
                        " OR (e.due_at = job_dispatch_queue.due_at AND e.id < job_dispatch_queue.id)))")


def claim_candidates(tx: Tx, *, now: int, limit: int, newest_first: bool = False) -> list[dict[str, SQLValue]]:
    """The due dispatches a claim of ``limit`` runs looks at, in the order it takes them.

    Normally every due dispatch, oldest first (``CANDIDATES_PER_WORKER`` x ``limit`` at most).
    When more are due than that (a backlog: thousands of jobs due at one instant), the slots
    that fell due last are not queued behind it: the ``limit`` newest due dispatches (those
    due after the oldest window, each its job's earliest pending one: a job never overtakes its
    own older work) are interleaved with the oldest, one each in turn, so a slot
    of another job due a second after a burst starts within a pass or two instead of after
    the whole burst (issue 30 defect 8). ``newest_first`` says which of the two goes first;
    the dispatcher alternates it from pass to pass, so under a lasting overload neither the
    backlog nor the newly due work starves. Two indexed reads, whatever the backlog.
    """
    window = limit * CANDIDATES_PER_WORKER
    oldest = tx.all(_CANDIDATE_SQL + " ORDER BY due_at, id LIMIT ?" + tx.skip_locked, (now, window))
    if len(oldest) < window:
        return oldest
    newest = tx.all(_CANDIDATE_SQL + " AND due_at > ?" + _EARLIEST_OF_ITS_JOB + " ORDER BY due_at DESC, id DESC LIMIT ?"
                    + tx.skip_locked, (now, oldest[-1]["due_at"], limit))
    newest.reverse()  # among themselves in due order: a job's earlier slot before its later one
    first, second = (newest, oldest) if newest_first else (oldest, newest)
    # One of each in turn while both last, then the rest of the longer one.
    merged: list[dict[str, SQLValue]] = [d for pair in zip(first, second, strict=False) for d in pair]
    shorter = min(len(first), len(second))
    merged += first[shorter:] or second[shorter:]
    return merged


def claim_and_start(
    store: Store, lease: Lease, *, limit: int, now: int | None = None,
    veto: Callable[[dict[str, SQLValue], str], str | None] | None = None, check_lease: bool = True,
    newest_first: bool = False,
) -> list[StartedRun]:
    """Claim up to ``limit`` due dispatches and create their runs, in one fenced transaction.

    The candidates are ``claim_candidates``' (``newest_first`` is its): oldest due first,
    with the newest due ones interleaved when a backlog is larger than the claim looks at.

    ``veto`` (the observers' ``dispatch_veto``) is asked per candidate with the job's row as a
    mapping and the dispatch's kind. Each candidate's dispatch and job rows are built once, at their read.

    Dispatches that must not run become records instead: a disabled job's
    non-manual dispatch is cancelled; an overlapping slot under ``skip`` (or past the
    ``queue`` limit) becomes a ``skipped`` run; under ``queue`` it waits. A replay
    (``replay_count`` > 0, an at-least-once run recovery ended) is never skipped for
    overlap: it waits for the job's active run to end under ``skip`` and ``queue``, runs
    beside it under ``allow``, and pending replays do not count against ``queue_limit``.
    """
    now = now_ms() if now is None else now
    if limit <= 0:
        return []
    with committing(store) as tx:
        if check_lease:  # False: the caller asserted it in this same transaction
            assert_live(tx, lease, now=now)
        return claim_and_start_in(tx, lease, limit=limit, now=now, veto=veto, newest_first=newest_first)


def claim_and_start_in(
    tx: Tx, lease: Lease, *, limit: int, now: int, veto: Callable[[dict[str, SQLValue], str], str | None] | None = None,
    newest_first: bool = False,
) -> list[StartedRun]:
    """``claim_and_start`` inside the caller's ``committing`` transaction, whose lease the caller asserted (the pass)."""
    started: list[StartedRun] = []
    if limit <= 0:
        return started
    candidates = claim_candidates(tx, now=now, limit=limit, newest_first=newest_first)
    # Without row locks (SQLite) the write transaction is the only writer: the candidates' jobs and active runs
    # are read in two statements for the first ``limit`` of them (two more should the pass look further). With row locks (PostgreSQL) each job is locked and then
    # counted, one by one, so a run another dispatcher starts meanwhile is always seen.
    batch = _BatchReads(tx, candidates, limit) if not tx.for_update and candidates else None
    deferred_jobs: set[str] = set()
    gates = registered().gates  # once per pass: the steps that may gate a run
    # New runs are claimed and inserted together after the loop (transitions.claim_and_start_many): the loop's
    # decisions never read them back (a job with a run started here is deferred, or its policy is ``allow``).
    new_runs: list[transitions.NewRun] = []
    for candidate in candidates:
        if len(started) + len(new_runs) >= limit:
            break
        # Typed once it is looked at (up to 4 x limit are read): the columns the claim reads (the others are None).
        d = DispatchRow.from_row(candidate)
        job = batch.job(d.job_id) if batch else _job_row(tx.one("SELECT * FROM jobs WHERE id = ?" + tx.for_update, (d.job_id,)))
        if job is None:
            continue
        if not job.enabled and d.kind != "manual":
            _drop_dispatch(tx, d, job, "job disabled", now, lease)
            if batch:
                batch.forget(job.id)  # a waiting run may have ended with it: count that job afresh
            continue
        if d.artifact_digest != job.artifact_digest:  # the job changed; its update should have cancelled this
            _drop_dispatch(tx, d, job, f"bound to superseded execution artifact {d.artifact_digest}", now, lease)
            if batch:
                batch.forget(job.id)
            continue
        if job.id in deferred_jobs:
            continue
        running = batch.active(job.id, d.id) if batch else active_runs(tx, job.id, other_than_dispatch=d.id)
        policy = job.overlap_policy
        if running and policy != "allow" and d.kind != "retry":
            if d.replay_count:
                # A replay is a promise (at-least-once): it waits for the overlap to clear under ``skip`` and
                # ``queue`` alike, is never skipped, and does not hold the job's newer slots back.
                continue
            # Waiting replays are not counted against ``queue_limit``: they are owed, not queued.
            waiting = tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE job_id = ? AND status = 'pending'"
                                " AND replay_count = 0", (job.id,))
            if policy == "queue" and waiting <= job.queue_limit:
                deferred_jobs.add(job.id)
                continue
            reason = "overlap: job already running" if policy == "skip" else f"overlap: queue limit {job.queue_limit} reached"
            _skip_dispatch(tx, d, job, reason, now, lease)
            continue
        vetoed = veto(job.to_dict(), d.kind) if veto is not None else None
        if vetoed:
            _skip_dispatch(tx, d, job, f"veto: {vetoed}", now, lease)
            continue
        run = _start(tx, lease, d, job, now, gates)
        if run is None:
            if batch:
                batch.forget(job.id)  # an approval gate opened: its waiting run counts from now on
            continue
        if isinstance(run, transitions.NewRun):
            new_runs.append(run)
        else:
            started.append(run)
        if policy != "allow":
            deferred_jobs.add(job.id)
    if new_runs:
        for r in transitions.claim_and_start_many(tx, lease, new_runs, expires_at=now + CLAIM_TTL_MS, now=now):
            d = r.dispatch
            started.append(StartedRun(run_id=r.run_id, dispatch_id=d.id, dispatch_kind=d.kind, job=r.job,
                                      attempt=r.attempt, scheduled_for=d.due_at, started_at=now,
                                      parent_run_id=r.parent_run_id, source_run_id=d.source_run_id, queued_at=d.created_at))
    return started


def _job_row(row: Mapping[str, object] | None) -> JobRow | None:
    return JobRow.from_row(row) if row is not None else None


#: The statuses ``active_runs`` counts against ``overlap_policy``.
_ACTIVE = "('running', 'awaiting_approval', 'approved')"


class _BatchReads:
    """One claim pass's job rows and active runs, read for many candidates at once (SQLite: the transaction is exclusive).

    The jobs of the first ``limit`` candidates are read first (a pass takes ``limit`` runs, and
    usually from its first candidates); the others' only when the pass looks past those (waiting
    slots, skips). A job's row becomes its ``JobRow`` when the pass first looks at it, and once only.
    """

    def __init__(self, tx: Tx, candidates: Sequence[Mapping[str, object]], limit: int) -> None:
        self._tx = tx
        ids = list(dict.fromkeys(str(d["job_id"]) for d in candidates))
        self._later = ids[limit:]
        self._rows: dict[str, Mapping[str, object]] = {}
        self._jobs: dict[str, JobRow] = {}
        self._active: dict[str, list[str | None]] = {}
        self._read(ids[:limit])

    def _read(self, ids: list[str]) -> None:
        """The job rows and active runs of ``ids`` (two statements)."""
        marks = ", ".join("?" * len(ids))
        for row in self._tx.all(f"SELECT * FROM jobs WHERE id IN ({marks})", ids):
            self._rows[str(row["id"])] = row
        for job_id in ids:
            self._active[job_id] = []
        for row in self._tx.all(f"SELECT job_id, dispatch_id FROM runs WHERE job_id IN ({marks}) AND status IN {_ACTIVE}",
                                ids):
            self._active[row["job_id"]].append(row["dispatch_id"])

    def _read_later(self) -> None:
        """The pass looked past its first candidates' jobs: read the others (once)."""
        later, self._later = self._later, []
        self._read(later)

    def job(self, job_id: str) -> JobRow | None:
        """The job row as the pass read it (None: deleted)."""
        job = self._jobs.get(job_id)
        if job is None:
            row = self._rows.get(job_id)
            if row is None:
                if not self._later:
                    return None
                self._read_later()
                row = self._rows.get(job_id)
                if row is None:
                    return None
            job = self._jobs[job_id] = JobRow.from_row(row)
        return job

    def active(self, job_id: str, dispatch_id: str) -> int:
        """``active_runs(tx, job_id, other_than_dispatch=dispatch_id)`` from the pass's read (or afresh once forgotten)."""
        runs = self._active.get(job_id)
        if runs is None:
            return active_runs(self._tx, job_id, other_than_dispatch=dispatch_id)
        return sum(1 for d in runs if d is None or d != dispatch_id)

    def forget(self, job_id: str) -> None:
        """This pass changed the job's runs: count them with a query from now on."""
        self._active.pop(job_id, None)


def active_runs(tx: Tx, job_id: str, *, other_than_dispatch: str | None = None) -> int:
    """Runs of a job that count against ``overlap_policy``: running, and waiting at (or past) an approval gate.

    ``other_than_dispatch`` leaves out the run of that dispatch (an approved run being resumed is not its own overlap).
    """
    return tx.scalar(
        "SELECT COUNT(*) FROM runs WHERE job_id = ? AND status IN ('running', 'awaiting_approval', 'approved')"
        " AND (dispatch_id IS NULL OR dispatch_id <> ?)",
        (job_id, other_than_dispatch or ""),
    )


def _drop_dispatch(tx: Tx, d: DispatchRow, job: JobRow, reason: str, now: int, lease: Lease) -> None:
    """Cancel a due dispatch that must not run, with the approved run waiting on it (if any)."""
    waiting = _waiting_run(tx, d)
    if waiting is not None:
        transitions.cancel_waiting_run(tx, waiting, reason=reason, actor=lease.owner, now=now)
    transitions.cancel_dispatch(tx, d.id, job_id=job.id, reason=reason, now=now, actor=lease.owner)


def _waiting_run(tx: Tx, d: DispatchRow) -> RunRow | None:
    """The approved run a re-queued dispatch carries (None for a dispatch that has not been claimed before)."""
    if not d.run_id:
        return None
    row = tx.one("SELECT * FROM runs WHERE id = ? AND status = 'approved'", (d.run_id,))
    return RunRow.from_row(row) if row is not None else None


def _skip_dispatch(tx: Tx, d: DispatchRow, job: JobRow, reason: str, now: int, lease: Lease) -> None:
    """A due dispatch that must not run: its row is done and a ``skipped`` run says why."""
    if transitions.finish_dispatch(tx, d.id, "done", now=now):
        record_skip(tx, job, slot_ms=d.due_at, reason=reason, now=now, dispatch_id=d.id, dispatch_kind=d.kind,
                    replay_of_run_id=d.source_run_id if d.replay_count else None)


def _start(tx: Tx, lease: Lease, d: DispatchRow, job: JobRow, now: int,
           gates: Sequence[Step]) -> StartedRun | transitions.NewRun | None:
    """Claim ``d`` and start its run; or open a step's gate (``Step.gates``); or resume the run its approval released.

    None when nothing is to execute now (no longer ours, or waiting for a decision); a
    ``NewRun`` for a new run the caller claims and starts with the pass's others
    (``transitions.claim_and_start_many``).
    """
    approved = _waiting_run(tx, d)
    if approved is not None:
        if not transitions.claim_dispatch(tx, d.id, lease, run_id=approved.id, claim_token=secrets.token_hex(8),
                                          expires_at=now + CLAIM_TTL_MS, now=now):
            return None
        if not transitions.dispatch_approved_run(tx, lease, approved, now=now):
            return None
        assert approved.scheduled_for is not None  # a gated run keeps its dispatch's slot
        return StartedRun(run_id=approved.id, dispatch_id=d.id, dispatch_kind=d.kind, job=job, attempt=approved.attempt,
                          scheduled_for=approved.scheduled_for, started_at=now, parent_run_id=approved.parent_run_id,
                          source_run_id=approved.source_run_id, queued_at=d.created_at)
    run_id = new_run_id()
    attempt, parent_run_id, retry_of = 1, None, None
    if d.kind == "retry" and d.source_run_id:
        src = tx.one("SELECT attempt FROM runs WHERE id = ?", (d.source_run_id,))
        attempt = (src["attempt"] if src else 0) + 1
        retry_of = d.source_run_id
    elif d.kind == "chain":
        parent_run_id = d.source_run_id
    replay_of = d.source_run_id if d.replay_count else None
    gate = next((step for step in gates if step.gates(job)), None)
    if gate is None:
        return transitions.NewRun(run_id=run_id, claim_token=secrets.token_hex(8), job=job, dispatch=d, attempt=attempt,
                                  executor=executor_name_of(job), parent_run_id=parent_run_id, retry_of_run_id=retry_of,
                                  replay_of_run_id=replay_of)
    if not transitions.claim_dispatch(tx, d.id, lease, run_id=run_id, claim_token=secrets.token_hex(8),
                                      expires_at=now + CLAIM_TTL_MS, now=now):
        return None  # no longer pending: someone else's (never a run without its claim)
    # A gated job (the approval step's ``approval_required``): nothing of the payload runs before a decision.
    gate.open_gate(tx, Gate(run_id=run_id, job=job, dispatch_id=d.id, dispatch_kind=d.kind, attempt=attempt,
                            scheduled_for=d.due_at, parent_run_id=parent_run_id, retry_of_run_id=retry_of,
                            replay_of_run_id=replay_of, now=now, actor=lease.owner))
    return None


def release_expired_claims(store: Store, *, now: int | None = None) -> int:
    """Return expired claims with no active run to pending (attempts and last error stay)."""
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        return transitions.release_expired_claims(tx, now=now)


__all__ = [
    "CLAIM_TTL_MS",
    "DueSlots",
    "StartedRun",
    "claim_and_start",
    "claim_and_start_in",
    "due_slots",
    "enqueue_manual",
    "insert_dispatch",
    "materialize_due",
    "materialize_due_in",
    "next_due",
    "next_due_parts",
    "record_skip",
    "release_expired_claims",
    "slot_dispatch_id",
]
