"""Event mode: ``openclaw system event --text TEXT --mode now|queue --json``, fire-and-forget.

The command runs with no shell, in its own process group, with a minimal environment, a
timeout (``event_timeout_s``, never past the run deadline) and capped output. It starts
behind a gate: a tiny Python process (this interpreter, ``-I``) that waits for one line on
its standard input and then ``exec``s the command (same PID, same group). The group's
identity is recorded with ``record_handle`` while the gate is still closed, so nothing is
delivered before crash recovery could find it; if recording fails the gate never opens.
Cancellation and the deadline kill the whole group at once.

Its answer must be exactly one JSON object on stdout (duplicate keys, NaN and trailing
garbage refused); ``"ok": false`` is a refusal.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
from scheduler_toolkit.evidence import strict_json
from scheduler_toolkit.process import kill_group, minimal_env, process_identity, snippet

from scheduler.api import SchedulerError

POLL_S = 0.02
#: Read one line (the gate), then become the command. No shell: argv is passed as it is.
GATE = ("import os,sys\n"
        "if not sys.stdin.buffer.readline(): os._exit(125)\n"
        "fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n")


@attrs.define(kw_only=True)
class EventOutcome:
    reason: str = "done"
    error_code: str | None = None
    error_message: str | None = None
    exit_code: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    answer: dict[str, Any] | None = None
    termination: str | None = None


def find_command(path: str) -> str:
    """The command's absolute path; ``MAIN_SESSION_COMMAND_NOT_FOUND`` when there is no such executable."""
    candidate = os.path.expanduser(path)
    found = candidate if os.path.isabs(candidate) else shutil.which(candidate)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise SchedulerError("MAIN_SESSION_COMMAND_NOT_FOUND",
                             f"the openclaw command {path!r} is not an executable file "
                             "([executors.main-session] openclaw_path); nothing was delivered")
    return found


def argv_for(command: str, text: str, event_mode: str) -> list[str]:
    return [command, "system", "event", "--text", text, "--mode", event_mode, "--json"]


def run(argv: list[str], *, timeout_s: float, deadline: float, max_bytes: int, kill_grace_s: float,
        record_handle: Callable[[dict[str, Any]], None], is_cancelled: Callable[[], bool],
        extra_env: dict[str, str]) -> EventOutcome:
    """Run the command under the gate; see the module docstring. ``record_handle`` raising keeps the gate shut."""
    out = EventOutcome()
    env = minimal_env(extra_env)
    proc = subprocess.Popen([sys.executable, "-I", "-c", GATE, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True, close_fds=True)
    pgid = proc.pid
    handle = {"kind": "main-session-event", "pid": proc.pid, "pgid": pgid, "start_time": process_identity(proc.pid),
              "host": socket.gethostname()}
    try:
        record_handle(handle)
    except BaseException:
        proc.stdin.close()  # type: ignore[union-attr]  # the gate never opens: the command does not start
        kill_group(pgid, 0, reap=proc.poll)
        proc.wait()
        raise
    buffers = {"stdout": bytearray(), "stderr": bytearray()}
    over = threading.Event()

    def read(stream: Any, buf: bytearray) -> None:
        try:
            while chunk := stream.read1(65536):
                buf.extend(chunk[: max_bytes + 1 - len(buf)])
                if len(buf) > max_bytes:
                    over.set()
                    return
        except (OSError, ValueError):
            return

    readers = [threading.Thread(target=read, args=(proc.stdout, buffers["stdout"]), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, buffers["stderr"]), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.stdin.write(b"go\n")  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    except (BrokenPipeError, OSError):
        pass
    started = time.monotonic()
    command_deadline = min(deadline, started + timeout_s)
    stop: tuple[str, str, str] | None = None
    while True:
        if is_cancelled():
            stop = ("cancelled", "RUN_CANCELLED", "cancelled while the openclaw command was running")
        elif over.is_set():
            stop = ("error", "MAIN_SESSION_COMMAND_OUTPUT_TOO_LARGE",
                    f"the openclaw command wrote more than {max_bytes} bytes; it was stopped")
        elif time.monotonic() >= command_deadline:
            stop = (("timeout", "RUN_TIMEOUT", "the run deadline passed; the openclaw command was stopped")
                    if command_deadline >= deadline else
                    ("error", "MAIN_SESSION_COMMAND_TIMEOUT",
                     f"the openclaw command did not finish within event_timeout_s ({timeout_s:g}s); it was stopped"))
        if stop is not None:
            out.termination = kill_group(pgid, kill_grace_s, reap=proc.poll)
            proc.wait()
            break
        try:
            proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            continue
        # the command exited; what it left running in its group may still hold the pipes: bounded wait, then kill
        for reader in readers:
            reader.join(max(0.0, min(command_deadline, time.monotonic() + 1.0) - time.monotonic()))
        if any(r.is_alive() for r in readers):
            out.termination = kill_group(pgid, kill_grace_s)
        break
    for reader, stream in zip(readers, (proc.stdout, proc.stderr), strict=True):
        reader.join(0.5)
        if not reader.is_alive():
            stream.close()  # type: ignore[union-attr]
    out.stdout, out.stderr = bytes(buffers["stdout"][:max_bytes]), bytes(buffers["stderr"][:max_bytes])
    out.exit_code = proc.returncode
    if stop is not None:
        out.reason, out.error_code, out.error_message = stop
        return out
    if proc.returncode == 125 and not out.stdout:
        out.reason, out.error_code = "error", "MAIN_SESSION_COMMAND_FAILED"
        out.error_message = f"the openclaw command could not be started: {snippet(out.stderr) or 'gate failed'}"
        return out
    if proc.returncode != 0:
        out.reason, out.error_code = "error", "MAIN_SESSION_COMMAND_FAILED"
        out.error_message = (f"the openclaw command exited with status {proc.returncode}"
                             + (f": {snippet(out.stderr or out.stdout)}" if out.stderr or out.stdout else ""))
        return out
    try:
        answer = strict_json(out.stdout)
        if not isinstance(answer, dict):
            raise ValueError("the answer is not a JSON object")
        if "ok" in answer and not isinstance(answer["ok"], bool):
            raise ValueError("`ok` is not a boolean")
    except (ValueError, UnicodeDecodeError) as exc:  # StrictJSONError is a ValueError
        out.reason, out.error_code = "error", "MAIN_SESSION_EVENT_ANSWER_MALFORMED"
        out.error_message = f"the openclaw command's answer is not one strict JSON object ({exc}): {snippet(out.stdout)!r}"
        return out
    out.answer = answer
    if answer.get("ok") is False:
        error = answer.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        out.reason, out.error_code = "error", "MAIN_SESSION_EVENT_REJECTED"
        out.error_message = f"openclaw refused the event: {str(message)[:300] if message else 'ok: false'}"
    return out
