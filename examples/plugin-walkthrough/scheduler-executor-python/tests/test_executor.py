"""Direct unit tests: call ``execute`` with a ``LocalRunControl``, exactly as the dispatcher would."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from scheduler_executor_python import PythonExecutor, PythonOptions
from scheduler_toolkit.output import read_artifact
from scheduler_toolkit.process import group_alive, process_identity

from scheduler.api import PLUGIN_API_VERSION, Executor, RecoveryRequest, SchedulerError
from scheduler.testing import LocalRunControl, load_provider


def test_declares_the_api_options_and_capabilities() -> None:
    executor = PythonExecutor()
    assert isinstance(executor, Executor) and executor.plugin_api == PLUGIN_API_VERSION
    assert executor.options_class is PythonOptions
    assert {"process-group", "timeout", "cancel", "stdin", "env-policy"} <= executor.capabilities
    assert "verify" not in executor.capabilities and "sandbox" not in executor.capabilities


def test_runs_the_payload_as_python(make_request) -> None:
    request = make_request("import sys\nprint(sum(range(5)))\nprint('to stderr', file=sys.stderr)")
    result = PythonExecutor().execute(request, LocalRunControl())
    assert (result.status, result.exit_code, result.error_code) == ("ok", 0, None), result.stderr
    assert result.stdout.excerpt == "10\n" and result.stdout.sha256 == hashlib.sha256(b"10\n").hexdigest()
    assert result.stderr.excerpt == "to stderr\n" and result.summary == "10\n"


def test_an_exception_is_exit_nonzero_with_the_traceback_on_stderr(make_request) -> None:
    result = PythonExecutor().execute(make_request("print('before')\nraise ValueError('boom')"), LocalRunControl())
    assert (result.status, result.exit_code, result.error_code) == ("error", 1, "EXIT_NONZERO")
    assert result.stdout.excerpt == "before\n" and "ValueError: boom" in result.stderr.excerpt


def test_sys_exit_sets_the_exit_code(make_request) -> None:
    result = PythonExecutor().execute(make_request("import sys; sys.exit(7)"), LocalRunControl())
    assert (result.status, result.exit_code) == ("error", 7)


def test_handle_is_recorded_before_the_payload_runs(make_request, tmp_path) -> None:
    marker = tmp_path / "ran"
    seen: list[bool] = []

    class Watching(LocalRunControl):
        def record_handle(self, handle: dict) -> None:
            seen.append(marker.exists())
            super().record_handle(handle)

    control = Watching()
    request = make_request(f"open({str(marker)!r}, 'w').close()")
    result = PythonExecutor().execute(request, control)
    assert result.status == "ok" and marker.exists() and seen == [False]
    (handle,) = control.handles
    assert handle["pid"] == handle["pgid"] and handle["host"] == socket.gethostname()
    assert handle["start_time"].startswith("ticks:")


def test_a_failed_record_never_runs_the_payload(make_request, tmp_path) -> None:
    marker = tmp_path / "ran"

    class Fenced(LocalRunControl):
        def record_handle(self, handle: dict) -> None:
            self.pgid = handle["pgid"]
            raise SchedulerError("STALE_FENCE", "lost the run")

    control = Fenced()
    result = PythonExecutor().execute(make_request(f"open({str(marker)!r}, 'w').close()"), control)
    assert (result.status, result.error_code) == ("error", "STALE_FENCE")
    assert not marker.exists() and not group_alive(control.pgid)


def test_stdin_and_environment_policy(make_request, monkeypatch) -> None:
    monkeypatch.setenv("PYTHON_EXAMPLE_VISIBLE", "seen")
    code = ("import os, sys\n"
            "print(sys.stdin.read().upper(), os.environ.get('PYTHON_EXAMPLE_VISIBLE'), os.environ['SCHEDULER_RUN_ID'])")
    minimal = make_request(code, executor_options={"stdin_text": "abc"})
    result = PythonExecutor().execute(minimal, LocalRunControl())
    assert result.stdout.excerpt == f"ABC None {minimal.run_id}\n"
    inherit = make_request(code, executor_options={"env_policy": "inherit"})
    assert PythonExecutor().execute(inherit, LocalRunControl()).stdout.excerpt == f" seen {inherit.run_id}\n"


def test_structured_and_large_output(make_request) -> None:
    result = PythonExecutor().execute(make_request("print('{\"a\": 1}')", output_format="json"), LocalRunControl())
    assert result.structured["valid"] is True and result.structured["parsed"] == {"a": 1}
    request = make_request("import sys; sys.stdout.buffer.write(bytes(300000))")
    big = PythonExecutor().execute(request, LocalRunControl())
    assert big.stdout.bytes == 300_000 and big.stdout.artifact
    assert read_artifact(request.artifacts_root, big.stdout.artifact, big.stdout.sha256, big.stdout.bytes) == bytes(300_000)


def test_deadline_stops_a_payload_that_ignores_sigterm(make_request) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(30)"
    control, start = LocalRunControl(), time.monotonic()
    result = PythonExecutor().execute(make_request(code, timeout_ms=300), control)
    assert (result.status, result.error_code) == ("timeout", "RUN_TIMEOUT")
    assert control.terminations == ["SIGKILL"] and time.monotonic() - start < 10


def test_cancel_stops_the_group_and_its_children(make_request) -> None:
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\ntime.sleep(30)")
    control = LocalRunControl()
    threading.Timer(0.5, control.cancel, args=("user",)).start()
    result = PythonExecutor().execute(make_request(code), control)
    assert (result.status, result.error_code) == ("cancelled", "RUN_CANCELLED") and control.terminations == ["SIGTERM"]
    assert not group_alive(control.handles[0]["pgid"])


def test_cancel_before_start_runs_nothing(make_request) -> None:
    control = LocalRunControl()
    control.cancel("user")
    result = PythonExecutor().execute(make_request("print('no')"), control)
    assert (result.status, result.error_code) == ("cancelled", "RUN_CANCELLED") and control.handles == []


def test_recover_stops_an_orphaned_group() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    handle = {"pid": proc.pid, "pgid": proc.pid, "start_time": process_identity(proc.pid), "host": socket.gethostname()}
    try:
        outcome = PythonExecutor().recover(RecoveryRequest(run_id="r", job_id="j", handle=handle, owner=None, owner_host=None,
                                                          kill_grace_s=1.0))
        assert outcome.state == "terminated" and outcome.detail == "SIGTERM"
        proc.wait(5)
        gone = PythonExecutor().recover(RecoveryRequest(run_id="r", job_id="j", handle=handle, owner=None, owner_host=None))
        assert gone.state == "gone"
        elsewhere = {**handle, "host": "another-host"}
        assert PythonExecutor().recover(
            RecoveryRequest(run_id="r", job_id="j", handle=elsewhere, owner=None, owner_host=None)).state == "unknown"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.mark.usefixtures("python_installed")
def test_loads_through_its_entry_point_like_production() -> None:
    assert isinstance(load_provider("executor", "python"), PythonExecutor)
