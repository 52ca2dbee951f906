"""Worker supervision: the runs executing on the pool, their results, and enforcing the executor contract.

Shortly after a run's deadline the dispatcher cancels it, and a worker that still has not
returned a kill grace later is abandoned (left running on a daemon thread, its late result
discarded) while the dispatcher commits the run itself (``timeout`` /
``EXECUTOR_DEADLINE_EXCEEDED``, or ``cancelled`` / ``EXECUTOR_ABANDONED`` after a cancel
request or at shutdown).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import short_run_id
from scheduler.base.timeutil import now_ms
from scheduler.core import lease as leases
from scheduler.core.claimed import ClaimedRun
from scheduler.core.contracts import LoadedExecutors
from scheduler.core.dispatcher.config import ABANDON_SLACK_S, DEADLINE_SLACK_S, MAX_SLEEP_S, DispatcherConfig, clock
from scheduler.core.dispatcher.pool import WorkerPool
from scheduler.core.events import append_event
from scheduler.core.execution import (
    INTERRUPTED_VERIFICATION,
    CancellationToken,
    ExecutionResult,
    RecoveryRequest,
    verification_interrupted,
)
from scheduler.core.fenced_writes import FencedWrite, FencedWriter
from scheduler.core.members import Recoverable
from scheduler.core.participants import EvidenceRows
from scheduler.core.rows import JSONObject, SQLValue
from scheduler.core.spec import spec_from_row
from scheduler.core.store.base import Store

log = logging.getLogger("scheduler.core.dispatcher")


class WritesFenced(Protocol):
    """What a run control writes through: the dispatcher's group writer of fenced bookkeeping writes."""

    fenced_writes: FencedWriter


class DbRunControl(CancellationToken):
    """The dispatcher's ``RunControl``: cancellation token plus fenced bookkeeping writes."""

    def __init__(self, dispatcher: WritesFenced, run_id: str, job_id: str) -> None:
        super().__init__()
        self._writes = dispatcher.fenced_writes
        self.run_id = run_id
        self.job_id = job_id

    def _fenced(self, values: dict[str, SQLValue] | None, kind: str, data: Mapping[str, object] | None) -> None:
        """Commit through the dispatcher's group writer (one transaction for what all workers wrote meanwhile);
        returns once committed, raises ``STALE_FENCE`` / ``LEASE_LOST`` for this write alone (``fenced_writes``)."""
        self._writes.write(FencedWrite(run_id=self.run_id, job_id=self.job_id, kind=kind, data=data, values=values))

    def record_handle(self, handle: JSONObject) -> None:
        """Durably record the executor's handle on its work (before that work may act); fenced."""
        self._fenced({"executor_handle": json.dumps(handle, sort_keys=True, default=str), "process_state": "running"},
                     "run.handle_recorded", {"handle": handle})
        self.handle = dict(handle)  # kept for stopping the work should the worker have to be abandoned

    def record_termination(self, how: str) -> None:
        """Durably record that the executor stopped its work, and how."""
        try:
            self._fenced({"process_state": "terminated", "process_signal": how, "process_terminated_at": now_ms()},
                         "run.process_terminated", {"signal": how, "reason": self._reason})
        except SchedulerError as exc:  # lease lost: the recovering dispatcher records the end instead
            log.warning("could not record termination of run %s: %s", self.run_id, exc.message)

    def event(self, kind: str, data: Mapping[str, object] | None = None) -> None:
        """Append an audit event for this run; committed (grouped with other workers' writes) before it returns."""
        self._fenced(None, kind, data)


@attrs.define(eq=False)
class ActiveRun:
    """A run executing on a worker, as the loop supervises it."""

    control: DbRunControl
    started: ClaimedRun
    #: Epoch ms after which the run is past its ``run_timeout_ms``.
    deadline_ms: int
    #: ``time.monotonic()`` when the loop first saw the run cancelled (by us, a user, shutdown, a lost lease).
    cancelled_at: float | None = None
    #: The result the dispatcher committed in place of an executor it cut loose.
    abandoned: ExecutionResult | None = None


class Workers:
    """The runs on the pool (``active``), the results they hand back (``finished``) and their supervision."""

    def __init__(self, store: Store, config: DispatcherConfig, *, owner: str, executors: LoadedExecutors,
                 evidence: EvidenceRows, fenced: WritesFenced,
                 execute: Callable[[ClaimedRun, DbRunControl], None],
                 finished: queue.SimpleQueue[tuple[ClaimedRun, ExecutionResult]],
                 stats: dict[str, int], say: Callable[[str], None] | None, wake: threading.Event) -> None:
        self.store = store
        self.config = config
        self.owner = owner
        self.executors = executors
        #: Gives a run committed without its worker its interrupted evidence row (jobs declaring evidence).
        self.evidence = evidence
        #: Where a run's bookkeeping writes go (``DbRunControl``).
        self.fenced = fenced
        #: The worker-side run (``execute.RunExecution.execute``): what a worker thread does with a started run.
        self.execute = execute
        self.stats = stats
        self.say = say or (lambda _msg: None)
        #: Whether anyone reads ``say``: a quiet dispatcher does not even format the per-run lines.
        self.says = say is not None
        self.wake = wake
        self.pool = WorkerPool(config.concurrency, "run")
        self.active: dict[str, ActiveRun] = {}
        self.lock = threading.Lock()
        #: Results handed from workers to the loop, which commits them in groups.
        self.finished = finished
        #: Results whose commit met a busy database: committed on a later pass.
        self.retry: list[tuple[ClaimedRun, ExecutionResult]] = []
        #: Runs whose worker was cut loose: a late result from it is discarded.
        self.abandoned: set[str] = set()

    def submit(self, s: ClaimedRun, lines: list[str] | None = None) -> None:
        """Hand a started run to a worker; its start line goes to ``lines`` (said by the caller) or is said now."""
        control = DbRunControl(self.fenced, s.run_id, s.job.id)
        self.stats["started"] += 1
        if self.says:
            line = f"{clock()} start  {s.job.name} run {short_run_id(s.run_id)} ({s.dispatch_kind}, attempt {s.attempt})"
            if lines is None:
                self.say(line)
            else:
                lines.append(line)
        entry = ActiveRun(control=control, started=s, deadline_ms=s.started_at + int(s.job.run_timeout_ms or 0))
        with self.lock:
            self.active[s.run_id] = entry
        self.pool.submit(lambda: self.execute(s, control))

    def running(self) -> int:
        """Runs on the pool now (abandoned ones until their result is committed)."""
        with self.lock:
            return len(self.active)

    def cancel_all(self, reason: str) -> None:
        """Cancel every running run's token (shutdown, a lost lease)."""
        with self.lock:
            for entry in self.active.values():
                entry.control.cancel(reason)

    def take_finished(self) -> list[tuple[ClaimedRun, ExecutionResult]]:
        """Results to commit this pass: those kept after a busy database, then new ones.

        A late result of a worker we abandoned is discarded here (the run was already
        committed without it); a result that comes after the dispatcher cancelled the
        run for its deadline is recorded as the ``timeout`` it is.
        """
        items, self.retry = self.retry, []
        finished = self.finished
        while not finished.empty():  # the loop is its only reader: a queue not empty has a result to get
            items.append(finished.get_nowait())
        if not items:
            return items
        with self.lock:  # once for the pass's results, not once each
            entries = [self.active.get(s.run_id) for s, _result in items]
        kept = []
        for (s, result), entry in zip(items, entries, strict=True):
            if entry is None or (entry.abandoned is not None and result is not entry.abandoned):
                if s.run_id in self.abandoned:  # else: a run given up with the lease, nothing to say
                    self.abandoned.discard(s.run_id)
                    self.stats["late_results_discarded"] += 1
                    self.say(f"{clock()} discarding late result of abandoned run {short_run_id(s.run_id)} ({result.status})")
                continue
            kept.append((s, past_deadline(entry, result)))
        return kept

    def forget(self, finished: list[tuple[ClaimedRun, ExecutionResult]]) -> None:
        """Drop committed (or given up) runs from the active set."""
        with self.lock:
            for s, _result in finished:
                self.active.pop(s.run_id, None)

    def propagate_cancels(self) -> None:
        """Cancel the token of every running run someone asked to cancel (``runs cancel``)."""
        with self.lock:
            if not self.active:
                return
            ids = list(self.active)
        with self.store.read() as tx:
            marks = ", ".join("?" for _ in ids)
            rows = tx.all(f"SELECT id FROM runs WHERE id IN ({marks}) AND cancel_requested_at IS NOT NULL", ids)
        with self.lock:
            for r in rows:
                entry = self.active.get(r["id"])
                if entry and not entry.control.is_cancelled():
                    entry.control.cancel("user")

    def supervise(self) -> float:
        """Enforce deadlines and cancellations the executor does not honour; seconds until the next check.

        ``DEADLINE_SLACK_S`` after a run's deadline its token is cancelled (reason
        ``deadline``); ``kill_grace_s + ABANDON_SLACK_S`` after any cancellation, a worker
        that still has not returned is abandoned and the run is committed without it.
        """
        mono, wall = time.monotonic(), now_ms()
        abandon_after = self.config.kill_grace_s + ABANDON_SLACK_S
        next_in = MAX_SLEEP_S
        with self.lock:
            entries = [e for e in self.active.values() if e.abandoned is None]
        for e in entries:
            if e.cancelled_at is None:
                if not e.control.is_cancelled():
                    due_in = (e.deadline_ms - wall) / 1000 + DEADLINE_SLACK_S
                    if due_in > 0:
                        next_in = min(next_in, due_in)
                        continue
                    e.control.cancel("deadline")
                    self.say(f"{clock()} deadline passed for {e.started.job.name} run {short_run_id(e.started.run_id)}: cancelling it")
                e.cancelled_at = mono
            left = e.cancelled_at + abandon_after - mono
            if left > 0:
                next_in = min(next_in, left)
                continue
            self.abandon(e, abandon_after)
            next_in = 0.0
        return max(0.0, next_in)

    def abandon(self, e: ActiveRun, waited_s: float) -> None:
        """Cut a worker loose: the run gets a result from the dispatcher, the worker's own comes too late."""
        reason = e.control.cancel_reason() or "user"
        s = e.started
        try:
            executor = spec_from_row(s.job).executor_name()
        except Exception:  # noqa: BLE001 - only for the message
            executor = "?"
        details = {"abandoned": True, "cancel_reason": reason, "waited_s": round(waited_s, 1)}
        if reason == "deadline":
            result = ExecutionResult(
                status="timeout", error_code="EXECUTOR_DEADLINE_EXCEEDED", details=details,
                error_message=f"executor {executor!r} ignored the run's {s.job.run_timeout_ms} ms deadline and did not"
                              f" return within {waited_s:.1f}s of being cancelled; its worker was abandoned",
            )
        else:
            why = {"shutdown": "the dispatcher was stopping", "user": "a cancel request",
                   "lease_lost": "the dispatcher lost its lease"}.get(reason, reason)
            result = ExecutionResult(
                status="cancelled", error_code="EXECUTOR_ABANDONED", details=details,
                error_message=f"executor {executor!r} did not return within {waited_s:.1f}s of being cancelled ({why});"
                              " its worker was abandoned",
            )
        handle = getattr(e.control, "handle", None)
        if verification_interrupted(handle):  # the post-success check was still running: it was cut short
            result = attrs.evolve(result, verification=dict(INTERRUPTED_VERIFICATION))
        e.abandoned = result
        if s.job.evidence:  # committed without its worker: an interrupted evidence row, as recovery gives
            self.evidence.interrupt(s.outcomes, result.error_code or "EXECUTOR_ABANDONED")
        self.abandoned.add(s.run_id)
        self.stats["abandoned"] += 1
        self.say(f"{clock()} abandoning {s.job.name} run {short_run_id(s.run_id)}:"
                 f" executor {executor!r} ignored cancellation ({reason})")
        self.finished.put((s, result))
        self.wake.set()
        self.stop_abandoned_work(s, handle)

    def stop_abandoned_work(self, s: ClaimedRun, handle: JSONObject | None) -> None:
        """An abandoned worker's executor ignored cancellation: ask its ``recover`` to stop the work it started.

        The same call crash recovery makes (the handle the run recorded, this host), on a
        daemon thread so the loop never waits for it; the outcome is an audit event.
        """
        if handle is None:
            return
        executor = self.executors.peek(spec_from_row(s.job).executor_name())
        if not isinstance(executor, Recoverable):
            return
        recover_fn = executor.recover
        request = RecoveryRequest(run_id=s.run_id, job_id=s.job.id, handle=handle, owner=self.owner,
                                  owner_host=leases.owner_host(self.owner), kill_grace_s=self.config.kill_grace_s)

        def stop() -> None:
            try:
                outcome = recover_fn(request)
                with self.store.transaction() as tx:
                    append_event(tx, "run.abandoned_work_stopped", job_id=s.job.id, run_id=s.run_id, actor=self.owner,
                                 data={"state": getattr(outcome, "state", None), "detail": getattr(outcome, "detail", None)})
            except Exception:  # best effort; crash recovery is not involved (the run is ended)
                log.exception("stopping the work of abandoned run %s failed", s.run_id)

        threading.Thread(target=stop, name=f"stop-{short_run_id(s.run_id)}", daemon=True).start()


def past_deadline(entry: ActiveRun, result: ExecutionResult) -> ExecutionResult:
    """A result that arrives after the dispatcher cancelled the run for its deadline is a ``timeout``.

    The executor's outputs are kept; its status is not (it typically says ``cancelled``,
    not knowing why). An executor that reported ``timeout`` itself keeps its own code.
    """
    if entry.control.cancel_reason() != "deadline" or result.status == "timeout":
        return result
    said = result.status + (f" {result.error_code}" if result.error_code else "")
    return attrs.evolve(
        result, status="timeout", error_code="EXECUTOR_DEADLINE_EXCEEDED",
        error_message=f"run passed its {entry.started.job.run_timeout_ms} ms deadline and was cancelled by the"
                      f" dispatcher (the executor reported {said})",
    )
