"""The gate inside bash (BASH_ENV on a private pipe) behaves as ``bash -c`` did: nothing of the gate leaks into the command."""

from __future__ import annotations

import os
import time
from pathlib import Path

from scheduler_executor_shell.runner import run_process

from scheduler.testing import LocalRunControl


class _Collect:
    """A sink that keeps the bytes (the tests read what the command printed)."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, chunk: bytes) -> bool:
        self.data += chunk
        return True


def _run(payload: str, *, shell: str = "/bin/bash", env: dict[str, str] | None = None, stdin: bytes | None = None):
    out, err = _Collect(), _Collect()
    outcome = run_process(shell=shell, payload=payload, cwd=None, env=env or {"PATH": os.environ["PATH"]}, stdin_data=stdin,
                          outputs={"stdout": out, "stderr": err}, deadline=time.monotonic() + 30, control=LocalRunControl(),
                          grace_s=1.0, label="command")
    return outcome, out.data.decode(), err.data.decode()


def test_bash_command_sees_no_trace_of_the_gate() -> None:
    outcome, out, err = _run('echo "0=$0 env=${BASH_ENV-unset} args=$#"; ls /proc/self/fd | sort -n | tr "\\n" " "')
    assert outcome.reason == "exited" and outcome.returncode == 0, (outcome, err)
    first, fds = out.splitlines()
    assert first == "0=/bin/bash env=unset args=0"
    assert fds.split() == ["0", "1", "2", "3"]  # stdin, stdout, stderr and ls's own directory fd: no gate pipe left open
    assert err == ""


def test_bash_stdin_text_arrives_whole_after_the_go_ahead_line() -> None:
    text = b"first line\nsecond\n" + b"x" * 200_000
    outcome, out, _err = _run("wc -c; true", stdin=text)
    assert outcome.returncode == 0 and int(out.strip()) == len(text)
    outcome, out, _err = _run("cat; echo end")  # no stdin text: /dev/null, never the gate's pipe
    assert (outcome.returncode, out) == (0, "end\n")


def test_bash_exit_status_and_signals_are_the_commands_own() -> None:
    outcome, _out, _err = _run("exit 7")
    assert outcome.returncode == 7
    outcome, _out, _err = _run("kill -9 $$")
    assert outcome.returncode == -9
    # bash execs a last simple command (as `bash -c` does): a process killing itself is seen killed, not "exit 137"
    outcome, _out, _err = _run("sh -c 'kill -9 $$'")
    assert outcome.returncode == -9


def test_a_users_bash_env_is_still_honoured(tmp_path: Path) -> None:
    """With BASH_ENV in the job's environment the gate runs in /bin/sh and the command's bash sources the user's file."""
    rc = tmp_path / "rc.bash"
    rc.write_text("GREETING=from-user-bash-env\n")
    outcome, out, err = _run('echo "$GREETING"', env={"PATH": os.environ["PATH"], "BASH_ENV": str(rc)})
    assert (outcome.returncode, out, err) == (0, "from-user-bash-env\n", "")


def test_other_shells_use_the_sh_gate(tmp_path: Path) -> None:
    alias = tmp_path / "mysh"
    alias.symlink_to("/bin/bash")
    outcome, out, _err = _run('echo "$0 ${BASH_ENV-unset}"', shell=str(alias))
    assert (outcome.returncode, out) == (0, f"{alias} unset\n")


def _silent_gate(monkeypatch, tmp_path: Path) -> Path:
    """Fault injection: a bash gate that blocks without reporting in (as if BASH_ENV had not been read)."""
    import scheduler_executor_shell.runner as runner

    real = runner._bash_gate

    def silent(shell, payload, mode, env, cgroup_procs=None):
        ready_r, fds, argv = real(shell, payload, mode, env, cgroup_procs)
        script_r, _ready_w = fds
        os.read(script_r, 4096)  # swallow the real gate script ...
        quiet_r, quiet_w = os.pipe()
        os.write(quiet_w, b"IFS= read -r _ || exit 125\n")  # ... and source one that never writes the ready byte
        os.close(quiet_w)
        os.dup2(quiet_r, script_r)
        os.close(quiet_r)
        return ready_r, fds, argv

    monkeypatch.setattr(runner, "_bash_gate", silent)
    return tmp_path / "payload-ran"


def test_a_gate_that_never_reports_in_fails_the_spawn_and_the_payload_never_runs(monkeypatch, tmp_path: Path) -> None:
    import scheduler_executor_shell.runner as runner

    marker = _silent_gate(monkeypatch, tmp_path)
    monkeypatch.setattr(runner, "GATE_READY_S", 0.3)
    outcome, _out, _err = _run(f"touch {marker}")
    assert outcome.reason == "spawn_failed" and outcome.error is not None and outcome.error.code == "SHELL_SPAWN_FAILED"
    assert outcome.termination in ("SIGTERM", "SIGKILL")
    time.sleep(0.1)
    assert not marker.exists()


def test_the_deadline_passing_while_waiting_for_the_gate_is_a_timeout(monkeypatch, tmp_path: Path) -> None:
    marker = _silent_gate(monkeypatch, tmp_path)
    out, err = _Collect(), _Collect()
    outcome = run_process(shell="/bin/bash", payload=f"touch {marker}", cwd=None, env={"PATH": os.environ["PATH"]},
                          stdin_data=None, outputs={"stdout": out, "stderr": err}, deadline=time.monotonic() + 0.3,
                          control=LocalRunControl(), grace_s=1.0, label="command")
    assert outcome.reason == "timeout" and outcome.error is None
    time.sleep(0.1)
    assert not marker.exists()
