"""``AgentExecutor``: one agent turn per run over an OpenAI-compatible ``POST {base_url}/chat/completions``.

What it enforces: the run deadline, an idle-stream timeout, cancellation (the HTTP request
is shut down at once and the abort recorded), the output cap, ``constraints.max_tokens``
and ``constraints.max_cost`` (the stream is stopped when its running count passes the
cap, and the exact usage the endpoint reports is checked again at the end), the prompt
rules (sanitising, injection patterns for ``user_added``/``external`` jobs, heartbeat files
confined to the workspace) and ``output_format`` on the reply. What it does not do: run
processes, filter environments, sandbox anything, or stop a remote turn after a crash of
the dispatcher that started it (``recover`` says so honestly).

The reply's text goes to stdout and reasoning text (``reasoning_content``) to stderr,
both through the kernel's ``StreamRecorder`` as they arrive, so large replies are
offloaded and digested exactly like shell output.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

from scheduler_toolkit.output import DEFAULT_EXCERPT_BYTES, DEFAULT_OFFLOAD_BYTES, StreamCapture, StreamRecorder
from scheduler_toolkit.structured import structured_from_capture, unparsed_record
from scheduler_toolkit.timeutil import now_ms

from scheduler.api import (
    ExecutionRequest,
    ExecutionResult,
    RecoveryOutcome,
    RecoveryRequest,
    RunControl,
    SchedulerError,
)
from scheduler_executor_agent import prompt as prompts
from scheduler_executor_agent import sessions
from scheduler_executor_agent.gateway import ENV_INJECT_CAPABILITY, CapabilityCache, Discovery
from scheduler_executor_agent.options import AgentOptions
from scheduler_executor_agent.settings import (
    AgentSettings,
    Endpoint,
    price_of,
    resolve_endpoint,
    resolve_settings,
)

#: Longest discovery request (it never holds a turn up for long; failures mean "no capabilities").
DISCOVERY_TIMEOUT_S = 3.0


class RecorderSink:
    """A ``StreamRecorder`` and the head of the stream as recorded (redacted) while it is small (structured
    output needs bytes)."""

    def __init__(self, recorder: StreamRecorder, keep_bytes: int) -> None:
        self.recorder = recorder
        self._keep = keep_bytes
        self.error: OSError | None = None

    def write(self, data: bytes) -> bool:
        try:
            return self.recorder.write(data)
        except OSError as exc:  # the artifact disk: reported as OUTPUT_CAPTURE_FAILED, never silent
            self.error = exc
            return False

    @property
    def head(self) -> bytes:
        head = self.recorder.head
        return head if len(head) <= self._keep else b""

    def finish(self) -> StreamCapture:
        return self.recorder.finish()


def _result(status: str, code: str | None, message: str | None, details: dict[str, Any], **fields: Any) -> ExecutionResult:
    return ExecutionResult(status=status, error_code=code, error_message=message, details=details, **fields)


def _cancelled(control: RunControl, details: dict[str, Any], when: str) -> ExecutionResult:
    reason = control.cancel_reason() or "unspecified"
    return _result("cancelled", "RUN_CANCELLED", f"cancelled {when} ({reason})", {**details, "cancel_reason": reason})


class AgentExecutor:
    """Executor driver ``agent`` (the default for ``session_target: isolated``)."""

    plugin_api = 3
    #: ``agent-turn`` is informational (not in KNOWN_CAPABILITIES): the work is one chat-completions turn, with no
    #: process and no exit status; the agent's own conformance cases require it, so no other executor runs them.
    #: ``credentials-env`` is enforced at run time: the values go to the gateway only in ``x-openclaw-env-inject``,
    #: and only when it (re-)declares ``chat-completions-env-inject-v1``; otherwise the run ends
    #: ``GATEWAY_ENV_INJECT_UNSUPPORTED`` and nothing is sent. ``file`` and ``stdin`` are not claimed.
    capabilities = frozenset({"timeout", "cancel", "output-capture", "structured-output", "token-cap", "cost-cap", "agent-turn",
                              "state", "credentials-env"})
    options_class = AgentOptions
    settings_class = AgentSettings

    def __init__(self, *, environ: Mapping[str, str] | None = None) -> None:
        """``environ`` stands for the dispatcher's environment; default: ``os.environ`` read at each run."""
        self._environ = environ
        self.gateways = CapabilityCache()

    def configure(self, settings: AgentSettings) -> None:
        """The loader validated ``[executors.agent]`` once; each run reads it again, so a change applies to the next run."""

    # -- at add ----------------------------------------------------------------------------------

    def check_job(self, options: AgentOptions | None, spec: Any) -> list[dict[str, str]]:
        """What would fail every run of this job, judged with this host's ``[executors.agent]`` when the job is added.

        A ``heartbeat_file`` that resolves outside the workspace (a symlink out of it:
        ``HEARTBEAT_PATH_REFUSED``), ``thinking`` on an endpoint whose ``thinking_mapping`` is ``refuse``
        (``AGENT_THINKING_UNSUPPORTED``), and ``constraints.max_cost`` for a model with no configured
        price (``AGENT_PRICE_UNKNOWN``). What cannot be judged yet (no workspace, no endpoint
        configured on this host, a heartbeat file not created yet) is left to the run, which
        checks everything again.
        """
        options = options if isinstance(options, AgentOptions) else AgentOptions()
        settings = resolve_settings(None)
        problems: list[dict[str, str]] = []
        if options.heartbeat_file:
            problem = prompts.heartbeat_outside(settings.workspace, options.heartbeat_file)
            if problem:
                problems.append({"field": "executor_options.heartbeat_file", "code": "HEARTBEAT_PATH_REFUSED", "error": problem})
        if options.thinking and settings.thinking_mapping.get(options.endpoint or settings.default_endpoint) == "refuse":
            problems.append({"field": "executor_options.thinking", "code": "AGENT_THINKING_UNSUPPORTED",
                             "error": _thinking_refused(options.thinking, options.endpoint or settings.default_endpoint)})
        constraints = getattr(spec, "constraints", None) or {}
        if isinstance(constraints, dict) and constraints.get("max_cost") is not None:
            endpoint_name = options.endpoint or settings.default_endpoint
            model = options.model
            if not model:
                try:
                    endpoint = resolve_endpoint(settings, options.endpoint, dict(os.environ))
                except SchedulerError:
                    endpoint = None  # not configured here (yet): the run says so
                endpoint_name, model = (endpoint.name, endpoint.model) if endpoint is not None else (endpoint_name, None)
            if model and price_of(settings, endpoint_name, model) is None:
                problems.append({"field": "constraints.max_cost", "code": "AGENT_PRICE_UNKNOWN",
                                 "error": f"max_cost needs a price for model {model!r} ([executors.agent] prices); every run"
                                          " would fail with AGENT_PRICE_UNKNOWN"})
        return problems

    # -- recovery --------------------------------------------------------------------------------

    def recover(self, request: RecoveryRequest) -> RecoveryOutcome:
        """An agent turn cannot be resumed, and an OpenAI-compatible endpoint cannot be asked whether it stopped.

        The turn's HTTP connection belonged to the dead dispatcher process: once that process
        is gone the connection is closed, which stops generation on servers that abort on
        disconnect; a gateway may still have finished tool calls. So: ``gone`` when nothing was
        sent, ``blocked`` while the recorded process still lives (it still holds the
        connection; recovery asks again), otherwise ``unknown`` with the reason.
        """
        from scheduler_toolkit.process import same_process

        handle = request.handle or {}
        if handle.get("kind") != "agent-turn":
            return RecoveryOutcome(state="gone")
        host = handle.get("host") or request.owner_host
        if host != socket.gethostname():
            return RecoveryOutcome(state="unknown", detail=f"the turn was sent from host {host}; it cannot be checked from here")
        pid, identity = handle.get("pid"), handle.get("process_identity")
        if isinstance(pid, int) and pid != os.getpid() and same_process(pid, identity):
            return RecoveryOutcome(state="blocked", detail=f"dispatcher process {pid} still holds the turn's connection")
        return RecoveryOutcome(
            state="unknown",
            detail="the turn's connection closed with its dispatcher; whether the endpoint stopped generating cannot be checked",
        )

    # -- a run -----------------------------------------------------------------------------------

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        """Run one turn; see the module docstring."""
        options = request.options if isinstance(request.options, AgentOptions) else AgentOptions()
        environ = dict(os.environ if self._environ is None else self._environ)
        details: dict[str, Any] = {"context_mode": options.context_mode}
        if control.is_cancelled():
            return _cancelled(control, details, "before the turn started")
        if request.deadline_ms <= now_ms():
            return _result("timeout", "RUN_TIMEOUT", "the run deadline passed before the turn started", details)
        try:
            return self._execute(request, control, options, environ, details)
        except SchedulerError as exc:
            extra = exc.details if isinstance(exc.details, dict) else {}
            return _result("error", exc.code, exc.message, {**details, **extra})

    def _execute(self, request: ExecutionRequest, control: RunControl, options: AgentOptions, environ: dict[str, str],
                 details: dict[str, Any]) -> ExecutionResult:
        job = request.job
        settings = resolve_settings(environ if self._environ is not None else None)
        if job.verify_shell:
            raise SchedulerError("AGENT_VERIFY_UNSUPPORTED", "verify_shell is not run by the agent executor; remove it or"
                                 " check the result in a chained shell job")
        endpoint = resolve_endpoint(settings, options.endpoint, environ)
        model = options.model or endpoint.model
        if not model:
            raise SchedulerError("AGENT_MODEL_UNSET", f"no model: set executor_options.model or the model of endpoint "
                                 f"{endpoint.name!r}")
        key = sessions.session_key(options.agent_id, request.job_id)
        details.update(endpoint=endpoint.name, model=model, session_key=key)
        price = price_of(settings, endpoint.name, model)
        constraints = request.constraints
        if constraints.max_cost is not None and price is None:
            raise SchedulerError("AGENT_PRICE_UNKNOWN", f"max_cost needs a price for model {model!r} ([executors.agent] prices)")

        heartbeat = prompts.heartbeat_for(request, settings.workspace, options.heartbeat_file, settings.heartbeat_max_bytes)
        built = prompts.assemble(request, heartbeat=heartbeat)
        details.update(built.details)
        history: list[sessions.Message] | None = None
        if options.context_mode == "session":
            history = sessions.from_state(request.state, key)
            details.update(sessions.describe(history))

        send_thinking = self._thinking(options, settings, endpoint, control, details)
        api_key = endpoint.resolve_key(environ)
        headers = self._headers(request, options, key, api_key)
        env_inject = {c.key: c.value or "" for c in request.credentials if c.medium == "env" and c.key}
        if any(c.medium != "env" for c in request.credentials):
            raise SchedulerError("AGENT_CREDENTIAL_MEDIUM_UNSUPPORTED",
                                 "an agent turn can take credentials only as a gateway-injected environment (medium env)")
        if env_inject:  # the only turn that needs a capability, so the only one that probes the endpoint
            if settings.capability_discovery.get(endpoint.name, "auto") == "off":
                raise SchedulerError("GATEWAY_ENV_INJECT_UNSUPPORTED",
                                     f"capability discovery is off for endpoint {endpoint.name!r} ([executors.agent]"
                                     f" capability_discovery), so it cannot declare {ENV_INJECT_CAPABILITY}; the"
                                     " credentials were not sent", details={"credentials": sorted(env_inject)})
            fresh = self._discover(endpoint, headers, settings, request, need=ENV_INJECT_CAPABILITY)
            details["gateway"] = fresh.to_json()
            if ENV_INJECT_CAPABILITY not in fresh.capabilities:
                raise SchedulerError("GATEWAY_ENV_INJECT_UNSUPPORTED",
                                     f"endpoint {endpoint.name!r} does not declare {ENV_INJECT_CAPABILITY}; the credentials"
                                     " were not sent", details={"credentials": sorted(env_inject)})
            headers["x-openclaw-env-inject"] = _encode_env(env_inject)

        body = self._body(options, model, history or [], built.text, constraints, price, send_thinking=send_thinking)
        if control.is_cancelled():
            return _cancelled(control, details, "before the turn was sent")
        handle = {"kind": "agent-turn", "request_id": headers["x-request-id"], "endpoint": endpoint.name, "model": model,
                  "session_key": key, "host": socket.gethostname(), "pid": os.getpid(),
                  "process_identity": _own_identity()}
        try:
            control.record_handle(handle)  # fenced: if it fails, nothing has been sent
        except SchedulerError as exc:
            return _result("error", exc.code, exc.message, {**details, "fenced": True})
        return self._turn(request, control, settings, endpoint, model, price, headers, body, api_key, built.text,
                          history, key, details)

    def _headers(self, request: ExecutionRequest, options: AgentOptions, key: str, api_key: str | None) -> dict[str, str]:
        headers = {
            "accept": "text/event-stream" if options.stream else "application/json",
            "x-request-id": str(uuid.uuid4()),
            "x-openclaw-session-key": key,
            "x-openclaw-agent-id": options.agent_id,
            "x-scheduler-run-id": request.run_id,
            "x-scheduler-job-id": request.job_id,
            "x-scheduler-attempt": str(request.attempt),
        }
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        return headers

    def _discover(self, endpoint: Endpoint, headers: dict[str, str], settings: AgentSettings, request: ExecutionRequest,
                  *, need: str) -> Discovery:
        """What the endpoint declares, for a turn that needs capability ``need`` (``/health`` only for a gateway)."""
        remaining = (request.deadline_ms - now_ms()) / 1000
        auth = {k: v for k, v in headers.items() if k == "authorization"}
        return self.gateways.get(endpoint.base_url, headers=auth, ttl_s=settings.discovery_ttl_s,
                                 timeout_s=min(DISCOVERY_TIMEOUT_S, max(0.05, remaining / 4)), need=need,
                                 health=endpoint.name in settings.gateway_endpoints)

    @staticmethod
    def _thinking(options: AgentOptions, settings: AgentSettings, endpoint: Endpoint, control: RunControl,
                  details: dict[str, Any]) -> bool:
        """Whether ``thinking`` is sent as ``reasoning_effort`` on this endpoint (``thinking_mapping``).

        ``drop`` records a warning (run event ``agent.warning`` and ``details.warnings``) and sends nothing;
        ``refuse`` ends the run ``AGENT_THINKING_UNSUPPORTED`` before anything is sent (the job was refused at
        add if the setting was there then).
        """
        if not options.thinking:
            return False
        mapping = settings.thinking_mapping.get(endpoint.name, "send")
        if mapping == "refuse":
            raise SchedulerError("AGENT_THINKING_UNSUPPORTED", _thinking_refused(options.thinking, endpoint.name))
        if mapping == "drop":
            warning = (f"thinking {options.thinking!r} was not sent: endpoint {endpoint.name!r} drops it"
                       " ([executors.agent] thinking_mapping)")
            details.setdefault("warnings", []).append(warning)
            control.event("agent.warning", {"code": "AGENT_THINKING_DROPPED", "message": warning})
            return False
        return True

    @staticmethod
    def _body(options: AgentOptions, model: str, history: list[sessions.Message], text: str, constraints: Any,
              price: tuple[float, float] | None, *, send_thinking: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": [*history, {"role": "user", "content": text}],
                                "stream": options.stream}
        if options.stream:
            body["stream_options"] = {"include_usage": True}
        if options.thinking and send_thinking:
            body["reasoning_effort"] = options.thinking
        caps = []
        if constraints.max_tokens is not None:
            caps.append(int(constraints.max_tokens))
        if constraints.max_cost is not None and price is not None and price[1] > 0:
            caps.append(max(1, int(constraints.max_cost * 1_000_000 / price[1])))
        if caps:
            body["max_tokens"] = min(caps)
        return body

    def _turn(self, request: ExecutionRequest, control: RunControl, settings: AgentSettings, endpoint: Endpoint, model: str,
              price: tuple[float, float] | None, headers: dict[str, str], body: dict[str, Any], api_key: str | None,
              prompt_text: str, history: list[sessions.Message] | None, key: str,
              details: dict[str, Any]) -> ExecutionResult:
        """Send the turn; on ``ok`` in session mode the result's ``state`` is the conversation with this turn added
        (the kernel keeps it only when it commits the run ``ok``; any other end keeps the previous one)."""
        from scheduler_executor_agent.client import Limits, Turn

        job = request.job
        sinks = {
            name: RecorderSink(request.stream_recorder(name, excerpt_bytes=DEFAULT_EXCERPT_BYTES,  # redacts credentials
                                                       offload_bytes=DEFAULT_OFFLOAD_BYTES, cap_bytes=settings.max_output_bytes),
                               keep_bytes=DEFAULT_OFFLOAD_BYTES)
            for name in ("stdout", "stderr")
        }
        limits = Limits(
            deadline=time.monotonic() + (request.deadline_ms - now_ms()) / 1000, idle_timeout_s=settings.idle_timeout_s,
            connect_timeout_s=settings.connect_timeout_s, max_attempts=settings.max_attempts,
            max_backoff_s=settings.max_backoff_s, max_output_bytes=settings.max_output_bytes,
            token_cap=request.constraints.max_tokens, cost_cap=request.constraints.max_cost, price=price,
        )
        turn = Turn(url=endpoint.chat_url, headers=headers, body=body, limits=limits, stdout=sinks["stdout"],
                    stderr=sinks["stderr"], is_cancelled=control.is_cancelled, wait_cancelled=control.wait_cancelled,
                    on_event=control.event, secrets_to_hide=(api_key or "",),
                    keep_text_bytes=settings.session_max_bytes if history is not None else 0)
        out = turn.run()
        stdout, stderr = sinks["stdout"].finish(), sinks["stderr"].finish()
        details.update(attempts=out.attempts, streamed=out.streamed, finish_reason=out.finish_reason)
        if out.http_status is not None:
            details["http_status"] = out.http_status
        capture_error = sinks["stdout"].error or sinks["stderr"].error
        if capture_error is not None:
            out.reason, out.error_code = "capture", "OUTPUT_CAPTURE_FAILED"
            out.error_message = f"recording the reply failed ({capture_error.strerror or capture_error}); the turn was stopped"
            out.aborted = True
        if out.aborted:
            how = {"cancelled": "aborted: cancelled", "timeout": "aborted: deadline", "idle": "aborted: idle stream"}
            termination = how.get(out.reason, f"aborted: {out.reason}")
            control.record_termination(termination)
            details["termination"] = termination

        usage = self._usage(out, price, endpoint, model)
        status, code, message = "ok", None, None
        if out.reason != "done":
            status = {"cancelled": "cancelled", "timeout": "timeout", "idle": "timeout"}.get(out.reason, "error")
            code, message = out.error_code, out.error_message
            if status == "cancelled":
                reason = control.cancel_reason() or "unspecified"
                details["cancel_reason"] = reason
                message = f"{message} ({reason})"
        else:
            status, code, message = self._final_caps(out, request, price, usage)

        if stdout.limit_exceeded:
            structured = unparsed_record(job.output_format, total_bytes=stdout.bytes, sha256=stdout.sha256,
                                         artifact=stdout.artifact, warning="the reply exceeded the output limit; not parsed")
        else:
            structured = structured_from_capture(job.output_format, stdout, root=request.artifacts_root,
                                                 head=sinks["stdout"].head)
        state = None
        if status == "ok" and history is not None:
            reply = turn.text() + ("" if out.text_complete else "\n[reply truncated in the session history]")
            if request.redactions is not None:  # the kept conversation never holds a presented credential value
                reply = request.redactions.redact(reply.encode("utf-8"))[0].decode("utf-8", errors="replace")
            state = sessions.to_state(key, [*history, {"role": "user", "content": prompt_text},
                                            {"role": "assistant", "content": reply}],
                                      max_turns=settings.session_max_turns, max_bytes=settings.session_max_bytes)
            details["session_turns"] = state["turns"]
        return ExecutionResult(status=status, error_code=code, error_message=message, stdout=stdout, stderr=stderr,
                               structured=structured, summary=stdout.excerpt, usage=usage, details=details, state=state)

    @staticmethod
    def _usage(out: Any, price: tuple[float, float] | None, endpoint: Endpoint, model: str) -> dict[str, Any]:
        exact = out.prompt_tokens is not None and out.completion_tokens is not None
        completion = out.completion_tokens if out.completion_tokens is not None else out.estimated_completion
        usage: dict[str, Any] = {"endpoint": endpoint.name, "model": model, "prompt_tokens": out.prompt_tokens,
                                 "completion_tokens": completion, "estimated": not exact}
        if exact:
            usage["total_tokens"] = out.prompt_tokens + out.completion_tokens
        cost = out.cost(price)
        if cost is not None:
            usage.update(cost=round(cost, 8), currency="USD")
        return usage

    @staticmethod
    def _final_caps(out: Any, request: ExecutionRequest, price: tuple[float, float] | None,
                    usage: dict[str, Any]) -> tuple[str, str | None, str | None]:
        """The exact check after a complete reply: caps need the endpoint's usage (fail closed without it)."""
        constraints = request.constraints
        if constraints.max_tokens is None and constraints.max_cost is None:
            return "ok", None, None
        if usage["estimated"]:
            return ("error", "AGENT_USAGE_UNREPORTED",
                    "the endpoint reported no token usage, so max_tokens/max_cost cannot be verified")
        if constraints.max_tokens is not None and usage["total_tokens"] > constraints.max_tokens:
            return ("error", "TOKEN_CAP_EXCEEDED",
                    f"the turn used {usage['total_tokens']} tokens, more than max_tokens {constraints.max_tokens}")
        if constraints.max_cost is not None and usage.get("cost", 0.0) > constraints.max_cost:
            return ("error", "COST_CAP_EXCEEDED",
                    f"the turn cost {usage['cost']:.6f} USD, more than max_cost {constraints.max_cost}")
        return "ok", None, None


def _thinking_refused(thinking: str, endpoint: str) -> str:
    """The message of ``AGENT_THINKING_UNSUPPORTED`` (at add and at run)."""
    return (f"endpoint {endpoint!r} refuses thinking ([executors.agent] thinking_mapping = refuse), and this job sets"
            f" thinking {thinking!r}: remove executor_options.thinking or choose another endpoint")


def _own_identity() -> str | None:
    from scheduler_toolkit.process import process_identity

    return process_identity(os.getpid())


def _encode_env(values: dict[str, str]) -> str:
    """The ``x-openclaw-env-inject`` header value: base64url of a JSON object (values stay in memory only)."""
    import base64
    import json

    return base64.urlsafe_b64encode(json.dumps(values, sort_keys=True).encode("utf-8")).decode("ascii")


__all__ = ["AgentExecutor", "AgentOptions", "AgentSettings"]
