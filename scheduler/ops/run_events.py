"""``scheduler --json run``: one JSON object per run event (NDJSON), from the observer hooks the dispatcher already calls.

``RunEventLines`` is an in-process hook plugin (``scheduler_run_state_changed``,
``scheduler_run_completed``) that ``scheduler run`` registers only under ``--json``: the
dispatcher tells observers of every committed transition anyway, so nothing is added to its
path when the flag is absent, and with it the cost is one line per event (and the one batched
read of completed runs that ``scheduler_run_completed`` implies). Events:

* ``run.started``: a run went ``running`` (claimed, or approved and started);
* ``run.finished``: a run reached a terminal status (``ok``, ``error``, ``timeout``,
  ``cancelled``, ``crashed``, ``skipped``), with its error code, exit code and duration;
* ``run.state_changed``: any other transition (``awaiting_approval``, ``recovery_blocked``, ...).

Each carries ``event``, ``at`` (ISO-8601), ``run_id``, ``job_id``, ``job`` (the job's name, None
once deleted) and ``status``. The summary ``scheduler run`` prints when it stops stays the last line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from scheduler.base.timeutil import to_iso
from scheduler.core.runs import TERMINAL
from scheduler.core.store.base import Store
from scheduler.plugins.hookspecs import hookimpl

#: The fields of a run's JSON view a ``run.finished`` event carries besides the common ones.
FINISHED_FIELDS = ("dispatch_kind", "attempt", "error_code", "error_message", "skip_reason", "exit_code", "duration_ms",
                   "started_at", "finished_at")


class RunEventLines:
    """Writes one JSON object per run event through ``write`` (``echo_json``); thread-safe, never raises into core."""

    def __init__(self, store: Store, write: Callable[[dict[str, Any]], None]) -> None:
        """``store``: where job names are read (once per job); ``write``: prints one object as one line."""
        self._store = store
        self._write = write
        self._lock = threading.Lock()
        self._names: dict[str, str | None] = {}

    def _job_name(self, job_id: str) -> str | None:
        """The job's name, read on first sight of the job and kept (a rename shows from the next start of the process)."""
        if job_id not in self._names:
            with self._store.read() as tx:
                self._names[job_id] = tx.scalar("SELECT name FROM jobs WHERE id = ?", (job_id,))
        return self._names[job_id]

    def _emit(self, event: str, at: str | None, run_id: str, job_id: str, status: str, **extra: Any) -> None:
        """Write one event line (under the lock: workers and the loop may commit at once)."""
        with self._lock:
            self._write({"event": event, "at": at, "run_id": run_id, "job_id": job_id, "job": self._job_name(job_id),
                         "status": status, **extra})

    @hookimpl
    def scheduler_run_state_changed(self, run_id: str, job_id: str, old_status: str | None, new_status: str,
                                    at_ms: int) -> None:
        """``run.started`` or ``run.state_changed``; a terminal status waits for ``scheduler_run_completed``."""
        if new_status in TERMINAL:
            return
        event = "run.started" if new_status == "running" else "run.state_changed"
        self._emit(event, to_iso(at_ms), run_id, job_id, new_status, old_status=old_status)

    @hookimpl
    def scheduler_run_completed(self, run: dict[str, Any]) -> None:
        """``run.finished`` with the run's outcome, from its JSON view read after the commit."""
        self._emit("run.finished", run.get("terminal_at") or run.get("finished_at"), str(run["id"]), str(run["job_id"]),
                   str(run["status"]), **{k: run.get(k) for k in FINISHED_FIELDS})
