"""``PythonExecutor``: runs a job's ``payload_message`` as Python code, in a child interpreter.

What it enforces, and therefore declares as capabilities:

* ``process-group``: the child runs in a new session (its own process group). It
  waits on a gate pipe until its handle (pid, pgid, start time, host) is recorded
  with ``control.record_handle``; only then does the executor send it the payload.
  If recording fails (this dispatcher lost the run), the payload never runs.
* ``timeout`` / ``cancel``: at the deadline or on cancellation the whole group gets
  SIGTERM, then SIGKILL after ``KILL_GRACE_S`` (``kill_group``), and the
  termination is recorded. Background children left behind by a payload that ended
  normally are stopped too, so nothing of a run outlives it.
* ``output-capture`` / ``structured-output``: both streams go through
  ``StreamRecorder`` (size and SHA-256 of everything, an excerpt, offloaded when
  large, capped at ``MAX_OUTPUT_BYTES``); ``output_format`` json/ndjson is parsed.
* ``stdin`` / ``env-policy``: ``executor_options`` ``stdin_text`` is the payload's
  standard input (else it reads end-of-file), ``env_policy`` is ``minimal`` (PATH,
  HOME, a UTF-8 locale and the kernel's ``extra_env``) or ``inherit`` (the
  dispatcher's environment plus ``extra_env``).
* ``recover``: crash recovery stops a process group a dead dispatcher left behind.

It does not run ``verify_shell`` (no ``verify`` capability), sandbox anything or
restrict the network.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
from typing import IO, Any, Literal, cast

import attrs
from scheduler_toolkit.output import DEFAULT_OFFLOAD_BYTES, StreamRecorder
from scheduler_toolkit.process import group_alive, kill_group, orphan_group_safe_to_kill, process_identity
from scheduler_toolkit.structured import structured_from_capture
from scheduler_toolkit.timeutil import now_ms

from scheduler.api import (
    ExecutionRequest,
    ExecutionResult,
    RecoveryOutcome,
    RecoveryRequest,
    RunControl,
    SchedulerError,
)

#: Seconds between SIGTERM and SIGKILL of the payload's process group.
KILL_GRACE_S = 1.0
#: Cap per output stream; a payload writing more is stopped (``OUTPUT_LIMIT_EXCEEDED``).
MAX_OUTPUT_BYTES = 64 * 1024 * 1024
#: How often the wait loop looks at the deadline (cancellation wakes it at once).
POLL_S = 0.05

#: Runs in the child: wait at the gate for the payload (the executor sends it once the
#: handle is recorded), then execute it as ``__main__``. An empty gate means "do not run".
BOOTSTRAP = """\
import os, sys
fd = int(sys.argv[1])
chunks = []
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    chunks.append(chunk)
os.close(fd)
source = b"".join(chunks)
if not source.startswith(b"\\x01"):
    os._exit(125)
del fd, chunks, chunk
sys.argv = ["<payload>"]
exec(compile(source[1:], "<payload>", "exec"), {"__name__": "__main__"})
"""


@attrs.frozen(kw_only=True)
class PythonOptions:
    """What a python job may set in ``executor_options``; the kernel validates and stores it."""

    stdin_text: str | None = attrs.field(default=None, metadata={"doc": "Text the payload reads on standard input."})
    env_policy: Literal["minimal", "inherit"] = attrs.field(
        default="minimal",
        validator=attrs.validators.in_(("minimal", "inherit")),
        metadata={"doc": "`minimal` (PATH, HOME, a UTF-8 locale) or `inherit` (the dispatcher's environment)."},
    )


def _environment(policy: str, request: ExecutionRequest) -> dict[str, str]:
    """The payload's environment under ``policy``, always with the kernel's ``extra_env``."""
    if policy == "inherit":
        env = dict(os.environ)
    else:
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        if "HOME" in os.environ:
            env["HOME"] = os.environ["HOME"]
    env.update(request.extra_env)
    return env


class _Stream:
    """Pumps one pipe into a ``StreamRecorder``, keeping the head in memory for the structured-output parser."""

    def __init__(self, request: ExecutionRequest, name: str, pipe: IO[bytes], overflow: threading.Event) -> None:
        self.recorder = StreamRecorder(
            root=request.artifacts_root, directory=request.artifacts_dir, name=name, cap_bytes=MAX_OUTPUT_BYTES
        )
        self.head = bytearray()
        self._pipe, self._overflow = cast(io.BufferedReader, pipe), overflow  # Popen's default bufsize: a buffered reader
        self.thread = threading.Thread(target=self._pump, name=f"python-executor-{name}", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for chunk in iter(lambda: self._pipe.read1(65536), b""):
            if len(self.head) < DEFAULT_OFFLOAD_BYTES:
                self.head += chunk[: DEFAULT_OFFLOAD_BYTES - len(self.head)]
            if not self.recorder.write(chunk):
                self._overflow.set()
                break
        self._pipe.close()


def _feed(fd: int, data: bytes) -> None:
    """Write ``data`` to a pipe file descriptor and close it (in a thread: the reader may be slow)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass  # the child is gone; its exit status says what happened
    finally:
        os.close(fd)


class PythonExecutor:
    """Executor driver ``python`` (entry point group ``scheduler.executors``)."""

    plugin_api = 3
    capabilities = frozenset({
        "process-group", "timeout", "cancel", "output-capture", "structured-output", "stdin", "env-policy", "recover",
    })
    options_class = PythonOptions

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        """Run one attempt of a python job and report it (see the module docstring for the guarantees)."""
        options = request.options if isinstance(request.options, PythonOptions) else PythonOptions()
        if control.is_cancelled():
            return ExecutionResult(status="cancelled", error_code="RUN_CANCELLED", error_message="cancelled before start")
        if now_ms() >= request.deadline_ms:
            return ExecutionResult(status="timeout", error_code="RUN_TIMEOUT", error_message="deadline passed before start")
        gate_read, gate_write = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", BOOTSTRAP, str(gate_read)],
                stdin=subprocess.PIPE if options.stdin_text is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_environment(options.env_policy, request),
                pass_fds=(gate_read,),
                start_new_session=True,  # its own session, so its own process group: pgid == pid
            )
        except OSError as exc:
            os.close(gate_write)
            return ExecutionResult(status="error", error_code="PYTHON_SPAWN_FAILED", error_message=str(exc))
        finally:
            os.close(gate_read)
        handle = {"pid": proc.pid, "pgid": proc.pid, "start_time": process_identity(proc.pid) or "", "host": socket.gethostname()}
        try:
            control.record_handle(handle)  # before the payload exists in the child: a fenced write
        except Exception as exc:  # noqa: BLE001 - this dispatcher no longer owns the run: never run the payload
            os.close(gate_write)
            kill_group(proc.pid, 0, reap=proc.poll)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            code = exc.code if isinstance(exc, SchedulerError) else "PYTHON_RECORD_FAILED"
            return ExecutionResult(status="error", error_code=code, error_message=f"payload not started: {exc}")
        return self._supervise(request, control, options, proc, gate_write)

    def _supervise(
        self, request: ExecutionRequest, control: RunControl, options: PythonOptions, proc: subprocess.Popen[bytes],
        gate_write: int,
    ) -> ExecutionResult:
        """Open the gate, pump the output, enforce deadline and cancellation, then classify the end."""
        overflow = threading.Event()
        assert proc.stdout is not None and proc.stderr is not None
        streams = {"stdout": _Stream(request, "stdout", proc.stdout, overflow),
                   "stderr": _Stream(request, "stderr", proc.stderr, overflow)}
        feeders = [threading.Thread(target=_feed, args=(gate_write, b"\x01" + request.job.payload_message.encode()), daemon=True)]
        if proc.stdin is not None:
            stdin_fd = os.dup(proc.stdin.fileno())  # fed (and closed) by its own thread
            feeders.append(threading.Thread(target=_feed, args=(stdin_fd, (options.stdin_text or "").encode()), daemon=True))
            proc.stdin.close()
        for feeder in feeders:
            feeder.start()
        stopped: str | None = None
        while proc.poll() is None:
            if control.is_cancelled():
                stopped = "cancelled"
            elif now_ms() >= request.deadline_ms:
                stopped = "timeout"
            elif overflow.is_set():
                stopped = "limit"
            if stopped:
                break
            control.wait_cancelled(POLL_S)
        details: dict[str, Any] = {"pid": proc.pid, "python": sys.executable}
        try:
            if stopped:
                how = kill_group(proc.pid, KILL_GRACE_S, reap=proc.poll)
                control.record_termination(how)
                details["termination"] = how
            proc.wait()
            if group_alive(proc.pid):  # background children the payload left in its group
                kill_group(proc.pid, 0)
                details["leftover_processes_killed"] = True
        except SchedulerError as exc:  # PROCESS_GROUP_SURVIVED: members stuck even after SIGKILL
            proc.wait()
            return ExecutionResult(status="error", exit_code=proc.returncode, error_code=exc.code,
                                   error_message=exc.message, details=details)
        for stream in streams.values():
            stream.thread.join(5)
        out, err = streams["stdout"].recorder.finish(), streams["stderr"].recorder.finish()
        structured = structured_from_capture(
            request.job.output_format, out, root=request.artifacts_root, head=bytes(streams["stdout"].head)
        )
        result = ExecutionResult(status="ok", exit_code=proc.returncode, stdout=out, stderr=err, structured=structured,
                                 summary=out.excerpt, details=details)
        if stopped == "cancelled":
            reason = control.cancel_reason() or "unspecified"
            return attrs.evolve(result, status="cancelled", error_code="RUN_CANCELLED", error_message=f"cancelled ({reason})")
        if stopped == "timeout":
            return attrs.evolve(result, status="timeout", error_code="RUN_TIMEOUT",
                                error_message="the payload ran past its deadline and was stopped")
        if stopped == "limit":
            return attrs.evolve(result, status="error", error_code="OUTPUT_LIMIT_EXCEEDED",
                                error_message=f"output exceeded {MAX_OUTPUT_BYTES} bytes; the payload was stopped")
        if proc.returncode != 0:
            return attrs.evolve(result, status="error", error_code="EXIT_NONZERO",
                                error_message=f"the payload exited with status {proc.returncode}")
        return result

    def recover(self, request: RecoveryRequest) -> RecoveryOutcome:
        """Crash recovery: stop the process group a dead dispatcher's run left behind (same host, same process)."""
        handle = request.handle or {}
        pid, pgid = handle.get("pid"), handle.get("pgid")
        if not isinstance(pid, int) or not isinstance(pgid, int):
            return RecoveryOutcome(state="gone")
        if handle.get("host") != socket.gethostname():
            return RecoveryOutcome(state="unknown", detail=f"the run was on host {handle.get('host')!r}")
        safe = orphan_group_safe_to_kill(pid, pgid, handle.get("start_time") or None)
        if safe is None:
            return RecoveryOutcome(state="unknown", detail=f"pid {pid} now belongs to another process")
        if not safe:
            return RecoveryOutcome(state="gone")
        try:
            return RecoveryOutcome(state="terminated", detail=kill_group(pgid, request.kill_grace_s))
        except (PermissionError, SchedulerError) as exc:
            return RecoveryOutcome(state="blocked", detail=str(exc))


__all__ = ["PythonExecutor", "PythonOptions"]
