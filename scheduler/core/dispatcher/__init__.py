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

``Dispatcher`` composes the parts, each its own module: the lease keeper (``lease_keeper``,
with the ``pidfile``), the pass (``passes``: claim and complete), worker supervision
(``workers``, on the ``pool``), the worker-side run (``execute``), ``shutdown`` and the
settings ``reload``. What it calls above core (observers, executors, duties, expiries, the
run pipeline) arrives in ``scheduler.core.parts.Parts``: build it with ``scheduler.runtime``.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import short_run_id
from scheduler.core import lease as leases
from scheduler.core.claimed import ClaimedRun
from scheduler.core.dispatcher.config import MAX_SLEEP_S, DispatcherConfig, is_transient
from scheduler.core.dispatcher.execute import RunExecution
from scheduler.core.dispatcher.lease_keeper import LeaseKeeper
from scheduler.core.dispatcher.passes import Pass, RunMetrics
from scheduler.core.dispatcher.pidfile import PidFile
from scheduler.core.dispatcher.pool import WorkerPool
from scheduler.core.dispatcher.reload import SettingsReload
from scheduler.core.dispatcher.shutdown import Shutdown
from scheduler.core.dispatcher.workers import DbRunControl, Workers
from scheduler.core.duty import DutyContext
from scheduler.core.execution import ExecutionResult
from scheduler.core.fenced_writes import FencedWriter
from scheduler.core.parts import Parts
from scheduler.core.recovery import recover
from scheduler.core.spec import executor_name_of
from scheduler.core.steps import registered
from scheduler.core.store import default_artifacts_root
from scheduler.core.store.base import Store

__all__ = ["MAX_SLEEP_S", "DbRunControl", "Dispatcher", "DispatcherConfig", "WorkerPool", "install_signal_handlers",
           "is_transient"]

log = logging.getLogger(__name__)


class Dispatcher:
    """One ``scheduler run`` process: the facade over its parts (see the module docstring).

    ``parts`` must carry the observers, the executors and the completion and recovery participants
    (``scheduler.runtime.dispatcher_parts`` builds them): a dispatcher never runs without them.
    """

    def __init__(self, store: Store, parts: Parts, config: DispatcherConfig | None = None, *,
                 say: Callable[[str], None] | None = None) -> None:
        observers, executors, completion, recovery = parts.observers, parts.executors, parts.completion, parts.recovery
        if observers is None or executors is None or completion is None or recovery is None:
            needed = (("observers", observers), ("executors", executors), ("completion", completion), ("recovery", recovery))
            missing = [name for name, part in needed if part is None]
            raise ValueError(f"a Dispatcher needs its parts ({', '.join(missing)} missing): build it with scheduler.runtime")
        self.store = store
        self.parts = parts
        self.config = config = config or DispatcherConfig()
        self.owner = config.owner or leases.new_owner_id()
        self.exclusive = exclusive = config.exclusive if config.exclusive is not None else store.exclusive_dispatch
        self.lease_name = "dispatcher" if exclusive else f"dispatcher:{self.owner}"
        self.hooks = observers
        #: Crash recovery's participants (executors, credentials, evidence, outbox).
        self._recovery = recovery
        self.say = say or (lambda _msg: None)
        self.artifacts_root = config.artifacts_root or default_artifacts_root(store.local_path)
        self.stats = {"started": 0, "finished": 0, "skipped_commits": 0, "abandoned": 0, "late_results_discarded": 0}
        #: The loaded executors (``get``/``peek``/``forget``); a failed load is retried after a while.
        self._executors = executors
        self._stop = threading.Event()
        #: A second stop request: cancel running work now instead of waiting out the grace period.
        self._hurry = threading.Event()
        pidfile = PidFile(Path(f"{store.local_path}.dispatcher.pid") if store.local_path is not None and exclusive else None,
                          self.say)
        self._keeper = LeaseKeeper(store, name=self.lease_name, owner=self.owner, ttl_ms=config.lease_ttl_ms,
                                   exclusive=exclusive, pidfile=pidfile, say=self.say, on_lost=self._on_lease_lost)
        #: Group commit of the workers' ``RunControl`` writes (its thread starts on the first one).
        self.fenced_writes = FencedWriter(store, lambda: self._keeper.lease, self.owner)
        wake = threading.Event()
        finished: queue.SimpleQueue[tuple[ClaimedRun, ExecutionResult]] = queue.SimpleQueue()
        #: The worker-side run: what a worker thread does with a started run.
        self._worker = RunExecution(store=store, executor=executors.get, artifacts_root=self.artifacts_root,
                                    finished=finished, wake=wake)
        self._workers = Workers(store, config, owner=self.owner, executors=executors,
                                evidence=completion.evidence, fenced=self, execute=self._worker.execute,
                                finished=finished, stats=self.stats, say=say, wake=wake)
        self._pass = Pass(store, config, keeper=self._keeper, workers=self._workers, observers=observers,
                          expiries=parts.expiries, completion=completion, stats=self.stats, say=say)
        self._stopping = Shutdown(config, keeper=self._keeper, workers=self._workers, passes=self._pass,
                                   hurry=self._hurry, on_lease_lost=self._on_lease_lost, say=self.say)
        self._reload = SettingsReload(executors, self.say, parts.settings_check)

    # -- what callers read and set ----------------------------------------------------------------

    @property
    def lease(self) -> leases.Lease | None:
        """The dispatcher's lease while it holds it."""
        return self._keeper.lease

    @lease.setter
    def lease(self, lease: leases.Lease | None) -> None:
        self._keeper.lease = lease

    @property
    def metrics(self) -> RunMetrics | None:
        """``scheduler.ops.metrics.DispatcherMetrics`` when ``scheduler run --metrics-port`` serves them, else None."""
        return self._pass.metrics

    @metrics.setter
    def metrics(self, metrics: RunMetrics | None) -> None:
        self._pass.metrics = metrics

    def stuck_workers(self) -> int:
        """Workers still inside an executor (after ``run`` returned: ones that ignored cancellation)."""
        return self._workers.pool.busy

    # -- lifecycle -------------------------------------------------------------------------------

    def request_stop(self, *_args: object) -> None:
        """Stop claiming new work (SIGTERM/SIGINT); running work gets the grace period.

        A second request (a second SIGTERM/SIGINT) stops waiting: running work is
        cancelled at once, and what does not return within the kill grace is abandoned.
        Safe in a signal handler: it only sets events.
        """
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()
        self._workers.wake.set()

    def request_reload(self, *_args: object) -> None:
        """Reload the settings file (SIGHUP, ``systemctl reload``) on the loop's next pass.

        Safe in a signal handler: it only sets events; the loop does the reading, so a
        handler never runs inside the settings lock.
        """
        self._reload.requested.set()
        self._workers.wake.set()

    def start(self) -> None:
        """Take the lease (or fail with ``DISPATCHER_ALREADY_RUNNING``), start renewal, recover orphans, start duties."""
        lease = self._keeper.acquire()
        self.say(f"dispatcher {self.owner} holds lease {lease.name!r} with fencing token {lease.token}")
        self._keeper.start_renewal()
        self._recover()
        # Singleton duties are fenced by our own lease on SQLite, by the maintenance lease (taken by recovery) on PostgreSQL.
        context = DutyContext(store=self.store, owner=self.owner, artifacts_root=self.artifacts_root, say=self.say,
                              singleton_fence=self._keeper.singleton_fence)
        for factory in self.parts.duties:
            duty = factory(context)
            duty.start()
            self._pass.duties.append(duty)
        self._warm_up()

    def _warm_up(self) -> None:
        """Load now what the first runs would otherwise load inside their own lateness: the run pipeline's steps
        (entry points scanned, third-party steps imported) and the executor of every enabled job.

        Measured before this existed: the first job due after ``scheduler run`` started began 50 ms (testkit) to
        74 ms (shell) after its due time, against 1 ms for the next one (tests/test_dispatcher_warm_up.py). A step
        or executor that cannot be loaded is left as it is: the run that needs it fails closed with the same code
        it always did (``PIPELINE_STEP_NOT_REGISTERED``, ``EXECUTOR_NOT_AVAILABLE``, remembered for the retry period).
        """
        try:
            registered()
        except Exception as exc:  # noqa: BLE001 - the first run raises it again, as it did without the warm-up
            log.debug("pipeline steps not loaded at start: %s", exc)
        try:
            with self.store.read() as tx:
                names = {executor_name_of(row) for row in tx.all(
                    "SELECT DISTINCT executor, session_target FROM jobs WHERE enabled = 1")}
        except SchedulerError as exc:  # busy database: the runs load their executors themselves
            log.debug("executors not loaded at start: %s", exc.message)
            return
        for name in sorted(names):
            try:
                self._executors.get(name)
            except SchedulerError as exc:
                log.debug("executor %r not loaded at start: %s", name, exc.message)

    def _on_lease_lost(self, why: str, code: str = "LEASE_LOST") -> None:
        """Step down: the lease was lost, or (``DB_VANISHED``) the database file was deleted or replaced."""
        if not self._keeper.lose(why, code):
            return  # we gave it up ourselves during shutdown, or it was already lost
        self.say(f"{'LEASE LOST' if code == 'LEASE_LOST' else code}: {why}; aborting runs, committing nothing")
        self._workers.cancel_all("lease_lost")
        self._stop.set()
        self._workers.wake.set()

    def _recover(self) -> None:
        lease = self._keeper.lease
        assert lease is not None
        if not self.exclusive:
            lease = self._keeper.maintenance()
            if lease is None:
                return
        try:
            for item in recover(self.store, lease, participants=self._recovery, kill_grace_s=self.config.kill_grace_s,
                                hooks=self.hooks):
                self.say(f"recovered run {short_run_id(str(item['run_id']))}: {item['outcome']}")
        except leases.LeaseLost:
            pass
        except SchedulerError as exc:
            if not is_transient(exc):
                raise
            log.warning("recovery pass postponed: %s", exc.message)  # the next pass retries

    # -- main loop -------------------------------------------------------------------------------

    def run(self, *, duration_s: float | None = None) -> int:
        """Dispatch until stopped; returns the process exit code."""
        self.start()
        passes, workers = self._pass, self._workers
        deadline = time.monotonic() + duration_s if duration_s else None
        recovery_every = (self.config.recovery_interval_ms or self.config.lease_ttl_ms / 3) / 1000
        next_recovery = time.monotonic() + recovery_every
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if self._reload.requested.is_set():
                    self._reload.apply()
                try:
                    if time.monotonic() >= next_recovery:
                        self._recover()
                        next_recovery = time.monotonic() + recovery_every
                    timeout = passes.tick()
                    passes.db_available()
                except SchedulerError as exc:
                    if exc.code == "DB_VANISHED":
                        self._on_lease_lost(exc.message, exc.code)
                        break
                    if not is_transient(exc):
                        raise
                    timeout = passes.db_busy(exc)
                timeout = min(timeout, workers.supervise())
                if deadline is not None:
                    timeout = min(timeout, max(0.0, deadline - time.monotonic()))
                try:
                    passes.wait(timeout)
                except SchedulerError as exc:
                    if not is_transient(exc):
                        raise
                    workers.wake.wait(passes.db_busy(exc))
        except leases.LeaseLost as exc:
            self._on_lease_lost(exc.message)
        finally:
            self._shutdown()
        if self._keeper.lost is not None:
            raise SchedulerError(self._keeper.lost_code, f"dispatcher stopped: {self._keeper.lost}")
        return 0

    def _tick(self, *, claim: bool = True) -> float:
        """One pass (``passes.Pass.tick``); returns how long to sleep (tests and ``bench/scale`` time it)."""
        return self._pass.tick(claim=claim)

    def _shutdown(self) -> None:
        """Stop: drain the running work, then release the lease, the renewal thread and the pid file."""
        self._stop.set()
        self._stopping.run()


def install_signal_handlers(dispatcher: Dispatcher) -> None:
    """SIGTERM and SIGINT stop claiming and start the graceful shutdown; SIGHUP reloads the settings file."""
    signal.signal(signal.SIGTERM, dispatcher.request_stop)
    signal.signal(signal.SIGINT, dispatcher.request_stop)
    signal.signal(signal.SIGHUP, dispatcher.request_reload)
