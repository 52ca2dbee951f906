"""The dispatcher: holds a fenced lease, turns due slots into runs, executes them in a bounded pool.

It sleeps until the earliest due time (an indexed query) or until another process
changes the database (a CLI ``jobs add``/``run``/``cancel``), so a due job starts
within milliseconds and CLI changes take effect without a restart or a tick.
Workers commit only while the lease is live and the run is still theirs; if the
lease is lost the dispatcher aborts its runs and exits without committing.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import attrs

from scheduler import lease as leases
from scheduler.artifacts import default_artifacts_root, run_dir
from scheduler.completion import complete_run
from scheduler.errors import SchedulerError
from scheduler.events import append_event
from scheduler.execution import EXECUTION_STATUSES, CancellationToken, ExecutionRequest, ExecutionResult
from scheduler.plugins.hooks import Hooks
from scheduler.queue import StartedRun, claim_and_start, materialize_due, next_due
from scheduler.recovery import recover
from scheduler.runs import StaleFence, fenced_update, run_to_json
from scheduler.spec import spec_from_row
from scheduler.store.base import Store
from scheduler.timeutil import now_ms, to_iso

log = logging.getLogger(__name__)

#: Longest the loop sleeps without looking at the database.
MAX_SLEEP_S = 1.0
#: How often the loop looks for cancel requests of its running runs (well inside the 250 ms promise).
CANCEL_CHECK_MS = 100
#: How often a sleeping loop looks for other processes' changes (well inside the 250 ms promise).
WAIT_SLICE_S = 0.02
#: How long a failed executor load is remembered before the dispatcher tries again.
EXECUTOR_RETRY_S = 30.0


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

    def _fenced(self, values: dict[str, Any], kind: str, data: dict[str, Any]) -> None:
        lease = self._d.lease
        assert lease is not None
        with self._d.store.transaction() as tx:
            leases.assert_live(tx, lease)
            fenced_update(tx, self.run_id, lease.owner, lease.token, "running", values)
            append_event(tx, kind, job_id=self.job_id, run_id=self.run_id, actor=lease.owner, data=data)

    def record_process(self, pid: int, pgid: int, start_time: str) -> None:
        self._fenced({"pid": pid, "pgid": pgid, "process_start_time": start_time, "process_state": "running"},
                     "run.process_started", {"pid": pid, "pgid": pgid})

    def record_termination(self, signal_name: str) -> None:
        try:
            self._fenced({"process_state": "terminated", "process_signal": signal_name, "process_terminated_at": now_ms()},
                         "run.process_terminated", {"signal": signal_name, "reason": self._reason})
        except SchedulerError as exc:  # lease lost: the recovering dispatcher records the end instead
            log.warning("could not record termination of run %s: %s", self.run_id, exc.message)

    def event(self, kind: str, data: dict[str, Any] | None = None) -> None:
        with self._d.store.transaction() as tx:
            append_event(tx, kind, job_id=self.job_id, run_id=self.run_id, actor=self._d.owner, data=data)


class Dispatcher:
    """One ``scheduler run`` process."""

    def __init__(self, store: Store, config: DispatcherConfig | None = None, *, hooks: Hooks | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.config = config or DispatcherConfig()
        self.owner = self.config.owner or leases.new_owner_id()
        exclusive = self.config.exclusive if self.config.exclusive is not None else store.dialect == "sqlite"
        self.exclusive = exclusive
        self.lease_name = "dispatcher" if exclusive else f"dispatcher:{self.owner}"
        self.lease: leases.Lease | None = None
        #: The singleton ``maintenance`` lease (shared mode only), while we hold it.
        self._maint: leases.Lease | None = None
        self.hooks = hooks
        self.say = say or (lambda _msg: None)
        self.artifacts_root = self.config.artifacts_root or default_artifacts_root(store.location)
        self._pool = ThreadPoolExecutor(max_workers=self.config.concurrency, thread_name_prefix="run")
        self._active: dict[str, tuple[Future[None], DbRunControl, StartedRun]] = {}
        self._active_lock = threading.Lock()
        self._wake = threading.Event()
        #: Results handed from workers to the loop, which commits them in groups.
        self._finished: queue.SimpleQueue[tuple[StartedRun, ExecutionResult]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lost: str | None = None
        self._executors: dict[str, Any] = {}
        self._executors_lock = threading.Lock()
        self._cancels_checked_at = 0
        self._pidfile: Any = None
        self._released = False
        self.stats = {"started": 0, "finished": 0, "skipped_commits": 0}

    # -- lifecycle -------------------------------------------------------------------------------

    def request_stop(self, *_args: Any) -> None:
        """Stop claiming new work (SIGTERM/SIGINT); running work gets the grace period."""
        self._stop.set()
        self._wake.set()

    def _lock_pidfile(self) -> str | None:
        """Single instance per SQLite file: an flock'd pid file beside the database.

        Returns None when locked, or the pid of the process holding it. A holder that
        lets its lease expire (stopped, hung) does not block a takeover: the lease, not
        the pid file, decides who owns the database.
        """
        if "://" in self.store.location or not self.exclusive:
            return None
        path = Path(self.store.location + ".dispatcher.pid")
        fh = open(path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            other = fh.read().strip() or "?"
            fh.close()
            return other
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._pidfile = fh
        return None

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
            if self._pidfile is not None:
                self._pidfile.close()
            raise SchedulerError(
                "DISPATCHER_ALREADY_RUNNING",
                f"dispatcher lease on {self.store.location} is held by {row['owner'] if row else '?'}"
                f" until {to_iso(row['expires_at']) if row else '?'}",
            )
        if holder is not None:
            self.say(f"pid file held by stalled process {holder} whose lease expired: taking over")
        self.lease = lease
        if self.hooks is None:
            self.hooks = Hooks()
        self.say(f"dispatcher {self.owner} holds lease {lease.name!r} with fencing token {lease.token}")
        threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True).start()
        self._recover()

    def _renew_loop(self) -> None:
        assert self.lease is not None
        interval = self.lease.ttl_ms / 3000
        while not self._stop.is_set() or self._active:
            time.sleep(interval)
            if self._lost is not None or self._released:
                return
            try:
                leases.renew(self.store, self.lease)
            except leases.LeaseLost as exc:
                self._on_lease_lost(exc.message)
                return
            except Exception as exc:  # database unavailable: keep trying until the lease runs out
                log.warning("lease renewal failed: %s", exc)
                if now_ms() >= self.lease.expires_at:
                    self._on_lease_lost(f"lease expired while renewal failed: {exc}")
                    return

    def _on_lease_lost(self, why: str) -> None:
        if self._released:
            return  # we gave it up ourselves during shutdown
        self._lost = why
        self.say(f"LEASE LOST: {why}; aborting runs, committing nothing")
        with self._active_lock:
            for _future, control, _s in self._active.values():
                control.cancel("lease_lost")
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
            for item in recover(self.store, lease, kill_grace_s=self.config.kill_grace_s):
                self.say(f"recovered run {item['run_id'][:8]}: {item['outcome']}")
        except leases.LeaseLost:
            pass

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
                if time.monotonic() >= next_recovery:
                    self._recover()
                    next_recovery = time.monotonic() + recovery_every
                timeout = self._tick()
                if deadline is not None:
                    timeout = min(timeout, max(0.0, deadline - time.monotonic()))
                self._wait(timeout)
        except leases.LeaseLost as exc:
            self._on_lease_lost(exc.message)
        finally:
            self._shutdown()
        if self._lost is not None:
            raise SchedulerError("LEASE_LOST", f"dispatcher stopped: {self._lost}")
        return 0

    def _tick(self) -> float:
        """One pass; returns how long to sleep.

        Finished runs are completed, due slots materialised and free workers given new
        runs in ONE write transaction (group commit: one commit for many runs). An idle
        pass costs one indexed read.
        """
        assert self.lease is not None
        self.store.wait_for_change(0)  # arm: changes after this point (not before our reads) wake the next wait
        tick_now = now_ms()
        if tick_now - self._cancels_checked_at >= CANCEL_CHECK_MS:
            self._propagate_cancels()
            self._cancels_checked_at = tick_now
        finished = self._take_finished()
        if not finished:
            with self.store.read() as tx:
                due = next_due(tx)
            if due is None or due > tick_now:
                return MAX_SLEEP_S if due is None else min(max(0.0, (due - now_ms()) / 1000), MAX_SLEEP_S)
        with self._active_lock:
            free = self.config.concurrency - len(self._active) + len(finished)
        veto = self.hooks.dispatch_veto if self.hooks else None
        committed: list[tuple[StartedRun, dict[str, Any]]] = []
        started: list[StartedRun] = []
        created = 0
        try:
            with self.store.transaction() as tx:
                leases.assert_live(tx, self.lease, now=tick_now)
                committed = self._complete(finished, now=tick_now)
                created = materialize_due(self.store, now=tick_now)
                if free > 0:
                    started = claim_and_start(self.store, self.lease, limit=free, now=tick_now, veto=veto, check_lease=False)
                due = None if started else next_due(tx)  # with new runs started, the loop comes straight back anyway
        except leases.LeaseLost:
            self._forget(finished)
            raise
        except SchedulerError as exc:
            if not finished:
                raise
            # One bad completion must not take the others (or new claims) down: commit them one by one.
            log.warning("group commit failed (%s); completing runs one at a time", exc.message)
            committed, started, created, due = self._complete_each(finished), [], 0, None
        self._forget(finished)
        if created:
            self.store.notify_change()  # other dispatchers (PostgreSQL) may claim the new slots too
        for s, run in committed:
            self._report(s, run)
        for s in started:
            self._submit(s)
        if started:
            return 0.0
        if due is None:
            return MAX_SLEEP_S
        if due <= tick_now:
            # Due work this pass could not start (pool full, or waiting behind a running run of
            # the same job): sleep until something changes (a run finishing wakes us).
            return MAX_SLEEP_S / 2
        # Not due at the start of this pass (maybe due by now: then the loop comes straight back).
        return min(max(0.0, (due - now_ms()) / 1000), MAX_SLEEP_S)

    def _take_finished(self) -> list[tuple[StartedRun, ExecutionResult]]:
        items = []
        while True:
            try:
                items.append(self._finished.get_nowait())
            except queue.Empty:
                return items

    def _complete(
        self, finished: list[tuple[StartedRun, ExecutionResult]], *, now: int | None = None
    ) -> list[tuple[StartedRun, dict[str, Any]]]:
        """Complete runs inside the caller's transaction; a run we no longer own is skipped, not fatal.

        With the pass's ``now``, retries and children due at once are claimed in the same pass.
        """
        assert self.lease is not None
        done = []
        for s, result in finished:
            try:
                done.append((s, complete_run(self.store, self.lease, s.run_id, result, now=now, check_lease=False)))
            except StaleFence as exc:
                self.stats["skipped_commits"] += 1
                self.say(f"{_clock()} not committing run {s.run_id[:8]}: {exc.message}")
        return done

    def _complete_each(self, finished: list[tuple[StartedRun, ExecutionResult]]) -> list[tuple[StartedRun, dict[str, Any]]]:
        """Commit runs one at a time; a run whose completion itself fails still ends (``COMPLETION_FAILED``)."""
        done = []
        for item in finished:
            try:
                with self.store.transaction() as tx:
                    assert self.lease is not None
                    leases.assert_live(tx, self.lease)
                    done += self._complete([item])
            except leases.LeaseLost:
                raise
            except Exception as exc:
                log.exception("completion of run %s failed", item[0].run_id)
                self._end_failed_completion(item[0], exc)
        return done

    def _end_failed_completion(self, s: StartedRun, exc: Exception) -> None:
        """Nothing stays ``running`` forever: record the failed completion as the run's (fenced) error."""
        assert self.lease is not None
        now = now_ms()
        message = f"completion failed: {type(exc).__name__}: {getattr(exc, 'message', exc)}"[:2000]
        try:
            with self.store.transaction() as tx:
                leases.assert_live(tx, self.lease)
                ended = tx.execute(
                    "UPDATE runs SET status = 'error', error_code = 'COMPLETION_FAILED', error_message = ?,"
                    " finished_at = CASE WHEN started_at > ? THEN started_at ELSE ? END,"
                    " terminal_at = CASE WHEN started_at > ? THEN started_at ELSE ? END"
                    " WHERE id = ? AND status = 'running' AND dispatcher_owner = ? AND dispatcher_token = ?",
                    (message, now, now, now, now, s.run_id, self.lease.owner, self.lease.token),
                )
                if ended:
                    tx.execute("UPDATE job_dispatch_queue SET status = 'failed', last_error = ?, updated_at = ? WHERE id = ?",
                               (message, now, s.dispatch_id))
                    append_event(tx, "run.completion_failed", job_id=s.job["id"], run_id=s.run_id, actor=self.owner,
                                 at=now, data={"error": message})
        except leases.LeaseLost:
            raise
        except Exception:
            log.exception("could not record the failed completion of run %s; recovery will end it", s.run_id)

    def _forget(self, finished: list[tuple[StartedRun, ExecutionResult]]) -> None:
        with self._active_lock:
            for s, _result in finished:
                self._active.pop(s.run_id, None)

    def _report(self, s: StartedRun, run: dict[str, Any]) -> None:
        """After a completion committed: count it, print it, tell the hooks."""
        self.stats["finished"] += 1
        took = run["duration_ms"] or 0
        detail = f" [{run['error_code']}]" if run["error_code"] and run["status"] != "ok" else ""
        self.say(f"{_clock()} {run['status']:<6} {s.job['name']} run {s.run_id[:8]} in {took} ms{detail}")
        if self.hooks:
            self.hooks.run_state_changed(s.run_id, s.job["id"], "running", run["status"], run["finished_at"])
            if self.hooks.wants("scheduler_run_completed"):
                with self.store.read() as tx:
                    full = tx.one("SELECT * FROM runs WHERE id = ?", (s.run_id,))
                self.hooks.run_completed(run_to_json(full or run, full=True))

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
                if entry and not entry[1].is_cancelled():
                    entry[1].cancel("user")

    # -- execution -------------------------------------------------------------------------------

    def _submit(self, s: StartedRun) -> None:
        control = DbRunControl(self, s.run_id, s.job["id"])
        self.stats["started"] += 1
        self.say(f"{_clock()} start  {s.job['name']} run {s.run_id[:8]} ({s.dispatch_kind}, attempt {s.attempt})")
        if self.hooks:
            self.hooks.run_state_changed(s.run_id, s.job["id"], None, "running", s.started_at)
        with self._active_lock:
            future = self._pool.submit(self._execute, s, control)
            self._active[s.run_id] = (future, control, s)

    def _executor(self, name: str) -> Any:
        """The loaded executor; a load failure is remembered for a short while, then retried (a fix may be installed)."""
        cached = self._executors.get(name)
        if cached is None or (isinstance(cached, tuple) and time.monotonic() >= cached[1]):
            with self._executors_lock:  # workers starting together load a driver once
                return self._load_executor(name)
        if isinstance(cached, tuple):
            raise cached[0]
        return cached

    def _load_executor(self, name: str) -> Any:
        cached = self._executors.get(name)
        if cached is None or (isinstance(cached, tuple) and time.monotonic() >= cached[1]):
            from scheduler.plugins.loader import load_provider

            try:
                cached = load_provider("executor", name)
            except SchedulerError as exc:
                err = SchedulerError(
                    "EXECUTOR_NOT_AVAILABLE", f"executor {name!r} is not available: {exc.message}", details={"cause": exc.code}
                )
                cached = (err, time.monotonic() + EXECUTOR_RETRY_S)
            self._executors[name] = cached
        if isinstance(cached, tuple):
            raise cached[0]
        return cached

    def _execute(self, s: StartedRun, control: DbRunControl) -> None:
        spec = spec_from_row(s.job)
        try:
            executor = self._executor(spec.executor_name())
            root = self.artifacts_root
            request = ExecutionRequest(
                run_id=s.run_id, job_id=s.job["id"], job=spec, attempt=s.attempt, scheduled_for_ms=s.scheduled_for,
                started_at_ms=s.started_at, deadline_ms=s.started_at + spec.run_timeout_ms,
                artifacts_dir=run_dir(root, s.run_id, create=False), artifacts_root=root,
                extra_env={"SCHEDULER_RUN_ID": s.run_id, "SCHEDULER_JOB_ID": s.job["id"], "SCHEDULER_JOB_NAME": spec.name,
                           "SCHEDULER_ATTEMPT": str(s.attempt)},
            )
            result = executor.execute(request, control)
            if not isinstance(result, ExecutionResult) or result.status not in EXECUTION_STATUSES:
                result = ExecutionResult(status="error", error_code="EXECUTOR_INVALID_RESULT",
                                         error_message=f"executor {spec.executor_name()!r} returned {type(result).__name__}")
        except SchedulerError as exc:
            details = exc.details if isinstance(exc.details, dict) else {}
            result = ExecutionResult(status="error", error_code=exc.code, error_message=exc.message, details=details)
        except Exception as exc:
            log.exception("executor crashed")
            result = ExecutionResult(status="error", error_code="EXECUTOR_CRASHED", error_message=f"{type(exc).__name__}: {exc}")
        self._finished.put((s, result))  # the loop commits it (group commit), under its fence
        self._wake.set()

    def _shutdown(self) -> None:
        """Stop: let runs finish within the grace period, cancel the rest, release the lease."""
        self._stop.set()
        with self._active_lock:
            pending = [f for f, _c, _s in self._active.values()]
        if pending and self._lost is None:
            self.say(f"stopping: waiting up to {self.config.grace_s:.0f}s for {len(pending)} run(s)")
            end = time.monotonic() + self.config.grace_s
            for f in pending:
                try:
                    f.result(timeout=max(0.0, end - time.monotonic()))
                except Exception:
                    pass
        with self._active_lock:
            for _f, control, _s in self._active.values():
                control.cancel("shutdown")
            pending = [f for f, _c, _s in self._active.values()]
        for f in pending:
            try:
                f.result(timeout=self.config.kill_grace_s + 10)
            except Exception:
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._lost is None and self.lease is not None:
            try:
                finished = self._take_finished()
                if finished:
                    with self.store.transaction() as tx:
                        leases.assert_live(tx, self.lease)
                        committed = self._complete(finished)
                    self._forget(finished)
                    self.store.notify_change()
                    for s, run in committed:
                        self._report(s, run)
            except leases.LeaseLost as exc:
                self._on_lease_lost(exc.message)
        if self.lease is not None and self._lost is None:
            self._released = True
            leases.release(self.store, self.lease)
            if self._maint is not None:
                leases.release(self.store, self._maint)
        if self._pidfile is not None:
            self._pidfile.close()


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def install_signal_handlers(dispatcher: Dispatcher) -> None:
    """SIGTERM and SIGINT stop claiming and start the graceful shutdown."""
    signal.signal(signal.SIGTERM, dispatcher.request_stop)
    signal.signal(signal.SIGINT, dispatcher.request_stop)
