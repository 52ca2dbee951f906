"""The dispatcher: holds a fenced lease, turns due slots into runs, executes them in a bounded pool.

It sleeps until the earliest due time (an indexed query) or until another process
changes the database (a CLI ``jobs add``/``run``/``cancel``), so a due job starts
within milliseconds and CLI changes take effect without a restart or a tick.
Workers commit only while the lease is live and the run is still theirs; if the
lease is lost the dispatcher aborts its runs and exits without committing.

The executor contract is enforced, not trusted: shortly after a run's deadline the
dispatcher cancels it, and a worker that still has not returned a kill grace later
is abandoned (left running on a daemon thread, its late result discarded) while the
dispatcher commits the run itself (``timeout`` / ``EXECUTOR_DEADLINE_EXCEEDED``, or
``cancelled`` / ``EXECUTOR_ABANDONED`` after a cancel request or at shutdown). So
neither a run nor ``scheduler run --grace`` waits on an executor that ignores it.
A busy database (``DB_BUSY``) is waited out and retried; a lease that ran out in the
meantime is never resurrected: the dispatcher steps down (``LEASE_LOST``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import attrs

from scheduler.core import lease as leases
from scheduler.approvals.decisions import expire_due as expire_due_approvals
from scheduler.delivery.outbox import parts_enqueued as delivery_parts_enqueued
from scheduler.core.outputs import default_artifacts_root
from scheduler.core.completion import complete_run_in
from scheduler.base.errors import SchedulerError
from scheduler.core.events import append_event, batched as batched_events
from scheduler.core.fenced_writes import FencedWrite, FencedWriter
from scheduler.core.dispatcher.execute import RunExecution
from scheduler.core.execution import CancellationToken, ExecutionResult, RecoveryRequest
from scheduler.plugins.hooks import Hooks
from scheduler.plugins.loaded import LoadedProviders
from scheduler.core.queue import StartedRun, claim_and_start, materialize_due, next_due_parts
from scheduler.core.recovery import recover
from scheduler.core.runs import StaleFence
from scheduler.core.spec import spec_from_row
from scheduler.core.store.base import Store
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.transitions import batched_finishes, committing, fail_completion, fenced_update

log = logging.getLogger(__name__)

#: Longest the loop sleeps without looking at the database.
MAX_SLEEP_S = 1.0
#: How often the loop looks for cancel requests of its running runs (well inside the 250 ms promise).
CANCEL_CHECK_MS = 100
#: How often a sleeping loop looks for other processes' changes (well inside the 250 ms promise).
WAIT_SLICE_S = 0.02
#: How long a failed executor load is remembered before the dispatcher tries again.
EXECUTOR_RETRY_S = 30.0
#: After a run's deadline, how long its executor gets to end the run itself (``timeout``) before
#: the dispatcher cancels it: room for clock granularity, so a self-enforcing executor is never raced.
DEADLINE_SLACK_S = 0.5
#: After the dispatcher cancelled a run, how long on top of ``kill_grace_s`` the executor gets to
#: return (stopping a process group takes up to the kill grace) before its worker is abandoned.
ABANDON_SLACK_S = 1.0
#: Longest pause between attempts while the database stays busy (``DB_BUSY``).
BUSY_BACKOFF_MAX_S = 1.0
#: At shutdown, how long to wait for the lease-renewal thread to finish a statement (it may be
#: waiting out a busy database) before the store can be closed under it.
RENEW_JOIN_S = 15.0
#: Codes of database errors worth waiting out, as opposed to a bug or a lost lease.
TRANSIENT_DB_CODES = frozenset({"DB_BUSY", "DB_UNAVAILABLE"})


def is_transient(exc: BaseException) -> bool:
    """True for a database error that may go away by itself (busy, briefly unavailable).

    The dispatcher waits such errors out and retries instead of crashing; a lost lease
    is never transient.
    """
    if not isinstance(exc, SchedulerError) or isinstance(exc, leases.LeaseLost):
        return False
    return bool(getattr(exc, "retryable", False)) or exc.code in TRANSIENT_DB_CODES


class WorkerPool:
    """Daemon threads that run executor calls; grows past its size only to replace stuck workers.

    Why not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined at
    interpreter exit (a stuck executor kept ``scheduler run`` alive for as long as it
    slept), and a stuck worker keeps its slot forever. Here a task goes to an idle
    worker or to a new thread, so a worker the dispatcher abandoned never holds up new
    runs (the dispatcher bounds how many runs it submits); a surplus thread exits when
    its task finally returns.
    """

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self._name = name
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._busy = 0
        self._seq = 0
        self._closed = False

    @property
    def threads(self) -> int:
        """Worker threads alive (idle, busy or stuck)."""
        return self._threads

    @property
    def busy(self) -> int:
        """Workers running a task now (after a stop: the stuck ones)."""
        return self._busy

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on an idle worker, or on a new daemon thread when none is idle."""
        with self._lock:
            if self._closed:
                raise RuntimeError("worker pool is closed")
            self._busy += 1
            if self._idle > 0:
                self._idle -= 1  # reserved: that worker takes this task
            else:
                self._threads += 1
                self._seq += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._seq}", daemon=True).start()
        self._tasks.put(fn)

    def _work(self) -> None:
        while True:
            fn = self._tasks.get()
            if fn is None:
                with self._lock:
                    self._threads -= 1
                return
            try:
                fn()
            except BaseException:  # the dispatcher's task reports its own failures; never lose the worker silently
                log.exception("worker task failed")
            with self._lock:
                self._busy -= 1
                if self._closed or self._threads > self.size:
                    self._threads -= 1  # a replacement took our place meanwhile (or we are stopping)
                    return
                self._idle += 1

    def close(self) -> None:
        """Let idle workers exit; busy (stuck) ones are not waited for: they are daemon threads."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._tasks.put(None)


@attrs.define(eq=False)
class _ActiveRun:
    """A run executing on a worker, as the loop supervises it."""

    control: DbRunControl
    started: StartedRun
    #: Epoch ms after which the run is past its ``run_timeout_ms``.
    deadline_ms: int
    #: ``time.monotonic()`` when the loop first saw the run cancelled (by us, a user, shutdown, a lost lease).
    cancelled_at: float | None = None
    #: The result the dispatcher committed in place of an executor it cut loose.
    abandoned: ExecutionResult | None = None


@attrs.define
class DispatcherConfig:
    """Tunables of one dispatcher process."""

    concurrency: int = 4
    lease_ttl_ms: int = 15_000
    #: One dispatcher per database (SQLite default) or several sharing the work (PostgreSQL).
    exclusive: bool | None = None
    grace_s: float = 10.0
    kill_grace_s: float = 2.0
    recovery_interval_ms: int | None = None
    artifacts_root: Path | None = None
    owner: str | None = None


class DbRunControl(CancellationToken):
    """The dispatcher's ``RunControl``: cancellation token plus fenced bookkeeping writes."""

    def __init__(self, dispatcher: Dispatcher, run_id: str, job_id: str) -> None:
        super().__init__()
        self._d = dispatcher
        self.run_id = run_id
        self.job_id = job_id

    def _fenced(self, values: dict[str, Any] | None, kind: str, data: dict[str, Any] | None) -> None:
        """Commit through the dispatcher's group writer (one transaction for what all workers wrote meanwhile);
        returns once committed, raises ``STALE_FENCE`` / ``LEASE_LOST`` for this write alone (``fenced_writes``)."""
        self._d.fenced_writes.write(FencedWrite(run_id=self.run_id, job_id=self.job_id, kind=kind, data=data, values=values))

    def record_handle(self, handle: dict[str, Any]) -> None:
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

    def event(self, kind: str, data: dict[str, Any] | None = None) -> None:
        """Append an audit event for this run; committed (grouped with other workers' writes) before it returns."""
        self._fenced(None, kind, data)


class Dispatcher:
    """One ``scheduler run`` process."""

    def __init__(self, store: Store, config: DispatcherConfig | None = None, *, hooks: Hooks | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.config = config or DispatcherConfig()
        self.owner = self.config.owner or leases.new_owner_id()
        exclusive = self.config.exclusive if self.config.exclusive is not None else store.exclusive_dispatch
        self.exclusive = exclusive
        self.lease_name = "dispatcher" if exclusive else f"dispatcher:{self.owner}"
        self.lease: leases.Lease | None = None
        #: The singleton ``maintenance`` lease (shared mode only), while we hold it.
        self._maint: leases.Lease | None = None
        self.hooks = hooks
        self.say = say or (lambda _msg: None)
        #: Whether anyone reads ``say``: a quiet dispatcher does not even format the per-run lines.
        self._says = say is not None
        self.artifacts_root = self.config.artifacts_root or default_artifacts_root(store.local_path)
        self._pool = WorkerPool(self.config.concurrency, "run")
        #: Group commit of the workers' ``RunControl`` writes (its thread starts on the first one).
        self.fenced_writes = FencedWriter(store, lambda: self.lease, self.owner)
        self._active: dict[str, _ActiveRun] = {}
        self._active_lock = threading.Lock()
        self._wake = threading.Event()
        #: Results handed from workers to the loop, which commits them in groups.
        self._finished: queue.SimpleQueue[tuple[StartedRun, ExecutionResult]] = queue.SimpleQueue()
        #: Results whose commit met a busy database: committed on a later pass.
        self._retry: list[tuple[StartedRun, ExecutionResult]] = []
        #: Runs whose worker was cut loose: a late result from it is discarded.
        self._abandoned: set[str] = set()
        self._stop = threading.Event()
        #: A second stop request: cancel running work now instead of waiting out the grace period.
        self._hurry = threading.Event()
        #: SIGHUP: reload the settings file on the loop's next pass (``request_reload``).
        self._reload = threading.Event()
        #: ``scheduler.ops.metrics.DispatcherMetrics`` when ``scheduler run --metrics-port`` serves them, else None.
        self.metrics: Any = None
        self._lost: str | None = None
        self._executors = LoadedProviders("executor", unavailable_code="EXECUTOR_NOT_AVAILABLE", noun="executor",
                                          retry_s=EXECUTOR_RETRY_S)
        self._cancels_checked_at = 0
        self._pidfile: Any = None
        self._released = False
        self._renew_thread: threading.Thread | None = None
        self._renew_stop = threading.Event()
        #: The outbox consumer (``scheduler.delivery.outbox``), started with the lease.
        self.delivery: Any = None
        #: The retention duty's thread (``scheduler.ops.retention``), started with the lease.
        self.retention: Any = None
        self._busy_since: float | None = None
        self._busy_backoff = 0.0
        #: The worker-side run (``execute``): what a worker thread does with a started run.
        self._worker = RunExecution(store=store, executor=self._executor, artifacts_root=self.artifacts_root,
                                    finished=self._finished, wake=self._wake)
        self.stats = {"started": 0, "finished": 0, "skipped_commits": 0, "abandoned": 0, "late_results_discarded": 0}

    # -- lifecycle -------------------------------------------------------------------------------

    def request_stop(self, *_args: Any) -> None:
        """Stop claiming new work (SIGTERM/SIGINT); running work gets the grace period.

        A second request (a second SIGTERM/SIGINT) stops waiting: running work is
        cancelled at once, and what does not return within the kill grace is abandoned.
        Safe in a signal handler: it only sets events.
        """
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()
        self._wake.set()

    def request_reload(self, *_args: Any) -> None:
        """Reload the settings file (SIGHUP, ``systemctl reload``) on the loop's next pass.

        Safe in a signal handler: it only sets events; the loop does the reading, so a
        handler never runs inside the settings lock.
        """
        self._reload.set()
        self._wake.set()

    def _reload_settings(self) -> None:
        """Re-read and validate the settings; invalid ones are logged and the previous settings kept.

        On success executors are loaded afresh for the next runs (plugin settings are given
        at load); running runs keep the executor they started with. ``[dispatcher]``
        concurrency, lease TTL and grace are fixed for the process (flags win): restart for those.
        """
        from scheduler.settings.load import replace_settings

        self._reload.clear()
        try:
            fresh = replace_settings()
        except SchedulerError as exc:
            log.error("settings reload failed, keeping the previous settings: %s", exc.message)
            self.say(f"{_clock()} settings reload failed ({exc.code}), keeping the previous settings: {exc.message}")
            return
        self._executors.forget()
        self.say(f"{_clock()} settings reloaded from {fresh.file.source}")

    def stuck_workers(self) -> int:
        """Workers still inside an executor (after ``run`` returned: ones that ignored cancellation)."""
        return self._pool.busy

    def _pidfile_path(self) -> Path | None:
        if self.store.local_path is None or not self.exclusive:
            return None
        return Path(f"{self.store.local_path}.dispatcher.pid")

    def _lock_pidfile(self) -> str | None:
        """Single instance per SQLite file: an flock'd pid file beside the database.

        Only takes the lock, never writes: returns None when we hold it, or the PID the
        file names when another process holds it. A holder that lets its lease expire
        (stopped, hung) does not block a takeover: the lease, not the pid file, decides
        who owns the database. The PID is written once the lease is ours
        (``_write_pidfile``), so a refused dispatcher never overwrites it.
        """
        path = self._pidfile_path()
        if path is None:
            return None
        from scheduler.core.filemodes import create_file  # created 0600 (0660 in group mode), like the database

        fh = os.fdopen(create_file(path, os.O_RDWR | os.O_APPEND)[0], "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            other = fh.read().strip() or "?"
            fh.close()
            return other
        self._pidfile = fh
        return None

    def _write_pidfile(self) -> None:
        """Name our PID in the pid file: we hold the lease, so we are the dispatcher of this database.

        After a takeover from a stalled holder that still has the flock, the file is
        written without it (the stalled process never writes it again); the renewal
        thread takes the flock as soon as the stalled process is gone.
        """
        path = self._pidfile_path()
        if path is None:
            return
        line = f"{os.getpid()}\n"
        try:
            if self._pidfile is not None:
                self._pidfile.seek(0)
                self._pidfile.truncate()
                self._pidfile.write(line)
                self._pidfile.flush()
            else:
                with open(path, "r+" if path.exists() else "w") as fh:
                    fh.truncate()
                    fh.write(line)
        except OSError as exc:
            log.warning("could not write pid file %s: %s", path, exc)

    def _retry_pidfile_lock(self) -> None:
        """Take the pid-file lock once the stalled process we took over from has let go of it."""
        if self._pidfile is not None or self._pidfile_path() is None:
            return
        if self._lock_pidfile() is None and self._pidfile is not None:
            self._write_pidfile()
            self.say(f"{_clock()} pid file lock taken over from the stalled dispatcher")

    def _release_pidfile(self, *, clean: bool) -> None:
        """Close the pid file; after a clean stop, empty it first so no stale PID is left behind."""
        fh, self._pidfile = self._pidfile, None
        path = self._pidfile_path()
        try:
            if clean and path is not None:
                if fh is not None:
                    fh.seek(0)
                    if fh.read().strip() == str(os.getpid()):
                        fh.seek(0)
                        fh.truncate()
                        fh.flush()
                elif path.exists() and path.read_text().strip() == str(os.getpid()):
                    with open(path, "r+") as other:
                        other.truncate()
        except OSError as exc:
            log.warning("could not clear pid file %s: %s", path, exc)
        finally:
            if fh is not None:
                fh.close()

    def start(self) -> None:
        """Take the lease (or fail with ``DISPATCHER_ALREADY_RUNNING``), start renewal, recover orphans."""
        holder = self._lock_pidfile()
        lease = leases.acquire(self.store, self.lease_name, self.owner, self.config.lease_ttl_ms)
        if lease is None:
            with self.store.read() as tx:
                row = tx.one("SELECT owner, expires_at FROM dispatcher_leases WHERE name = ?", (self.lease_name,))
            if row and leases.owner_is_dead_local_process(row["owner"]):
                # The holder crashed on this host (kill -9): no need to wait for its lease to run out.
                lease = leases.acquire(self.store, self.lease_name, self.owner, self.config.lease_ttl_ms, steal_from=row["owner"])
                if lease is not None:
                    self.say(f"previous dispatcher {row['owner']} is gone: took over its lease")
        if lease is None:
            if self._pidfile is not None:  # never written: the file keeps naming the live holder
                self._pidfile.close()
                self._pidfile = None
            raise SchedulerError(
                "DISPATCHER_ALREADY_RUNNING",
                f"dispatcher lease on {self.store.location} is held by {row['owner'] if row else '?'}"
                f" until {to_iso(row['expires_at']) if row else '?'}",
            )
        if holder is not None:
            self.say(f"pid file held by stalled process {holder} whose lease expired: taking over")
        self.lease = lease
        self._write_pidfile()
        if self.hooks is None:
            self.hooks = Hooks()
        self.say(f"dispatcher {self.owner} holds lease {lease.name!r} with fencing token {lease.token}")
        self._renew_thread = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._renew_thread.start()
        self._recover()
        from scheduler.delivery.outbox import DeliveryWorker

        self.delivery = DeliveryWorker(self.store, self.owner, artifacts_root=self.artifacts_root, say=self.say)
        self.delivery.start()
        from scheduler.ops.retention import RetentionDuty

        # Fenced by our own lease on SQLite, by the singleton maintenance lease (taken by recovery) on PostgreSQL.
        self.retention = RetentionDuty(self.store, self.owner, lambda: self.lease if self.exclusive else self._maint,
                                       artifacts_root=self.artifacts_root, say=self.say)
        self.retention.start()

    def _renew_loop(self) -> None:
        """Renew the lease every third of its TTL until shutdown stops this thread.

        A failed renewal (busy or unavailable database) is retried soon; a lease that
        was taken over or ran out meanwhile is lost (``renew`` never resurrects an
        expired lease), and the dispatcher steps down.
        """
        assert self.lease is not None
        interval = self.lease.ttl_ms / 3000
        delay = interval
        while not self._renew_stop.wait(delay):
            if self._lost is not None or self._released:
                return
            try:
                leases.renew(self.store, self.lease)
                delay = interval
            except leases.LeaseLost as exc:
                self._on_lease_lost(exc.message)
                return
            except Exception as exc:  # database busy or unavailable: keep trying until the lease runs out
                log.warning("lease renewal failed: %s", getattr(exc, "message", exc))
                if now_ms() >= self.lease.expires_at:
                    self._on_lease_lost(f"lease expired while renewal failed: {getattr(exc, 'message', exc)}")
                    return
                delay = min(interval, 0.2)
                continue
            self._retry_pidfile_lock()

    def _on_lease_lost(self, why: str) -> None:
        if self._released:
            return  # we gave it up ourselves during shutdown
        self._lost = why
        self.say(f"LEASE LOST: {why}; aborting runs, committing nothing")
        with self._active_lock:
            for entry in self._active.values():
                entry.control.cancel("lease_lost")
        self._stop.set()
        self._wake.set()

    def _recover(self) -> None:
        assert self.lease is not None
        lease = self.lease
        if not self.exclusive:
            lease = self._maintenance_lease()
            if lease is None:
                return
        try:
            for item in recover(self.store, lease, kill_grace_s=self.config.kill_grace_s, hooks=self.hooks):
                self.say(f"recovered run {item['run_id'][:8]}: {item['outcome']}")
        except leases.LeaseLost:
            pass
        except SchedulerError as exc:
            if not is_transient(exc):
                raise
            log.warning("recovery pass postponed: %s", exc.message)  # the next pass retries

    def _maintenance_lease(self) -> leases.Lease | None:
        """Singleton duties (recovery) run under one named lease, taken over when it expires."""
        current = self._maint
        if current is not None:
            try:
                leases.renew(self.store, current)
                return current
            except leases.LeaseLost:
                self._maint = None
        self._maint = leases.acquire(self.store, "maintenance", self.owner, self.config.lease_ttl_ms)
        return self._maint

    # -- main loop -------------------------------------------------------------------------------

    def run(self, *, duration_s: float | None = None) -> int:
        """Dispatch until stopped; returns the process exit code."""
        self.start()
        deadline = time.monotonic() + duration_s if duration_s else None
        recovery_every = (self.config.recovery_interval_ms or self.config.lease_ttl_ms / 3) / 1000
        next_recovery = time.monotonic() + recovery_every
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if self._reload.is_set():
                    self._reload_settings()
                try:
                    if time.monotonic() >= next_recovery:
                        self._recover()
                        next_recovery = time.monotonic() + recovery_every
                    timeout = self._tick()
                    self._db_available()
                except SchedulerError as exc:
                    if not is_transient(exc):
                        raise
                    timeout = self._db_busy(exc)
                timeout = min(timeout, self._supervise())
                if deadline is not None:
                    timeout = min(timeout, max(0.0, deadline - time.monotonic()))
                try:
                    self._wait(timeout)
                except SchedulerError as exc:
                    if not is_transient(exc):
                        raise
                    self._wake.wait(self._db_busy(exc))
        except leases.LeaseLost as exc:
            self._on_lease_lost(exc.message)
        finally:
            self._shutdown()
        if self._lost is not None:
            raise SchedulerError("LEASE_LOST", f"dispatcher stopped: {self._lost}")
        return 0

    def _tick(self, *, claim: bool = True) -> float:
        """One pass; returns how long to sleep.

        Finished runs are completed, due slots materialised and free workers given new
        runs in ONE write transaction (group commit: one commit for many runs). An idle
        pass costs one indexed read. ``claim=False`` (during shutdown) only commits
        finished runs. A busy database raises ``DB_BUSY`` after keeping the finished
        results for the next pass.
        """
        assert self.lease is not None
        self.store.wait_for_change(0)  # arm: changes after this point (not before our reads) wake the next wait
        tick_now = now_ms()
        if tick_now - self._cancels_checked_at >= CANCEL_CHECK_MS:
            self._propagate_cancels()
            self._cancels_checked_at = tick_now
        finished = self._take_finished()
        if not claim and not finished:
            return CANCEL_CHECK_MS / 1000
        if not finished:
            with self.store.read() as tx:
                jobs_due, dispatch_due, approval_due = next_due_parts(tx)
            due = min((v for v in (jobs_due, dispatch_due, approval_due) if v is not None), default=None)
            if due is None or due > tick_now:
                if self.delivery is not None:  # an idle pass follows a change another process committed (a part, perhaps)
                    self.delivery.wake()
                return MAX_SLEEP_S if due is None else min(max(0.0, (due - now_ms()) / 1000), MAX_SLEEP_S)
            if claim and not _reached(jobs_due, tick_now) and not _reached(approval_due, tick_now):
                with self._active_lock:
                    pool_full = len(self._active) >= self.config.concurrency
                if pool_full:  # only dispatches are due and no worker could take one: a finishing run wakes us
                    return MAX_SLEEP_S / 2
        with self._active_lock:
            free = self.config.concurrency - len(self._active) + len(finished)
        # The veto hook is called per candidate: only when a plugin implements it.
        veto = self.hooks.dispatch_veto if self.hooks and self.hooks.wants("scheduler_dispatch_veto") else None
        committed: list[tuple[StartedRun, dict[str, Any]]] = []
        started: list[StartedRun] = []
        created = 0
        parts: tuple[int | None, int | None, int | None] = (None, None, None)
        try:
            # committing: observers hear of this pass's transitions (starts, skips, completions) once it committed.
            # batched_events: the pass's run.started/run.finished rows go in as one INSERT before the commit.
            # batched_finishes: the completed runs' dispatch rows go done in one UPDATE.
            with committing(self.store, self.hooks) as tx, batched_events(tx), batched_finishes(tx):
                leases.assert_live(tx, self.lease, now=tick_now)
                committed = self._complete(tx, finished, now=tick_now)
                if claim:
                    created = materialize_due(self.store, now=tick_now)
                    expire_due_approvals(tx, now=tick_now)  # timeouts release or cancel their runs before claiming
                    if free > 0:
                        started = claim_and_start(self.store, self.lease, limit=free, now=tick_now, veto=veto, check_lease=False)
                    parts = next_due_parts(tx)
        except leases.LeaseLost:
            self._forget(finished)
            raise
        except SchedulerError as exc:
            if is_transient(exc):
                self._retry = finished + self._retry  # nothing was committed: try these again next pass
                raise
            if not finished:
                raise
            # One bad completion must not take the others (or new claims) down: commit them one by one.
            log.warning("group commit failed (%s); completing runs one at a time", exc.message)
            committed, started, created = self._complete_each(finished), [], 0
        retried = {s.run_id for s, _r in self._retry}
        self._forget([item for item in finished if item[0].run_id not in retried])
        if created:
            self.store.notify_change()  # other dispatchers (PostgreSQL) may claim the new slots too
        if self.delivery is not None and delivery_parts_enqueued.is_set():
            delivery_parts_enqueued.clear()
            self.delivery.wake()  # completions and approval gates of this pass enqueued outbox parts
        # The pass's start and end lines are said at once (one write for the pass, not one per line).
        lines: list[str] | None = [] if self._says and (started or committed) else None
        for s in started:  # first: a run committed as running must reach a worker whatever happens next
            self._submit(s, lines)
        for s, run in committed:
            try:
                self._report(s, run, lines)
            except Exception:  # noqa: BLE001 - the run is committed; a failing report (hook, read) must not stop the loop
                log.exception("reporting the end of run %s failed", s.run_id)
        if lines:
            try:
                self.say("\n".join(lines))
            except Exception:  # noqa: BLE001 - the runs are committed and submitted; output must not stop the loop
                log.exception("writing the pass's run lines failed")
        if not claim:
            return 0.0 if committed else CANCEL_CHECK_MS / 1000
        jobs_due, dispatch_due, approval_due = parts
        if started:
            with self._active_lock:
                pool_full = len(self._active) >= self.config.concurrency
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

    def _take_finished(self) -> list[tuple[StartedRun, ExecutionResult]]:
        """Results to commit this pass: those kept after a busy database, then new ones.

        A late result of a worker we abandoned is discarded here (the run was already
        committed without it); a result that comes after the dispatcher cancelled the
        run for its deadline is recorded as the ``timeout`` it is.
        """
        items, self._retry = self._retry, []
        while True:
            try:
                items.append(self._finished.get_nowait())
            except queue.Empty:
                break
        kept = []
        for s, result in items:
            with self._active_lock:
                entry = self._active.get(s.run_id)
            if entry is None or (entry.abandoned is not None and result is not entry.abandoned):
                if s.run_id in self._abandoned:  # else: a run given up with the lease, nothing to say
                    self._abandoned.discard(s.run_id)
                    self.stats["late_results_discarded"] += 1
                    self.say(f"{_clock()} discarding late result of abandoned run {s.run_id[:8]} ({result.status})")
                continue
            kept.append((s, _past_deadline(entry, result)))
        return kept

    def _complete(
        self, tx: Any, finished: list[tuple[StartedRun, ExecutionResult]], *, now: int | None = None
    ) -> list[tuple[StartedRun, dict[str, Any]]]:
        """Complete runs inside the caller's ``committing`` transaction ``tx`` (its lease asserted); a run we no longer
        own is skipped, not fatal. With the pass's ``now``, retries and children due at once are claimed in the same pass.
        """
        assert self.lease is not None
        now = now_ms() if now is None else now
        done = []
        for s, result in finished:
            try:
                done.append((s, complete_run_in(tx, self.lease, s.run_id, result, now=now, outcomes=s.outcomes)))
            except StaleFence as exc:
                self.stats["skipped_commits"] += 1
                self.say(f"{_clock()} not committing run {s.run_id[:8]}: {exc.message}")
        return done

    def _complete_each(self, finished: list[tuple[StartedRun, ExecutionResult]]) -> list[tuple[StartedRun, dict[str, Any]]]:
        """Commit runs one at a time; a run whose completion itself fails still ends (``COMPLETION_FAILED``)."""
        done = []
        for i, item in enumerate(finished):
            try:
                with committing(self.store, self.hooks) as tx:
                    assert self.lease is not None
                    leases.assert_live(tx, self.lease)
                    done += self._complete(tx, [item])
            except leases.LeaseLost:
                raise
            except SchedulerError as exc:
                if not is_transient(exc):
                    log.exception("completion of run %s failed", item[0].run_id)
                    self._end_failed_completion(item[0], exc)
                    continue
                self._retry.extend(finished[i:])  # busy database: the next pass tries these again
                break
            except Exception as exc:
                log.exception("completion of run %s failed", item[0].run_id)
                self._end_failed_completion(item[0], exc)
        return done

    def _end_failed_completion(self, s: StartedRun, exc: Exception) -> None:
        """Nothing stays ``running`` forever: record the failed completion as the run's (fenced) error."""
        assert self.lease is not None
        now = now_ms()
        message = f"completion failed: {type(exc).__name__}: {getattr(exc, 'message', exc)}"[:2000]
        # An evidence job's run gets its terminal (interrupted) evidence row too; should that fail, the run still ends.
        for with_evidence in ((True, False) if s.job.get("evidence") else (False,)):
            try:
                with committing(self.store, self.hooks) as tx:
                    leases.assert_live(tx, self.lease)
                    if fail_completion(tx, s.run_id, owner=self.lease.owner, token=self.lease.token, message=message,
                                       now=now) and with_evidence:
                        from scheduler.evidence.store import record_interrupted

                        record_interrupted(tx, {"id": s.run_id}, now=now, actor=self.lease.owner, error_code="COMPLETION_FAILED")
                return
            except leases.LeaseLost:
                raise
            except Exception:
                log.exception("could not record the failed completion of run %s%s", s.run_id,
                              " with its interrupted evidence" if with_evidence else "; recovery will end it")

    def _forget(self, finished: list[tuple[StartedRun, ExecutionResult]]) -> None:
        with self._active_lock:
            for s, _result in finished:
                self._active.pop(s.run_id, None)

    def _report(self, s: StartedRun, run: dict[str, Any], lines: list[str] | None = None) -> None:
        """After a completion committed: count it and print it (observers were told by ``committing``).

        ``lines``: the pass's output lines, said together by the caller (None: say it now, if anyone listens).
        """
        self.stats["finished"] += 1
        if self.metrics is not None:
            self.metrics.observe(s, run)
        if not self._says:
            return
        took = run["duration_ms"] or 0
        detail = f" [{run['error_code']}]" if run["error_code"] and run["status"] != "ok" else ""
        line = f"{_clock()} {run['status']:<6} {s.job['name']} run {s.run_id[:8]} in {took} ms{detail}"
        if lines is None:
            self.say(line)
        else:
            lines.append(line)

    def _wait(self, timeout: float) -> None:
        """Sleep until ``timeout``, a finished run (in-process event) or another process's change."""
        end = time.monotonic() + timeout
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0 or self._wake.wait(min(WAIT_SLICE_S, remaining)):
                break
            if self.store.wait_for_change(0):
                break
        self._wake.clear()

    def _propagate_cancels(self) -> None:
        with self._active_lock:
            if not self._active:
                return
            ids = list(self._active)
        with self.store.read() as tx:
            marks = ", ".join("?" for _ in ids)
            rows = tx.all(f"SELECT id FROM runs WHERE id IN ({marks}) AND cancel_requested_at IS NOT NULL", ids)
        with self._active_lock:
            for r in rows:
                entry = self._active.get(r["id"])
                if entry and not entry.control.is_cancelled():
                    entry.control.cancel("user")

    # -- enforcing the executor contract ----------------------------------------------------------

    def _supervise(self) -> float:
        """Enforce deadlines and cancellations the executor does not honour; seconds until the next check.

        ``DEADLINE_SLACK_S`` after a run's deadline its token is cancelled (reason
        ``deadline``); ``kill_grace_s + ABANDON_SLACK_S`` after any cancellation, a worker
        that still has not returned is abandoned and the run is committed without it.
        """
        mono, wall = time.monotonic(), now_ms()
        abandon_after = self.config.kill_grace_s + ABANDON_SLACK_S
        next_in = MAX_SLEEP_S
        with self._active_lock:
            entries = [e for e in self._active.values() if e.abandoned is None]
        for e in entries:
            if e.cancelled_at is None:
                if not e.control.is_cancelled():
                    due_in = (e.deadline_ms - wall) / 1000 + DEADLINE_SLACK_S
                    if due_in > 0:
                        next_in = min(next_in, due_in)
                        continue
                    e.control.cancel("deadline")
                    self.say(f"{_clock()} deadline passed for {e.started.job['name']} run {e.started.run_id[:8]}: cancelling it")
                e.cancelled_at = mono
            left = e.cancelled_at + abandon_after - mono
            if left > 0:
                next_in = min(next_in, left)
                continue
            self._abandon(e, abandon_after)
            next_in = 0.0
        return max(0.0, next_in)

    def _abandon(self, e: _ActiveRun, waited_s: float) -> None:
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
                error_message=f"executor {executor!r} ignored the run's {s.job.get('run_timeout_ms')} ms deadline and did not"
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
        e.abandoned = result
        if s.job.get("evidence"):  # committed without its worker: an interrupted evidence row, as recovery gives
            from scheduler.evidence.attest import interrupt

            interrupt(s.outcomes, result.error_code or "EXECUTOR_ABANDONED")
        self._abandoned.add(s.run_id)
        self.stats["abandoned"] += 1
        self.say(f"{_clock()} abandoning {s.job['name']} run {s.run_id[:8]}:"
                 f" executor {executor!r} ignored cancellation ({reason})")
        self._finished.put((s, result))
        self._wake.set()
        self._stop_abandoned_work(s, getattr(e.control, "handle", None))

    def _stop_abandoned_work(self, s: StartedRun, handle: dict[str, Any] | None) -> None:
        """An abandoned worker's executor ignored cancellation: ask its ``recover`` to stop the work it started.

        The same call crash recovery makes (the handle the run recorded, this host), on a
        daemon thread so the loop never waits for it; the outcome is an audit event.
        """
        if handle is None:
            return
        executor = self._executors.peek(spec_from_row(s.job).executor_name())
        recover_fn = getattr(executor, "recover", None)
        if recover_fn is None:
            return
        request = RecoveryRequest(run_id=s.run_id, job_id=s.job["id"], handle=handle, owner=self.owner,
                                  owner_host=leases.owner_host(self.owner), kill_grace_s=self.config.kill_grace_s)

        def stop() -> None:
            try:
                outcome = recover_fn(request)
                with self.store.transaction() as tx:
                    append_event(tx, "run.abandoned_work_stopped", job_id=s.job["id"], run_id=s.run_id, actor=self.owner,
                                 data={"state": getattr(outcome, "state", None), "detail": getattr(outcome, "detail", None)})
            except Exception:  # noqa: BLE001 - best effort; crash recovery is not involved (the run is ended)
                log.exception("stopping the work of abandoned run %s failed", s.run_id)

        threading.Thread(target=stop, name=f"stop-{s.run_id[:8]}", daemon=True).start()

    def _db_busy(self, exc: SchedulerError) -> float:
        """A pass met a busy database: say so once per episode; returns the back-off before the next attempt."""
        if self._busy_since is None:
            self._busy_since = time.monotonic()
            self.say(f"{_clock()} database busy ({exc.code}): {exc.message}; waiting and retrying")
        self._busy_backoff = min(BUSY_BACKOFF_MAX_S, max(0.05, self._busy_backoff * 2))
        return self._busy_backoff

    def _db_available(self) -> None:
        if self._busy_since is not None:
            self.say(f"{_clock()} database available again after {time.monotonic() - self._busy_since:.1f}s")
            self._busy_since, self._busy_backoff = None, 0.0

    # -- execution -------------------------------------------------------------------------------

    def _submit(self, s: StartedRun, lines: list[str] | None = None) -> None:
        """Hand a started run to a worker; its start line goes to ``lines`` (said by the caller) or is said now."""
        control = DbRunControl(self, s.run_id, s.job["id"])
        self.stats["started"] += 1
        if self._says:
            line = f"{_clock()} start  {s.job['name']} run {s.run_id[:8]} ({s.dispatch_kind}, attempt {s.attempt})"
            if lines is None:
                self.say(line)
            else:
                lines.append(line)
        entry = _ActiveRun(control=control, started=s, deadline_ms=s.started_at + int(s.job.get("run_timeout_ms") or 0))
        with self._active_lock:
            self._active[s.run_id] = entry
        self._pool.submit(lambda: self._worker.execute(s, control))

    def _executor(self, name: str) -> Any:
        """The loaded executor; a load failure is remembered for a short while, then retried (a fix may be installed)."""
        return self._executors.get(name)

    def _shutdown(self) -> None:
        """Stop: drain the running work (see ``_drain``), then release the lease, the renewal thread and the pid file."""
        self._stop.set()
        try:
            self._drain()
        except Exception:  # a bug while draining must not keep the lease or the process
            log.exception("shutdown drain failed; recovery will end the runs still recorded as running")
        finally:
            self._finish()

    def _drain(self) -> None:
        """Graceful stop, bounded in time whatever the executors do.

        No new claims. Runs that finish are committed as they finish (a ``kill -9`` during
        the grace period cannot replay them). After ``grace_s`` (at once on a second stop
        request, or when the lease is lost) the running runs are cancelled; a worker that
        still has not returned ``kill_grace_s + ABANDON_SLACK_S`` later is abandoned and its
        run committed ``cancelled`` (``EXECUTOR_ABANDONED``). Without a lease nothing is
        committed: recovery ends those runs.
        """
        with self._active_lock:
            running = len(self._active)
        if running and self._lost is None:
            self.say(f"stopping: waiting up to {self.config.grace_s:g}s for {running} run(s)")
        grace_end = time.monotonic() + self.config.grace_s
        give_up: float | None = None
        while True:
            with self._active_lock:
                running = len(self._active)
            if not running and not self._retry and self._finished.empty():
                return
            mono = time.monotonic()
            if give_up is None and (mono >= grace_end or self._hurry.is_set() or self._lost is not None):
                if self._hurry.is_set() and mono < grace_end:
                    self.say(f"{_clock()} second stop request: cancelling {running} run(s) now")
                with self._active_lock:
                    for entry in self._active.values():
                        entry.control.cancel("shutdown")
                # Room to abandon stuck workers and commit them, plus a little for a busy database.
                give_up = mono + self.config.kill_grace_s + ABANDON_SLACK_S + 2.0
            if give_up is not None and mono >= give_up:
                self.say(f"{_clock()} giving up on {running} uncommitted run(s): recovery will end them")
                return
            timeout = CANCEL_CHECK_MS / 1000
            if self._lost is None:
                try:
                    timeout = self._tick(claim=False)
                    self._db_available()
                except leases.LeaseLost as exc:
                    self._on_lease_lost(exc.message)
                except SchedulerError as exc:
                    if not is_transient(exc):
                        raise
                    timeout = self._db_busy(exc)
            else:
                self._forget(self._take_finished())  # cannot commit without the lease: recovery ends them
            timeout = min(timeout, self._supervise(), CANCEL_CHECK_MS / 1000)
            if timeout > 0:
                self._wake.wait(timeout)
            self._wake.clear()

    def _finish(self) -> None:
        """Let go of the process's hold on the database, in an order that leaves no window for confusion.

        The renewal thread is stopped and joined first (closing the store under a
        thread blocked in a statement crashed the process); the pid file is emptied
        before the lease is released (never after another dispatcher took over).
        """
        clean = self.lease is not None and self._lost is None
        if self.delivery is not None:  # a part being sent finishes; a claim left behind expires and is taken over
            self.delivery.stop()
        if self.retention is not None:  # stops after its current batch (each batch is its own transaction)
            self.retention.stop()
        self._renew_stop.set()
        if self._renew_thread is not None and self._renew_thread is not threading.current_thread():
            self._renew_thread.join(RENEW_JOIN_S)
            if self._renew_thread.is_alive():
                log.warning("lease renewal thread still busy after %.0fs", RENEW_JOIN_S)
        clean = clean and self._lost is None
        self._released = True
        self._pool.close()
        if clean:
            self._release_pidfile(clean=True)
            assert self.lease is not None
            for lease in (self.lease, self._maint):
                if lease is None:
                    continue
                try:
                    leases.release(self.store, lease)
                except SchedulerError as exc:  # busy: the lease simply expires after its TTL
                    log.warning("could not release lease %r: %s", lease.name, exc.message)
        else:
            self._release_pidfile(clean=False)


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def _reached(at_ms: int | None, now: int) -> bool:
    """Whether an optional due time has come."""
    return at_ms is not None and at_ms <= now


def _past_deadline(entry: _ActiveRun, result: ExecutionResult) -> ExecutionResult:
    """A result that arrives after the dispatcher cancelled the run for its deadline is a ``timeout``.

    The executor's outputs are kept; its status is not (it typically says ``cancelled``,
    not knowing why). An executor that reported ``timeout`` itself keeps its own code.
    """
    if entry.control.cancel_reason() != "deadline" or result.status == "timeout":
        return result
    said = result.status + (f" {result.error_code}" if result.error_code else "")
    return attrs.evolve(
        result, status="timeout", error_code="EXECUTOR_DEADLINE_EXCEEDED",
        error_message=f"run passed its {entry.started.job.get('run_timeout_ms')} ms deadline and was cancelled by the"
                      f" dispatcher (the executor reported {said})",
    )


def install_signal_handlers(dispatcher: Dispatcher) -> None:
    """SIGTERM and SIGINT stop claiming and start the graceful shutdown; SIGHUP reloads the settings file."""
    signal.signal(signal.SIGTERM, dispatcher.request_stop)
    signal.signal(signal.SIGINT, dispatcher.request_stop)
    signal.signal(signal.SIGHUP, dispatcher.request_reload)
