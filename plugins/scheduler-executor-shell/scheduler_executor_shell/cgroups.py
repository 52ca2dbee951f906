"""Cgroup v2 containment of shell runs: every process a command starts, ``setsid`` or not, in one cgroup of its own.

A process group holds only what stays in it: a child that calls ``setsid`` (or ``setpgid``)
leaves it, so ``kill_group`` never sees it and it outlives its run. A cgroup is inherited by
every descendant and cannot be left without write access to a ``cgroup.procs`` above it, so
where this host offers a cgroup v2 subtree the dispatcher may write (root, or a delegated
subtree such as a systemd unit with ``Delegate=yes``), each command runs in
``<the dispatcher's cgroup>/scheduler-run-<run id>-<step>-<token>``:

* ``find_place()`` finds the dispatcher's own cgroup v2 directory (``/proc/self/cgroup`` line
  ``0::``, under the ``cgroup2`` mount of ``/proc/self/mountinfo``) and proves it writable by
  creating and removing a probe cgroup; else it says why not (``Unavailable``). The first run of
  an executor process removes the empty run cgroups dead dispatchers left there (``sweep_stale``);
* ``RunCgroup.create`` makes the run's cgroup and the gate process is moved into it while the
  gate still blocks before the payload (nothing has forked yet, so nothing escapes): the bash
  gate writes its own PID into ``cgroup.procs`` (so the move, which can wait for an RCU grace
  period, overlaps the handle's commit), otherwise ``adopt(pid)`` moves it;
* ``kill_cgroup`` sends SIGTERM (and SIGCONT) to every member, waits the grace, then kills
  the whole cgroup at once (``cgroup.kill``; on kernels before 5.14, freeze, SIGKILL every
  member, thaw) and returns once ``cgroup.events`` says ``populated 0`` (zombies do not count);
* ``recorded_cgroup`` turns the path a run recorded in its process handle back into a
  directory for crash recovery, only when it is a run cgroup of that very run under a cgroup2
  mount (a row edited to name another cgroup is never killed).

The mode is ``[executors.shell] containment``: ``auto`` (a cgroup where available, else the
process group), ``cgroup`` (refused with ``CGROUP_UNAVAILABLE`` where it is not) or
``process-group``.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable

import attrs

from scheduler.api import SchedulerError

#: Name prefix of every run cgroup (recovery kills nothing else).
RUN_PREFIX = "scheduler-run-"
#: How long ``kill_cgroup`` waits after the kill before it gives up (the kernel needs only milliseconds).
KILL_CONFIRM_TIMEOUT_S = 5.0
#: How long the freeze of the pre-5.14 fallback may take to settle.
FREEZE_TIMEOUT_S = 1.0
#: An empty run cgroup older than this is a leftover (its dispatcher died, and nothing recovered the run there).
STALE_AFTER_S = 60.0


@attrs.frozen
class Place:
    """Where run cgroups are made: the ``cgroup2`` mount point and the dispatcher's own cgroup under it."""

    mount: str
    #: The mount's root within the hierarchy (field 4 of mountinfo; "/" unless a subtree is mounted).
    root: str
    #: The dispatcher's cgroup as ``/proc/self/cgroup`` names it ("/" for the root cgroup).
    own: str
    #: Whether the kernel has ``cgroup.kill`` (5.14+); else freeze and kill every member.
    has_kill: bool

    @property
    def directory(self) -> str:
        """The dispatcher's cgroup directory, where run cgroups are created."""
        return _under(self.mount, self.root, self.own)


@attrs.frozen
class Unavailable:
    """Why run cgroups cannot be used on this host."""

    reason: str


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path (the ``0::`` line of ``/proc/self/cgroup``), or None without one."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].strip() or "/"
    except OSError:
        return None
    return None


def cgroup2_mounts() -> list[tuple[str, str]]:
    """``(root within the hierarchy, mount point)`` of every ``cgroup2`` mount in ``/proc/self/mountinfo``."""
    mounts: list[tuple[str, str]] = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            for line in fh:
                left, sep, right = line.partition(" - ")
                if not sep or right.split(" ", 1)[0] != "cgroup2":
                    continue
                fields = left.split()
                if len(fields) >= 5:
                    mounts.append((_unescape(fields[3]), _unescape(fields[4])))
    except OSError:
        return []
    return mounts


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _within(root: str, path: str) -> bool:
    """Whether cgroup ``path`` is ``root`` or below it."""
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def _under(mount: str, root: str, path: str) -> str:
    """The directory of cgroup ``path`` in a mount of the hierarchy at ``root``."""
    rest = path[len(root.rstrip("/")):].strip("/")
    return os.path.join(mount, rest) if rest else mount


def find_place() -> Place | Unavailable:
    """Where this process can make run cgroups, proven by creating and removing a probe; else why not."""
    own = _own_cgroup()
    if own is None:
        return Unavailable("this host has no cgroup v2 hierarchy (no 0:: line in /proc/self/cgroup: cgroup v1 only)")
    for root, mount in cgroup2_mounts():
        if not _within(root, own):
            continue
        place = Place(mount=mount, root=root, own=own, has_kill=False)
        directory = place.directory
        if not os.access(os.path.join(directory, "cgroup.procs"), os.W_OK):
            return Unavailable(f"the dispatcher's cgroup {directory} is not writable (not root and not delegated)")
        probe = os.path.join(directory, f"{RUN_PREFIX}probe-{os.getpid()}")
        try:
            os.mkdir(probe)
        except FileExistsError:
            pass
        except OSError as exc:
            return Unavailable(f"cannot create a cgroup under {directory}: {exc.strerror}")
        has_kill = os.path.exists(os.path.join(probe, "cgroup.kill"))
        try:
            os.rmdir(probe)
        except OSError:
            pass
        return attrs.evolve(place, has_kill=has_kill)
    return Unavailable(f"no cgroup2 mount holds this process's cgroup {own}")


def sweep_stale(directory: str, *, older_than_s: float = STALE_AFTER_S) -> list[str]:
    """Remove the empty run cgroups under ``directory`` created more than ``older_than_s`` ago; the names removed.

    A dispatcher killed with its runs leaves their cgroups; recovery removes each one it recovers,
    but a database that was deleted (or a run recovered elsewhere) leaves them for good. An empty
    cgroup holds nothing to recover, and ``rmdir`` refuses a populated one, so only husks go; the
    age spares a cgroup another dispatcher has just created and not yet moved its command into.
    """
    removed: list[str] = []
    cutoff = time.time() - older_than_s
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(RUN_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime > cutoff or cgroup_populated(entry.path):
                continue
            os.rmdir(entry.path)
        except OSError:
            continue
        removed.append(entry.name)
    return removed


_PLACE: Place | Unavailable | None = None
_SWEPT = False


def cached_place() -> Place | Unavailable:
    """``find_place()``, asked once per process (a run must not pay a probe)."""
    global _PLACE
    if _PLACE is None:
        _PLACE = find_place()
    return _PLACE


def place_for_runs() -> Place | Unavailable:
    """``cached_place()`` for running commands: the first call also sweeps the husks dead dispatchers left there
    (``sweep_stale``; doctor's look at the place does not)."""
    global _SWEPT
    place = cached_place()
    if not _SWEPT and isinstance(place, Place):
        _SWEPT = True
        sweep_stale(place.directory)
    return place


def _safe(text: str) -> str:
    """``text`` with everything but letters, digits, ``.``, ``_`` and ``-`` replaced (a cgroup name component)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:80]


def run_cgroup_name(run_id: str, step: str, token: str) -> str:
    """The name of a run's cgroup: ``scheduler-run-<run id>-<step>-<token>`` (a fresh hex token per command)."""
    return f"{RUN_PREFIX}{_safe(run_id)}-{_safe(step)}-{_safe(token)}"


def _read(path: str) -> str:
    """A cgroup file's text (plain reads: no file object, about half the CPU of ``open().read()``)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


@attrs.define
class RunCgroup:
    """One run's cgroup directory; ``relative`` is what the run's process handle records."""

    directory: str
    relative: str
    has_kill: bool
    #: True once ``remove_if_empty`` removed it: nothing was left in it, and nothing can join it any more.
    removed: bool = False

    @classmethod
    def create(cls, place: Place, run_id: str, step: str, token: str) -> RunCgroup:
        """Make the cgroup of one command (``CGROUP_UNAVAILABLE`` when it cannot be made)."""
        name = run_cgroup_name(run_id, step, token)
        directory = os.path.join(place.directory, name)
        try:
            os.mkdir(directory)
        except OSError as exc:
            raise SchedulerError("CGROUP_UNAVAILABLE", f"cannot create the run's cgroup {directory}: {exc.strerror}") from None
        return cls(directory=directory, relative=place.own.rstrip("/") + "/" + name, has_kill=place.has_kill)

    @property
    def procs(self) -> str:
        """Its ``cgroup.procs``: writing a PID there moves that process in."""
        return os.path.join(self.directory, "cgroup.procs")

    def adopt(self, pid: int) -> None:
        """Move ``pid`` (the gate, blocked before the payload) into the cgroup; ``CGROUP_UNAVAILABLE`` if refused."""
        try:
            _write(self.procs, str(pid))
        except OSError as exc:
            raise SchedulerError("CGROUP_UNAVAILABLE", f"cannot move the command into {self.directory}: {exc.strerror}") from None

    def populated(self) -> bool:
        """Whether a live process is left in the cgroup (``cgroup.events``; zombies do not count)."""
        return not self.removed and cgroup_populated(self.directory)

    def remove_if_empty(self) -> bool:
        """Remove the cgroup when it holds no live process; True when it is gone (now, or already).

        The kernel refuses to remove a populated cgroup (``EBUSY``), so one ``rmdir`` that works
        says "nothing is left" and does the removal the run ends with anyway: four system calls
        fewer than reading ``cgroup.events`` first. False (it stays) when the ``rmdir`` is refused
        for any reason: ``populated`` then says whether something is left (a child cgroup also
        makes it refuse).
        """
        if not self.removed:
            try:
                os.rmdir(self.directory)
            except FileNotFoundError:
                pass  # gone already: nothing can be in it
            except OSError:
                return False
            self.removed = True
        return True

    def kill(self, grace_s: float, *, reap: Callable[[], object] | None = None) -> str:
        """``kill_cgroup`` of this cgroup."""
        return kill_cgroup(self.directory, grace_s, has_kill=self.has_kill, reap=reap)

    def remove(self) -> str | None:
        """Remove the (emptied) cgroup; the error text when it cannot be removed (left for recovery), else None."""
        if self.removed:
            return None
        problem = remove_cgroup(self.directory)
        self.removed = problem is None
        return problem


def cgroup_populated(directory: str) -> bool:
    """``populated 1`` in ``cgroup.events`` (False once the cgroup is gone or holds only zombies)."""
    try:
        events = _read(os.path.join(directory, "cgroup.events"))
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: assume something is left
    return "populated 1" in events


def cgroup_members(directory: str) -> list[int]:
    """PIDs in the cgroup (``cgroup.procs``; empty once it is gone)."""
    try:
        return [int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _signal_members(directory: str, signum: int) -> None:
    for pid in cgroup_members(directory):
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_empty(directory: str, timeout_s: float, reap: Callable[[], object] | None) -> bool:
    deadline = time.monotonic() + max(0.0, timeout_s)
    pause = 0.005
    while True:
        if reap is not None:
            reap()
        if not cgroup_populated(directory):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _kill_all(directory: str, has_kill: bool) -> None:
    """SIGKILL every member at once: ``cgroup.kill``, else freeze (no member can fork), SIGKILL each, thaw."""
    if has_kill:
        try:
            _write(os.path.join(directory, "cgroup.kill"), "1")
            return
        except FileNotFoundError:
            return  # the cgroup is gone
        except OSError:
            pass  # fall back to freezing
    freeze = os.path.join(directory, "cgroup.freeze")
    try:
        _write(freeze, "1")
    except OSError:
        _signal_members(directory, signal.SIGKILL)
        return
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if "frozen 1" in _read(os.path.join(directory, "cgroup.events")):
                break
        except OSError:
            break
        time.sleep(0.005)
    _signal_members(directory, signal.SIGKILL)
    try:
        _write(freeze, "0")  # a frozen process dies of SIGKILL only once it is thawed
    except OSError:
        pass


def kill_cgroup(directory: str, grace_s: float, *, has_kill: bool, reap: Callable[[], object] | None = None) -> str:
    """End every process in the cgroup; the strongest signal used (``"SIGTERM"`` or ``"SIGKILL"``).

    SIGTERM and SIGCONT go to every member; after ``grace_s`` the whole cgroup is killed
    (``_kill_all``), so a member that forks, ``setsid``s or ignores SIGTERM still dies. Returns
    once ``cgroup.events`` says nothing is left; ``PROCESS_GROUP_SURVIVED`` when members remain
    even after SIGKILL (stuck in the kernel).
    """
    if not cgroup_populated(directory):
        return "SIGTERM"
    _signal_members(directory, signal.SIGTERM)
    _signal_members(directory, signal.SIGCONT)
    if _wait_empty(directory, grace_s, reap):
        return "SIGTERM"
    _kill_all(directory, has_kill)
    if _wait_empty(directory, KILL_CONFIRM_TIMEOUT_S, reap):
        return "SIGKILL"
    raise SchedulerError("PROCESS_GROUP_SURVIVED", f"cgroup {directory} still has members {cgroup_members(directory)} after SIGKILL")


def remove_cgroup(directory: str) -> str | None:
    """``rmdir`` an emptied cgroup (gone already is fine); the error text when it cannot be removed."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{directory}: {exc.strerror}"
    return None


def recorded_cgroup(relative: object, run_id: str) -> str | Unavailable | None:
    """The directory of the cgroup a run recorded (``handle["cgroup"]``), for crash recovery.

    None when the run recorded none. ``Unavailable`` when the record cannot be this run's cgroup
    (not a ``scheduler-run-<this run id>-...`` name, a ``..`` in it, or no cgroup2 mount here):
    such a path is never signalled. A directory that no longer exists comes back as the path (nothing to kill).
    """
    if relative is None:
        return None
    if not isinstance(relative, str) or not relative.startswith("/") or "/../" in relative + "/" or "\x00" in relative:
        return Unavailable("the recorded cgroup is not an absolute cgroup path")
    name = os.path.basename(relative)
    if not re.fullmatch(re.escape(RUN_PREFIX + _safe(run_id)) + r"-[A-Za-z0-9._-]+-[0-9a-f]+", name):
        return Unavailable(f"the recorded cgroup {name!r} is not a cgroup of run {run_id}")
    for root, mount in cgroup2_mounts():
        if _within(root, relative):
            return _under(mount, root, relative)
    return Unavailable("no cgroup2 mount on this host holds the recorded cgroup")


def has_cgroup_kill(directory: str) -> bool:
    """Whether the kernel offers ``cgroup.kill`` in this cgroup (5.14+)."""
    return os.path.exists(os.path.join(directory, "cgroup.kill"))
