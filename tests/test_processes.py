"""scheduler.core.processes: process identity from /proc and whole-group termination, on real processes."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from scheduler.core.processes import (
    group_alive,
    kill_group,
    leftovers_after_reap,
    live_group_members,
    process_identity,
    same_process,
)


@pytest.fixture
def group_gone():
    """Assert no live member of a group is left (zombies awaiting a slow init reaper do not count)."""

    def check(pgid: int, **_kw: object) -> None:
        assert live_group_members(pgid) == []
        assert not group_alive(pgid)

    return check


def test_identity_of_this_process() -> None:
    ident = process_identity(os.getpid())
    assert ident is not None and ident.startswith("ticks:") and ident[6:].isdigit()
    assert same_process(os.getpid(), ident)
    assert not same_process(os.getpid(), "ticks:1")
    assert not same_process(os.getpid(), None)


def test_identity_of_missing_process() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert process_identity(proc.pid) is None
    assert not same_process(proc.pid, "ticks:0")


def test_identity_survives_exec_and_tells_processes_apart() -> None:
    a = subprocess.Popen(["sh", "-c", "sleep 0.1; exec sleep 5"])
    ident = process_identity(a.pid)
    time.sleep(0.02)
    b = subprocess.Popen(["sleep", "5"])
    try:
        time.sleep(0.3)  # a has exec'd meanwhile: same process, same identity
        assert same_process(a.pid, ident)
        assert not same_process(b.pid, ident)
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    assert not same_process(a.pid, ident)


def test_kill_group_sigterm_with_grandchildren(group_gone) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 100 & sleep 100"], start_new_session=True)
    time.sleep(0.1)
    assert group_alive(proc.pid)
    assert kill_group(proc.pid, 2.0, reap=proc.poll) == "SIGTERM"
    assert not group_alive(proc.pid)
    group_gone(proc.pid)


def test_kill_group_escalates(group_gone) -> None:
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 100 & sleep 100"], start_new_session=True)
    time.sleep(0.1)
    t0 = time.monotonic()
    assert kill_group(proc.pid, 0.2, reap=proc.poll) == "SIGKILL"
    assert time.monotonic() - t0 < 3
    assert proc.wait() == -9
    group_gone(proc.pid)


def test_kill_group_of_missing_group() -> None:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    assert kill_group(proc.pid, 0.1) == "SIGTERM"


def test_leftovers_after_reap_empty_group() -> None:
    """A command whose whole group ended: the cheap check (one killpg, no /proc scan) says so once the leader is reaped."""
    proc = subprocess.Popen(["sh", "-c", "true"], start_new_session=True)
    proc.wait()
    assert not leftovers_after_reap(proc.pid)


def test_leftovers_after_reap_sees_a_daemonised_member(group_gone) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 100 >/dev/null 2>&1 & exit 0"], start_new_session=True)
    proc.wait()
    try:
        assert leftovers_after_reap(proc.pid)
        assert live_group_members(proc.pid) != []
    finally:
        kill_group(proc.pid, 1.0)
    group_gone(proc.pid)


def test_leftovers_after_reap_never_claims_a_reused_number() -> None:
    """A live process owning the number leads its own group: the group id was reused, never ours to signal."""
    other = subprocess.Popen(["sleep", "5"], start_new_session=True)
    try:
        assert group_alive(other.pid)
        assert not leftovers_after_reap(other.pid)
    finally:
        other.kill()
        other.wait()
