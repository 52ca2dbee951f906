"""Cgroup v2 containment (issue 30 defect 6): a ``setsid`` child is in its run's cgroup, so it dies with the run.

A process group holds only what stays in it: ``setsid sleep 64 & echo x`` left its sleep
alive after every run and after recovery. Where this host offers a writable cgroup v2
subtree (root here, or a delegated one), each command runs in a cgroup of its own, killed
as a whole at the end of the run, on timeout, on cancellation and by crash recovery. Every
test runs real processes and reads ``/proc`` and the cgroup files itself. Without a usable
cgroup v2 hierarchy the cgroup tests skip, saying why; the fallback and the refusal of
``containment = "cgroup"`` are tested as an account that cannot write cgroups (``nobody``).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from scheduler_executor_shell import ShellExecutor
from scheduler_executor_shell.capture import HashSink
from scheduler_executor_shell.cgroups import Place, RunCgroup, Unavailable, find_place, sweep_stale
from scheduler_executor_shell.runner import CgroupPlan, run_process

import scheduler.api
from scheduler.api import RecoveryRequest
from scheduler.testing import LocalRunControl, unreachable_by_others

PLACE = find_place()
needs_cgroups = pytest.mark.skipif(isinstance(PLACE, Unavailable), reason=f"no usable cgroup v2 here: {getattr(PLACE, 'reason', '')}")


@pytest.fixture(autouse=True)
def _cgroup_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests demand the cgroup mode (a run without its cgroup would fail CGROUP_UNAVAILABLE, not pass)."""
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_CONTAINMENT", "cgroup")


def _marker() -> str:
    """A sleep duration no other process uses, to find the sleep in ``/proc`` by its command line."""
    return f"64.{uuid.uuid4().int % 10**9:09d}"


def _sleepers(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line is ``sleep <marker>``, read from ``/proc``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if argv[:2] == [b"sleep", marker.encode()] and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def _gone(marker: str, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _sleepers(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _cgroup_dir(relative: str) -> Path:
    assert not isinstance(PLACE, Unavailable)
    return Path(PLACE.mount) / relative[len(PLACE.root.rstrip("/")):].lstrip("/")


@pytest.fixture
def reap_sleepers():
    """Kill whatever a failing test left behind (the markers it registered)."""
    markers: list[str] = []
    yield markers
    for marker in markers:
        for pid in _sleepers(marker):
            os.kill(pid, signal.SIGKILL)


@needs_cgroups
def test_a_setsid_child_dies_when_its_run_ends(run_job, reap_sleepers) -> None:
    marker = _marker()
    reap_sleepers.append(marker)
    ran = run_job(f"setsid sleep {marker} & echo x", run_timeout_ms=30_000)
    r = ran.result
    assert (r.status, r.summary) == ("ok", "x\n")
    assert r.details["leftover_processes_killed"] is True and "output_pipes_abandoned" not in r.details
    assert ran.elapsed < 5  # not waited for: it left the group, it is killed with the cgroup
    assert _sleepers(marker) == []
    handle = ran.control.handles[0]
    assert handle["cgroup"] == r.details["cgroup"] and os.path.basename(handle["cgroup"]).startswith(f"scheduler-run-{ran.request.run_id}-command-")
    assert not _cgroup_dir(handle["cgroup"]).exists()  # removed once empty


@needs_cgroups
def test_the_whole_cgroup_is_killed_on_timeout(run_job, reap_sleepers) -> None:
    marker = _marker()
    reap_sleepers.append(marker)
    # The setsid child ignores SIGTERM too: only the cgroup's SIGKILL ends it.
    ran = run_job(f"setsid sh -c 'trap \"\" TERM; sleep {marker}' & echo x; sleep 30", run_timeout_ms=700)
    assert ran.result.status == "timeout" and ran.result.error_code == "RUN_TIMEOUT"
    assert ran.control.terminations == ["SIGKILL"] and _sleepers(marker) == []
    assert not _cgroup_dir(ran.control.handles[0]["cgroup"]).exists()


@needs_cgroups
def test_the_whole_cgroup_is_killed_on_cancel(run_job, reap_sleepers) -> None:
    marker = _marker()
    reap_sleepers.append(marker)
    control = LocalRunControl()
    timer = threading.Timer(0.5, control.cancel)
    timer.start()
    try:
        ran = run_job(f"setsid sleep {marker} & echo x; sleep 30", control=control)
    finally:
        timer.cancel()
    assert ran.result.status == "cancelled" and control.terminations == ["SIGTERM"]
    assert _sleepers(marker) == []


@needs_cgroups
def test_verify_runs_in_a_cgroup_of_its_own(run_job, reap_sleepers) -> None:
    marker = _marker()
    reap_sleepers.append(marker)
    ran = run_job("true", verify_shell=f"setsid sleep {marker} & true")
    assert ran.result.status == "ok" and ran.result.verification["status"] == "passed"
    steps = {h["step"]: h["cgroup"] for h in ran.control.handles}
    assert set(steps) == {"command", "verify"} and steps["command"] != steps["verify"]
    assert _sleepers(marker) == []


@needs_cgroups
def test_recovery_kills_the_recorded_cgroup_of_a_dead_dispatcher(reap_sleepers) -> None:
    """What a dead dispatcher leaves: a command in its cgroup whose setsid child left the group; only the cgroup finds it."""
    assert not isinstance(PLACE, Unavailable)
    marker = _marker()
    reap_sleepers.append(marker)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    leader = subprocess.Popen(["sh", "-c", "read _; setsid sleep " + marker + " & exec sleep " + marker],
                              stdin=subprocess.PIPE, start_new_session=True)
    cgroup = RunCgroup.create(PLACE, run_id, "command", f"{leader.pid:x}")
    try:
        cgroup.adopt(leader.pid)
        assert leader.stdin is not None
        leader.stdin.write(b"\n")
        leader.stdin.close()
        deadline = time.monotonic() + 5
        while len(_sleepers(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(_sleepers(marker)) == 2
        handle = {"pid": leader.pid, "pgid": leader.pid, "start_time": "ticks:1", "host": socket.gethostname(),
                  "step": "command", "cgroup": cgroup.relative}
        # An edited row naming a cgroup that is not this run's is never touched.
        forged = ShellExecutor().recover(RecoveryRequest(run_id="another-run", job_id="j", handle=handle, owner="h:1:x",
                                                         owner_host="h", kill_grace_s=0.2))
        assert forged.state == "blocked" and len(_sleepers(marker)) == 2
        # The recorded start time is not the leader's (as if its PID were reused): the group is left alone,
        # but the cgroup is this run's and is killed, the escaped child with it.
        outcome = ShellExecutor().recover(RecoveryRequest(run_id=run_id, job_id="j", handle=handle, owner="h:1:x",
                                                          owner_host="h", kill_grace_s=0.2))
        assert (outcome.state, outcome.detail) == ("terminated", "SIGTERM")
        leader.wait(5)
        assert _gone(marker) and not Path(cgroup.directory).exists()
        again = ShellExecutor().recover(RecoveryRequest(run_id=run_id, job_id="j", handle=handle, owner="h:1:x",
                                                        owner_host="h", kill_grace_s=0.2))
        assert (again.state, again.detail) == ("gone", None)
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait(5)
        cgroup.remove()


#: Under a system interpreter of the same version with the venv's site-packages: the venv's own interpreter may live
#: under a directory only root can enter (/root/.pyenv here).
@needs_cgroups
def test_empty_run_cgroups_left_by_dead_dispatchers_are_swept_and_nothing_else() -> None:
    """In a parent of the test's own (a sweep of the real one could take another test's cgroup just made)."""
    assert not isinstance(PLACE, Unavailable)
    parent = Path(PLACE.directory) / f"scheduler-test-{uuid.uuid4().hex[:12]}"
    parent.mkdir()
    husk, busy, other = parent / "scheduler-run-r1-command-1", parent / "scheduler-run-r2-command-2", parent / "not-a-run"
    for path in (husk, busy, other):
        path.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        assert sweep_stale(str(parent)) == []  # all younger than a minute: spared
        assert sweep_stale(str(parent), older_than_s=0) == [husk.name]
        assert not husk.exists() and busy.is_dir() and other.is_dir() and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait(5)
        for path in (busy, other, parent):
            deadline = time.monotonic() + 5
            while path.exists() and time.monotonic() < deadline:
                try:
                    path.rmdir()
                except OSError:
                    time.sleep(0.02)


@pytest.mark.parametrize("required", [True, False])
def test_a_run_whose_cgroup_cannot_be_made_is_refused_or_falls_back(tmp_path: Path, required: bool) -> None:
    """A place that stopped being usable (here: a directory that does not exist): ``cgroup`` refuses the run before the
    payload starts; ``auto`` runs it in its process group and says why in the details."""
    marker = tmp_path / "ran"
    place = Place(mount=str(tmp_path / "gone"), root="/", own="/", has_kill=True)
    outcome = run_process(shell="/bin/sh", payload=f"touch {marker}", cwd=None, env={"PATH": os.environ["PATH"]},
                          stdin_data=None, outputs={"stdout": HashSink(), "stderr": HashSink()}, deadline=time.monotonic() + 30,
                          control=LocalRunControl(), grace_s=1.0, label="command",
                          cgroup=CgroupPlan(place=place, run_id="r1", required=required))
    if required:
        assert outcome.reason == "spawn_failed" and outcome.error is not None and outcome.error.code == "CGROUP_UNAVAILABLE"
        assert not marker.exists() and outcome.cgroup is None
    else:
        assert outcome.reason == "exited" and outcome.returncode == 0 and marker.exists()
        assert outcome.cgroup is None and "cannot create the run's cgroup" in outcome.notes["cgroup_error"]


_AS_NOBODY = textwrap.dedent(
    """
    import json, site, sys
    site.addsitedir(sys.argv.pop(1))
    from pathlib import Path
    from scheduler_executor_shell import ShellExecutor
    from scheduler.testing import LocalRunControl, make_request

    request = make_request(sys.argv[1], artifacts_root=Path(sys.argv[2]), run_id="run-nobody")
    executor = ShellExecutor()
    result = executor.execute(request, LocalRunControl())
    print(json.dumps({"status": result.status, "code": result.error_code, "message": result.error_message,
                      "details": result.details, "checks": executor.health_checks()}))
    """
)


def _nobody_python() -> tuple[str, str]:
    """A system interpreter of this version, and the venv's site-packages for it."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = next((p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.access(p, os.X_OK)), None)
    if python is None:
        pytest.skip(f"no system {version} that the nobody account can run")
    site_dir = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    if (unreachable := unreachable_by_others(site_dir, os.path.dirname(os.path.dirname(scheduler.api.__file__)))) is not None:
        pytest.skip(unreachable)
    return python, site_dir


def _as_nobody(shared: Path, payload: str, mode: str) -> dict:
    """The executor in a real process running as ``nobody``, which may not write any cgroup here."""
    nobody = pwd.getpwnam("nobody")
    root = Path(tempfile.mkdtemp(dir=shared))
    root.chmod(0o777)
    config = shared / "empty.toml"
    config.write_text("")
    config.chmod(0o644)
    env = {"PATH": os.environ["PATH"], "SCHEDULER_CONFIG": str(config), "SCHEDULER_EXECUTORS_SHELL_CONTAINMENT": mode,
           "HOME": "/"}
    python, site_dir = _nobody_python()
    out = subprocess.run([python, "-c", _AS_NOBODY, site_dir, payload, str(root)], capture_output=True, text=True, env=env,
                         timeout=60, cwd="/", user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory ``nobody`` can use (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="cgroup-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as nobody")
def test_without_a_writable_cgroup_auto_falls_back_and_cgroup_is_refused(shared: Path) -> None:
    marker = shared / "ran"
    refused = _as_nobody(shared, f"touch {marker}", "cgroup")
    assert (refused["status"], refused["code"]) == ("error", "CGROUP_UNAVAILABLE"), refused
    assert not marker.exists()  # refused before anything started
    [check] = refused["checks"]
    assert (check["check"], check["ok"], check["code"], check["mode"]) == ("shell_containment", False, "CGROUP_UNAVAILABLE",
                                                                          "process-group")
    fallback = _as_nobody(shared, f"touch {marker}", "auto")
    assert fallback["status"] == "ok" and "cgroup" not in fallback["details"] and marker.exists(), fallback
    [check] = fallback["checks"]
    assert (check["ok"], check["warning"], check["mode"], check["setting"]) == (True, True, "process-group", "auto")
    assert "setsid" in check["detail"]


_DOCTOR = "import site, sys; site.addsitedir(sys.argv.pop(1)); from scheduler.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as nobody")
def test_doctor_fails_when_cgroup_is_demanded_and_this_account_cannot_have_one(shared: Path) -> None:
    """``scheduler doctor`` as an account that may write no cgroup: ``containment = "cgroup"`` fails it, ``auto`` warns."""
    db = shared / "s.db"
    _cli(db, "jobs", "add", json.dumps({"name": "a", "schedule_kind": "manual", "payload_message": "true"}))
    python, site_dir = _nobody_python()
    nobody = pwd.getpwnam("nobody")
    for mode in ("cgroup", "auto"):
        env = {"PATH": os.environ["PATH"], "HOME": str(shared), "SCHEDULER_EXECUTORS_SHELL_CONTAINMENT": mode}
        out = subprocess.run([python, "-c", _DOCTOR, site_dir, "--db", str(db), "--json", "doctor"], capture_output=True,
                             text=True, env=env, timeout=120, cwd="/", user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
        data = json.loads(out.stdout.strip().splitlines()[-1])
        checks = data["checks"] if data["ok"] else data["details"]
        [check] = [c for c in checks if c["check"] == "shell_containment"]
        assert (check["mode"], check["setting"], check["provider"]) == ("process-group", mode, "executor shell")
        if mode == "cgroup":  # doctor fails, naming the check (other checks may fail too for nobody: file ownership)
            assert out.returncode == 1 and data["code"] == "UNHEALTHY" and "shell_containment" in data["error"], out
            assert not check["ok"] and check["code"] == "CGROUP_UNAVAILABLE"
        else:
            assert "shell_containment" not in data.get("error", ""), out
            assert check["ok"] and check["warning"] and check["detail"].startswith("warning: ")


@needs_cgroups
def test_doctor_says_the_cgroup_mode_is_active(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _cli(db, "jobs", "add", json.dumps({"name": "a", "schedule_kind": "manual", "payload_message": "true"}))
    [check] = [c for c in _cli(db, "doctor")["checks"] if c["check"] == "shell_containment"]
    assert (check["ok"], check["mode"], check["setting"]) == (True, "cgroup", "cgroup") and "cgroup v2" in check["detail"]


@needs_cgroups
def test_the_health_check_names_the_active_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    [check] = ShellExecutor().health_checks()
    assert (check["check"], check["ok"], check["mode"], check["setting"]) == ("shell_containment", True, "cgroup", "cgroup")
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_CONTAINMENT", "process-group")
    [check] = ShellExecutor().health_checks()
    assert (check["ok"], check["mode"], check["warning"]) == (True, "process-group", True)


# -- through a real dispatcher: the issue's command, at the end of a run, on timeout, cancel and recovery ---------------

SCHEDULER = [sys.executable, "-m", "scheduler"]


def _cli(db: Path, *args: str) -> dict:
    out = subprocess.run([*SCHEDULER, "--db", str(db), "--json", *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SCHEDULER_EXECUTORS_SHELL_CONTAINMENT": "cgroup"})
    assert "Traceback" not in out.stdout + out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and data["ok"], out
    return data


def _dispatcher(db: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*SCHEDULER, "--db", str(db), "run", "--lease-ttl", "2s", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "SCHEDULER_EXECUTORS_SHELL_CONTAINMENT": "cgroup"})


def _run_of(db: Path, name: str) -> dict:
    runs = _cli(db, "runs", "list", name)["runs"]
    return _cli(db, "runs", "get", runs[0]["id"])["run"] if runs else {}


def _wait_run(db: Path, name: str, ready, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = _run_of(db, name)
        if run and ready(run):
            return run
        time.sleep(0.1)
    raise AssertionError(f"{name}: {_run_of(db, name)}")


@needs_cgroups
def test_the_issues_command_leaves_no_sleep_after_its_run_a_timeout_a_cancel_and_recovery(tmp_path: Path, reap_sleepers) -> None:
    db = tmp_path / "s.db"
    marks = {name: _marker() for name in ("ends", "times-out", "cancelled", "recovered")}
    reap_sleepers.extend(marks.values())
    _cli(db, "jobs", "add", json.dumps([
        {"name": "ends", "schedule_kind": "manual", "payload_message": f"setsid sleep {marks['ends']} & echo x"},
        {"name": "times-out", "schedule_kind": "manual", "payload_message": f"setsid sleep {marks['times-out']} & echo x; sleep 30",
         "run_timeout_ms": 1500, "max_retries": 0},
        {"name": "cancelled", "schedule_kind": "manual", "payload_message": f"setsid sleep {marks['cancelled']} & echo x; sleep 30"},
        {"name": "recovered", "schedule_kind": "manual", "payload_message": f"setsid sleep {marks['recovered']} & echo x; sleep 30"},
    ]))
    for name in ("ends", "times-out", "cancelled", "recovered"):
        _cli(db, "jobs", "run", name)
    first = _dispatcher(db)
    try:
        running = {name: _wait_run(db, name, lambda r: r["status"] == "running" and r["executor_handle"])
                   for name in ("cancelled", "recovered")}
        deadline = time.monotonic() + 10
        while not all(_sleepers(marks[n]) for n in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_sleepers(marks[n]) for n in running)
        _cli(db, "runs", "cancel", running["cancelled"]["id"], "--reason", "enough")
        ended = _wait_run(db, "ends", lambda r: r["status"] != "running")
        timed_out = _wait_run(db, "times-out", lambda r: r["status"] not in ("pending", "running"))
        cancelled = _wait_run(db, "cancelled", lambda r: r["status"] != "running")
        assert (ended["status"], timed_out["status"], cancelled["status"]) == ("ok", "timeout", "cancelled")
        for name in ("ends", "times-out", "cancelled"):
            assert _gone(marks[name]), f"{name}: the setsid sleep outlived its run"
        assert _sleepers(marks["recovered"])  # still running when its dispatcher dies
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    handle = running["recovered"]["executor_handle"]
    assert _cgroup_dir(handle["cgroup"]).is_dir()  # left behind by the dead dispatcher, with the sleep in it
    second = _dispatcher(db, "--duration", "6s")
    assert second.wait(60) == 0
    recovered = _run_of(db, "recovered")
    assert recovered["status"] == "crashed", recovered
    assert _gone(marks["recovered"]), "the setsid sleep outlived recovery"
    assert not _cgroup_dir(handle["cgroup"]).exists()
