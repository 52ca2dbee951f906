"""The worker pool: daemon threads that run executor calls."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("scheduler.core.dispatcher")


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
