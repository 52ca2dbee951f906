"""ShellExecutor lifecycle: exit codes, timeout, cancellation, process groups, identity, cwd and stdin.

Every test runs real processes through /bin/bash; group cleanup is checked in /proc.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from scheduler_executor_shell import ShellExecutor
from scheduler_toolkit.process import same_process
from scheduler_toolkit.settings import reload_settings
from scheduler_toolkit.types import CredentialPresentation

from scheduler.api import PLUGIN_API_VERSION, Executor, SchedulerError
from scheduler.testing import LocalRunControl


def test_protocol_and_capabilities() -> None:
    ex = ShellExecutor()
    assert isinstance(ex, Executor)
    assert ex.plugin_api == PLUGIN_API_VERSION
    assert {
        "process-group",
        "timeout",
        "cancel",
        "output-capture",
        "structured-output",
        "verify",
        "env-policy",
    } <= ex.capabilities
    assert not {c for c in ex.capabilities if any(w in c for w in ("sandbox", "network", "filesystem", "isolation"))}


def test_success(run_job) -> None:
    ran = run_job("echo hello; echo oops >&2")
    r = ran.result
    assert (r.status, r.exit_code, r.error_code) == ("ok", 0, None)
    assert r.stdout.excerpt == "hello\n" and r.stdout.bytes == 6 and not r.stdout.truncated
    assert r.stderr.excerpt == "oops\n"
    assert r.summary == "hello\n"
    assert r.structured["format"] == "text" and r.structured["parsed"] == "hello"
    assert r.env_warning is None
    assert ran.control.terminations == []


def test_nonzero_exit(run_job) -> None:
    r = run_job("echo partial; exit 3").result
    assert (r.status, r.exit_code, r.error_code) == ("error", 3, "EXIT_NONZERO")
    assert r.stdout.excerpt == "partial\n"


def test_killed_by_signal_reports_negative_signum(run_job) -> None:
    r = run_job("kill -KILL $$").result
    assert (r.status, r.exit_code, r.error_code) == ("error", -9, "EXIT_NONZERO")
    assert "SIGKILL" in r.error_message


def test_timeout_terminates_and_records(run_job, group_gone) -> None:
    ran = run_job("sleep 30", run_timeout_ms=300)
    r = ran.result
    assert (r.status, r.error_code) == ("timeout", "RUN_TIMEOUT")
    assert ran.elapsed < 5
    assert ran.control.terminations == ["SIGTERM"]
    assert r.exit_code == -15
    group_gone(ran.control.handles[0]["pgid"])


def test_timeout_escalates_to_sigkill(run_job, monkeypatch, group_gone) -> None:
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_KILL_GRACE_S", "0.2")
    ran = run_job("trap '' TERM; exec sleep 30", run_timeout_ms=300)
    assert ran.result.status == "timeout"
    assert ran.control.terminations == ["SIGKILL"]
    assert ran.result.exit_code == -9
    group_gone(ran.control.handles[0]["pgid"])


def test_timeout_kills_grandchildren(run_job, group_gone) -> None:
    ran = run_job("sh -c 'sleep 100 & sleep 100'", run_timeout_ms=300)
    assert ran.result.status == "timeout"
    assert ran.control.terminations == ["SIGTERM"]
    pid, pgid = ran.control.handles[0]["pid"], ran.control.handles[0]["pgid"]
    assert pid == pgid
    group_gone(pgid, reaped=True)


def test_cancel_from_another_thread_kills_grandchildren(run_job, group_gone) -> None:
    control = LocalRunControl()
    timer = threading.Timer(0.3, control.cancel, kwargs={"reason": "user"})
    timer.start()
    try:
        ran = run_job("sh -c 'sleep 100 & sleep 100'", control=control)
    finally:
        timer.cancel()
    r = ran.result
    assert (r.status, r.error_code) == ("cancelled", "RUN_CANCELLED")
    assert r.details["cancel_reason"] == "user"
    assert ran.elapsed < 5
    assert control.terminations == ["SIGTERM"]
    group_gone(control.handles[0]["pgid"], reaped=True)


def test_cancelled_before_start_spawns_nothing(run_job) -> None:
    control = LocalRunControl()
    control.cancel("shutdown")
    ran = run_job("echo should-not-run", control=control)
    assert ran.result.status == "cancelled"
    assert control.handles == [] and control.terminations == []


def test_background_leftovers_are_killed_after_success(run_job, group_gone) -> None:
    ran = run_job("sleep 100 >/dev/null 2>&1 </dev/null & echo started")
    r = ran.result
    assert r.status == "ok" and r.summary == "started\n"
    assert r.details["leftover_processes_killed"] is True
    assert ran.control.terminations == ["SIGTERM"]
    group_gone(ran.control.handles[0]["pgid"])


def test_background_writer_in_group_is_waited_for(run_job) -> None:
    r = run_job("(sleep 0.3; echo late) & echo early").result
    assert r.status == "ok"
    assert r.stdout.excerpt == "early\nlate\n"


def test_escaped_process_holding_pipes_does_not_hang_the_run(run_job, monkeypatch: pytest.MonkeyPatch) -> None:
    """With process groups alone (a cgroup kills it instead: tests/test_cgroups.py), a setsid child escapes the group."""
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_CONTAINMENT", "process-group")
    ran = run_job("setsid sleep 20 & echo $!", run_timeout_ms=10_000)
    escaped = int(ran.result.stdout.excerpt.split()[0])
    try:
        assert ran.result.status == "ok"
        assert ran.result.details["output_pipes_abandoned"] is True
        assert ran.elapsed < 5
        assert threading.active_count() < 50  # pump threads end, they are not leaked per run
        assert [t for t in threading.enumerate() if t.name == "shell-pipe-pump"] == []
    finally:
        os.kill(escaped, 9)


def test_record_handle_before_payload_runs(run_job, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    seen: list[tuple[bool, bool]] = []

    class Checking(LocalRunControl):
        def record_handle(self, handle: dict) -> None:
            seen.append((marker.exists(), same_process(handle["pid"], handle["start_time"])))
            super().record_handle(handle)

    control = Checking()
    ran = run_job(f"touch {marker}; echo $$; sleep 0.2", control=control)
    assert ran.result.status == "ok"
    handle = control.handles[0]
    pid, pgid, identity = handle["pid"], handle["pgid"], handle["start_time"]
    assert handle["host"] == __import__("socket").gethostname()
    assert pid == int(ran.result.stdout.excerpt) == pgid
    assert identity.startswith("ticks:")
    assert seen == [(False, True)]  # recorded while alive, before the payload did anything
    assert not same_process(pid, identity)  # it has exited now
    assert not same_process(pid, "ticks:1")


def test_record_handle_failure_never_starts_payload(run_job, tmp_path: Path, group_gone, fence_lost_control) -> None:
    marker = tmp_path / "side-effect"

    control = fence_lost_control
    r = run_job(f"touch {marker}; sleep 30", control=control).result
    assert (r.status, r.error_code) == ("error", "LEASE_LOST")
    assert not marker.exists()
    group_gone(control.handles[0]["pgid"])


def test_working_dir_and_stdin(run_job, tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    r = run_job("pwd; cat", executor_options={"working_dir": str(wd), "stdin_text": "hello\nworld"}).result
    assert r.status == "ok"
    assert r.stdout.excerpt == f"{os.path.realpath(wd)}\nhello\nworld"


def test_large_stdin_is_fed_without_blocking(run_job) -> None:
    r = run_job("wc -c", executor_options={"stdin_text": "x" * 3_000_000}).result
    assert r.status == "ok" and r.stdout.excerpt.strip() == "3000000"


def test_no_stdin_reads_dev_null(run_job) -> None:
    ran = run_job("cat; readlink /proc/self/fd/0; echo done", run_timeout_ms=5000)
    assert ran.result.status == "ok"
    assert ran.result.stdout.excerpt == "/dev/null\ndone\n"


def test_missing_working_dir(make_request, tmp_path: Path) -> None:
    """A working_dir removed after the job was added (``jobs add`` refuses a missing one) fails the run before it starts."""
    gone = tmp_path / "gone"
    gone.mkdir()
    request = make_request("echo hi", executor_options={"working_dir": str(gone)})
    gone.rmdir()
    control = LocalRunControl()
    result = ShellExecutor().execute(request, control)
    assert (result.status, result.error_code) == ("error", "WORKING_DIR_MISSING")
    assert control.handles == []


def test_a_missing_working_dir_is_refused_when_the_job_is_validated(make_request, tmp_path: Path) -> None:
    with pytest.raises(SchedulerError) as info:
        make_request("echo hi", executor_options={"working_dir": str(tmp_path / "nope")})
    assert [d["code"] for d in info.value.details] == ["WORKING_DIR_INVALID"]


def test_shell_override_and_bad_value(run_job, monkeypatch) -> None:
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_SHELL", "/bin/sh")
    r = run_job("echo $0").result
    assert r.status == "ok" and r.stdout.excerpt == "/bin/sh\n" and r.details["shell"] == "/bin/sh"
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_SHELL", "/no/such/shell")
    r = run_job("echo hi").result
    assert (r.status, r.error_code) == ("error", "CONFIG_INVALID")
    assert "executors.shell.shell" in r.error_message and "env:SCHEDULER_EXECUTORS_SHELL_SHELL" in r.error_message


def test_settings_file_table_applies_and_the_override_wins(run_job, monkeypatch, tmp_path: Path) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text('[executors.shell]\nshell = "/bin/sh"\nmax_output_bytes = 4\n')
    monkeypatch.setenv("SCHEDULER_CONFIG", str(settings))
    reload_settings()
    r = run_job("echo $0; sleep 10", run_timeout_ms=20_000).result  # still running when the cap is hit
    assert r.details["shell"] == "/bin/sh" and (r.status, r.error_code) == ("error", "OUTPUT_LIMIT_EXCEEDED")
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_MAX_OUTPUT_BYTES", "1000")
    r = run_job("echo $0").result
    assert (r.status, r.stdout.excerpt) == ("ok", "/bin/sh\n")


def test_one_executor_sees_override_changes_between_runs(make_request, monkeypatch) -> None:
    """The executor keeps its resolved settings across runs, but never past a change of its overrides."""
    executor = ShellExecutor()

    def run() -> object:
        return executor.execute(make_request("echo $0"), LocalRunControl())

    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_SHELL", "/bin/sh")
    assert run().stdout.excerpt == "/bin/sh\n"
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_SHELL", "/no/such/shell")
    assert run().error_code == "CONFIG_INVALID"
    assert run().error_code == "CONFIG_INVALID"  # a bad value is never kept as the settings
    monkeypatch.delenv("SCHEDULER_EXECUTORS_SHELL_SHELL")
    r = run()
    assert r.status == "ok" and r.details["shell"] == "/bin/bash"


def test_one_executor_sees_environment_changes_between_runs(make_request, monkeypatch) -> None:
    """The filtered environment is kept across runs, but never past a change of the dispatcher environment."""
    executor = ShellExecutor()

    def run(**options: object) -> str:
        request = make_request('echo "${PROBE_VALUE-unset}:${PROBE_TOKEN-unset}"', executor_options=options)
        return executor.execute(request, LocalRunControl()).stdout.excerpt

    monkeypatch.delenv("PROBE_VALUE", raising=False)
    assert run(env_policy="inherit") == "unset:unset\n"
    monkeypatch.setenv("PROBE_VALUE", "one")
    monkeypatch.setenv("PROBE_TOKEN", "secret")
    assert run(env_policy="inherit") == "one:unset\n"
    assert run() == "unset:unset\n"  # minimal, from the same environment
    assert run(env_policy="inherit", env_allow=["PROBE_TOKEN"]) == "one:secret\n"
    monkeypatch.setenv("PROBE_VALUE", "two")
    assert run(env_policy="inherit") == "two:unset\n"


def test_a_runs_own_variables_never_reach_the_next_run_of_the_same_shape(make_request) -> None:
    """The job environment kept per job shape is copied for each run: a credential or run id set on one run
    (``extra_env``, credentials) is not in the next one's."""
    executor = ShellExecutor()
    payload = 'echo "${PROBE_SECRET_VALUE-unset}:$SCHEDULER_RUN_ID"'
    with_secret = make_request(payload, credentials=(
        CredentialPresentation(name="probe", medium="env", key="PROBE_SECRET_VALUE", value="s3"),))
    first = executor.execute(with_secret, LocalRunControl())
    plain = make_request(payload)
    second = executor.execute(plain, LocalRunControl())
    assert first.stdout.excerpt == f"[REDACTED:probe]:{with_secret.run_id}\n"  # it was set (and redacted)
    assert second.stdout.excerpt == f"unset:{plain.run_id}\n"


@pytest.mark.parametrize("value", ["abc", "0"])
def test_bad_output_limit_setting(run_job, monkeypatch, value: str) -> None:
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_MAX_OUTPUT_BYTES", value)
    r = run_job("echo hi").result
    assert r.error_code == "CONFIG_INVALID" and "executors.shell.max_output_bytes" in r.error_message
