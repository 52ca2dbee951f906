"""Deliberately broken executors for testing the conformance runner (never use them for real work)."""

from __future__ import annotations

import hashlib
from typing import Any

#: Every capability the v1 executor cases ask for: the broken executor claims them all.
ALL_CAPABILITIES = frozenset({"structured-output", "verify", "env-policy", "cancel", "timeout", "process-group"})


class BrokenExecutor:
    """Claims everything, does nothing: status ``ok`` for every job, with made-up output metadata."""

    plugin_api = 1
    capabilities = ALL_CAPABILITIES

    def execute(self, request: Any, control: Any) -> Any:
        """Pretend the command ran: echo the command text as its output with a wrong size and digest."""
        from scheduler.execution import ExecutionResult, StreamCapture

        text = request.job.payload_message
        stdout = StreamCapture(
            bytes=len(text) + 1,  # wrong: the size of the command, not of its output
            sha256=hashlib.sha256(b"").hexdigest(),  # wrong: always the empty digest
            excerpt=text,
        )
        stderr = StreamCapture(bytes=0, sha256=hashlib.sha256(b"").hexdigest(), excerpt="")
        structured = None
        if request.job.output_format != "text":
            structured = {"format": request.job.output_format, "valid": True, "parsed": None}
        verification = {"status": "passed"} if request.job.verify_shell else None
        return ExecutionResult(
            status="ok",
            exit_code=0,
            stdout=stdout,
            stderr=stderr,
            structured=structured,
            verification=verification,
            summary=text,
        )


class FutureApiExecutor(BrokenExecutor):
    """Written for a plugin API major the kernel does not provide."""

    plugin_api = 99
