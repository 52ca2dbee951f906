"""Hook module ``agent-sessions``: a session-mode turn joins its conversation only once its run is committed ``ok``.

Runs for every committed run transition of every executor, so it does nothing but a
dictionary lookup unless this process staged a turn for that run. It never raises (the
kernel would log it) and never touches the scheduler's database.
"""

from __future__ import annotations

import logging

from scheduler.api import hookimpl
from scheduler_executor_agent import sessions

log = logging.getLogger(__name__)
_FINAL = frozenset({"ok", "error", "timeout", "cancelled", "crashed", "skipped"})


@hookimpl
def scheduler_run_state_changed(run_id: str, new_status: str) -> None:
    """Promote or drop the staged turn of ``run_id`` when its final status is committed."""
    if new_status not in _FINAL:
        return
    try:
        sessions.settle(run_id, new_status)
    except Exception:  # noqa: BLE001 - an observer must never fail the kernel's commit path
        log.exception("agent session: could not record the turn of run %s", run_id)
