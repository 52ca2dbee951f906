"""The completion transaction: one commit that finishes a run and creates every consequence.

Inside one transaction, under the run owner's live fence: the terminal status
(``cancelled`` if a cancel request won the race), output and audit fields, the
dispatch row, job counters and auto-pause, a retry with exponential backoff,
chained children, delivery outbox rows and watchdog alerts. If the fence is gone,
nothing is written at all. The status writes go through ``scheduler.core.transitions``,
which also queues the observer notifications fired after commit.

What completion writes above core it writes through its participants
(``scheduler.core.participants.CompletionParticipants``, handed in by the composition root):
the outbox enqueues every message, the evidence rows insert the pipeline's evidence row,
the proof step gives an escalation's gate its proof window. They write in the same
transaction, in the order this module calls them, so they commit with the terminal state
or not at all; a run whose cancellation won gets none of the consequences.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import attrs

from scheduler.base.run_ids import short_run_id
from scheduler.base.timeutil import now_ms
from scheduler.core import state, transitions
from scheduler.core.conditions import condition_matches
from scheduler.core.debts import open_debt
from scheduler.core.events import append_event
from scheduler.core.execution import MAX_EXECUTOR_STATE_BYTES, ExecutionResult, StreamCapture
from scheduler.core.lease import Lease, assert_live
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.participants import CompletionParticipants, EvidenceRows, Outbox
from scheduler.core.rows import JobRow, Row, RunRow, SQLValue
from scheduler.core.runs import FAILURES, StaleFence
from scheduler.core.store.base import Store, Tx
from scheduler.core.transitions import committing, insert_dispatch
from scheduler.settings import current_settings

#: Longest backoff between retries, whatever the attempt number.
MAX_RETRY_BACKOFF_MS = 6 * 3_600_000


@attrs.frozen(slots=False)
class CountedJob(Row):
    """What a terminal run's consequences read of its job: statement ``count_job_run``'s RETURNING, once the run counted.

    Not a whole ``JobRow`` (the consequences need these columns only, and the completion's hot
    path builds one per run): ``has_children`` says whether any job chains on it, ``auto_paused``
    is the reason when this run's failure just auto-paused it (None otherwise).
    """

    id: str
    name: str
    enabled: int
    job_type: str
    consecutive_failures: int
    max_consecutive_failures: int
    max_retries: int
    retry_backoff_ms: int
    delivery_mode: str
    delivery_channel: str | None
    delivery_to: str | None
    watchdog_alert_channel: str | None
    watchdog_alert_to: str | None
    watchdog_self_destruct: int
    notify: int
    session_target: str
    has_children: int | bool
    auto_paused: str | None = None


def _stream_columns(prefix: str, capture: StreamCapture | None) -> dict[str, SQLValue]:
    if capture is None:
        return {}
    return {
        f"{prefix}_excerpt": capture.excerpt,
        f"{prefix}_bytes": capture.bytes,
        f"{prefix}_sha256": capture.sha256,
        f"{prefix}_artifact": capture.artifact,
        f"{prefix}_truncated": int(bool(capture.truncated)),
    }


def result_columns(result: ExecutionResult) -> dict[str, SQLValue]:
    """Run columns describing an execution result (no credential or environment values)."""
    cols: dict[str, SQLValue] = {
        "exit_code": result.exit_code,
        "error_code": result.error_code,
        "error_message": result.error_message,
        "summary": (result.summary or "")[:4096] or None,
        "env_policy_warning": result.env_warning,
    }
    if result.stdout is not None:
        cols.update(_stream_columns("stdout", result.stdout))
    if result.stderr is not None:
        cols.update(_stream_columns("stderr", result.stderr))
    s = result.structured
    if s:
        cols.update(
            output_format=s.get("format"),
            output_valid=int(bool(s.get("valid"))),
            output_warning=s.get("warning"),
            output_bytes=s.get("bytes"),
            output_sha256=s.get("sha256"),
            output_parsed=json.dumps(s["parsed"]) if s.get("parsed") is not None else None,
            output_artifact=s.get("artifact"),
        )
    if result.usage:
        cols["usage_json"] = json.dumps(result.usage, sort_keys=True)
    v = result.verification
    if v:
        cols.update(verify_status=v.get("status"), verify_json=json.dumps(v, sort_keys=True))
    return cols


def complete_run(
    store: Store, lease: Lease, run_id: str, result: ExecutionResult, *, participants: CompletionParticipants,
    now: int | None = None, check_lease: bool = True, outcomes: RunOutcomes | None = None,
) -> RunRow:
    """Commit a run's terminal state and side effects; raises ``LeaseLost``/``StaleFence`` and writes nothing if not owner.

    ``check_lease=False`` is for a caller that already asserted the lease in the same
    transaction (the dispatcher's group commit); the run's owner/token compare-and-swap
    is always done. Observers hear of the run once the (outermost) transaction committed.
    ``outcomes`` (the pipeline's decisions: run columns, events, the evidence row) commit
    in the same transaction, through ``participants``.
    """
    now = now_ms() if now is None else now
    with committing(store) as tx:
        if check_lease:
            assert_live(tx, lease, now=now)
        return complete_run_in(tx, lease, run_id, result, participants=participants, now=now, outcomes=outcomes)


def complete_run_in(
    tx: Tx, lease: Lease, run_id: str, result: ExecutionResult, *, participants: CompletionParticipants,
    now: int, outcomes: RunOutcomes | None = None,
) -> RunRow:
    """``complete_run`` inside the caller's ``committing`` transaction, whose lease the caller asserted.

    Raises ``StaleFence`` (and writes nothing for this run) when the run is no longer ours. The run
    returned holds what its terminal write returned (``transitions.finish_run``; an escalated
    run: ``transitions.escalate_run``'s columns, status ``awaiting_approval``).
    """
    run, owed = _end_run(tx, lease, run_id, result, participants=participants, now=now, outcomes=outcomes)
    if owed:
        apply_consequences(tx, run, outbox=participants.outbox, details=result.details, now=now, actor=lease.owner,
                           suppress=outcomes is not None and outcomes.suppress_consequences)
    return run


#: What ``complete_runs_in`` completes: a run's id, its executor's result and the pipeline's outcomes (or None).
Finished = tuple[str, ExecutionResult, RunOutcomes | None]


def complete_runs_in(
    tx: Tx, lease: Lease, finished: Sequence[Finished], *, participants: CompletionParticipants, now: int,
) -> list[RunRow | StaleFence]:
    """``complete_run_in`` for each of a pass's finished runs, in order, in the caller's transaction (lease asserted).

    Each run's entry is what ``complete_run_in`` returns, or the ``StaleFence`` it raises (nothing
    written for that run). The same writes, in the same order per run; only the job counters of
    the runs whose job ends no other run of the pass go in one statement (``count_job_runs``) before
    their consequences: counting a run never depends on another job's consequences. Runs of a job
    the pass ends twice or more are counted one by one, each after the previous one's consequences.
    """
    ended: list[tuple[RunRow, bool, ExecutionResult, RunOutcomes | None] | StaleFence] = []
    for run_id, result, outcomes in finished:
        try:
            run, owed = _end_run(tx, lease, run_id, result, participants=participants, now=now, outcomes=outcomes)
        except StaleFence as exc:
            ended.append(exc)
            continue
        ended.append((run, owed, result, outcomes))
    owed_jobs: dict[str, int] = {}  # how many of the pass's owed runs each job ends
    for e in ended:
        if not isinstance(e, StaleFence) and e[1]:
            job_id = e[0].job_id
            owed_jobs[job_id] = owed_jobs.get(job_id, 0) + 1
    once = [e[0] for e in ended if not isinstance(e, StaleFence) and e[1] and owed_jobs[e[0].job_id] == 1]
    counted: dict[str, dict[str, object]] = {}
    if len(once) > 1:
        counted = {str(row["id"]): row for row in state.rows(tx, "count_job_runs", now=now,
                                                             rows=[_count_params(run, now) for run in once])}
    counted_ids = {run.id for run in once} if len(once) > 1 else set()
    out: list[RunRow | StaleFence] = []
    for e in ended:
        if isinstance(e, StaleFence):
            out.append(e)
            continue
        run, owed, result, outcomes = e
        if owed:
            row_of_job = partial(counted.get, run.job_id) if run.id in counted_ids else None
            apply_consequences(tx, run, outbox=participants.outbox, details=result.details, now=now, actor=lease.owner,
                               suppress=outcomes is not None and outcomes.suppress_consequences, counted=row_of_job)
        out.append(run)
    return out


def _end_run(
    tx: Tx, lease: Lease, run_id: str, result: ExecutionResult, *, participants: CompletionParticipants,
    now: int, outcomes: RunOutcomes | None,
) -> tuple[RunRow, bool]:
    """A run's terminal write (or its escalation) and what the pipeline decided; ``(run, consequences owed)``.

    Raises ``StaleFence`` (nothing written) when the run is no longer ours. An escalated run
    waiting for a decision owes no consequences.
    """
    values = result_columns(result)
    if outcomes is not None:
        values.update(outcomes.columns)
    popped = values.pop("error_message")
    message = popped if isinstance(popped, str) else None
    # The executor returned, so the work it recorded has ended; a worker the dispatcher cut
    # loose (``abandoned``) may still be running it: that is not known.
    process_state = "unknown" if (result.details or {}).get("abandoned") else "exited"
    if outcomes is not None and outcomes.escalate is not None and result.error_code == "AUTHORIZATION_ESCALATED":
        gated = escalate_to_approval(tx, lease, run_id, outcomes, participants, now=now)
        if gated is not None:
            return gated, False  # waiting for a decision: no terminal state, no consequences
    run = transitions.finish_run(tx, run_id, owner=lease.owner, token=lease.token, status=result.status, values=values,
                                 error_message=message, now=now, process_state=process_state)
    if run is None:
        raise StaleFence(f"run {run_id} is no longer running under owner {lease.owner} token {lease.token}")
    if result.state is not None and run.status == "ok":
        keep_executor_state(tx, run, result.state, now=now, actor=lease.owner)
    if outcomes is not None:
        commit_outcomes(tx, run, outcomes, participants.evidence, now=now, actor=lease.owner)
    return run, True


def escalate_to_approval(tx: Tx, lease: Lease, run_id: str, outcomes: RunOutcomes, participants: CompletionParticipants, *,
                         now: int) -> RunRow | None:
    """An authorization provider escalated: the run waits in ``awaiting_approval`` behind an approval of gate kind
    ``authorization`` (``transitions.escalate_run``), with the pipeline's columns and events; an approval notice goes
    out like a job gate's. None when the run is no longer ours or a cancel came first (the caller ends it as usual).
    """
    escalate = outcomes.escalate or {}
    approval_id = str(uuid.uuid4())
    run = transitions.escalate_run(tx, run_id, owner=lease.owner, token=lease.token, values=dict(outcomes.columns),
                                   approval_id=approval_id, gate_kind=escalate.get("gate_kind", "authorization"),
                                   risk_level=escalate.get("risk_level") or "medium", reason=escalate.get("reason"), now=now,
                                   proof_window=participants.proofs.gate_columns(outcomes))
    if run is None:
        return None
    commit_outcomes(tx, run, outcomes, participants.evidence, now=now, actor=lease.owner)
    found = tx.one("SELECT id, name, delivery_mode, delivery_channel, delivery_to, approval_approver_scope FROM jobs WHERE id = ?",
                   (run.job_id,))
    job = JobRow.from_row(found) if found is not None else None  # those columns (the others are None)
    if job is not None and job.delivery_mode != "none" and job.delivery_channel:
        scope = job.approval_approver_scope
        body = (f"[Approval required] {job.name} ({run.dispatch_kind} run {short_run_id(run_id)}), escalated by its authorization"
                f" policy, risk {escalate.get('risk_level')}{f', approver {scope}' if scope else ''}."
                f"{chr(10) + 'Reason: ' + escalate['reason'] if escalate.get('reason') else ''}\n"
                f"Approve: scheduler approvals approve {approval_id}\nReject:  scheduler approvals reject {approval_id}")
        participants.outbox.enqueue(tx, {"id": run_id, "job_id": job.id}, job.delivery_channel, job.delivery_to,
                                    body, f"{approval_id}:approval-notice", now)
    return run


def commit_outcomes(tx: Tx, run: RunRow, outcomes: RunOutcomes, evidence: EvidenceRows, *, now: int,
                    actor: str | None) -> None:
    """Write the pipeline's events and (through ``evidence``) its evidence row for ``run`` inside its completion transaction."""
    for kind, data in outcomes.events:
        append_event(tx, kind, job_id=run.job_id, run_id=run.id, actor=actor, at=now, data=data)
    if outcomes.evidence is not None:
        evidence.insert(tx, run.to_dict(), outcomes.evidence, now=now)


def keep_executor_state(tx: Tx, run: RunRow, state: object, *, now: int, actor: str | None) -> bool:
    """Keep an ok run's ``ExecutionResult.state`` for its job's next run (replacing the last); False when refused.

    A state that is not a JSON object, or is larger than ``MAX_EXECUTOR_STATE_BYTES``, is not
    kept (an event says why) and the previous one stays: a run never loses what an earlier
    one kept by returning something unusable.
    """
    executor = tx.scalar("SELECT executor FROM runs WHERE id = ?", (run.id,)) or ""
    try:
        text = json.dumps(dict(state), sort_keys=True, allow_nan=False) if isinstance(state, Mapping) else None
    except (TypeError, ValueError):
        text = None
    size = len(text.encode("utf-8")) if text is not None else 0
    if text is None or size > MAX_EXECUTOR_STATE_BYTES:
        why = "not a JSON object" if text is None else f"{size} bytes is more than {MAX_EXECUTOR_STATE_BYTES}"
        append_event(tx, "executor_state.refused", job_id=run.job_id, run_id=run.id, actor=actor, at=now,
                     data={"executor": executor, "reason": why})
        return False
    tx.execute(
        "INSERT INTO executor_state(job_id, executor, state, state_bytes, run_id, updated_at) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (job_id, executor) DO UPDATE SET state = excluded.state, state_bytes = excluded.state_bytes,"
        " run_id = excluded.run_id, updated_at = excluded.updated_at",
        (run.job_id, executor, text, size, run.id, now),
    )
    return True


def apply_consequences(
    tx: Tx, run: RunRow, *, outbox: Outbox, details: Mapping[str, object] | None = None, now: int, allow_retry: bool = True,
    actor: str | None = None, suppress: bool = False, counted: Callable[[], Mapping[str, object] | None] | None = None,
) -> None:
    """Everything a terminal run causes, inside the caller's transaction (also used by crash recovery).

    ``actor`` is the dispatcher committing it (the run's owner, or the recovering
    dispatcher after a crash); the ``run.finished`` event names it. ``suppress`` (a run
    whose required evidence failed) counts the run but sends nothing and starts nothing.
    Every message goes through ``outbox``, in this order: notifications, the job's delivery,
    a watchdog alert. ``run`` is what its terminal write returned (``transitions.finish_run``,
    ``transitions.crash_run``): its binding and identity columns included. ``counted``: the run's job row as
    ``count_job_runs`` returned it when the caller already counted the run (None: counted here, ``count_job_run``).
    """
    status = run.status
    transitions.finish_dispatch(tx, run.dispatch_id, "done", now=now, last_error=run.error_code if status != "ok" else None,
                                deferrable=True)  # the dispatcher's pass writes its runs' finishes in one UPDATE
    actor = actor or run.dispatcher_owner
    data: dict[str, object] = {"status": status, "error_code": run.error_code, "token": run.dispatcher_token}
    if actor != run.dispatcher_owner:
        data["run_owner"] = run.dispatcher_owner  # recovery: the dead owner the run belonged to
    if details:
        data["details"] = details  # executor-reported metadata (never output text or secrets)
    # The run's binding and identity came back with its terminal write: the event needs no lookups.
    append_event(tx, "run.finished", job_id=run.job_id, run_id=run.id, dispatch_id=run.dispatch_id,
                 actor=actor, at=now, data=data, artifact_digest=run.artifact_digest,
                 principal=run.principal, trust_level=run.trust_level)
    job = _update_job_counters(tx, run, now, actor, counted)
    if job is None or suppress:
        return
    parts = _notify(tx, outbox, job, run, now)
    if status == "cancelled":
        _open_debt(tx, job, run, parts, None, now, actor)
        return  # cancellation won: no retry, no child, no delivery
    # A disabled or just auto-paused job gets no retry (it would only be cancelled at claim).
    retrying = allow_retry and job.enabled and status in FAILURES and run.attempt <= job.max_retries
    if retrying:
        backoff = min(MAX_RETRY_BACKOFF_MS, job.retry_backoff_ms * (2 ** (run.attempt - 1)))
        insert_dispatch(tx, id=f"{run.id}:retry", job_id=job.id, kind="retry", due_at=now + backoff, now=now,
                        source_run_id=run.id)
        append_event(tx, "run.retry_scheduled", job_id=job.id, run_id=run.id, at=now,
                     data={"attempt": run.attempt + 1, "due_in_ms": backoff})
    else:
        _trigger_children(tx, job, run, now)
    delivered = _enqueue_delivery(tx, outbox, job, run, now)
    parts += delivered + _watchdog(tx, outbox, job, run, now, actor)
    _open_debt(tx, job, run, parts, f"{run.id}:delivery" if delivered else None, now, actor)


def _open_debt(tx: Tx, job: CountedJob, run: RunRow, parts: int, group: str | None, now: int, actor: str | None) -> None:
    """The run's completion debt (``scheduler.core.debts``), opened in this transaction when it enqueued any part."""
    if parts:
        open_debt(tx, job_id=job.id, session_key=job.session_target, run_id=run.id, outbox_group=group, owner=actor, now=now)


def _count_params(run: RunRow, now: int) -> dict[str, SQLValue]:
    """What counting ``run`` on its job writes (statements ``count_job_run`` and ``count_job_runs``)."""
    status = run.status
    outcome = "ok" if status == "ok" else ("failure" if status in FAILURES else "other")
    return {"job_id": run.job_id, "last_run_at": run.started_at or now, "status": status,
            "error": run.error_message if status != "ok" else None, "duration_ms": run.duration_ms, "outcome": outcome}


def _update_job_counters(tx: Tx, run: RunRow, now: int, actor: str | None,
                         counted: Callable[[], Mapping[str, object] | None] | None = None) -> CountedJob | None:
    """Count the run on its job (one UPDATE ... RETURNING, or ``counted``: the caller's) and auto-pause it after too
    many failures in a row.

    Auto-pause cancels the job's pending work exactly as ``jobs disable`` does
    (``transitions.cancel_pending_work``): pending dispatches, waiting runs, approvals.
    """
    row = state.one(tx, "count_job_run", now=now, **_count_params(run, now)) if counted is None else counted()
    if row is None:
        return None
    job = CountedJob.from_row(row)
    failures, limit = job.consecutive_failures, job.max_consecutive_failures
    if run.status in FAILURES and limit and failures >= limit and job.enabled:
        reason = f"auto-paused after {failures} consecutive failures"
        state.execute(tx, "auto_pause_job", job_id=job.id, now=now, reason=reason)
        transitions.cancel_pending_work(tx, job.id, reason=reason, now=now, actor=actor)
        append_event(tx, "job.auto_paused", job_id=job.id, run_id=run.id, actor=actor, at=now, data={"failures": failures})
        job = attrs.evolve(job, enabled=0, auto_paused=reason)
    return job


def _notify(tx: Tx, outbox: Outbox, job: CountedJob, run: RunRow, now: int) -> int:
    """The settings file's ``[notifications]`` about this run (and an auto-pause it caused), through the outbox;
    returns the parts enqueued.

    Jobs with ``notify: false`` opt out. Events: ``completed`` (ok), ``failed`` (error or
    timeout), ``paused`` (this failure auto-paused the job).
    """
    if not job.notify:
        return 0
    cfg = current_settings().notifications
    if not cfg.routes:
        return 0
    events = []
    if run.status == "ok" and "completed" in cfg.events:
        events.append(("completed", f"[Job completed] {job.name}\nDuration: {(run.duration_ms or 0) / 1000:.1f}s"))
    elif run.status in FAILURES and "failed" in cfg.events:
        body = f"[Job failed] {job.name}\nStatus: {run.status}\nDuration: {(run.duration_ms or 0) / 1000:.1f}s"
        if run.error_message:
            body += f"\nError: {run.error_message}"
        events.append(("failed", body))
    if job.auto_paused and "paused" in cfg.events:
        events.append(("paused", f"[Job paused] {job.name}: {job.auto_paused}\nResume: scheduler jobs resume {job.name}"))
    view = run.to_dict() if events else {}
    parts = 0
    for event, body in events:
        for index, route in enumerate(cfg.routes):
            channel, _, target = route.partition(":")
            parts += outbox.enqueue(tx, view, channel, target or None, body, f"{run.id}:notify:{event}:{index}", now)
    return parts


def _outcome_matches(trigger_on: str | None, status: str) -> bool:
    if trigger_on == "failure":
        return status in FAILURES
    if trigger_on == "complete":
        return status == "ok" or status in FAILURES
    return status == "ok"


def _trigger_children(tx: Tx, job: CountedJob, run: RunRow, now: int) -> None:
    if not job.has_children:  # the counters' RETURNING said so: no query for the common childless job
        return
    # What a chain trigger reads of each child (the rows' other columns are None).
    children = [JobRow.from_row(row) for row in tx.all(
        "SELECT id, trigger_on, trigger_delay_s, trigger_condition, enabled FROM jobs WHERE parent_id = ?", (job.id,))]
    text = run.summary or run.stdout_excerpt or ""
    for child in children:
        if not child.enabled or not _outcome_matches(child.trigger_on, run.status):
            continue
        if not condition_matches(child.trigger_condition, text):
            append_event(tx, "chain.condition_not_met", job_id=child.id, run_id=run.id, at=now,
                         data={"condition": child.trigger_condition})
            continue
        insert_dispatch(tx, id=f"{run.id}:chain:{child.id}", job_id=child.id, kind="chain",
                        due_at=now + child.trigger_delay_s * 1000, now=now, source_run_id=run.id)


def _enqueue_delivery(tx: Tx, outbox: Outbox, job: CountedJob, run: RunRow, now: int) -> int:
    """The job's own delivery of the run's result, per its ``delivery_mode``; returns the parts enqueued."""
    mode = job.delivery_mode
    ok = run.status == "ok"
    if mode == "none" or (mode == "on_success" and not ok) or (mode == "on_failure" and ok):
        return 0
    head = "completed" if ok else "failed"
    body = f"[Job {head}] {job.name}\nStatus: {run.status}\nDuration: {(run.duration_ms or 0) / 1000:.1f}s"
    if not ok and run.error_message:
        body += f"\nError: {run.error_message}"
    if run.summary:
        body += f"\n\n{run.summary}"
    channel = job.delivery_channel or ""  # a delivering job has its channel (the spec requires it)
    view = run.to_dict()  # the outbox takes the run as the mapping a read returns
    attachments = outbox.attachments(view, channel, body)
    return outbox.enqueue(tx, view, channel, job.delivery_to, body, f"{run.id}:delivery", now, attachments=attachments)


#: Error codes that say the scheduler lost or gave up the run (fencing, lease, cancellation,
#: a dead dispatcher), not that the watched thing is wrong: a watchdog never alerts on them.
WATCHDOG_NO_ALERT_CODES = frozenset({
    "STALE_FENCE", "LEASE_LOST", "DISPATCHER_LOST", "RECOVERY_BLOCKED", "COMPLETION_FAILED", "RUN_CANCELLED", "EXECUTOR_ABANDONED",
})


def watchdog_alerts(status: str, error_code: str | None) -> bool:
    """Whether a finished watchdog run raises an alert: only when the check itself failed.

    The check failed when it ran and answered ``error`` (including an executor that could
    not run it) or ``timeout``. Nothing else alerts: ``ok``; ``cancelled`` and ``skipped``
    (no answer); ``crashed`` (the dispatcher died: recovery records it, and an at-least-once
    job runs the check again); and an error whose code is a fencing, lease or cancellation
    problem (``WATCHDOG_NO_ALERT_CODES``), which says nothing about what the check watches.
    This is the only place the decision is made (executors report results, never alerts).
    """
    return status in ("error", "timeout") and error_code not in WATCHDOG_NO_ALERT_CODES


def _watchdog(tx: Tx, outbox: Outbox, job: CountedJob, run: RunRow, now: int, actor: str | None) -> int:
    """A watchdog's consequences: an alert for a failed check, and self-destruct (disable) after a passing one;
    returns the alert parts enqueued."""
    if job.job_type != "watchdog":
        return 0
    parts = 0
    if job.watchdog_alert_channel and watchdog_alerts(run.status, run.error_code):
        body = f"[Watchdog alert] {job.name}: check {run.status} ({run.error_code or 'failed'})"
        parts = outbox.enqueue(tx, run.to_dict(), job.watchdog_alert_channel, job.watchdog_alert_to, body,
                               f"{run.id}:watchdog-alert", now)
    if run.status == "ok" and job.watchdog_self_destruct:
        reason = "watchdog self-destructed after a passing check"
        state.execute(tx, "self_destruct_job", job_id=job.id, reason=reason, now=now)
        transitions.cancel_pending_work(tx, job.id, reason=reason, now=now, actor=actor)
        append_event(tx, "job.watchdog_self_destructed", job_id=job.id, run_id=run.id, actor=actor, at=now)
    return parts
