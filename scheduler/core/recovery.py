"""Crash recovery: finish every run whose owner's fence is gone, and free stale claims.

A run is orphaned when no live lease carries its owner and token. Before ending it
we ask its executor (``recover``) to make sure its work is gone: ``gone`` (nothing
was running: nothing signalled), ``terminated`` (stopped, with the signal used),
``unknown`` (cannot tell, e.g. another host) or ``blocked``. A blocked run becomes
``recovery_blocked`` and is retried on every pass; the rest become ``crashed`` with a
final process state and get the usual consequences in the same transaction, plus a
replay when the job asked for ``at-least-once``. The recovering dispatcher is the
actor of every event it writes (the dead owner is named in the event data), and the
status writes go through ``scheduler.core.transitions``, so observers hear of the crash.

What recovery does above core it does through its participants
(``scheduler.core.participants.RecoveryParticipants``, handed in by the composition root), in
this order for each orphan: its executor settles the work, its credentials are cleaned (not
proven: the run is ``recovery_blocked`` and its job paused), then one transaction crashes it,
gives it its interrupted evidence row, its replay and its consequences (messages through the
outbox). A run whose last recorded handle was its post-success verification check (``"step":
"verify"``) gets ``verify_status`` ``interrupted`` before its evidence row, which binds it. Credentials are cleaned before evidence is written, as in a run.
"""

from __future__ import annotations

import json
import logging

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core import state, transitions
from scheduler.core.completion import apply_consequences
from scheduler.core.debts import reconcile
from scheduler.core.events import append_event
from scheduler.core.execution import INTERRUPTED_VERIFICATION, RecoveryOutcome, RecoveryRequest, verification_interrupted
from scheduler.core.jobs import repair_missing_next_runs
from scheduler.core.lease import FENCE_COUNTER, Lease, assert_live, describe_lost_dispatcher, next_token, owner_host
from scheduler.core.members import Recoverable
from scheduler.core.observers import Observers
from scheduler.core.participants import ExecutorSource, RecoveryParticipants
from scheduler.core.queue import release_expired_claims
from scheduler.core.rows import JSONObject, RunRow
from scheduler.core.store.base import Store
from scheduler.core.transitions import committing, insert_dispatch

log = logging.getLogger("scheduler.core.recovery")


def _settle_process(run: RunRow, grace_s: float, executors: ExecutorSource) -> tuple[str, str | None]:
    """Ask the run's executor to make sure its work is gone: ``("gone"|"terminated"|"unknown"|"blocked", detail)``.

    The executor's ``recover`` reads the handle the run recorded (a process identity, a
    remote turn id). A run that recorded nothing never started its work: ``gone``. An
    executor that cannot be loaded or has no ``recover`` cannot confirm anything: ``unknown``.
    """
    raw = run.executor_handle
    if not raw:
        return "gone", None
    try:
        executor = executors(run.executor or "shell")
    except SchedulerError as exc:
        return "unknown", f"executor not available: {exc.code}"
    if not isinstance(executor, Recoverable):
        return "unknown", "executor has no recover()"
    request = RecoveryRequest(
        run_id=run.id, job_id=run.job_id, handle=json.loads(raw), owner=run.dispatcher_owner,
        owner_host=owner_host(run.dispatcher_owner), kill_grace_s=grace_s,
    )
    try:
        outcome = executor.recover(request)
    except Exception as exc:  # noqa: BLE001 - a failing recover must not end the run as if its work were gone
        return "blocked", f"recover() raised {type(exc).__name__}: {exc}"
    if not isinstance(outcome, RecoveryOutcome) or outcome.state not in ("gone", "terminated", "unknown", "blocked"):
        return "blocked", "recover() returned an invalid outcome"
    return outcome.state, outcome.detail


def find_orphans(store: Store, *, now: int | None = None) -> list[RunRow]:
    """Active runs whose owner no longer holds a live lease with the run's token."""
    now = now_ms() if now is None else now
    with store.read() as tx:
        return [RunRow.from_row(row) for row in tx.all(
            "SELECT r.* FROM runs r WHERE r.status IN ('running', 'recovery_blocked') AND NOT EXISTS ("
            " SELECT 1 FROM dispatcher_leases l WHERE l.owner = r.dispatcher_owner AND l.token = r.dispatcher_token"
            " AND l.expires_at > ?)",
            (now,),
        )]


def fence_out(store: Store, owner: str, *, now: int | None = None) -> int:
    """Take the expired leases of a dead or stalled owner away from it (new token, no owner).

    After this, the stalled process's next renewal or commit fails even if it wakes up:
    it learns it lost its lease instead of carrying on with a token nobody revoked.
    """
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        names = [r["name"] for r in tx.all(
            "SELECT name FROM dispatcher_leases WHERE owner = ? AND expires_at <= ? AND name <> ?", (owner, now, FENCE_COUNTER))]
        for name in names:
            tx.execute("UPDATE dispatcher_leases SET owner = NULL, token = ? WHERE name = ? AND owner = ?", (next_token(tx), name, owner))
            append_event(tx, "lease.fenced_out", actor=owner, at=now, data={"lease": name})
    return len(names)


def _reconcile_debts(store: Store, lease: Lease) -> None:
    """Settle the completion debts whose runs' parts are all settled (also a dead dispatcher's). A failure only
    leaves debts open (the side that errs safe: ``status`` keeps showing them), so it is logged, never fatal to the
    pass; a busy database propagates for the caller's retry."""
    try:
        reconcile(store, actor=lease.owner)
    except SchedulerError as exc:
        if exc.code.startswith("DB_"):
            raise
        log.warning("completion debts not reconciled: %s: %s", exc.code, exc.message)
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("completion debts not reconciled: %s: %s", type(exc).__name__, exc)


def recover(store: Store, lease: Lease, *, participants: RecoveryParticipants, kill_grace_s: float = 2.0,
            hooks: Observers | None = None) -> list[JSONObject]:
    """One recovery pass under our live lease; returns what was done to each orphan.

    Each orphan is ended in its own transaction; ``hooks`` (default: the process's default
    observers) hear of every transition once it committed. ``participants`` settle each
    orphan's executor work and credentials and write its evidence and messages.
    """
    report: list[JSONObject] = []
    orphans = find_orphans(store)
    for owner in {r.dispatcher_owner for r in orphans if r.dispatcher_owner}:
        fence_out(store, owner)
    for run in orphans:
        process, detail = _settle_process(run, kill_grace_s, participants.executors)
        raw_handle = json.loads(run.executor_handle) if run.executor_handle else None
        view = run.to_dict()  # the participants take the run as the mapping a read returns
        cleaned, why = participants.credentials.clean(store, view)  # the dead run's credential files (none: one read)
        now = now_ms()
        with committing(store, hooks) as tx:
            assert_live(tx, lease, now=now)
            if not cleaned:
                transitions.block_recovery(tx, run, actor=lease.owner, now=now, detail=why, message=why)
                participants.credentials.block_job(tx, view, why or "", actor=lease.owner, now=now)
                report.append({"run_id": run.id, "outcome": "recovery_blocked", "credentials": why})
                continue
            if process == "blocked":
                transitions.block_recovery(tx, run, actor=lease.owner, now=now, detail=detail)
                report.append({"run_id": run.id, "outcome": "recovery_blocked"})
                continue
            message = describe_lost_dispatcher(run.dispatcher_owner, run.dispatcher_token)
            replay = run.delivery_guarantee == "at-least-once" and run.dispatch_id is not None
            # Only ``terminated`` signalled anything; for the other states the detail is an explanation.
            signal = detail if process == "terminated" else None
            fresh = transitions.crash_run(
                tx, run, actor=lease.owner, now=now, message=message, process_state=process, process_signal=signal,
                data={"process": process, "signal": signal, "detail": None if signal else detail, "replay": replay,
                      "from_owner": run.dispatcher_owner, "from_token": run.dispatcher_token},
            )
            if fresh is None:
                continue  # its owner finished it meanwhile, or another recovery did
            if verification_interrupted(raw_handle):  # its post-success check was cut short: the run says so
                state.execute(tx, "mark_verify_interrupted", run_id=run.id,
                              verify_json=json.dumps(INTERRUPTED_VERIFICATION, sort_keys=True))
            participants.evidence.interrupted(tx, view, now=now, actor=lease.owner)  # an evidence job's run: its terminal row
            if replay:
                d = tx.one("SELECT kind, replay_count FROM job_dispatch_queue WHERE id = ?", (fresh.dispatch_id,))
                count = (d["replay_count"] if d else 0) + 1
                kind = d["kind"] if d else "manual"
                insert_dispatch(tx, id=f"{fresh.dispatch_id}:replay:{count}", job_id=fresh.job_id, kind=kind,
                                due_at=now, now=now, source_run_id=fresh.id, replay_count=count)
            # a replay stands in for a retry: both would run the work a third time
            apply_consequences(tx, fresh, outbox=participants.outbox, now=now, allow_retry=not replay, actor=lease.owner)
            report.append({"run_id": run.id, "outcome": "crashed", "process": process, "replayed": replay})
    participants.credentials.sweep(store)  # finished runs of a dead dispatcher that never reached their credential cleanup
    release_expired_claims(store)
    _reconcile_debts(store, lease)
    repair_missing_next_runs(store)
    return report
