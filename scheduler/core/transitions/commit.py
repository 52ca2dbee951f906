"""After-commit observer notices: ``committing`` opens the outermost write transaction of code that changes a
run's status; each transition made in it queues a ``RunNotice`` (``notify``), fired once the transaction committed,
never when it rolled back (``hooks=None``: the process's default observers, ``scheduler.core.observers``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import attrs

from scheduler.core import observers
from scheduler.core.rows import JSONObject, RunRow
from scheduler.core.runs import TERMINAL, run_to_json
from scheduler.core.store.base import Store, Tx

if TYPE_CHECKING:
    from scheduler.core.observers import Observers

log = logging.getLogger("scheduler.core.transitions")

#: Rows read per query when observers of ``scheduler_run_completed`` need full runs.
_READ_CHUNK = 500


# -- after-commit notifications --------------------------------------------------------------------


@attrs.frozen
class RunNotice:
    """One committed run transition, as observers are told about it."""

    run_id: str
    job_id: str
    old_status: str | None
    new_status: str
    at_ms: int

    @property
    def terminal(self) -> bool:
        """Whether the run ended with this transition (``scheduler_run_completed`` fires too)."""
        return self.new_status in TERMINAL


class AfterCommit:
    """The observer notifications queued by the transitions of one transaction."""

    def __init__(self) -> None:
        #: The queued transitions as ``RunNotice`` fields (``notify`` queues a tuple: the notice is made only when
        #: an observer wants it, at ``fire``).
        self.queued: list[tuple[str, str, str | None, str, int]] = []

    @property
    def notices(self) -> list[RunNotice]:
        """The queued notifications, in order."""
        return [RunNotice(*fields) for fields in self.queued]

    def add(self, notice: RunNotice) -> None:
        """Queue one notification (fired by ``fire`` once the transaction committed)."""
        self.queued.append((notice.run_id, notice.job_id, notice.old_status, notice.new_status, notice.at_ms))

    def fire(self, store: Store, hooks: Observers | None = None) -> None:
        """Tell observers about every queued transition, in order; never raises.

        ``scheduler_run_completed`` gets the run's full JSON view, read once for all
        terminal runs of the transaction and only when a plugin implements that hook
        (the dispatcher's hot path pays nothing for observers nobody installed).
        """
        queued, self.queued = self.queued, []
        if not queued:
            return
        try:
            if hooks is None:
                hooks = observers.default()
                if hooks is None:
                    return
            wants_state = hooks.wants("scheduler_run_state_changed")
            wants_done = hooks.wants("scheduler_run_completed")
            if not (wants_state or wants_done):
                return
            notices = [RunNotice(*fields) for fields in queued]
            rows = _read_runs(store, [n.run_id for n in notices if n.terminal]) if wants_done else {}
            for n in notices:
                if wants_state:
                    hooks.run_state_changed(n.run_id, n.job_id, n.old_status, n.new_status, n.at_ms)
                if wants_done and n.terminal:
                    row = rows.get(n.run_id)  # None: deleted meanwhile (``jobs delete``)
                    view: JSONObject = run_to_json(row, full=True) if row is not None else {
                        "id": n.run_id, "job_id": n.job_id, "status": n.new_status}
                    hooks.run_completed(view)
        except Exception:  # an observer problem never undoes or blocks a committed transition
            log.exception("could not notify observers of %d run transition(s)", len(queued))


def _read_runs(store: Store, run_ids: list[str]) -> dict[str, RunRow]:
    out: dict[str, RunRow] = {}
    with store.read() as tx:
        for i in range(0, len(run_ids), _READ_CHUNK):
            chunk = run_ids[i:i + _READ_CHUNK]
            marks = ", ".join("?" for _ in chunk)
            for row in tx.all(f"SELECT * FROM runs WHERE id IN ({marks})", chunk):
                run = RunRow.from_row(row)
                out[run.id] = run
    return out


_scope: ContextVar[AfterCommit | None] = ContextVar("scheduler_after_commit", default=None)


@contextmanager
def committing(store: Store, hooks: Observers | None = None) -> Iterator[Tx]:
    """A write transaction whose run transitions notify observers once it committed.

    Use it for the outermost transaction of any code that may change a run's status.
    Nested inside another ``committing`` block it joins that block (its ``hooks`` are
    the outer block's): the notifications fire when the outermost transaction commits,
    and are dropped if it rolls back.
    """
    if _scope.get() is not None:
        with store.transaction() as tx:
            yield tx
        return
    pending = AfterCommit()
    token = _scope.set(pending)
    try:
        with store.transaction() as tx:
            yield tx
    finally:
        _scope.reset(token)
    pending.fire(store, hooks)


def notify(run_id: str, job_id: str, old: str | None, new: str, at_ms: int) -> None:
    """Queue the observer notice of one run transition on the enclosing ``committing`` block (fired once it committed)."""
    scope = _scope.get()
    if scope is None:
        log.debug("run %s %s -> %s outside a committing() transaction: observers not notified", run_id, old, new)
        return
    scope.queued.append((run_id, job_id, old, new, at_ms))
