"""Deliberately broken executors for testing the conformance runner (never use them for real work)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

#: Every capability the v2 executor cases ask for: the broken executor claims them all.
ALL_CAPABILITIES = frozenset(
    {"structured-output", "verify", "env-policy", "cancel", "timeout", "process-group", "stdin", "output-capture"}
)


class BrokenExecutor:
    """Claims everything, does nothing: status ``ok`` for every job, with made-up output metadata."""

    plugin_api = 3
    capabilities = ALL_CAPABILITIES
    #: Its own payload adapter accepts the shell-only cases too, so they run (and fail) as well.
    languages = frozenset({"posix-shell"})

    def conformance_payload(self, behaviour: Any) -> dict[str, Any]:
        """Its own payload adapter: every behaviour "expressed" as the JSON of its steps (never declined)."""
        if behaviour.raw is not None:
            return {"payload_message": behaviour.raw.text}
        return {"payload_message": json.dumps([[s.action, s.value] for s in behaviour.steps])}

    def execute(self, request: Any, control: Any) -> Any:
        """Pretend the payload ran: echo its text as the output with a wrong size and digest; record nothing."""
        from scheduler_toolkit.output import StreamCapture

        from scheduler.api import ExecutionResult

        text = request.job.payload_message
        stdout = StreamCapture(
            bytes=len(text) + 1,  # wrong: the size of the payload, not of its output
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


class ApiTwoExecutor(BrokenExecutor):
    """Written for plugin API 2, before the contract moved (what a provider not yet ported declares)."""

    plugin_api = 2
