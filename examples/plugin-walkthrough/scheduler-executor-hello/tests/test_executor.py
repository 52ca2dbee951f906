"""Direct unit tests: call ``execute`` with a ``LocalRunControl``, exactly as the dispatcher would."""

from __future__ import annotations

import hashlib
import time

import pytest
from scheduler_executor_hello import HelloExecutor
from scheduler_executor_hello import executor as hello_module
from scheduler_toolkit.output import read_artifact

from scheduler.api import PLUGIN_API_VERSION, ExecutionResult, Executor
from scheduler.testing import LocalRunControl, load_provider


def test_declares_the_api_and_claims_no_capability() -> None:
    executor = HelloExecutor()
    assert isinstance(executor, Executor)
    assert executor.plugin_api == PLUGIN_API_VERSION
    assert executor.capabilities == frozenset()


def test_success_reports_output_size_and_digest(make_request) -> None:
    request = make_request("printf 'hello\\n'; echo oops >&2")
    result = HelloExecutor().execute(request, LocalRunControl())
    assert isinstance(result, ExecutionResult)
    assert (result.status, result.exit_code, result.error_code) == ("ok", 0, None)
    assert result.stdout.excerpt == "hello\n" and result.stdout.bytes == 6
    assert result.stdout.sha256 == hashlib.sha256(b"hello\n").hexdigest()
    assert result.stdout.artifact is None  # small output stays inline
    assert "oops" in result.stderr.excerpt
    assert result.summary == "hello\n"


def test_kernel_variables_reach_the_command_and_stdin_is_empty(make_request) -> None:
    request = make_request('echo "$SCHEDULER_RUN_ID"; cat; echo end')
    result = HelloExecutor().execute(request, LocalRunControl())
    assert result.stdout.excerpt == f"{request.run_id}\nend\n"


def test_minimal_environment_hides_dispatcher_variables(make_request, monkeypatch) -> None:
    monkeypatch.setenv("HELLO_TEST_SECRET", "s3cret")
    result = HelloExecutor().execute(make_request('echo "[$HELLO_TEST_SECRET]"'), LocalRunControl())
    assert result.stdout.excerpt == "[]\n"


def test_nonzero_exit_is_an_error_with_a_code(make_request) -> None:
    result = HelloExecutor().execute(make_request("echo before; exit 3"), LocalRunControl())
    assert (result.status, result.exit_code, result.error_code) == ("error", 3, "EXIT_NONZERO")
    assert result.stdout.excerpt == "before\n"


def test_large_output_is_offloaded_and_verifiable(make_request) -> None:
    request = make_request("head -c 300000 /dev/zero")
    result = HelloExecutor().execute(request, LocalRunControl())
    assert result.status == "ok" and result.stdout.bytes == 300_000 and result.stdout.artifact
    data = read_artifact(request.artifacts_root, result.stdout.artifact, result.stdout.sha256, result.stdout.bytes)
    assert data == b"\0" * 300_000


def test_cancel_before_start_runs_nothing(make_request, tmp_path) -> None:
    marker = tmp_path / "ran"
    control = LocalRunControl()
    control.cancel("user")
    result = HelloExecutor().execute(make_request(f"touch {marker}"), control)
    assert (result.status, result.error_code) == ("cancelled", "RUN_CANCELLED")
    assert not marker.exists()


def test_deadline_is_honoured(make_request) -> None:
    start = time.monotonic()
    result = HelloExecutor().execute(make_request("exec sleep 5", timeout_ms=300), LocalRunControl())
    assert (result.status, result.error_code) == ("timeout", "RUN_TIMEOUT")
    assert time.monotonic() - start < 4


def test_spawn_failure_is_a_coded_error(make_request, monkeypatch) -> None:
    def no_shell(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", "/bin/sh")

    monkeypatch.setattr(hello_module.subprocess, "run", no_shell)
    result = HelloExecutor().execute(make_request("true"), LocalRunControl())
    assert (result.status, result.error_code) == ("error", "HELLO_SPAWN_FAILED")


@pytest.mark.usefixtures("hello_installed")
def test_loads_through_its_entry_point_like_production() -> None:
    provider = load_provider("executor", "hello")
    assert isinstance(provider, HelloExecutor)
