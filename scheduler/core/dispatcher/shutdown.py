"""Shutdown: drain the running work within the grace period, then let go of the database in a safe order.

Neither a run nor ``scheduler run --grace`` waits on an executor that ignores cancellation:
what does not return in time is abandoned (see ``workers``) and committed by the dispatcher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scheduler.base.errors import SchedulerError
from scheduler.core import lease as leases
from scheduler.core.dispatcher.config import ABANDON_SLACK_S, CANCEL_CHECK_MS, DispatcherConfig, clock, is_transient
from scheduler.core.dispatcher.lease_keeper import LeaseKeeper
from scheduler.core.dispatcher.passes import Pass
from scheduler.core.dispatcher.workers import Workers

log = logging.getLogger("scheduler.core.dispatcher")


class Shutdown:
    """The end of one dispatcher: ``run`` (drain, then finish), never raising out of the drain."""

    def __init__(self, config: DispatcherConfig, *, keeper: LeaseKeeper, workers: Workers, passes: Pass,
                 hurry: threading.Event, on_lease_lost: Callable[[str], None], say: Callable[[str], None]) -> None:
        self.config = config
        self.keeper = keeper
        self.workers = workers
        self.passes = passes
        #: A second stop request: cancel running work now instead of waiting out the grace period.
        self.hurry = hurry
        self.on_lease_lost = on_lease_lost
        self.say = say

    def run(self) -> None:
        """Stop: drain the running work (see ``drain``), then release the lease, the renewal thread and the pid file."""
        try:
            self.drain()
        except Exception:  # a bug while draining must not keep the lease or the process
            log.exception("shutdown drain failed; recovery will end the runs still recorded as running")
        finally:
            self.finish()

    def drain(self) -> None:
        """Graceful stop, bounded in time whatever the executors do.

        No new claims. Runs that finish are committed as they finish (a ``kill -9`` during
        the grace period cannot replay them). After ``grace_s`` (at once on a second stop
        request, or when the lease is lost) the running runs are cancelled; a worker that
        still has not returned ``kill_grace_s + ABANDON_SLACK_S`` later is abandoned and its
        run committed ``cancelled`` (``EXECUTOR_ABANDONED``). Without a lease nothing is
        committed: recovery ends those runs.
        """
        workers, keeper, passes = self.workers, self.keeper, self.passes
        running = workers.running()
        if running and keeper.lost is None:
            self.say(f"stopping: waiting up to {self.config.grace_s:g}s for {running} run(s)")
        grace_end = time.monotonic() + self.config.grace_s
        give_up: float | None = None
        while True:
            running = workers.running()
            if not running and not workers.retry and workers.finished.empty():
                return
            mono = time.monotonic()
            if give_up is None and (mono >= grace_end or self.hurry.is_set() or keeper.lost is not None):
                if self.hurry.is_set() and mono < grace_end:
                    self.say(f"{clock()} second stop request: cancelling {running} run(s) now")
                workers.cancel_all("shutdown")
                # Room to abandon stuck workers and commit them, plus a little for a busy database.
                give_up = mono + self.config.kill_grace_s + ABANDON_SLACK_S + 2.0
            if give_up is not None and mono >= give_up:
                self.say(f"{clock()} giving up on {running} uncommitted run(s): recovery will end them")
                return
            timeout = CANCEL_CHECK_MS / 1000
            if keeper.lost is None:
                try:
                    timeout = passes.tick(claim=False)
                    passes.db_available()
                except leases.LeaseLost as exc:
                    self.on_lease_lost(exc.message)
                except SchedulerError as exc:
                    if not is_transient(exc):
                        raise
                    timeout = passes.db_busy(exc)
            else:
                workers.forget(workers.take_finished())  # cannot commit without the lease: recovery ends them
            timeout = min(timeout, workers.supervise(), CANCEL_CHECK_MS / 1000)
            if timeout > 0:
                workers.wake.wait(timeout)
            workers.wake.clear()

    def finish(self) -> None:
        """Let go of the process's hold on the database, in an order that leaves no window for confusion.

        The duties stop first, then the renewal thread is stopped and joined (closing the
        store under a thread blocked in a statement crashed the process); the pid file is
        emptied before the lease is released (never after another dispatcher took over).
        """
        keeper = self.keeper
        clean = keeper.lease is not None and keeper.lost is None
        for duty in self.passes.duties:  # a part being sent finishes; retention stops after its current batch
            duty.stop()
        keeper.stop_renewal()
        clean = clean and keeper.lost is None
        self.workers.pool.close()
        keeper.release(clean=clean)
