"""``ShellExecutor``: runs a job's ``payload_message`` with a POSIX shell on this host.

What it enforces: its own process group per command (killed as a whole on timeout,
cancellation or output overflow), a recorded process identity before the payload
starts, per-stream output caps, the ``shell_env_policy`` filter, structured-output
parsing, post-success verification and watchdog reporting. What it does *not* do:
sandboxing, network restriction or filesystem isolation; it never claims them.

Dispatcher environment knobs (read at each execution):

* ``SCHEDULER_SHELL``: shell program (default ``/bin/bash``, else ``/bin/sh``); must be POSIX-like.
* ``SCHEDULER_SHELL_MAX_OUTPUT_BYTES``: cap per output stream (default 64 MiB).
* ``SCHEDULER_SHELL_KILL_GRACE_S``: seconds between SIGTERM and SIGKILL (default 2).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any

import attrs

from scheduler import PLUGIN_API_VERSION
from scheduler.artifacts import DEFAULT_EXCERPT_BYTES, DEFAULT_OFFLOAD_BYTES, StreamRecorder
from scheduler.errors import SchedulerError
from scheduler.execution import ExecutionRequest, ExecutionResult, RunControl
from scheduler.spec import JobSpec
from scheduler.structured import structured_from_capture, unparsed_record
from scheduler.timeutil import now_ms
from scheduler_executor_shell.capture import HashSink, RecorderSink
from scheduler_executor_shell.envpolicy import build_environment
from scheduler_executor_shell.runner import ProcessOutcome, run_process

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024
DEFAULT_KILL_GRACE_S = 2.0
DEFAULT_SHELLS = ("/bin/bash", "/bin/sh")

#: Error codes of a failed check that a watchdog turns into an alert (fencing problems never alert).
_WATCHDOG_ALERTS = frozenset(
    {
        "EXIT_NONZERO",
        "RUN_TIMEOUT",
        "OUTPUT_LIMIT_EXCEEDED",
        "VERIFY_FAILED",
        "VERIFY_TIMEOUT",
        "WORKING_DIR_MISSING",
        "SHELL_SPAWN_FAILED",
    }
)


@attrs.frozen(kw_only=True)
class ShellSettings:
    """Dispatcher-level settings of the shell executor."""

    shell: str
    max_output_bytes: int
    kill_grace_s: float


def resolve_settings(environ: Mapping[str, str]) -> ShellSettings:
    """Read the ``SCHEDULER_SHELL*`` knobs; ``SHELL_CONFIG_INVALID`` for a bad value.

    Done per execution so that an operator's change applies to the next run and a
    typo fails that run with a clear code instead of silently using a default.
    """
    shell = environ.get("SCHEDULER_SHELL") or next((s for s in DEFAULT_SHELLS if os.access(s, os.X_OK)), DEFAULT_SHELLS[-1])
    if not os.path.isabs(shell) or not os.access(shell, os.X_OK):
        raise SchedulerError("SHELL_CONFIG_INVALID", f"SCHEDULER_SHELL must be an executable absolute path, got {shell!r}")
    try:
        cap = int(environ.get("SCHEDULER_SHELL_MAX_OUTPUT_BYTES") or DEFAULT_MAX_OUTPUT_BYTES)
        grace = float(environ.get("SCHEDULER_SHELL_KILL_GRACE_S") or DEFAULT_KILL_GRACE_S)
    except ValueError as exc:
        raise SchedulerError("SHELL_CONFIG_INVALID", f"bad SCHEDULER_SHELL_* setting: {exc}") from None
    if cap < 1 or not 0 <= grace <= 3600:
        raise SchedulerError(
            "SHELL_CONFIG_INVALID", "SCHEDULER_SHELL_MAX_OUTPUT_BYTES must be >= 1 and SCHEDULER_SHELL_KILL_GRACE_S in [0, 3600]"
        )
    return ShellSettings(shell=shell, max_output_bytes=cap, kill_grace_s=grace)


def _signal_name(returncode: int) -> str:
    """``SIGKILL`` for -9, and so on."""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class ShellExecutor:
    """Executor driver ``shell`` (entry point group ``scheduler.executors``)."""

    plugin_api = PLUGIN_API_VERSION
    capabilities = frozenset(
        {"process-group", "timeout", "cancel", "output-capture", "structured-output", "verify", "env-policy"}
    )

    def __init__(self, *, environ: Mapping[str, str] | None = None) -> None:
        """``environ`` stands for the dispatcher environment; default: ``os.environ`` at each run."""
        self._environ = environ

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        """Run one attempt of a shell job and report it; see the module docstring for the guarantees."""
        job = request.job
        environ = dict(os.environ if self._environ is None else self._environ)
        try:
            settings = resolve_settings(environ)
            env, env_warning = build_environment(job.shell_env_policy, environ)
        except (SchedulerError, ValueError) as exc:
            err = exc if isinstance(exc, SchedulerError) else SchedulerError("SHELL_CONFIG_INVALID", str(exc))
            return ExecutionResult(status="error", error_code=err.code, error_message=err.message)
        env.update(request.extra_env)
        result = self._run_command(request, control, settings, env)
        result = attrs.evolve(result, env_warning=env_warning)
        if job.job_type == "watchdog":
            result = _watchdog_result(job, result)
        return result

    # -- the command ---------------------------------------------------------------------------

    def _run_command(
        self, request: ExecutionRequest, control: RunControl, settings: ShellSettings, env: dict[str, str]
    ) -> ExecutionResult:
        """Spawn, capture and classify the job's command, then verify it when it succeeded."""
        job = request.job
        details: dict[str, Any] = {"shell": settings.shell}
        if control.is_cancelled():
            return _cancelled(control, details, "before the command started")
        cwd = os.path.expanduser(job.working_dir) if job.working_dir else None
        if cwd is not None and not os.path.isdir(cwd):
            return ExecutionResult(
                status="error",
                error_code="WORKING_DIR_MISSING",
                error_message=f"working directory does not exist: {cwd}",
                details=details,
            )
        remaining_s = (request.deadline_ms - now_ms()) / 1000.0
        if remaining_s <= 0:
            return ExecutionResult(
                status="timeout",
                error_code="RUN_TIMEOUT",
                error_message="the run deadline passed before the command started",
                details=details,
            )

        sinks = {
            name: RecorderSink(
                StreamRecorder(
                    root=request.artifacts_root,
                    directory=request.artifacts_dir,
                    name=name,
                    excerpt_bytes=DEFAULT_EXCERPT_BYTES,
                    offload_bytes=DEFAULT_OFFLOAD_BYTES,
                    cap_bytes=settings.max_output_bytes,
                ),
                keep_bytes=DEFAULT_OFFLOAD_BYTES,
            )
            for name in ("stdout", "stderr")
        }
        outcome = run_process(
            shell=settings.shell,
            payload=job.payload_message,
            cwd=cwd,
            env=env,
            stdin_data=job.stdin_text.encode("utf-8") if job.stdin_text is not None else None,
            outputs=dict(sinks),
            deadline=time.monotonic() + remaining_s,
            control=control,
            grace_s=settings.kill_grace_s,
            label="command",
        )
        details.update(_process_details(outcome))
        if outcome.reason in ("spawn_failed", "record_failed"):
            for sink in sinks.values():
                sink.finish()
            assert outcome.error is not None
            if outcome.reason == "record_failed":
                details["fenced"] = True
            return ExecutionResult(
                status="error", error_code=outcome.error.code, error_message=outcome.error.message, details=details
            )

        stdout, stderr = sinks["stdout"].finish(), sinks["stderr"].finish()
        if stdout.limit_exceeded:
            structured = unparsed_record(
                job.output_format,
                total_bytes=stdout.bytes,
                sha256=stdout.sha256,
                artifact=stdout.artifact,
                warning=f"stdout exceeded the {settings.max_output_bytes}-byte output limit; not parsed",
            )
        else:
            structured = structured_from_capture(
                job.output_format, stdout, root=request.artifacts_root, head=sinks["stdout"].head
            )
        base = ExecutionResult(
            status="ok",
            exit_code=outcome.returncode,
            stdout=stdout,
            stderr=stderr,
            structured=structured,
            summary=stdout.excerpt,
            details=details,
        )
        result = _classify(base, outcome, control, settings)
        if result.status == "ok" and job.verify_shell:
            result = self._verify(result, request, control, settings, env, cwd)
        return result

    # -- verification ------------------------------------------------------------------------

    def _verify(
        self,
        result: ExecutionResult,
        request: ExecutionRequest,
        control: RunControl,
        settings: ShellSettings,
        env: dict[str, str],
        cwd: str | None,
    ) -> ExecutionResult:
        """Run ``verify_shell`` like the command (own group, env, cwd, cancellation); keep only an audit record."""
        job = request.job
        started_at, t0 = now_ms(), time.monotonic()
        out, err = HashSink(), HashSink()
        outcome = run_process(
            shell=settings.shell,
            payload=job.verify_shell or "",
            cwd=cwd,
            env=env,
            stdin_data=None,
            outputs={"stdout": out, "stderr": err},
            deadline=t0 + job.verify_timeout_s,
            control=control,
            grace_s=settings.kill_grace_s,
            label="verify",
        )
        if outcome.reason == "exited":
            vstatus = "passed" if outcome.returncode == 0 else "failed"
        elif outcome.reason in ("timeout", "cancelled"):
            vstatus = outcome.reason
        else:
            vstatus = "error"
        verification = {
            "status": vstatus,
            "exit_code": outcome.returncode,
            "started_at": started_at,
            "finished_at": now_ms(),
            "duration_ms": int((time.monotonic() - t0) * 1000),
            "stdout_bytes": out.bytes,
            "stdout_sha256": out.sha256,
            "stderr_bytes": err.bytes,
            "stderr_sha256": err.sha256,
        }
        details = dict(result.details)
        if outcome.termination:
            details["verify_termination"] = outcome.termination
        details.update({f"verify_{k}": v for k, v in outcome.notes.items()})
        result = attrs.evolve(result, verification=verification, details=details)
        if vstatus == "passed":
            return result
        if vstatus == "cancelled":
            return attrs.evolve(_cancelled(control, details, "during verification"), **_keep_outputs(result))
        if outcome.reason == "record_failed":  # fence lost: never soften this to a warning
            assert outcome.error is not None
            details["fenced"] = True
            return attrs.evolve(result, status="error", error_code=outcome.error.code, error_message=outcome.error.message)
        if vstatus == "failed":
            code, message = "VERIFY_FAILED", f"verification exited with status {outcome.returncode}"
        elif vstatus == "timeout":
            code, message = "VERIFY_TIMEOUT", f"verification did not finish within {job.verify_timeout_s}s"
        else:
            code = "VERIFY_FAILED"
            message = f"verification could not run: {outcome.error.message if outcome.error else outcome.reason}"
        if job.verify_on_failure == "warn":
            details["verification_warning"] = f"{code}: {message}"
            return attrs.evolve(result, details=details)
        return attrs.evolve(result, status="error", error_code=code, error_message=message)


def _keep_outputs(result: ExecutionResult) -> dict[str, Any]:
    """The output-related fields of a result, to carry over into a replacement result."""
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "structured": result.structured,
        "summary": result.summary,
        "verification": result.verification,
    }


def _process_details(outcome: ProcessOutcome) -> dict[str, Any]:
    """Audit details of the command's process (identity, termination, anomalies)."""
    out: dict[str, Any] = {}
    if outcome.pid is not None:
        out.update(pid=outcome.pid, pgid=outcome.pgid, process_identity=outcome.identity)
    if outcome.termination:
        out["termination"] = outcome.termination
    if outcome.leftovers_killed:
        out["leftover_processes_killed"] = True
    if outcome.pipes_abandoned:
        out["output_pipes_abandoned"] = True
    out.update(outcome.notes)
    return out


def _cancelled(control: RunControl, details: dict[str, Any], when: str) -> ExecutionResult:
    """A ``cancelled`` result naming the reason the dispatcher gave."""
    reason = control.cancel_reason() or "unspecified"
    details = {**details, "cancel_reason": reason}
    return ExecutionResult(
        status="cancelled", error_code="RUN_CANCELLED", error_message=f"cancelled {when} ({reason})", details=details
    )


def _classify(base: ExecutionResult, outcome: ProcessOutcome, control: RunControl, settings: ShellSettings) -> ExecutionResult:
    """Turn a finished command into ok / error / timeout / cancelled."""
    if outcome.reason == "exited":
        rc = outcome.returncode
        if rc == 0:
            return base
        message = f"command was killed by {_signal_name(rc)}" if rc is not None and rc < 0 else f"command exited with status {rc}"
        return attrs.evolve(base, status="error", error_code="EXIT_NONZERO", error_message=message)
    if outcome.reason == "timeout":
        return attrs.evolve(
            base, status="timeout", error_code="RUN_TIMEOUT", error_message="the command exceeded its deadline and was terminated"
        )
    if outcome.reason == "cancelled":
        return attrs.evolve(_cancelled(control, base.details, "while the command ran"), **_keep_outputs(base))
    if outcome.reason == "limit":
        streams = ", ".join(outcome.exceeded_streams) or "output"
        return attrs.evolve(
            base,
            status="error",
            error_code="OUTPUT_LIMIT_EXCEEDED",
            error_message=f"{streams} exceeded the {settings.max_output_bytes}-byte limit; the command was terminated",
        )
    if outcome.reason == "capture_failed":
        return attrs.evolve(
            base,
            status="error",
            error_code="OUTPUT_CAPTURE_FAILED",
            error_message=f"recording the output failed ({outcome.notes.get('pump_error', 'unknown error')}); the command was terminated",
        )
    return attrs.evolve(
        base, status="error", error_code="SHELL_EXECUTION_FAILED", error_message=f"unexpected end: {outcome.reason}"
    )


def _watchdog_result(job: JobSpec, result: ExecutionResult) -> ExecutionResult:
    """Report a watchdog check: an alert for a failed check, self-destruct due for a passing one.

    The dispatcher turns these details into the outbox alert or the job deletion.
    Cancellation and fencing failures are not check results and raise no alert.
    """
    details = dict(result.details)
    if result.status == "ok":
        details.update(alert=False, self_destruct_due=job.watchdog_self_destruct)
        return attrs.evolve(result, details=details)
    if result.status == "cancelled" or result.error_code not in _WATCHDOG_ALERTS:
        return result
    details.update(
        alert=True,
        alert_channel=job.watchdog_alert_channel,
        alert_to=job.watchdog_alert_to,
        self_destruct=job.watchdog_self_destruct,
        check_status=result.status,
        check_error_code=result.error_code,
    )
    return attrs.evolve(
        result,
        status="error",
        error_code="WATCHDOG_ALERT",
        error_message=f"watchdog check failed: {result.error_message}",
        details=details,
    )


__all__ = ["ShellExecutor", "ShellSettings", "resolve_settings"]
