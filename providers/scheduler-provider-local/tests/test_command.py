"""The ``command`` driver with real subprocesses: no shell, small environment, timeout, output cap, no leaks."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from scheduler_provider_local import CommandCredentialProvider, CommandSettings

from scheduler.api import SchedulerError


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o700)
    return str(path)


def provider_with(commands: dict[str, str], environ: dict[str, str] | None = None, **settings) -> CommandCredentialProvider:
    provider = CommandCredentialProvider(environ=environ)
    provider.configure(CommandSettings(commands=commands, **settings))
    return provider


def alive(pid: int, settle_s: float = 3.0) -> bool:
    """Whether ``pid`` still runs (not a zombie) once a SIGKILL sent to it has had ``settle_s`` to land."""
    deadline = time.monotonic() + settle_s
    while _running(pid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)
    return False


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_stdout_of_the_configured_command_through_the_entry_point(tmp_path, load, binding, context, secret) -> None:
    helper = script(tmp_path, "helper", f"printf '%s\\n' '{secret}'\n")
    provider = load("command", commands={"vault-api": helper})
    resolved = provider.resolve(binding("command", "vault-api"), context)
    assert resolved.value == secret
    assert resolved.metadata == {"provider": "command", "source": "command:vault-api", "bytes": len(secret) + 1}


def test_the_job_names_a_command_it_never_supplies_one(tmp_path, binding, context) -> None:
    provider = provider_with({"tok": "/bin/echo hi"})
    for ref in ("/bin/echo hi", "echo", "tok; rm -rf /", "TOK"):
        with pytest.raises(SchedulerError) as info:
            provider.resolve(binding("command", ref), context)
        assert info.value.code in ("CREDENTIAL_REF_INVALID", "CREDENTIAL_NOT_FOUND")
    with pytest.raises(SchedulerError) as info:
        provider.resolve(binding("command", "other"), context)
    assert info.value.code == "CREDENTIAL_NOT_FOUND" and "known: tok" in info.value.message


def test_no_shell_is_involved(binding, context) -> None:
    provider = provider_with({"lit": "/bin/echo $HOME; `id` | cat > /dev/null"})
    assert provider.resolve(binding("command", "lit"), context).value == "$HOME; `id` | cat > /dev/null"


def test_quoted_words_are_split_like_a_shell_would(tmp_path, binding, context) -> None:
    helper = script(tmp_path, "args", 'printf "%s|" "$@"\n')
    provider = provider_with({"a": f"{helper} 'two words' \"and more\" plain"})
    assert provider.resolve(binding("command", "a"), context).value == "two words|and more|plain|"


def test_the_command_gets_a_small_environment(tmp_path, binding, context) -> None:
    helper = script(tmp_path, "envdump", "env | sort\n")
    environ = {"PATH": "/usr/bin:/bin", "HOME": "/home/x", "VAULT_ADDR": "https://vault", "DB_PASSWORD": "hunter2",
               "SCHEDULER_CONFIG": "/etc/s.toml"}
    provider = provider_with({"dump": helper}, environ=environ, pass_env=["VAULT_ADDR"])
    seen = dict(line.split("=", 1) for line in provider.resolve(binding("command", "dump", name="db"), context).value.splitlines())
    seen.pop("PWD", None)  # set by the shell itself
    assert seen == {"PATH": "/usr/bin:/bin", "HOME": "/home/x", "VAULT_ADDR": "https://vault",
                    "SCHEDULER_CREDENTIAL_NAME": "db", "SCHEDULER_RUN_ID": "run-42", "SCHEDULER_JOB_ID": "job-7"}


def test_a_slow_command_is_killed_with_its_group(tmp_path, binding, context) -> None:
    pidfile = tmp_path / "child.pid"
    helper = script(tmp_path, "slow", f"sleep 30 & echo $! > {pidfile}\nsleep 30\n")
    provider = provider_with({"slow": helper}, timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(SchedulerError) as info:
        provider.resolve(binding("command", "slow"), context)
    assert time.monotonic() - t0 < 3
    assert info.value.code == "CREDENTIAL_COMMAND_TIMEOUT" and info.value.retryable and info.value.details["transient"]
    assert not alive(int(pidfile.read_text()))


def test_output_is_bounded(binding, context) -> None:
    provider = provider_with({"yes": "/usr/bin/yes"}, max_output_bytes=1000)
    t0 = time.monotonic()
    with pytest.raises(SchedulerError) as info:
        provider.resolve(binding("command", "yes"), context)
    assert info.value.code == "CREDENTIAL_COMMAND_OUTPUT_TOO_LARGE" and time.monotonic() - t0 < 3
    assert "y\ny" not in info.value.message


def test_exactly_the_limit_is_accepted(tmp_path, binding, context) -> None:
    helper = script(tmp_path, "hundred", "printf '%0100d' 0\n")
    assert provider_with({"h": helper}, max_output_bytes=100).resolve(binding("command", "h"), context).value == "0" * 100


def test_a_failing_command_never_shows_its_output(tmp_path, binding, context, secret, no_secret_in) -> None:
    helper = script(tmp_path, "fail", f"echo '{secret}'\necho 'error: bad token {secret}' >&2\nexit 3\n")
    with pytest.raises(SchedulerError) as info:
        provider_with({"fail": helper}).resolve(binding("command", "fail"), context)
    err = info.value
    assert err.code == "CREDENTIAL_COMMAND_FAILED" and "status 3" in err.message and not err.retryable
    assert err.details["exit_code"] == 3 and err.details["stderr_bytes"] > len(secret)
    no_secret_in(err, secret)


def test_a_program_that_cannot_start(tmp_path, binding, context) -> None:
    with pytest.raises(SchedulerError) as info:
        provider_with({"gone": str(tmp_path / "no-such-program")}).resolve(binding("command", "gone"), context)
    assert info.value.code == "CREDENTIAL_COMMAND_FAILED" and "could not be started" in info.value.message


def test_empty_output(binding, context) -> None:
    with pytest.raises(SchedulerError) as info:
        provider_with({"t": "/bin/true"}).resolve(binding("command", "t"), context)
    assert info.value.code == "CREDENTIAL_EMPTY"


def test_a_child_left_holding_the_pipe_does_not_hold_the_credential(tmp_path, binding, context) -> None:
    pidfile = tmp_path / "bg.pid"
    helper = script(tmp_path, "bg", f"printf tok\nsleep 30 &\necho $! > {pidfile}\n")
    t0 = time.monotonic()
    assert provider_with({"bg": helper}, timeout_s=10).resolve(binding("command", "bg"), context).value == "tok"
    assert time.monotonic() - t0 < 3
    assert not alive(int(pidfile.read_text()))


@pytest.mark.parametrize(("commands", "fragment"), [
    ({"rel": "echo hi"}, "absolute path"),
    ({"Bad Name": "/bin/echo"}, "command name"),
    ({"empty": ""}, "is empty"),
    ({"quote": "/bin/echo 'unterminated"}, "cannot be split"),
])
def test_bad_commands_are_settings_errors(commands, fragment, load) -> None:
    with pytest.raises(SchedulerError) as info:
        load("command", commands=commands)
    assert info.value.code == "CONFIG_INVALID" and fragment in info.value.message
    assert "providers.command.commands" in info.value.message


def test_concurrent_resolves(tmp_path, binding, context) -> None:
    helper = script(tmp_path, "who", 'printf "%s" "$SCHEDULER_CREDENTIAL_NAME"\n')
    provider = provider_with({"who": helper})
    results: dict[int, str] = {}

    def one(i: int) -> None:
        results[i] = provider.resolve(binding("command", "who", name=f"n{i}"), context).value

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"n{i}" for i in range(8)}
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_zombie_child(int(p))]


def _is_zombie_child(pid: int) -> bool:
    """A zombie whose parent is this test process (a child that was never reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] == "Z" and int(fields[1]) == os.getpid()
