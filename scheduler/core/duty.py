"""A dispatcher's background duty: a daemon thread that runs a pass, sleeps as long as the pass says, and can be woken.

The delivery worker and the retention duty are both this loop; a subclass gives ``run_once``
(one pass, returning the seconds to sleep before the next) and ``pass_failed`` (what a pass
that raised means: it is logged and the loop sleeps the seconds returned, for the dispatcher
must outlive a bad pass).

The dispatcher starts its duties with the lease and stops them at shutdown; it knows them only
as ``Duty`` (built by a ``DutyFactory`` from a ``DutyContext``), handed in through ``Parts``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from scheduler.core.lease import Lease
    from scheduler.core.store.base import Store


@attrs.frozen
class DutyContext:
    """What a duty of one dispatcher is built from."""

    store: Store
    #: The dispatcher's owner id (the duty's actor and claim owner).
    owner: str
    artifacts_root: Path
    say: Callable[[str], None]
    #: The lease fencing singleton work: the dispatcher's own (one dispatcher per database) or the shared
    #: ``maintenance`` lease while this dispatcher holds it (None meanwhile).
    singleton_fence: Callable[[], Lease | None]


class Duty(Protocol):
    """Background work the dispatcher runs while it holds its lease."""

    def start(self) -> None:
        """Start (the lease is held)."""
        ...

    def stop(self) -> None:
        """Stop after the work in progress (shutdown)."""
        ...

    def after_pass(self, idle: bool) -> None:
        """Called after each pass of the loop: ``idle`` when the pass found nothing due (another process changed
        the database, perhaps). Must be cheap: the loop's hot path calls it."""
        ...


class DutyFactory(Protocol):
    """Builds one dispatcher's duty."""

    def __call__(self, context: DutyContext) -> Duty:
        """The duty for the dispatcher ``context`` describes (not started)."""
        ...


class DutyThread:
    """``start`` / ``wake`` / ``stop`` around a loop of ``run_once`` passes in a daemon thread.

    ``first_delay`` is how long the thread waits before its first pass (0: at once).
    ``stop`` ends the loop after the pass in progress.
    """

    thread_name = "duty"
    first_delay = 0.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (a daemon: it never holds a shutdown up beyond the pass it is in)."""
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the next pass now instead of at the end of the current sleep."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current pass (waiting at most ``timeout`` seconds for it)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_once(self) -> float:
        """One pass; the seconds until the next."""
        raise NotImplementedError

    def pass_failed(self, exc: Exception) -> float:
        """Log a pass that raised ``exc``; the seconds until the next try."""
        raise NotImplementedError

    def _loop(self) -> None:
        delay = self.first_delay
        while not self._stop.is_set():
            if delay > 0:
                self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                delay = self.run_once()
            except Exception as exc:  # noqa: BLE001 - a failed pass is retried; the dispatcher keeps going
                delay = self.pass_failed(exc)
