"""The ten-line executor of ``docs/plugins.md``; ``tests/test_docs.py`` keeps the two identical."""

from __future__ import annotations

import os
import subprocess

from scheduler_toolkit.output import StreamCapture, StreamRecorder
from scheduler_toolkit.timeutil import now_ms

from scheduler.api import ExecutionRequest, ExecutionResult, RunControl


def _capture(request: ExecutionRequest, name: str, data: bytes) -> StreamCapture:
    """Size and SHA-256 of the whole stream, an excerpt, and a file in the artifact store once it is large."""
    recorder = StreamRecorder(root=request.artifacts_root, directory=request.artifacts_dir, name=name)
    recorder.write(data)
    return recorder.finish()


class HelloExecutor:
    plugin_api = 3
    capabilities: frozenset[str] = frozenset()  # claims no cancel, timeout, process-group, env-policy...

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        seconds_left = (request.deadline_ms - now_ms()) / 1000
        if control.is_cancelled():  # honour a cancel that came before we started anything
            return ExecutionResult(status="cancelled", error_code="RUN_CANCELLED", error_message="cancelled before start")
        if seconds_left <= 0:
            return ExecutionResult(status="timeout", error_code="RUN_TIMEOUT", error_message="deadline passed before start")
        try:
            done = subprocess.run(["/bin/sh", "-c", request.job.payload_message], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=seconds_left,
                                  env={"PATH": os.environ.get("PATH", os.defpath), **request.extra_env})
        except subprocess.TimeoutExpired:
            return ExecutionResult(status="timeout", error_code="RUN_TIMEOUT", error_message="deadline passed")
        except OSError as exc:
            return ExecutionResult(status="error", error_code="HELLO_SPAWN_FAILED", error_message=str(exc))
        out, err = _capture(request, "stdout", done.stdout), _capture(request, "stderr", done.stderr)
        status, code = ("ok", None) if done.returncode == 0 else ("error", "EXIT_NONZERO")
        return ExecutionResult(status=status, exit_code=done.returncode, error_code=code, stdout=out, stderr=err,
                               summary=out.excerpt)
