"""Running a helper program within bounds: input, a deadline and output caps, its whole group killed past them.

Evidence providers and proof verifiers that shell out (``ssh-keygen -Y sign``/``verify``, an
external attestor) must never let a stuck or chatty helper hang or flood the scheduler:
``run_bounded`` starts it in its own process group with a minimal environment
(``minimal_env``), feeds it stdin, and kills the group at the deadline or once stdout passes
its cap; ``snippet`` makes a short printable excerpt of its output for an error message.
Only plugins run helper programs, so this lives here, not in the kernel.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs


@attrs.frozen
class Completed:
    """How a bounded subprocess ended."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    oversized: bool = False


def minimal_env(extra: Mapping[str, str] | None = None, pass_through: Sequence[str] = ()) -> dict[str, str]:
    """A small, predictable environment: PATH, HOME, a C locale, plus what the caller adds."""
    env = {"PATH": os.environ.get("PATH") or os.defpath, "LC_ALL": "C", "LANG": "C"}
    if os.environ.get("HOME"):
        env["HOME"] = os.environ["HOME"]
    for name in pass_through:
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(extra or {})
    return env


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bounded(argv: Sequence[str], data: bytes, *, timeout_s: float, max_stdout: int, env: Mapping[str, str],
                max_stderr: int = 64 * 1024) -> Completed:
    """Run ``argv`` (no shell) in its own process group with ``data`` on stdin, within ``timeout_s`` and output caps.

    Past the deadline, or once stdout exceeds ``max_stdout`` bytes, the whole group is
    killed. ``FileNotFoundError`` / ``PermissionError`` propagate when ``argv[0]`` cannot
    be started.
    """
    deadline = time.monotonic() + timeout_s
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(env), start_new_session=True, close_fds=True)
    over = threading.Event()
    out, err = bytearray(), bytearray()

    def read(stream: Any, buf: bytearray, cap: int, flag: bool) -> None:
        try:
            while True:
                chunk = stream.read1(65536)
                if not chunk:
                    return
                room = cap + 1 - len(buf)
                buf.extend(chunk[:room])
                if len(buf) > cap:
                    if flag:
                        over.set()
                    return
        except (OSError, ValueError):
            return

    def write() -> None:
        try:
            proc.stdin.write(data)  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            try:
                proc.stdin.close()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass

    threads = [threading.Thread(target=write, daemon=True),
               threading.Thread(target=read, args=(proc.stdout, out, max_stdout, True), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, err, max_stderr, False), daemon=True)]
    for t in threads:
        t.start()
    timed_out = False
    while True:
        remaining = deadline - time.monotonic()
        if over.is_set():
            break
        if remaining <= 0:
            timed_out = True
            break
        try:
            proc.wait(timeout=min(0.02, remaining))
            break
        except subprocess.TimeoutExpired:
            continue
    if proc.returncode is None:  # late or oversized: the group goes, whatever it was doing
        _kill_group(proc.pid)
        proc.wait()
    else:
        # The leader exited; children it left may still hold the pipes open. Wait for the
        # readers until the deadline, then kill the group (it exists while those members do).
        for t in threads[1:]:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads[1:]):
            timed_out = True
            _kill_group(proc.pid)
    for t, stream in zip(threads[1:], (proc.stdout, proc.stderr), strict=True):
        t.join(0.5)
        if not t.is_alive():  # a reader still blocked holds the stream's lock: leave it to the daemon thread
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
    return Completed(returncode=proc.returncode, stdout=bytes(out[:max_stdout]), stderr=bytes(err[:max_stderr]),
                     timed_out=timed_out, oversized=over.is_set() or len(out) > max_stdout)


def snippet(data: bytes, limit: int = 200) -> str:
    """A short, single-line, printable excerpt of a process's output for an error message."""
    text = data.decode("utf-8", "replace").strip()
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", text)
    return text[:limit] + ("..." if len(text) > limit else "")


__all__ = ["Completed", "minimal_env", "run_bounded", "snippet"]
