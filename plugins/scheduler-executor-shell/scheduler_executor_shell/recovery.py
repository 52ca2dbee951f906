"""Crash recovery of shell runs: stop a dead dispatcher's cgroup and process group, never a reused PID.

The run recorded ``{"pid", "pgid", "start_time", "host"}`` (and ``"cgroup"`` when it ran in
one, ``cgroups.py``) before its payload could act (see ``runner.py``). Recovery on the same
host kills the recorded cgroup as a whole when something is left in it (a cgroup is never
reused: its name holds the run id and the gate's PID), then checks the recorded group: the
leader still being the same process, or surviving members of its group, means the group is
killed; a PID now owned by another process is never signalled. A recorded cgroup that is not
a cgroup of this run (an edited row) is never touched: the run stays ``blocked``.
"""

from __future__ import annotations

import socket

from scheduler_toolkit.process import kill_group, orphan_group_safe_to_kill

from scheduler.api import RecoveryOutcome, RecoveryRequest, SchedulerError
from scheduler_executor_shell.cgroups import (
    Unavailable,
    cgroup_populated,
    has_cgroup_kill,
    kill_cgroup,
    recorded_cgroup,
    remove_cgroup,
)


def recover_process_group(request: RecoveryRequest) -> RecoveryOutcome:
    """Make sure the run's cgroup and process group are gone: ``gone``, ``terminated``, ``unknown`` or ``blocked``."""
    handle = request.handle or {}
    pid, pgid = handle.get("pid"), handle.get("pgid")
    if not isinstance(pid, int) or not isinstance(pgid, int):
        return RecoveryOutcome(state="gone")  # the payload never started (nothing was recorded)
    host = handle.get("host") or request.owner_host
    if host != socket.gethostname():
        return RecoveryOutcome(state="unknown", detail=f"process group ran on host {host}")
    killed: str | None = None
    directory = recorded_cgroup(handle.get("cgroup"), request.run_id)
    if isinstance(directory, Unavailable):
        return RecoveryOutcome(state="blocked", detail=directory.reason)
    if directory is not None:
        try:
            if cgroup_populated(directory):
                killed = kill_cgroup(directory, request.kill_grace_s, has_kill=has_cgroup_kill(directory))
        except PermissionError:
            return RecoveryOutcome(state="blocked", detail="permission denied")
        except SchedulerError as exc:  # PROCESS_GROUP_SURVIVED: members stuck even after SIGKILL
            return RecoveryOutcome(state="blocked", detail=exc.code)
        remove_cgroup(directory)
    verdict = orphan_group_safe_to_kill(pid, pgid, handle.get("start_time"))
    if not verdict:
        return RecoveryOutcome(state="gone") if killed is None else RecoveryOutcome(state="terminated", detail=killed)
    try:
        return RecoveryOutcome(state="terminated", detail=kill_group(pgid, request.kill_grace_s))
    except PermissionError:
        return RecoveryOutcome(state="blocked", detail="permission denied")
    except SchedulerError as exc:  # PROCESS_GROUP_SURVIVED: members stuck even after SIGKILL
        return RecoveryOutcome(state="blocked", detail=exc.code)
