"""``ShellExecutor.recover``: crash recovery stops a dead dispatcher's process group, never a reused PID."""

from __future__ import annotations

import socket
import subprocess

from scheduler_executor_shell import ShellExecutor
from scheduler_toolkit.process import group_alive, process_identity

from scheduler.api import RecoveryRequest


def _request(handle: dict | None) -> RecoveryRequest:
    return RecoveryRequest(run_id="r1", job_id="j1", handle=handle, owner="host:1:x", owner_host="host", kill_grace_s=0.2)


def _group() -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30"], start_new_session=True)


def test_recover_kills_the_recorded_group_then_finds_it_gone() -> None:
    proc = _group()
    try:
        handle = {"pid": proc.pid, "pgid": proc.pid, "start_time": process_identity(proc.pid), "host": socket.gethostname()}
        first = ShellExecutor().recover(_request(handle))
        proc.wait(5)
        assert first.state == "terminated" and first.detail in ("SIGTERM", "SIGKILL")
        assert not group_alive(proc.pid)
        again = ShellExecutor().recover(_request(handle))
        assert (again.state, again.detail) == ("gone", None)  # nothing signalled the second time
    finally:
        if proc.poll() is None:
            proc.kill()


def test_recover_never_signals_a_process_that_is_not_the_recorded_one() -> None:
    proc = _group()
    try:
        handle = {"pid": proc.pid, "pgid": proc.pid, "start_time": "ticks:1", "host": socket.gethostname()}  # a reused PID
        outcome = ShellExecutor().recover(_request(handle))
        assert outcome.state == "gone" and proc.poll() is None and group_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait(5)


def test_recover_of_another_host_or_of_nothing() -> None:
    other = ShellExecutor().recover(_request({"pid": 1, "pgid": 1, "start_time": "ticks:1", "host": "elsewhere"}))
    assert other.state == "unknown" and "elsewhere" in (other.detail or "")
    assert ShellExecutor().recover(_request(None)).state == "gone"
