"""Running one shell command in its own process group (and cgroup), under a deadline and a cancellation token.

``run_process`` is shared by the job's command and its ``verify_shell`` check. The
order of events is what makes it safe to recover after a crash:

1. spawn the gate in a new session (own process group, ``pgid == pid``): it blocks on
   its first stdin line, so nothing of the payload has run. For bash (the default) the
   gate runs inside the payload's own ``bash -c`` (sourced from a private pipe through
   ``BASH_ENV``: one exec per run) and reports in on a second pipe before the gate
   opens; for other shells ``/bin/sh -c <gate>`` execs the configured shell. If the
   dispatcher dies now, the gate reads EOF and exits 125;
   Where the run has a cgroup (``cgroups.py``: ``[executors.shell] containment``), the gate is
   moved into ``scheduler-run-<run id>-<step>-<token>`` now, while it blocks (the bash gate moves
   itself before it reports in; otherwise the executor moves it): everything the
   payload will start is in that cgroup, ``setsid`` or not;
2. ``control.record_handle({"pid", "pgid", "start_time", "host", "step"[, "cgroup"]})``: durable before it
   returns (the dispatcher groups the handles of all its workers into one commit); if
   it raises (fence lost), the gate is closed, the payload never starts, and the group is killed;
3. open the gate: the wrapper ``exec``s the shell on the payload (same PID, same
   group, same start time) with stdin switched to ``/dev/null`` or the job's text;
4. pump the pipes on the worker's own thread (no thread per run) and wait for exit
   (a pidfd in the same ``select``), deadline, cancellation or the output cap, looking
   at the cancellation token at least every ``WAIT_SLICE_S``;
5. on deadline/cancel/cap: the pump moves to a thread of its own (output keeps
   flowing), the cgroup is killed (``kill_cgroup``) and the group (``kill_group``), then ``control.record_termination``;
   after a normal exit the leader is reaped and one ``killpg(pgid, 0)`` says whether
   anything of the group is left (no ``/proc`` scan unless it is); members left behind
   (daemonised background jobs) are killed too, and recorded, so nothing of the run keeps running;
   In a cgroup, one ``rmdir`` says it for everything the command started (the kernel refuses to remove a
   populated cgroup; ``cgroup.events`` is read only when it refuses):
   a child that left the group (``setsid``) is not waited for, but it is a leftover and is
   killed with the cgroup when the run ends;
6. the pipe pump gets a bounded time to reach EOF; a pipe still held by a process
   that left the group (``setsid``) and its cgroup (or had none) is abandoned rather than
   waited for; the emptied cgroup is removed.
"""

from __future__ import annotations

import os
import secrets
import select
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Mapping

import attrs
from scheduler_toolkit.process import group_alive, kill_group, leftovers_after_reap, live_group_members, process_identity

from scheduler.api import RunControl, SchedulerError
from scheduler_executor_shell.capture import PipePump, Sink
from scheduler_executor_shell.cgroups import Place, RunCgroup
from scheduler_executor_shell.direct import DirectCommand

#: Wrapper run by the gate shell: wait for the go-ahead line, pick stdin, then become the payload.
#: ``$0`` is the payload's shell, ``$1`` the payload, ``$2`` "null" or "pipe". Needs a POSIX shell.
GATE_SCRIPT = 'IFS= read -r _ || exit 125; if [ "$2" = null ]; then exec </dev/null; fi; exec "$0" -c "$1"'
#: Shell that runs the gate when the payload's shell is not bash: ``/bin/sh`` (dash starts several times faster
#: than bash), else the payload's shell. For bash the gate runs inside the payload's own bash (``_bash_gate``).
GATE_SHELL = "/bin/sh"
#: How long a bash gate may take to report in before the spawn counts as failed.
GATE_READY_S = 10.0
#: Longest slice of each wait for the command (cancellation latency).
WAIT_SLICE_S = 0.05
#: How long to wait for the pipes after the group is gone before abandoning them.
PIPE_DRAIN_S = 1.0
#: After the leader exited with pipes still open: how often to look for live group members ...
GROUP_CHECK_S = 0.25
#: ... and when first (the pipes of a command that simply ended reach EOF within microseconds).
FIRST_GROUP_CHECK_S = 0.01


@attrs.define(kw_only=True)
class ProcessOutcome:
    """How one process run ended."""

    #: exited | timeout | cancelled | limit | capture_failed | spawn_failed | record_failed
    reason: str
    returncode: int | None = None
    pid: int | None = None
    pgid: int | None = None
    identity: str | None = None
    #: The command's cgroup (as the handle records it), when it ran in one (``cgroups.py``).
    cgroup: str | None = None
    #: Signal the group was terminated with, when it had to be.
    termination: str | None = None
    #: True when the group was killed after a normal exit because members stayed behind.
    leftovers_killed: bool = False
    #: True when the pipes were still held open (by a process outside the group) and were abandoned.
    pipes_abandoned: bool = False
    exceeded_streams: list[str] = attrs.Factory(list)
    error: SchedulerError | None = None
    #: Problems worth recording that did not change the outcome (e.g. record_termination failed).
    notes: dict[str, str] = attrs.Factory(dict)


def _error_of(exc: BaseException, default_code: str) -> SchedulerError:
    """A ``SchedulerError`` for any exception (keeping its code when it already is one)."""
    if isinstance(exc, SchedulerError):
        return exc
    return SchedulerError(default_code, f"{type(exc).__name__}: {exc}")


def _event(control: RunControl, kind: str, data: dict) -> None:
    """Audit event; an event sink failure never changes what happens to the process."""
    try:
        control.event(kind, data)
    except Exception:  # noqa: BLE001 - audit is best effort; the durable parts are record_*
        pass


@attrs.frozen
class CgroupPlan:
    """Run the command in a cgroup of its own at ``place`` (``required``: ``CGROUP_UNAVAILABLE`` when it cannot be)."""

    place: Place
    run_id: str
    required: bool


@attrs.define
class Containment:
    """What a command's processes are tracked and killed by: its process group, and its cgroup when it has one.

    The cgroup holds every descendant, also one that left the group with ``setsid``; the
    group stays the fallback (and is checked too: a member that moved itself out of the cgroup).
    """

    pgid: int
    cgroup: RunCgroup | None = None

    def leftovers(self) -> bool:
        """After the leader was reaped: whether live members remain (the group's check is cheap first, see below).

        The cgroup is asked by removing it (``remove_if_empty``): an empty one, the common case, is
        gone then (``release`` has nothing left to do); one the kernel keeps is asked ``populated``.
        """
        if self.cgroup is not None and not self.cgroup.remove_if_empty() and self.cgroup.populated():
            return True
        return leftovers_after_reap(self.pgid) and bool(live_group_members(self.pgid))

    def kill(self, grace_s: float, reap: Callable[[], object]) -> str:
        """End the cgroup (when there is one), then the group; the strongest signal used."""
        how = "SIGTERM"
        if self.cgroup is not None:
            how = self.cgroup.kill(grace_s, reap=reap)
            if not group_alive(self.pgid):
                return how
        other = kill_group(self.pgid, grace_s, reap=reap)
        return "SIGKILL" if "SIGKILL" in (how, other) else other

    def release(self) -> str | None:
        """Remove the emptied cgroup; the error text when it could not be removed."""
        return None if self.cgroup is None else self.cgroup.remove()


def _make_cgroup(plan: CgroupPlan | None, label: str, notes: dict[str, str]) -> RunCgroup | None:
    """The command's cgroup, made before the spawn (None without a plan, or when ``auto`` cannot make one: noted)."""
    if plan is None:
        return None
    try:
        return RunCgroup.create(plan.place, plan.run_id, label, secrets.token_hex(4))
    except SchedulerError as exc:
        if plan.required:
            raise
        notes["cgroup_error"] = exc.message  # auto: the process group alone, said in the run's details
        return None


def _contain(pid: int, cgroup: RunCgroup | None, plan: CgroupPlan | None, outcome: ProcessOutcome,
             moved_by_gate: bool) -> Containment:
    """The command's containment: its group, and its cgroup (the gate still blocks): moved into it here, unless
    the bash gate moves itself (``moved_by_gate``: confirmed by its ready byte, ``_await_gate``)."""
    tracker = Containment(pgid=pid)
    if cgroup is None or plan is None:
        return tracker
    try:
        if not moved_by_gate:
            cgroup.adopt(pid)
    except SchedulerError as exc:
        cgroup.remove()
        if plan.required:
            raise
        outcome.notes["cgroup_error"] = exc.message
        return tracker
    tracker.cgroup = cgroup
    outcome.cgroup = cgroup.relative
    return tracker


@attrs.frozen
class RunAs:
    """The account a command runs as: uid, primary gid and supplementary groups (from the account databases)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str


def run_process(
    *,
    shell: str,
    payload: str,
    cwd: str | None,
    env: Mapping[str, str],
    stdin_data: bytes | None,
    outputs: dict[str, Sink],
    deadline: float,
    control: RunControl,
    grace_s: float,
    label: str,
    run_as: RunAs | None = None,
    cgroup: CgroupPlan | None = None,
    direct: DirectCommand | None = None,
) -> ProcessOutcome:
    """Run ``payload`` through ``shell -c`` under the gate protocol above; never raises for process problems.

    ``deadline`` is a ``time.monotonic()`` instant. ``outputs`` maps "stdout" and
    "stderr" to sinks. ``label`` ("command" or "verify") tags the audit events. ``run_as``:
    the child drops to that account (setgid, setgroups/initgroups, setuid) before its exec;
    the bash gate is not used then (its ``/dev/fd`` pipe cannot be reopened by another uid). ``cgroup``:
    the gate is moved into a cgroup of its own before its handle is recorded, so everything the
    payload starts is in it (a required cgroup that cannot be made is ``spawn_failed``, ``CGROUP_UNAVAILABLE``).
    ``direct``: ``payload`` is that plain command (``direct.py``), exec'd by the ``GATE_SHELL`` gate without ``shell``
    (the caller checked ``gate_shell_usable()``).
    """
    mode = "null" if stdin_data is None else "pipe"
    env = dict(env)
    notes: dict[str, str] = {}
    try:
        made = _make_cgroup(cgroup, label, notes)
    except SchedulerError as exc:  # containment = cgroup: nothing is spawned without one
        return ProcessOutcome(reason="spawn_failed", error=exc)
    gate_fds: tuple[int, int] | None = None  # (script read end, ready write end) of a bash gate, closed after the spawn
    ready_r: int | None = None
    if direct is not None:
        env = direct.environment(env)
        argv = direct.gate_argv(GATE_SHELL, mode)
    elif run_as is None and os.path.basename(shell) == "bash" and "BASH_ENV" not in env and _dev_fd_usable():
        ready_r, gate_fds, argv = _bash_gate(shell, payload, mode, env, None if made is None else made.procs)
    else:
        gate = GATE_SHELL if gate_shell_usable() else shell
        argv = [gate, "-c", GATE_SCRIPT, shell, payload, mode]
    # Plain pipes, not Popen's file objects: the pump reads, writes and closes their fds itself.
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin_r,
            stdout=out_w,
            stderr=err_w,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
            pass_fds=gate_fds or (),
            user=None if run_as is None else run_as.uid,
            group=None if run_as is None else run_as.gid,
            extra_groups=None if run_as is None else list(run_as.groups),
        )
    except BaseException as exc:
        _close(stdin_w, out_r, err_r, ready_r)
        if made is not None:
            made.remove()
        if not isinstance(exc, OSError):
            raise
        if cwd is not None and not os.path.isdir(cwd):
            err = SchedulerError("WORKING_DIR_MISSING", f"working directory does not exist: {cwd}")
        else:
            err = SchedulerError("SHELL_SPAWN_FAILED", f"cannot start {shell}: {exc}")
        return ProcessOutcome(reason="spawn_failed", error=err)
    finally:
        _close(stdin_r, out_w, err_w, *(gate_fds or ()))  # the child's ends: only the child keeps them

    pid = pgid = proc.pid  # start_new_session: the child called setsid() before exec
    identity = process_identity(pid)
    outcome = ProcessOutcome(reason="exited", pid=pid, pgid=pgid, identity=identity, notes=notes)
    tracker = Containment(pgid=pgid, cgroup=made)
    try:
        tracker = _contain(pid, made, cgroup, outcome, moved_by_gate=ready_r is not None)
        handle = {"pid": pid, "pgid": pgid, "start_time": identity or "unknown", "host": socket.gethostname(), "step": label}
        if tracker.cgroup is not None:
            handle["cgroup"] = tracker.cgroup.relative  # what recovery kills: the whole cgroup
        control.record_handle(handle)
    except BaseException as exc:  # any failure, even an interrupt: the payload must not start
        cgroup_failed = isinstance(exc, SchedulerError) and exc.code == "CGROUP_UNAVAILABLE" and outcome.cgroup is None
        outcome.reason = "spawn_failed" if cgroup_failed else "record_failed"
        _close(ready_r, stdin_w)  # the gate never opens (it reads EOF): the payload does not start
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            _terminate(outcome, control, tracker, grace_s, proc, label)
        proc.wait()
        _close(out_r, err_r)
        _release(outcome, tracker)
        outcome.returncode = proc.returncode
        outcome.error = _error_of(exc, "RECORD_PROCESS_FAILED")
        if not isinstance(exc, Exception):
            raise
        return outcome

    gate = "ready" if ready_r is None else _await_gate(ready_r, deadline)
    if gate == "cgroup_failed" and not (cgroup is not None and cgroup.required):
        # auto: the bash gate could not move itself; it runs in its process group alone (its handle named the
        # cgroup, which is removed now: recovery finds nothing there and checks the group)
        notes["cgroup_error"] = "the command could not move itself into its cgroup"
        _release(outcome, tracker)
        tracker.cgroup, outcome.cgroup, gate = None, None, "ready"
    if gate != "ready":
        # The deadline passed first, or the bash gate never reported in (cannot happen while /dev/fd
        # works): the gate stays closed and whatever runs in the group must not go on.
        outcome.reason = gate
        _terminate(outcome, control, tracker, grace_s, proc, label)
        proc.wait()
        _close(stdin_w, out_r, err_r)
        _release(outcome, tracker)
        outcome.returncode = proc.returncode
        if gate == "spawn_failed":
            outcome.error = SchedulerError("SHELL_SPAWN_FAILED", f"{shell} did not reach the gate before the command")
        elif gate == "cgroup_failed":
            outcome.reason, outcome.cgroup = "spawn_failed", None
            outcome.error = SchedulerError("CGROUP_UNAVAILABLE", "the command could not move itself into its cgroup")
        return outcome

    stdin_open = _open_gate(stdin_w, stdin_data)
    exit_fd = _pidfd(pid)
    try:
        pump = PipePump(
            {"stdout": (out_r, outputs["stdout"]), "stderr": (err_r, outputs["stderr"])},
            stdin=stdin_w if stdin_open else None,
            stdin_data=stdin_data or b"",
            exit_fd=exit_fd,
        )
        _finish(outcome, pump, proc, tracker, deadline, control, grace_s, label)
    finally:
        if exit_fd is not None:
            os.close(exit_fd)
        _release(outcome, tracker)
    return outcome


def _release(outcome: ProcessOutcome, tracker: Containment) -> None:
    """Remove the command's emptied cgroup; one that cannot be removed is noted (recovery finds it by the handle)."""
    problem = tracker.release()
    if problem is not None:
        outcome.notes["cgroup_remove_error"] = problem


def _finish(
    outcome: ProcessOutcome, pump: PipePump, proc: subprocess.Popen, tracker: Containment, deadline: float,
    control: RunControl, grace_s: float, label: str,
) -> None:
    """Steps 4-6 above: wait (this thread drives the pump), terminate when needed, reap, drain."""
    try:
        outcome.reason = _wait(proc, pump, deadline, control)
        if outcome.reason == "exited" and pump.error is not None:
            outcome.reason = "capture_failed"  # the pump failed just as the command ended
    except BaseException:
        outcome.reason = "error"
        pump.start()
        _terminate(outcome, control, tracker, grace_s, proc, label)
        proc.wait()
        pump.stop()
        raise
    if outcome.reason != "exited":
        pump.start()  # output keeps flowing on a thread of its own while the group is stopped
        _terminate(outcome, control, tracker, grace_s, proc, label)
    else:
        # Reaped now: while members remain the kernel keeps the number reserved as their group id,
        # so one killpg tells an empty group (the common case) from leftovers without a /proc scan;
        # the scan runs only to tell live leftovers from zombies a slow init has not reaped yet.
        # A cgroup says it for everything the command started: removed if empty, else cgroup.events.
        proc.wait()
        if tracker.leftovers():
            outcome.leftovers_killed = True  # left behind: must not outlive the run
            pump.start()
            _terminate(outcome, control, tracker, grace_s, proc, label)
    try:  # bounded only when SIGKILL did not work (a member stuck in the kernel)
        outcome.returncode = proc.wait(timeout=5.0 if "kill_error" in outcome.notes else None)
    except subprocess.TimeoutExpired:
        outcome.returncode = None
    if not pump.join(PIPE_DRAIN_S):
        pump.stop()
        outcome.pipes_abandoned = True
    outcome.exceeded_streams = list(pump.exceeded)
    if pump.error is not None:
        outcome.notes["pump_error"] = repr(pump.error)


def _bash_gate(shell: str, payload: str, mode: str, env: dict[str, str],
               cgroup_procs: str | None = None) -> tuple[int, tuple[int, int], list[str]]:
    """The gate inside the payload's own bash (one exec, not two): ``BASH_ENV`` names a pipe holding the gate.

    Non-interactive bash sources ``$BASH_ENV`` before its ``-c`` string. The gate script
    (read from ``/dev/fd/N``, a pipe only this spawn has) unsets ``BASH_ENV``, reports in
    on a second pipe (so a shell that did not run it is noticed), closes both pipes and
    blocks on the go-ahead line exactly as ``GATE_SCRIPT`` does; then the same bash runs
    the payload as ``bash -c`` would (``$0``, exec of a last simple command, exit status).
    With ``cgroup_procs`` the shell first writes its own PID there (joining its cgroup, while the
    dispatcher commits the handle) and reports ``x`` when it moved, ``c`` when it could not.
    Returns (ready read end, fds to pass, argv); ``env`` gets ``BASH_ENV``.
    """
    script_r, script_w = os.pipe()
    # Non-blocking (both ends: one byte into an empty pipe never waits): usually the shell has reported in by the
    # time the handle is committed, and one read finds its byte without a select first.
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    report = f"printf x >&{ready_w}"
    if cgroup_procs is not None:  # no variable: the payload's shell must see none of the gate's
        report = (f"if {{ echo $$ >{shlex.quote(cgroup_procs)}; }} 2>/dev/null; then printf x >&{ready_w};"
                  f" else printf c >&{ready_w}; fi")
    script = (
        f"unset BASH_ENV; {report} || exit 125; exec {ready_w}>&- {script_r}<&-\n"
        "IFS= read -r _ || exit 125\n" + ("exec </dev/null\n" if mode == "null" else "")
    ).encode()
    os.write(script_w, script)  # a few dozen bytes: always fits the pipe buffer
    os.close(script_w)
    env["BASH_ENV"] = f"/dev/fd/{script_r}"
    return ready_r, (script_r, ready_w), [shell, "-c", payload]


def _await_gate(ready_r: int, deadline: float) -> str:
    """Wait for the bash gate's ready byte: ``ready``, ``timeout`` (the run's deadline came first),
    ``cgroup_failed`` (``c``: it could not join its cgroup) or ``spawn_failed`` (EOF, a wrong byte, or
    nothing within ``GATE_READY_S``); closes ``ready_r``."""
    limit = time.monotonic() + GATE_READY_S
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if now >= limit:
                return "spawn_failed"
            try:
                byte = os.read(ready_r, 1)
                return "ready" if byte == b"x" else "cgroup_failed" if byte == b"c" else "spawn_failed"
            except BlockingIOError:
                select.select([ready_r], [], [], min(deadline, limit) - now)
    finally:
        os.close(ready_r)


def _open_gate(stdin_w: int, stdin_data: bytes | None) -> bool:
    """Step 3: write the go-ahead line into ``stdin_w``; True when it stays open for the pump to feed ``stdin_data``,
    else it is closed now (no input, or nobody reads it).

    One byte into the fresh, empty pipe never blocks. A gate that died meanwhile (EPIPE)
    needs no line: its exit status tells what happened.
    """
    try:
        os.write(stdin_w, b"\n")
    except OSError:
        stdin_data = None  # nobody reads it any more
    if not stdin_data:
        os.close(stdin_w)
        return False
    return True


def _close(*fds: int | None) -> None:
    """Close each fd given (None: nothing to close)."""
    for fd in fds:
        if fd is not None:
            os.close(fd)


_GATE_SHELL_OK: bool | None = None
_DEV_FD_OK: bool | None = None


def _dev_fd_usable() -> bool:
    """Whether ``/dev/fd`` exists for the bash gate's ``BASH_ENV`` (looked up once per process)."""
    global _DEV_FD_OK
    if _DEV_FD_OK is None:
        _DEV_FD_OK = os.path.isdir("/dev/fd")
    return _DEV_FD_OK


def gate_shell_usable() -> bool:
    """Whether ``GATE_SHELL`` is executable (looked up once per process)."""
    global _GATE_SHELL_OK
    if _GATE_SHELL_OK is None:
        _GATE_SHELL_OK = os.access(GATE_SHELL, os.X_OK)
    return _GATE_SHELL_OK


def _pidfd(pid: int) -> int | None:
    """A pidfd of our child (readable once it exits, without reaping it), or None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _wait(proc: subprocess.Popen, pump: PipePump, deadline: float, control: RunControl) -> str:
    """Wait for the end of the run; returns exited, timeout, cancelled, limit or capture_failed.

    "exited" means the leader exited and either both pipes reached EOF or no live
    member of the group is left (background children that keep writing are part of
    the run; a pipe held only by a process that left the group cannot be waited for).
    The leader stays unreaped, and its PID reserved as the group id, until the group
    has been dealt with: its exit is seen through the pump's pidfd (or, on kernels
    without pidfds, ``waitid(WNOWAIT)`` polls). This thread drives the pump: one
    ``select`` over the pipes and the pidfd wakes on output, EOF or the exit, so a
    short command is seen ending at once; between rounds (at most ``WAIT_SLICE_S``) it
    looks at the deadline and the cancellation token.
    """
    next_group_check = 0.0
    slice_s = 0.002  # the slice grows to WAIT_SLICE_S for long commands (cancellation latency)
    while True:
        if pump.limit_exceeded:
            return "limit"
        if pump.error is not None:
            return "capture_failed"
        now = time.monotonic()
        if pump.leader_exited if pump.watches_exit else _leader_exited(proc.pid):
            done = pump.finished
            if not done and not next_group_check:  # the pipes reach EOF a moment after the exit: no scan yet
                next_group_check = now + FIRST_GROUP_CHECK_S
            elif not done and now >= next_group_check:
                next_group_check = now + GROUP_CHECK_S
                done = not live_group_members(proc.pid)
            if done:
                # The pump may have crossed the cap (or failed) after the checks above: a fast command
                # that wrote too much must still end OUTPUT_LIMIT_EXCEEDED, never "ok".
                if pump.limit_exceeded:
                    return "limit"
                return "capture_failed" if pump.error is not None else "exited"
        remaining = deadline - now
        if remaining <= 0:
            return "timeout"
        if control.is_cancelled():
            return "cancelled"
        if pump.watches_exit:
            pump.step(min(WAIT_SLICE_S, remaining))  # wakes on output, EOF or the exit
        elif not pump.finished:
            pump.step(min(slice_s, remaining))
        elif control.wait_cancelled(min(slice_s, remaining)):
            return "cancelled"
        slice_s = min(slice_s * 2, WAIT_SLICE_S)


def _leader_exited(pid: int) -> bool:
    """True when our child has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _terminate(
    outcome: ProcessOutcome, control: RunControl, tracker: Containment, grace_s: float, proc: subprocess.Popen, label: str
) -> None:
    """Kill the cgroup and the group, then durably record the termination before anything else happens."""
    try:
        outcome.termination = tracker.kill(grace_s, proc.poll)
    except SchedulerError as exc:
        outcome.termination = "SIGKILL"
        outcome.notes["kill_error"] = f"{exc.code}: {exc.message}"
    try:
        control.record_termination(outcome.termination)
    except Exception as exc:  # noqa: BLE001 - the run still ends; the failure is reported
        err = _error_of(exc, "RECORD_TERMINATION_FAILED")
        outcome.notes["record_termination_error"] = f"{err.code}: {err.message}"
    data = {"step": label, "pgid": tracker.pgid, "signal": outcome.termination, "reason": outcome.reason}
    if tracker.cgroup is not None:
        data["cgroup"] = tracker.cgroup.relative
    _event(control, "shell.terminated", data)
