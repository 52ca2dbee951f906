"""Group commit of the workers' fenced bookkeeping writes (``RunControl.record_handle`` and friends).

A shell run must make its process identity durable before its payload may start
(crash recovery needs it to find the process group), so every spawn waits for a
commit. Done one transaction per run, four workers made four commits for four
spawns that were due together, each paying the lease read and, at
``synchronous=FULL``, an fsync. Here one writer thread per dispatcher takes every
write queued meanwhile and commits them in ONE transaction: the lease is asserted
once, then per write a fenced ``UPDATE`` of the run plus its event. A write is
acknowledged (its caller returns) only after that commit, so the durability promise
is exactly the one of a transaction per write; the caller may wait a few
milliseconds longer, the database sees a fraction of the commits.

Failures stay per write: a run that is no longer ours (``STALE_FENCE``) fails only
its own write (the ``UPDATE`` matched no row, so nothing of it was written); a lost
lease fails every fenced write of the group (unfenced events still commit); any
other error rolls the group back and each write is retried in a transaction of its
own, so one bad row cannot fail the others.

The dispatcher's pass takes part too (``join``): just before it commits, it takes the
queued bookkeeping writes into its own transaction (its lease already asserted), so a
process identity recorded while a pass holds the write lock rides that pass's commit
instead of waiting for it and then paying a commit of its own. Those writes are
acknowledged once the pass has committed (``acknowledge``); should the pass fail, they go
back to the queue (``give_back``) and the writer thread commits them on its own, never
joined again. Event-only writes (an executor's own event kinds) always stay with the
writer thread: a statement failing in a pass's transaction would take the pass down on
PostgreSQL.

The thread starts on the first write and ends after ``IDLE_EXIT_S`` without one, so
a dispatcher whose executors never record anything (no-op, HTTP agents that only
send events rarely) runs no extra thread and makes no extra query.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core.events import append_event
from scheduler.core.lease import Lease, LeaseLost, assert_live
from scheduler.core.runs import StaleFence
from scheduler.core.store.base import Store, Tx
from scheduler.core.transitions import fenced_update

if TYPE_CHECKING:
    from scheduler.core.rows import SQLValue

log = logging.getLogger(__name__)

#: The writer thread exits after this long without a write (and starts again on the next).
IDLE_EXIT_S = 2.0


def _held_lock() -> threading.Lock:
    """A lock already taken: the cheapest one-shot hand-off between two threads (one ``release`` wakes the waiter)."""
    lock = threading.Lock()
    lock.acquire()
    return lock


@attrs.define(eq=False)
class FencedWrite:
    """One queued write: bookkeeping ``values`` on a ``running`` run under the lease (None: event only) and its event."""

    run_id: str
    job_id: str
    kind: str
    data: Mapping[str, object] | None
    values: dict[str, SQLValue] | None = None
    #: Released (once) when the write is settled: committed, or ``error`` set; its writer waits by acquiring it.
    done: threading.Lock = attrs.field(factory=_held_lock)
    error: BaseException | None = None
    #: Set when a pass that took this write failed: from then on only the writer thread commits it.
    solo: bool = False


class FencedWriter:
    """Commits the queued writes of all workers in one transaction per group (see the module docstring)."""

    def __init__(self, store: Store, lease: Callable[[], Lease | None], actor: str) -> None:
        self._store = store
        self._lease = lease
        self._actor = actor
        self._queue: deque[FencedWrite] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._running = False
        #: Whether the dispatcher's pass is open (``pass_opens``): it will take the queued bookkeeping writes.
        self._passing = False
        #: Commits made and writes committed (the bench reports writes per commit); ``joined``: those of ``writes``
        #: that rode a pass's commit (``join``).
        self.commits = 0
        self.writes = 0
        self.joined = 0

    def write(self, item: FencedWrite) -> None:
        """Queue ``item`` and block until it is committed; raises what failed it (``STALE_FENCE``, ``LEASE_LOST``...)."""
        with self._cond:
            self._queue.append(item)
            self._wake_writer()
        item.done.acquire()
        if item.error is not None:
            raise item.error

    def _loop(self) -> None:
        """Once a write is queued, open a transaction and commit everything queued by then as one group,
        acknowledge; exit when idle for ``IDLE_EXIT_S``. While the dispatcher's pass is open this waits for it:
        the pass takes the queued bookkeeping writes into its own commit (``join``)."""
        while True:
            with self._cond:
                if not self._cond.wait_for(self._ready, IDLE_EXIT_S):
                    if self._queue:  # a pass is open (a long one): wait on, the writes are still owed
                        continue
                    self._running = False
                    return
            batch: list[FencedWrite] = []
            try:
                self._commit_group(batch, take=True)
            except BaseException as exc:  # the group failed as a whole: each write on its own
                if not batch:  # failed before it took the queue (the transaction did not start)
                    batch = self._take()
                if not isinstance(exc, Exception):  # an interrupt: nothing is acknowledged, every caller sees it
                    for item in batch:
                        item.error = exc
                        item.done.release()
                    with self._cond:
                        self._running = False
                    raise
                if len(batch) == 1:
                    batch[0].error = exc
                else:
                    log.debug("group of %d fenced writes failed (%s); committing each on its own", len(batch), exc)
                    for item in batch:
                        try:
                            self._commit_group([item])
                        except Exception as one:  # noqa: BLE001 - reported to that write's caller
                            item.error = one
            for item in batch:
                item.done.release()

    def _ready(self) -> bool:
        """Called with ``_cond`` held: something is queued that no open pass will take."""
        return bool(self._queue) and (not self._passing or any(item.values is None or item.solo for item in self._queue))

    def pass_opens(self) -> None:
        """The dispatcher's pass is about to open its transaction: the writer thread leaves the queue to it."""
        with self._cond:
            self._passing = True

    def pass_closes(self) -> None:
        """The pass committed (or failed) and settled what it ``join``-ed: the writer thread takes what is left."""
        with self._cond:
            self._passing = False
            if self._queue:
                self._cond.notify()

    def join(self, tx: Tx, lease: Lease, taken: list[FencedWrite]) -> None:
        """Inside the dispatcher's pass, its lease asserted: move the queued bookkeeping writes to ``taken`` and write
        them in ``tx``; the caller ``acknowledge``-s them once ``tx`` committed, or gives them back when it did not
        (``taken`` holds them from the moment they left the queue, so a failure half-way loses none).

        A run that is no longer ours fails its own write only (``StaleFence``: the ``UPDATE`` matched no row).
        """
        with self._cond:
            if not self._queue:
                return
            mine = [item for item in self._queue if item.values is not None and not item.solo]
            if not mine:
                return
            if len(mine) == len(self._queue):
                self._queue.clear()
            else:
                kept = [item for item in self._queue if item.values is None or item.solo]
                self._queue.clear()
                self._queue.extend(kept)
            taken.extend(mine)
        for item in mine:
            item.error = None
            _write_fenced(tx, item, lease)

    def acknowledge(self, taken: list[FencedWrite]) -> None:
        """The pass that ``join``-ed ``taken`` committed: their writers return (or raise their own ``StaleFence``)."""
        written = sum(1 for item in taken if item.error is None)
        self.writes += written
        self.joined += written
        for item in taken:
            item.done.release()

    def give_back(self, taken: list[FencedWrite]) -> None:
        """The pass that ``join``-ed ``taken`` did not commit: the writer thread commits them, each group on its own."""
        if not taken:
            return
        with self._cond:
            for item in reversed(taken):
                item.solo = True
                item.error = None
                self._queue.appendleft(item)
            self._wake_writer()

    def _wake_writer(self) -> None:
        """Called with ``_cond`` held, after queueing: tell the writer thread, or start it if it is not running."""
        if self._running:
            self._cond.notify()
        else:
            self._running = True
            threading.Thread(target=self._loop, name="fenced-writes", daemon=True).start()

    def _take(self) -> list[FencedWrite]:
        """Everything queued now, in order; the queue is left empty."""
        with self._cond:
            batch = list(self._queue)
            self._queue.clear()
        return batch

    def _commit_group(self, batch: list[FencedWrite], *, take: bool = False) -> None:
        """One transaction: the lease asserted once (when any write is fenced), then each write in order.

        With ``take`` the queue is taken into ``batch`` once the transaction has started:
        writes queued while it waited for the database's write lock (the loop's own
        transactions hold it often) join this group instead of waiting for a commit of their own.
        """
        with self._store.transaction() as tx:
            if take:
                batch.extend(self._take())
            lease = self._lease()
            lost: SchedulerError | None = None
            if any(item.values is not None for item in batch):
                if lease is None:
                    lost = LeaseLost("the dispatcher holds no lease")
                else:
                    try:
                        assert_live(tx, lease)
                    except LeaseLost as exc:
                        lost = exc
            written = 0
            for item in batch:
                item.error = None
                if item.values is not None:
                    if lost is not None:
                        item.error = lost
                        continue
                    assert lease is not None
                    written += _write_fenced(tx, item, lease)
                    continue
                _append(tx, item, self._actor)
                written += 1
        if batch:  # a pass may have taken everything while this waited for the write lock: nothing was committed
            self.commits += 1
        self.writes += written


def _write_fenced(tx: Tx, item: FencedWrite, lease: Lease) -> bool:
    """A bookkeeping write and its event under ``lease``; False (``item.error`` set, nothing written) when the run is
    no longer ours (``StaleFence``: the ``UPDATE`` matched no row)."""
    assert item.values is not None
    try:
        fenced_update(tx, item.run_id, lease.owner, lease.token, "running", item.values)
    except StaleFence as exc:
        item.error = exc
        return False
    _append(tx, item, lease.owner)
    return True


def _append(tx: Tx, item: FencedWrite, actor: str) -> None:
    append_event(tx, item.kind, job_id=item.job_id, run_id=item.run_id, actor=actor, data=item.data)
