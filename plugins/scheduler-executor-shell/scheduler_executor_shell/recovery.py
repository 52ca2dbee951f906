"""Crash recovery of shell runs: stop a dead dispatcher's process group, never a reused PID.

The run recorded ``{"pid", "pgid", "start_time", "host"}`` before its payload could
act (see ``runner.py``). Recovery on the same host checks the recorded identity: the
leader still being the same process, or surviving members of its group, means the
group is killed; a PID now owned by another process is never signalled.
"""

from __future__ import annotations

import socket

from scheduler_toolkit.process import kill_group, orphan_group_safe_to_kill

from scheduler.api import RecoveryOutcome, RecoveryRequest, SchedulerError


def recover_process_group(request: RecoveryRequest) -> RecoveryOutcome:
    """Make sure the run's process group is gone: ``gone``, ``terminated``, ``unknown`` or ``blocked``."""
    handle = request.handle or {}
    pid, pgid = handle.get("pid"), handle.get("pgid")
    if not isinstance(pid, int) or not isinstance(pgid, int):
        return RecoveryOutcome(state="gone")  # the payload never started (nothing was recorded)
    host = handle.get("host") or request.owner_host
    if host != socket.gethostname():
        return RecoveryOutcome(state="unknown", detail=f"process group ran on host {host}")
    verdict = orphan_group_safe_to_kill(pid, pgid, handle.get("start_time"))
    if not verdict:
        return RecoveryOutcome(state="gone")
    try:
        return RecoveryOutcome(state="terminated", detail=kill_group(pgid, request.kill_grace_s))
    except PermissionError:
        return RecoveryOutcome(state="blocked", detail="permission denied")
    except SchedulerError as exc:  # PROCESS_GROUP_SURVIVED: members stuck even after SIGKILL
        return RecoveryOutcome(state="blocked", detail=exc.code)
