"""A run's cgroup is asked whether anything is left by removing it (``RunCgroup.remove_if_empty``).

The kernel refuses to ``rmdir`` a populated cgroup, so a removal that works says nothing is
left and is the removal the run ends with anyway; one it refuses is asked ``cgroup.events``.
These tests use real cgroups, real processes and read the cgroup files themselves; without a
usable cgroup v2 hierarchy they skip, saying why.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scheduler_executor_shell.cgroups import RunCgroup, Unavailable, find_place
from scheduler_executor_shell.runner import Containment

PLACE = find_place()
needs_cgroups = pytest.mark.skipif(isinstance(PLACE, Unavailable), reason=f"no usable cgroup v2 here: {getattr(PLACE, 'reason', '')}")


@pytest.fixture(autouse=True)
def _cgroup_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs here demand their cgroup (a run without one fails CGROUP_UNAVAILABLE instead of passing)."""
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_CONTAINMENT", "cgroup")


@pytest.fixture
def cgroup() -> Iterator[RunCgroup]:
    """A fresh run cgroup; whatever a failing test left in it is killed and it is removed afterwards."""
    assert not isinstance(PLACE, Unavailable)
    made = RunCgroup.create(PLACE, f"removal-{secrets.token_hex(4)}", "command", secrets.token_hex(4))
    yield made
    if os.path.isdir(made.directory):
        for child in Path(made.directory).iterdir():
            if child.is_dir():
                child.rmdir()
        for pid in Path(made.directory, "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        _reap_and_rmdir(made.directory)


def _reap_and_rmdir(directory: str) -> None:
    """Remove the cgroup once its killed members are gone (a few ms)."""
    for _ in range(200):
        try:
            os.rmdir(directory)
            return
        except OSError:
            time.sleep(0.01)


def _populated(directory: str) -> bool:
    """``populated 1`` in the cgroup's own ``cgroup.events``, read here independently of the code under test."""
    return "populated 1" in Path(directory, "cgroup.events").read_text()


@needs_cgroups
def test_a_cgroup_with_a_live_process_is_kept_and_said_populated(cgroup: RunCgroup) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        Path(cgroup.procs).write_text(str(sleeper.pid))
        assert _populated(cgroup.directory)
        assert cgroup.remove_if_empty() is False  # the kernel refused the rmdir (EBUSY)
        assert os.path.isdir(cgroup.directory) and not cgroup.removed
        assert cgroup.populated() is True
        assert Containment(pgid=sleeper.pid, cgroup=cgroup).leftovers() is True
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not _populated(cgroup.directory)  # reaped: nothing live is left
    assert cgroup.remove_if_empty() is True
    assert not os.path.exists(cgroup.directory) and cgroup.removed
    assert cgroup.populated() is False and cgroup.remove() is None  # gone: nothing left to remove


@needs_cgroups
def test_an_empty_cgroup_is_removed_by_the_leftover_check_and_release_has_nothing_to_do(cgroup: RunCgroup) -> None:
    child = subprocess.Popen(["true"], start_new_session=True)
    Path(cgroup.procs).write_text(str(child.pid))
    child.wait()
    tracker = Containment(pgid=child.pid, cgroup=cgroup)
    assert tracker.leftovers() is False
    assert not os.path.exists(cgroup.directory)
    assert tracker.release() is None


@needs_cgroups
def test_a_cgroup_kept_by_an_empty_child_cgroup_is_not_taken_for_leftovers(cgroup: RunCgroup) -> None:
    """``rmdir`` also refuses a cgroup with a child cgroup: then ``cgroup.events`` decides (nothing live: no
    leftovers), and the removal at the end reports that it could not remove it, as before."""
    nested = Path(cgroup.directory, "made-by-the-payload")
    nested.mkdir()
    child = subprocess.Popen(["true"], start_new_session=True)
    child.wait()
    tracker = Containment(pgid=child.pid, cgroup=cgroup)
    assert tracker.leftovers() is False
    assert os.path.isdir(cgroup.directory) and not cgroup.removed
    problem = tracker.release()
    assert problem is not None and cgroup.directory in problem
    nested.rmdir()
    assert tracker.release() is None and not os.path.exists(cgroup.directory)


@needs_cgroups
@pytest.mark.parametrize("payload", ["true", "echo x; true"])  # the direct gate and the bash gate
def test_a_run_that_leaves_nothing_removes_its_cgroup_and_notes_nothing(run_job, payload: str) -> None:
    ran = run_job(payload)
    r = ran.result
    assert r.status == "ok", r
    assert "leftover_processes_killed" not in r.details and "termination" not in r.details
    assert not any(key.startswith("cgroup_") for key in r.details if key != "cgroup")
    handle = ran.control.handles[0]
    assert handle["cgroup"] == r.details["cgroup"]
    assert not isinstance(PLACE, Unavailable)
    assert not (Path(PLACE.mount) / handle["cgroup"][len(PLACE.root.rstrip("/")):].lstrip("/")).exists()
