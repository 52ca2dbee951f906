"""Test-only executor driven by a tiny step script in the job payload (see README)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

from scheduler_toolkit.output import StreamCapture
from scheduler_toolkit.process import kill_group, orphan_group_safe_to_kill, process_identity

from scheduler.api import (
    ExecutionRequest,
    ExecutionResult,
    RecoveryOutcome,
    RecoveryRequest,
    RunControl,
    SchedulerError,
)


def _capture(text: str) -> StreamCapture:
    import hashlib

    data = text.encode()
    return StreamCapture(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), excerpt=text)


class TestkitExecutor:
    """Runs the step script in ``payload_message``."""

    plugin_api = 3
    capabilities = frozenset({"cancel", "timeout", "process-group", "recover"})

    def recover(self, request: RecoveryRequest) -> RecoveryOutcome:
        """Kill a ``spawn`` step's process group left behind by a dead dispatcher (same host, same identity)."""
        handle = request.handle or {}
        pid, pgid = handle.get("pid"), handle.get("pgid")
        if not isinstance(pid, int) or not isinstance(pgid, int):
            return RecoveryOutcome(state="gone")
        if handle.get("host") != socket.gethostname():
            return RecoveryOutcome(state="unknown")
        if not orphan_group_safe_to_kill(pid, pgid, handle.get("start_time")):
            return RecoveryOutcome(state="gone")
        try:
            return RecoveryOutcome(state="terminated", detail=kill_group(pgid, request.kill_grace_s))
        except (PermissionError, SchedulerError) as exc:
            return RecoveryOutcome(state="blocked", detail=str(exc))

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        out: list[str] = []

        keep: dict[str, object] | None = None

        def result(status: str, **kw: object) -> ExecutionResult:
            text = "\n".join(out)
            return ExecutionResult(status=status, stdout=_capture(text), summary=text, state=keep, **kw)  # type: ignore[arg-type]

        for step in (s.strip() for s in request.job.payload_message.split(";")):
            name, _, arg = step.partition(":")
            if name == "ok" or not name:
                continue
            if name == "echo":
                out.append(arg)
            elif name == "keep":  # keep:KEY=VALUE adds to the state handed to the job's next run
                key, _, value = arg.partition("=")
                keep = {**dict(request.state or {}), **(keep or {}), key: value}
            elif name == "show-state":
                out.append(json.dumps(dict(request.state) if request.state is not None else None, sort_keys=True))
            elif name == "show-trigger":
                t = request.trigger
                out.append(json.dumps(None if t is None else {"kind": t.dispatch_kind, "attempt": t.attempt, "source": t.source_run_id,
                                                              "status": t.source_status, "output": t.source_output}, sort_keys=True))
            elif name == "fail":
                return result("error", error_code=arg or "TESTKIT_FAIL", error_message="testkit failure", exit_code=1)
            elif name == "flaky":
                if request.attempt < int(arg):
                    return result("error", error_code="TESTKIT_FLAKY", error_message=f"attempt {request.attempt} < {arg}")
            elif name == "crash":
                raise RuntimeError("testkit crash")
            elif name == "touch":
                with open(arg, "a") as fh:
                    fh.write(f"{request.run_id} {request.attempt}\n")
            elif name == "ignore-cancel":
                time.sleep(float(arg))
            elif name == "spawn-ignore":  # start a process group, record it, then ignore cancellation and deadline
                proc = subprocess.Popen(["sleep", arg], start_new_session=True)
                control.record_handle({"pid": proc.pid, "pgid": os.getpgid(proc.pid),
                                       "start_time": process_identity(proc.pid) or "", "host": socket.gethostname()})
                proc.wait()
            elif name == "sleep":
                end = time.monotonic() + float(arg)
                while (remaining := end - time.monotonic()) > 0:
                    if time.time() * 1000 >= request.deadline_ms:
                        return result("timeout", error_code="RUN_TIMEOUT", error_message="deadline passed")
                    if control.wait_cancelled(min(remaining, 0.02)):
                        return result("cancelled", error_code="RUN_CANCELLED", error_message=control.cancel_reason())
            elif name == "spawn":
                proc = subprocess.Popen(["sleep", arg], start_new_session=True)
                control.record_handle({"pid": proc.pid, "pgid": os.getpgid(proc.pid),
                                       "start_time": process_identity(proc.pid) or "", "host": socket.gethostname()})
                while proc.poll() is None:
                    if control.wait_cancelled(0.02):
                        control.record_termination(kill_group(proc.pid, 1.0))
                        proc.wait()
                        return result("cancelled", error_code="RUN_CANCELLED", error_message=control.cancel_reason())
                if proc.returncode != 0:
                    return result("error", exit_code=proc.returncode, error_code="EXIT_NONZERO")
            else:
                return result("error", error_code="TESTKIT_BAD_STEP", error_message=f"unknown step {step!r}")
        return result("ok", exit_code=0)


class StatefulTestkitExecutor(TestkitExecutor):
    """The testkit declaring ``state``: the kernel hands it what its last ok run kept (``keep:``, ``show-state``)."""

    capabilities = TestkitExecutor.capabilities | {"state"}


__all__ = ["StatefulTestkitExecutor", "TestkitExecutor", "signal"]
