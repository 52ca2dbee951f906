"""``MainSessionExecutor``: deliver a job's payload to the agent's main session (``session_target: main``).

Two modes (``executor_options.mode``, default ``[executors.main-session] default_mode``):

* ``reply``: one chat-completions request with the main session key
  (``x-openclaw-session-key: agent:<agent_id>:main``), waiting for the whole reply; its text
  is the run's stdout (through ``StreamRecorder``), reasoning text its stderr, token usage
  recorded. Cancellation and the deadline shut the request's socket at once.
* ``event``: ``openclaw system event --text ... --mode now|queue --json``, fire-and-forget;
  the command's JSON answer is the run's stdout. Cancellation and the deadline kill its
  process group at once.

Credentials are refused for this target: a request carrying any ends ``error`` /
``MAIN_SESSION_CREDENTIALS_REFUSED`` before anything is sent (the main session is shared
with the user; a credential put there would outlive the run).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

from scheduler_toolkit.output import DEFAULT_EXCERPT_BYTES, DEFAULT_OFFLOAD_BYTES, StreamCapture
from scheduler_toolkit.structured import structured_from_capture
from scheduler_toolkit.timeutil import now_ms

from scheduler.api import (
    ExecutionRequest,
    ExecutionResult,
    RecoveryOutcome,
    RecoveryRequest,
    RunControl,
    SchedulerError,
)
from scheduler_executor_main_session import chat, event
from scheduler_executor_main_session.options import MainSessionOptions
from scheduler_executor_main_session.prompt import assemble
from scheduler_executor_main_session.settings import MainSessionSettings, chat_endpoint, resolve_settings


def main_session_key(agent_id: str) -> str:
    return f"agent:{agent_id}:main"


def _capture(request: ExecutionRequest, name: str, data: bytes) -> StreamCapture:
    recorder = request.stream_recorder(name, excerpt_bytes=DEFAULT_EXCERPT_BYTES, offload_bytes=DEFAULT_OFFLOAD_BYTES)
    try:
        recorder.write(data)
        return recorder.finish()
    except OSError as exc:
        raise SchedulerError("OUTPUT_CAPTURE_FAILED", f"recording {name} failed ({exc.strerror or exc})") from None


def _head(request: ExecutionRequest, data: bytes) -> bytes:
    """What structured parsing reads in memory: the whole (redacted) stream while it is small (else it reads the
    artifact). Credentials are refused before a turn, so there is nothing to redact today; the rule holds anyway."""
    if request.redactions is not None:
        data = request.redactions.redact(data)[0]
    return data if len(data) <= DEFAULT_OFFLOAD_BYTES else b""


class MainSessionExecutor:
    """Executor driver ``main-session`` (the default for ``session_target: main``)."""

    plugin_api = 3
    #: Both modes: the deadline and cancellation stop the work at once, output goes through StreamRecorder,
    #: output_format applies to stdout; ``main-session-turn`` is informational (the work is a main-session delivery,
    #: with no exit status in reply mode; this distribution's own conformance cases require it). Not claimed: ``process-group`` (reply mode has no process; event mode
    #: does run its command in a recorded group, see the README), ``recover`` (a reply turn cannot be stopped
    #: after a crash), ``stdin``, ``env-policy``, ``verify``, the ``credentials-*`` media (refused) and every cap.
    capabilities = frozenset({"timeout", "cancel", "output-capture", "structured-output", "main-session-turn"})
    options_class = MainSessionOptions
    settings_class = MainSessionSettings

    def configure(self, settings: MainSessionSettings) -> None:
        """The loader validated the table once; each run reads it again, so a change applies to the next run."""

    # -- recovery --------------------------------------------------------------------------------

    def recover(self, request: RecoveryRequest) -> RecoveryOutcome:
        """Event mode: kill what is left of the recorded command group. Reply mode: say honestly what is known."""
        from scheduler_toolkit.process import kill_group, orphan_group_safe_to_kill, same_process

        handle = request.handle or {}
        kind = handle.get("kind")
        host = handle.get("host") or request.owner_host
        if kind not in ("main-session-event", "main-session-reply"):
            return RecoveryOutcome(state="gone")
        if host != socket.gethostname():
            return RecoveryOutcome(state="unknown", detail=f"the run was on host {host}; it cannot be checked from here")
        if kind == "main-session-event":
            pid, pgid = handle.get("pid"), handle.get("pgid")
            if not isinstance(pid, int) or not isinstance(pgid, int):
                return RecoveryOutcome(state="unknown", detail="the recorded handle has no process group")
            safe = orphan_group_safe_to_kill(pid, pgid, handle.get("start_time"))
            if safe is None:
                return RecoveryOutcome(state="unknown", detail=f"pid {pid} now belongs to another process; not signalled")
            if not safe:
                return RecoveryOutcome(state="gone")
            try:
                return RecoveryOutcome(state="terminated", detail=kill_group(pgid, request.kill_grace_s))
            except SchedulerError as exc:
                return RecoveryOutcome(state="blocked", detail=exc.message)
        pid, identity = handle.get("pid"), handle.get("process_identity")
        if isinstance(pid, int) and pid != os.getpid() and same_process(pid, identity):
            return RecoveryOutcome(state="blocked", detail=f"dispatcher process {pid} still holds the request's connection")
        return RecoveryOutcome(state="unknown", detail="the request's connection closed with its dispatcher; whether the "
                               "main session finished the turn cannot be checked")

    # -- a run -----------------------------------------------------------------------------------

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        options = request.options if isinstance(request.options, MainSessionOptions) else MainSessionOptions()
        details: dict[str, Any] = {"agent_id": options.agent_id, "session_key": main_session_key(options.agent_id)}
        if request.credentials:
            return ExecutionResult(
                status="error", error_code="MAIN_SESSION_CREDENTIALS_REFUSED",
                error_message="credentials are refused for the main session (it is shared and outlives the run); "
                              "nothing was sent. Use an isolated agent job or a shell job for credentialed work.",
                details={**details, "credentials": sorted(c.name for c in request.credentials)})
        if control.is_cancelled():
            reason = control.cancel_reason() or "unspecified"
            return ExecutionResult(status="cancelled", error_code="RUN_CANCELLED",
                                   error_message=f"cancelled before anything was sent ({reason})", details=details)
        if request.deadline_ms <= now_ms():
            return ExecutionResult(status="timeout", error_code="RUN_TIMEOUT",
                                   error_message="the run deadline passed before anything was sent", details=details)
        try:
            settings = resolve_settings()
            mode = options.mode or settings.default_mode
            details["mode"] = mode
            if request.job.verify_shell:
                raise SchedulerError("MAIN_SESSION_VERIFY_UNSUPPORTED", "verify_shell is not run by the main-session "
                                     "executor; check the result in a chained shell job")
            text = assemble(request)
            details.update(text.details)
            if mode == "event":
                return self._event(request, control, options, settings, text.text, details)
            return self._reply(request, control, options, settings, text.text, details)
        except SchedulerError as exc:
            extra = exc.details if isinstance(exc.details, dict) else {}
            return ExecutionResult(status="error", error_code=exc.code, error_message=exc.message,
                                   details={**details, **extra})

    def _deadline(self, request: ExecutionRequest) -> float:
        return time.monotonic() + (request.deadline_ms - now_ms()) / 1000

    def _reply(self, request: ExecutionRequest, control: RunControl, options: MainSessionOptions,
               settings: MainSessionSettings, text: str, details: dict[str, Any]) -> ExecutionResult:
        endpoint = chat_endpoint(settings, os.environ)
        model = options.model or endpoint.model
        if not model:
            raise SchedulerError("MAIN_SESSION_MODEL_UNSET", "no model: set executor_options.model, "
                                 "[executors.main-session] model or SCHEDULER_AGENT_MODEL")
        api_key = endpoint.resolve_key(os.environ)
        request_id = str(uuid.uuid4())
        headers = {"accept": "application/json", "x-request-id": request_id,
                   "x-openclaw-session-key": details["session_key"], "x-openclaw-agent-id": options.agent_id,
                   "x-scheduler-run-id": request.run_id, "x-scheduler-job-id": request.job_id,
                   "x-scheduler-attempt": str(request.attempt)}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": False}
        details["model"] = model
        if control.is_cancelled():
            return ExecutionResult(status="cancelled", error_code="RUN_CANCELLED",
                                   error_message="cancelled before anything was sent", details=details)
        from scheduler_toolkit.process import process_identity

        control.record_handle({"kind": "main-session-reply", "request_id": request_id, "session_key": details["session_key"],
                               "model": model, "host": socket.gethostname(), "pid": os.getpid(),
                               "process_identity": process_identity(os.getpid())})  # fenced: raising sends nothing
        reply = chat.send(url=endpoint.chat_url, headers=headers, body=body, deadline=self._deadline(request),
                          connect_timeout_s=settings.connect_timeout_s, max_bytes=settings.max_reply_bytes,
                          is_cancelled=control.is_cancelled, secrets_to_hide=(api_key or "",))
        if reply.http_status is not None:
            details["http_status"] = reply.http_status
        if reply.aborted:
            how = {"cancelled": "aborted: cancelled", "timeout": "aborted: deadline"}.get(reply.reason,
                                                                                           f"aborted: {reply.reason}")
            control.record_termination(how)
            details["termination"] = how
        stdout = _capture(request, "stdout", reply.content.encode("utf-8"))
        stderr = _capture(request, "stderr", reply.reasoning.encode("utf-8"))
        usage: dict[str, Any] = {"model": model, "prompt_tokens": reply.prompt_tokens,
                                 "completion_tokens": reply.completion_tokens}
        if reply.prompt_tokens is not None and reply.completion_tokens is not None:
            usage["total_tokens"] = reply.prompt_tokens + reply.completion_tokens
        status = {"done": "ok", "cancelled": "cancelled", "timeout": "timeout"}.get(reply.reason, "error")
        message = reply.error_message
        if status == "cancelled":
            details["cancel_reason"] = control.cancel_reason() or "unspecified"
            message = f"{message} ({details['cancel_reason']})"
        if reply.finish_reason:
            details["finish_reason"] = reply.finish_reason
        structured = structured_from_capture(request.job.output_format, stdout, root=request.artifacts_root,
                                             head=_head(request, reply.content.encode("utf-8")))
        return ExecutionResult(status=status, error_code=reply.error_code, error_message=message, stdout=stdout,
                               stderr=stderr, structured=structured, summary=stdout.excerpt, usage=usage, details=details)

    def _event(self, request: ExecutionRequest, control: RunControl, options: MainSessionOptions,
               settings: MainSessionSettings, text: str, details: dict[str, Any]) -> ExecutionResult:
        if options.agent_id != "main":
            raise SchedulerError("MAIN_SESSION_EVENT_AGENT_UNSUPPORTED", "`openclaw system event` reaches the main "
                                 f"agent only; agent_id {options.agent_id!r} needs mode reply")
        if options.model:
            raise SchedulerError("MAIN_SESSION_EVENT_MODEL_UNSUPPORTED", "a system event names no model; remove "
                                 "executor_options.model or use mode reply")
        command = event.find_command(settings.openclaw_path)
        details.update(event_mode=options.event_mode, command=os.path.basename(command))
        if control.is_cancelled():
            return ExecutionResult(status="cancelled", error_code="RUN_CANCELLED",
                                   error_message="cancelled before anything was sent", details=details)
        out = event.run(event.argv_for(command, text, options.event_mode), timeout_s=settings.event_timeout_s,
                        deadline=self._deadline(request), max_bytes=settings.event_max_output_bytes,
                        kill_grace_s=settings.kill_grace_s, record_handle=control.record_handle,
                        is_cancelled=control.is_cancelled, extra_env=dict(request.extra_env))
        if out.termination:
            control.record_termination(out.termination)
            details["termination"] = out.termination
        stdout, stderr = _capture(request, "stdout", out.stdout), _capture(request, "stderr", out.stderr)
        status = {"done": "ok", "cancelled": "cancelled", "timeout": "timeout"}.get(out.reason, "error")
        message = out.error_message
        if status == "cancelled":
            details["cancel_reason"] = control.cancel_reason() or "unspecified"
            message = f"{message} ({details['cancel_reason']})"
        if out.answer is not None:
            details["answer_keys"] = sorted(out.answer)[:20]
        structured = structured_from_capture(request.job.output_format, stdout, root=request.artifacts_root,
                                             head=_head(request, out.stdout))
        return ExecutionResult(status=status, exit_code=out.exit_code, error_code=out.error_code, error_message=message,
                               stdout=stdout, stderr=stderr, structured=structured, summary=stdout.excerpt,
                               details=details)
