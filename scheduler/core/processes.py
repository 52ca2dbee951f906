"""Process identity and process-group termination (Linux ``/proc``), for executors and crash recovery.

A PID alone does not identify a process: after it exits the number can be reused.
``process_identity`` adds the process start time (field 22 of ``/proc/<pid>/stat``,
clock ticks since boot), which never changes for the life of a process, even across
``exec``. Recovery compares it with ``same_process`` before it signals anything.

``kill_group`` ends a whole process group (the command and every descendant that
stayed in it): SIGTERM (plus SIGCONT so stopped members can act on it), a grace
period, then SIGKILL, and it only returns once the group is confirmed gone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from scheduler.base.errors import SchedulerError

#: How long ``kill_group`` waits after SIGKILL before it gives up (the kernel needs only milliseconds).
KILL_CONFIRM_TIMEOUT_S = 5.0


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the ``(comm)``, which may contain spaces), or None."""
    # os.open/os.read: three system calls where a buffered open() makes nine (it runs once per spawned command).
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)  # one record, far below 4 KiB
    except OSError:
        return None
    finally:
        os.close(fd)
    end = raw.rfind(b")")
    if end < 0:
        return None
    return raw[end + 2 :].decode("ascii", errors="replace").split()


def process_identity(pid: int) -> str | None:
    """``"ticks:<starttime>"`` of a running (or zombie) process, None if it does not exist.

    The start time is field 22 of ``/proc/<pid>/stat``; together with the PID it tells
    a process apart from a later one that reuses the number.
    """
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return f"ticks:{fields[19]}"  # field 22 is index 19 once fields 1-2 are cut off


def same_process(pid: int, identity: str | None) -> bool:
    """True when ``pid`` still is the process recorded as ``identity`` (not a reused PID)."""
    if not identity:
        return False
    return process_identity(pid) == identity


def live_group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid`` that are not zombies (they can still act)."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None or len(fields) < 3:
            continue
        state, group = fields[0], fields[2]
        if group == str(pgid) and state not in ("Z", "X"):
            members.append(int(entry))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` can still run.

    ``os.killpg(pgid, 0)`` raising ``ProcessLookupError`` is the definitive answer.
    When it does not, the group may consist only of zombies waiting for init to reap
    them (some container inits reap only every second or so); those are dead, so
    the group counts as gone when ``/proc`` shows no live member.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member exists but belongs to someone else
    return bool(live_group_members(pgid))


def leftovers_after_reap(pgid: int) -> bool:
    """After the group leader (PID ``pgid``) was reaped: whether members of its group may still exist.

    The cheap check for the common path, with no ``/proc`` scan: ``killpg(pgid, 0)``
    failing with ``ESRCH`` means the group is empty. While members exist the number
    stays allocated (Linux never hands out a PID still used as a group id), so a
    process now owning PID ``pgid`` proves the group had emptied and the number was
    reused: not ours, never to be signalled. Otherwise True: members (live, or zombies
    their new parent has not reaped yet; ``kill_group``/``group_alive`` tell those apart).
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member exists but belongs to someone else (it changed its uid)
    return process_identity(pgid) is None


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the group; False if the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pgid: int, timeout_s: float, reap: Callable[[], object] | None) -> bool:
    """Poll until the group is gone or ``timeout_s`` passes; ``reap`` collects our own child meanwhile."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    pause = 0.005
    while True:
        if reap is not None:
            reap()
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def kill_group(pgid: int, grace_s: float, *, reap: Callable[[], object] | None = None) -> str:
    """Terminate process group ``pgid``; return the strongest signal used (``"SIGTERM"`` or ``"SIGKILL"``).

    SIGTERM (and SIGCONT, so a stopped member can handle it) goes to the whole group;
    after ``grace_s`` seconds survivors get SIGKILL. The function returns only when
    the group is confirmed gone (see ``group_alive``). ``reap`` (e.g. ``Popen.poll``)
    is called while waiting so that our own child, the group leader, does not linger
    as a zombie. Raises ``PROCESS_GROUP_SURVIVED`` if members remain even after SIGKILL
    (e.g. stuck in uninterruptible I/O).
    """
    if not _signal_group(pgid, signal.SIGTERM):
        return "SIGTERM"
    _signal_group(pgid, signal.SIGCONT)
    if _wait_gone(pgid, grace_s, reap):
        return "SIGTERM"
    _signal_group(pgid, signal.SIGKILL)
    if _wait_gone(pgid, KILL_CONFIRM_TIMEOUT_S, reap):
        return "SIGKILL"
    raise SchedulerError(
        "PROCESS_GROUP_SURVIVED",
        f"process group {pgid} still has live members {live_group_members(pgid)} after SIGKILL",
    )


def orphan_group_safe_to_kill(pid: int, pgid: int, identity: str | None) -> bool | None:
    """Decide whether a recorded group may be killed during recovery.

    True: the recorded leader is still the same process and something of its group can
    still run, or the leader is gone but members of its group survive (a PGID cannot be
    reused while members exist). False: nothing that can run is left (a zombie leader
    nobody reaped counts as gone: there is nothing to signal). None: the PID now belongs
    to another process that leads a group with the same number (reuse), so it must not
    be touched.
    """
    leader_identity = process_identity(pid)
    if leader_identity is not None and leader_identity == identity:
        return group_alive(pgid)
    if leader_identity is not None and pid == pgid:
        return None
    return group_alive(pgid)


#: Environment variables the dynamic loader (glibc ``ld.so``, macOS ``dyld``) or libc reads to load code into
#: every process started with them: any ``LD_*`` (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT``, ...) and
#: ``DYLD_*`` (``DYLD_INSERT_LIBRARIES``, ...), plus glibc's module paths (``GCONV_PATH`` loads iconv modules,
#: ``LOCPATH``/``NLSPATH`` locale data). The one list: the shell executor's ``env_allow`` refuses them, and
#: credential bindings may not present a value under them (``scheduler.pipeline.credentials.bindings``).
LOADER_ENV_PREFIXES = ("LD_", "DYLD_")
LOADER_ENV_NAMES = frozenset({"GCONV_PATH", "LOCPATH", "NLSPATH", "MALLOC_TRACE", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN"})


def is_loader_variable(name: str) -> bool:
    """True when ``name`` (compared upper-cased) is a variable the dynamic loader or libc acts on (``LOADER_ENV_*``)."""
    upper = name.upper()
    return upper.startswith(LOADER_ENV_PREFIXES) or upper in LOADER_ENV_NAMES
