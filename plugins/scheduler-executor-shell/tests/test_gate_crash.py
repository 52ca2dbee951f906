"""The gate: a dispatcher killed (SIGKILL) while its spawn waits for the handle's commit never lets the payload run.

A real process stands in for the dispatcher: it spawns a command through ``run_process``
and, inside ``record_handle`` (where the real dispatcher waits for the grouped commit),
writes the handle to a file and SIGKILLs itself. The gated command lives in its own
session, so it survives its parent; it must see EOF on the go-ahead pipe and exit 125
without running the payload, which would create a marker file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from scheduler_toolkit.process import group_alive

_DISPATCHER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from scheduler.testing import LocalRunControl
    from scheduler_executor_shell.capture import HashSink
    from scheduler_executor_shell.runner import run_process

    handle_file, marker, shell = sys.argv[1], sys.argv[2], sys.argv[3]

    class Dying(LocalRunControl):
        def record_handle(self, handle):
            with open(handle_file, "w") as fh:
                json.dump(handle, fh)
            os.kill(os.getpid(), signal.SIGKILL)  # dies before the commit could be acknowledged

    run_process(shell=shell, payload=f"touch {marker}", cwd=None, env={"PATH": os.environ["PATH"]},
                stdin_data=None, outputs={"stdout": HashSink(), "stderr": HashSink()},
                deadline=time.monotonic() + 30, control=Dying(), grace_s=1.0, label="command")
    """
)


@pytest.mark.parametrize("gate", ["bash", "sh"])
def test_dispatcher_killed_before_the_handle_commit_never_runs_the_payload(tmp_path: Path, gate: str) -> None:
    """Both gates: inside bash (BASH_ENV) and /bin/sh exec'ing another shell (a bash under another name here)."""
    shell = "/bin/bash"
    if gate == "sh":
        shell = str(tmp_path / "othershell")
        Path(shell).symlink_to("/bin/bash")
    handle_file, marker = tmp_path / "handle.json", tmp_path / "payload-ran"
    proc = subprocess.run([sys.executable, "-c", _DISPATCHER, str(handle_file), str(marker), shell], timeout=60)
    assert proc.returncode == -9
    handle = json.loads(handle_file.read_text())
    assert handle["pgid"] == handle["pid"] and handle["step"] == "command"
    deadline = time.monotonic() + 10
    while group_alive(handle["pgid"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not group_alive(handle["pgid"]), "the gated command outlived its dispatcher"
    time.sleep(0.2)
    assert not marker.exists(), "the payload ran although its handle was never acknowledged"
