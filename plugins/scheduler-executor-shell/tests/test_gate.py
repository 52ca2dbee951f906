"""The gate inside bash (BASH_ENV on a private pipe) behaves as ``bash -c`` did: nothing of the gate leaks into the command."""

from __future__ import annotations

import os
import time
from pathlib import Path

from scheduler.testing import LocalRunControl
from scheduler_executor_shell.runner import run_process


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
