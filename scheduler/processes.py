"""Process identity and process-group termination, used by executors and by crash recovery.

A PID alone is not an identity: after a crash the number may belong to an
unrelated process. We pair it with the process start time from ``/proc`` so
recovery never signals a reused PID.
"""

from __future__ import annotations

import os
import signal
import time


def process_identity(pid: int) -> str | None:
    """A stable identity for a live process (``ticks:<starttime>`` from /proc), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(")") + 2 :].split()
    try:
        return f"ticks:{int(fields[19])}"
    except (IndexError, ValueError):
        return None


def same_process(pid: int, identity: str | None) -> bool:
    """True only if ``pid`` is alive and still the process recorded with ``identity``."""
    return identity is not None and process_identity(pid) == identity


def group_alive(pgid: int) -> bool:
    """Whether any process is left in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace_s: float = 2.0) -> str:
    """SIGTERM the group, wait up to ``grace_s``, SIGKILL what is left, and confirm it is gone.

    Returns the strongest signal used (``SIGTERM`` or ``SIGKILL``, ``none`` if the group
    was already gone). Raises ``PermissionError`` if the group cannot be signalled.
    """
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return "none"
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return "SIGTERM"
        time.sleep(0.02)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return "SIGTERM"
    deadline = time.monotonic() + 5.0
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "SIGKILL"


def orphan_group_safe_to_kill(pid: int, pgid: int, identity: str | None) -> bool | None:
    """Decide whether a recorded group may be killed during recovery.

    True: the recorded leader is still the same process, or the leader is gone but
    members of its group survive (a PGID cannot be reused while members exist).
    False: nothing is left. None: the PID now belongs to another process that leads a
    group with the same number (reuse), so it must not be touched.
    """
    leader_identity = process_identity(pid)
    if leader_identity is not None and leader_identity == identity:
        return True
    if leader_identity is not None and pid == pgid:
        return None
    return group_alive(pgid)
