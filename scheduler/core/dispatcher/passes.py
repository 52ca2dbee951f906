"""The dispatcher's pass: complete finished runs, materialise due slots and claim new runs, in one transaction.

It sleeps until the earliest due time (an indexed query) or until another process changes
the database, so a due job starts within milliseconds. This is the hot path
(``bench/throughput``): nothing here is done per run that the pass can do once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import short_run_id
from scheduler.base.timeutil import now_ms
from scheduler.core import lease as leases
from scheduler.core.claimed import ClaimedRun
from scheduler.core.completion import complete_runs_in
from scheduler.core.contracts import Expiry
from scheduler.core.dispatcher.config import (
    BUSY_BACKOFF_MAX_S,
    CANCEL_CHECK_MS,
    DISK_FULL_BACKOFF_MAX_S,
    GROUP_WINDOW_S,
    MAX_SLEEP_S,
    WAIT_SLICE_S,
    DispatcherConfig,
    clock,
    is_transient,
    reached,
)
from scheduler.core.dispatcher.lease_keeper import LeaseKeeper
from scheduler.core.dispatcher.workers import Workers
from scheduler.core.duty import Duty
from scheduler.core.events import DISK_FULL_EVENT, append_event
from scheduler.core.events import batched as batched_events
from scheduler.core.execution import ExecutionResult
from scheduler.core.fenced_writes import FencedWrite
from scheduler.core.observers import Observers
from scheduler.core.participants import CompletionParticipants
from scheduler.core.queue import claim_and_start_in, materialize_due_in, next_due_parts
from scheduler.core.rows import RunRow, SQLValue
from scheduler.core.runs import StaleFence
from scheduler.core.store.base import Store, Tx
from scheduler.core.transitions import batched_finishes, committing, fail_completion

log = logging.getLogger("scheduler.core.dispatcher")


class RunMetrics(Protocol):
    """What the pass tells about each committed completion (``scheduler.ops.metrics.DispatcherMetrics``)."""

    def observe(self, started: ClaimedRun, run: dict[str, SQLValue]) -> None:
        """Count one committed completion (memory only, never a query)."""
        ...


class Pass:
    """One pass of the loop (``tick``) and the waiting between passes."""

    def __init__(self, store: Store, config: DispatcherConfig, *, keeper: LeaseKeeper, workers: Workers,
                 observers: Observers, expiries: tuple[Expiry, ...], completion: CompletionParticipants,
                 stats: dict[str, int], say: Callable[[str], None] | None) -> None:
        self.store = store
        self.config = config
        self.keeper = keeper
        self.workers = workers
        self.hooks = observers
        self.expiries = expiries
        #: What the completion transaction calls above core (delivery, evidence rows, proofs).
        self.completion = completion
        self.stats = stats
        self.say = say or (lambda _msg: None)
        #: Whether anyone reads ``say``: a quiet dispatcher does not even format the per-run lines.
        self.says = say is not None
        #: The duties running with the lease (told after each pass); filled when the lease is taken.
        self.duties: list[Duty] = []
        #: ``scheduler.ops.metrics.DispatcherMetrics`` when ``scheduler run --metrics-port`` serves them, else None.
        self.metrics: RunMetrics | None = None
        self.wake = workers.wake
        self._cancels_checked_at = 0
        self._busy_since: float | None = None
        self._busy_backoff = 0.0
        #: When (epoch ms) the current episode of a full database began (``DB_DISK_FULL``), None outside one.
        self.disk_full_since: int | None = None
        #: Passes that met the full database in the current episode.
        self._disk_full_attempts = 0
        #: Whether the next claim takes the newest due dispatches before the oldest (alternating: ``claim_candidates``).
        self._newest_first = False
        #: ``time.monotonic()`` at the end of the last pass that committed work.
        self._last_pass = 0.0
        #: Whether that pass started fewer runs than it had free workers for (work arriving one run at a time).
        self._trickle = False

    def tick(self, *, claim: bool = True) -> float:
        """One pass; returns how long to sleep.

        Finished runs are completed, due slots materialised and free workers given new
        runs in ONE write transaction (group commit: one commit for many runs). An idle
        pass costs one indexed read. After a pass that started fewer runs than it had
        free workers, this one starts ``GROUP_WINDOW_S`` after it at the earliest (a
        time-capped commit group). ``claim=False`` (during shutdown) only commits
        finished runs. A busy database raises ``DB_BUSY`` after keeping the finished
        results for the next pass.
        """
        lease = self.keeper.lease
        assert lease is not None
        workers = self.workers
        if self._trickle and claim:  # the last pass took all there was: gather the window's work (GROUP_WINDOW_S)
            rest = self._last_pass + GROUP_WINDOW_S - time.monotonic()
            if rest > 0:
                self.pause(rest)
        self.store.wait_for_change(0)  # arm: changes after this point (not before our reads) wake the next wait
        # The results first, then the clock: every result this pass completes was attested before the pass's ``now``,
        # so a run's recorded duration is never shorter than its evidence payload's (tests/test_pass_clock.py).
        finished = workers.take_finished()
        tick_now = now_ms()
        if tick_now - self._cancels_checked_at >= CANCEL_CHECK_MS:
            workers.propagate_cancels()
            self._cancels_checked_at = tick_now
        if not claim and not finished:
            return CANCEL_CHECK_MS / 1000
        if not finished:
            with self.store.read() as tx:
                jobs_due, dispatch_due, approval_due = next_due_parts(tx)
            due = min((v for v in (jobs_due, dispatch_due, approval_due) if v is not None), default=None)
            if due is None or due > tick_now:
                for duty in self.duties:  # an idle pass follows a change another process committed (a part, perhaps)
                    duty.after_pass(True)
                return MAX_SLEEP_S if due is None else min(max(0.0, (due - now_ms()) / 1000), MAX_SLEEP_S)
            if claim and not reached(jobs_due, tick_now) and not reached(approval_due, tick_now):
                with workers.lock:
                    pool_full = len(workers.active) >= self.config.concurrency
                if pool_full:  # only dispatches are due and no worker could take one: a finishing run wakes us
                    return MAX_SLEEP_S / 2
        with workers.lock:
            free = self.config.concurrency - len(workers.active) + len(finished)
        # The veto hook is called per candidate: only when a plugin implements it.
        veto = self.hooks.dispatch_veto if self.hooks.wants("scheduler_dispatch_veto") else None
        committed: list[tuple[ClaimedRun, RunRow]] = []
        started: list[ClaimedRun] = []
        created = 0
        parts: tuple[int | None, int | None, int | None] = (None, None, None)
        writes = self.workers.fenced.fenced_writes
        joined: list[FencedWrite] = []
        writes.pass_opens()
        try:
            try:
                # committing: observers hear of this pass's transitions (starts, skips, completions) once it committed.
                # batched_events: the pass's run.started/run.finished rows go in as one INSERT before the commit.
                # batched_finishes: the completed runs' dispatch rows go done in one UPDATE.
                with committing(self.store, self.hooks) as tx, batched_events(tx), batched_finishes(tx):
                    leases.assert_live(tx, lease, now=tick_now)
                    committed = self.complete(tx, finished, now=tick_now)
                    if claim:
                        created = materialize_due_in(tx, now=tick_now)
                        for expire in self.expiries:  # timeouts release or cancel their runs before claiming
                            expire(tx, now=tick_now)
                        if free > 0:
                            self._newest_first = not self._newest_first
                            started = claim_and_start_in(tx, lease, limit=free, now=tick_now, veto=veto,
                                                         newest_first=self._newest_first)
                        parts = next_due_parts(tx)
                    # Last: the workers' process identities queued by now ride this commit (fenced_writes.join).
                    writes.join(tx, lease, joined)
            except BaseException:
                writes.give_back(joined)
                raise
            finally:
                writes.pass_closes()
            writes.acknowledge(joined)
        except leases.LeaseLost:
            workers.forget(finished)
            raise
        except SchedulerError as exc:
            if is_transient(exc):
                workers.retry = finished + workers.retry  # nothing was committed: try these again next pass
                raise
            if not finished:
                raise
            # One bad completion must not take the others (or new claims) down: commit them one by one.
            log.warning("group commit failed (%s); completing runs one at a time", exc.message)
            committed, started, created = self.complete_each(finished), [], 0
        self._last_pass = time.monotonic()
        self._trickle = bool(started or committed) and len(started) < free
        retried = {s.run_id for s, _r in workers.retry}
        workers.forget([item for item in finished if item[0].run_id not in retried])
        if created:
            self.store.notify_change()  # other dispatchers (PostgreSQL) may claim the new slots too
        for duty in self.duties:  # completions and approval gates of this pass may have enqueued outbox parts
            duty.after_pass(False)
        # The pass's start and end lines are said at once (one write for the pass, not one per line).
        lines: list[str] | None = [] if self.says and (started or committed) else None
        for s in started:  # first: a run committed as running must reach a worker whatever happens next
            workers.submit(s, lines)
        for s, run in committed:
            try:
                self.report(s, run, lines)
            except Exception:  # the run is committed; a failing report (hook, read) must not stop the loop
                log.exception("reporting the end of run %s failed", s.run_id)
        if lines:
            try:
                self.say("\n".join(lines))
            except Exception:  # the runs are committed and submitted; output must not stop the loop
                log.exception("writing the pass's run lines failed")
        if not claim:
            return 0.0 if committed else CANCEL_CHECK_MS / 1000
        jobs_due, dispatch_due, approval_due = parts
        if started:
            with workers.lock:
                pool_full = len(workers.active) >= self.config.concurrency
            if not pool_full:
                return 0.0  # workers left: the next pass starts whatever else is due
            # Every worker is busy: a due dispatch waits for one (its run's end wakes us), so the loop leaves the CPU
            # to the runs it just started instead of coming straight back; due jobs and approval timeouts still need
            # a pass (their slots are accounted for, their runs released).
            dispatch_due = None
        due = min((v for v in (jobs_due, dispatch_due, approval_due) if v is not None), default=None)
        if due is None:
            return MAX_SLEEP_S
        if due <= tick_now:
            # Due work this pass could not start (pool full, or waiting behind a running run of
            # the same job): sleep until something changes (a run finishing wakes us).
            return MAX_SLEEP_S / 2
        # Not due at the start of this pass (maybe due by now: then the loop comes straight back).
        return min(max(0.0, (due - now_ms()) / 1000), MAX_SLEEP_S)

    def complete(
        self, tx: Tx, finished: list[tuple[ClaimedRun, ExecutionResult]], *, now: int | None = None
    ) -> list[tuple[ClaimedRun, RunRow]]:
        """Complete runs inside the caller's ``committing`` transaction ``tx`` (its lease asserted); a run we no longer
        own is skipped, not fatal. With the pass's ``now``, retries and children due at once are claimed in the same pass.
        """
        lease = self.keeper.lease
        assert lease is not None
        now = now_ms() if now is None else now
        ended = complete_runs_in(tx, lease, [(s.run_id, result, s.outcomes) for s, result in finished],
                                 participants=self.completion, now=now)
        done: list[tuple[ClaimedRun, RunRow]] = []
        for (s, _result), run in zip(finished, ended, strict=True):
            if isinstance(run, StaleFence):
                self.stats["skipped_commits"] += 1
                self.say(f"{clock()} not committing run {short_run_id(s.run_id)}: {run.message}")
            else:
                done.append((s, run))
        return done

    def complete_each(self, finished: list[tuple[ClaimedRun, ExecutionResult]]) -> list[tuple[ClaimedRun, RunRow]]:
        """Commit runs one at a time; a run whose completion itself fails still ends (``COMPLETION_FAILED``)."""
        done: list[tuple[ClaimedRun, RunRow]] = []
        for i, item in enumerate(finished):
            try:
                with committing(self.store, self.hooks) as tx:
                    assert self.keeper.lease is not None
                    leases.assert_live(tx, self.keeper.lease)
                    done += self.complete(tx, [item])
            except leases.LeaseLost:
                raise
            except SchedulerError as exc:
                if not is_transient(exc):
                    log.exception("completion of run %s failed", item[0].run_id)
                    self.end_failed_completion(item[0], exc)
                    continue
                self.workers.retry.extend(finished[i:])  # busy database: the next pass tries these again
                break
            except Exception as exc:
                log.exception("completion of run %s failed", item[0].run_id)
                self.end_failed_completion(item[0], exc)
        return done

    def end_failed_completion(self, s: ClaimedRun, exc: Exception) -> None:
        """Nothing stays ``running`` forever: record the failed completion as the run's (fenced) error."""
        lease = self.keeper.lease
        assert lease is not None
        now = now_ms()
        message = f"completion failed: {type(exc).__name__}: {getattr(exc, 'message', exc)}"[:2000]
        # An evidence job's run gets its terminal (interrupted) evidence row too; should that fail, the run still ends.
        for with_evidence in ((True, False) if s.job.evidence else (False,)):
            try:
                with committing(self.store, self.hooks) as tx:
                    leases.assert_live(tx, lease)
                    if fail_completion(tx, s.run_id, owner=lease.owner, token=lease.token, message=message,
                                       now=now) and with_evidence:
                        self.completion.evidence.interrupted(tx, {"id": s.run_id}, now=now, actor=lease.owner,
                                                      error_code="COMPLETION_FAILED")
                return
            except leases.LeaseLost:
                raise
            except Exception:
                log.exception("could not record the failed completion of run %s%s", s.run_id,
                              " with its interrupted evidence" if with_evidence else "; recovery will end it")

    def report(self, s: ClaimedRun, run: RunRow, lines: list[str] | None = None) -> None:
        """After a completion committed: count it and print it (observers were told by ``committing``).

        ``lines``: the pass's output lines, said together by the caller (None: say it now, if anyone listens).
        """
        self.stats["finished"] += 1
        if self.metrics is not None:
            self.metrics.observe(s, run.to_dict())
        if not self.says:
            return
        took = run.duration_ms or 0
        detail = f" [{run.error_code}]" if run.error_code and run.status != "ok" else ""
        line = f"{clock()} {run.status:<6} {s.job.name} run {short_run_id(s.run_id)} in {took} ms{detail}"
        if lines is None:
            self.say(line)
        else:
            lines.append(line)

    def pause(self, seconds: float) -> None:
        """Let a commit group's window pass (``GROUP_WINDOW_S``): a plain sleep, since a finishing run must not cut it."""
        time.sleep(seconds)

    def wait(self, timeout: float) -> None:
        """Sleep until ``timeout``, a finished run (in-process event) or another process's change."""
        end = time.monotonic() + timeout
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0 or self.wake.wait(min(WAIT_SLICE_S, remaining)):
                break
            if self.store.wait_for_change(0):
                break
        self.wake.clear()

    def db_busy(self, exc: SchedulerError) -> float:
        """A pass met a busy (or full: ``DB_DISK_FULL``) database: say so once per episode; returns the back-off
        before the next attempt (doubling, at most ``BUSY_BACKOFF_MAX_S``, or ``DISK_FULL_BACKOFF_MAX_S`` when full)."""
        full = exc.code == "DB_DISK_FULL"
        if full:
            self._disk_full_attempts += 1
            if self.disk_full_since is None:
                self.disk_full_since = now_ms()
                if not self.says:  # quiet (--json): the log still tells
                    log.warning("database full: %s; waiting and retrying", exc.message)
        if self._busy_since is None:
            self._busy_since = time.monotonic()
            what = "full" if full else "busy"
            self.say(f"{clock()} database {what} ({exc.code}): {exc.message}; waiting and retrying")
        ceiling = DISK_FULL_BACKOFF_MAX_S if full else BUSY_BACKOFF_MAX_S
        self._busy_backoff = min(ceiling, max(0.05, self._busy_backoff * 2))
        return self._busy_backoff

    def db_available(self) -> None:
        """A pass went through: say so when it ends a busy-database episode; record a disk-full one (``status``)."""
        if self._busy_since is not None:
            self.say(f"{clock()} database available again after {time.monotonic() - self._busy_since:.1f}s")
            self._busy_since, self._busy_backoff = None, 0.0
        if self.disk_full_since is not None:
            since, attempts = self.disk_full_since, self._disk_full_attempts
            until = now_ms()
            try:
                with self.store.transaction() as tx:
                    append_event(tx, DISK_FULL_EVENT, actor=self.keeper.owner,
                                 data={"since": since, "until": until, "attempts": attempts})
            except SchedulerError as exc:  # full again, or busy: the next pass that goes through records it
                log.warning("could not record the disk-full episode: %s", exc.message)
                return
            if not self.says:
                log.warning("database writable again after %.1fs full (%d attempts)", (until - since) / 1000, attempts)
            self.disk_full_since, self._disk_full_attempts = None, 0
