"""``ShellExecutor``: runs a job's ``payload_message`` with a POSIX shell on this host.

What it enforces: its own process group per command, and its own cgroup v2 where the host
offers one (killed as a whole on timeout, cancellation or output overflow), a recorded process identity before the payload
starts, per-stream output caps, the environment filter (``executor_options``:
``env_policy``, ``env_allow``), structured-output parsing, post-success verification,
credential presentation (env, file, stdin) and crash recovery of its process groups
(``recover``). Watchdog alerts are the kernel's decision, not this executor's. What it does *not* do:
sandboxing, network restriction or filesystem isolation; it never claims them.

Host settings (``settings_class = ShellSettings``), table ``[executors.shell]`` of the
settings file, each overridable as ``SCHEDULER_EXECUTORS_SHELL_<KEY>``:

* ``shell``: shell program (default ``/bin/bash``, else ``/bin/sh``); an executable absolute path, POSIX-like.
* ``max_output_bytes``: cap per output stream (default 64 MiB).
* ``kill_grace_s``: seconds between SIGTERM and SIGKILL (default 2).
* ``containment``: ``auto`` (default: each command in a cgroup v2 of its own where this host offers
  one the dispatcher may write, else its process group), ``cgroup`` (a run is refused
  ``CGROUP_UNAVAILABLE`` where it cannot have one) or ``process-group`` (see ``cgroups.py``).

A bad value is ``CONFIG_INVALID`` naming the key and its source, reported by
``scheduler config --check`` and as the error of the run that meets it.
"""

from __future__ import annotations

import os
import pwd
import signal
import time
import types
from collections.abc import Mapping
from typing import Any, Literal

import attrs
from scheduler_toolkit.output import DEFAULT_EXCERPT_BYTES, DEFAULT_OFFLOAD_BYTES
from scheduler_toolkit.settings import plugin_settings
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
from scheduler_executor_shell.capture import HashSink, RecorderSink
from scheduler_executor_shell.cgroups import Unavailable, cached_place, place_for_runs
from scheduler_executor_shell.checks import shell_job_problems
from scheduler_executor_shell.direct import DirectCommand, direct_command, is_dash
from scheduler_executor_shell.envpolicy import build_environment
from scheduler_executor_shell.options import ShellOptions
from scheduler_executor_shell.recovery import recover_process_group
from scheduler_executor_shell.runner import GATE_SHELL, CgroupPlan, ProcessOutcome, RunAs, gate_shell_usable, run_process

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024
DEFAULT_KILL_GRACE_S = 2.0
DEFAULT_SHELLS = ("/bin/bash", "/bin/sh")
#: Prefix of the variables that override ``[executors.shell]`` (``SCHEDULER_EXECUTORS_SHELL_<KEY>``).
OVERRIDE_PREFIX = "SCHEDULER_EXECUTORS_SHELL_"
#: How many job environments (distinct ``env_policy`` and ``env_allow``) an executor keeps built (``_job_environment``).
ENV_SHAPES_KEPT = 64


def _executable_path(value: str) -> str | None:
    """The check of ``shell``: an absolute path of an executable file, else the error message."""
    if not os.path.isabs(value) or os.path.isdir(value) or not os.access(value, os.X_OK):
        return "must be the absolute path of an executable POSIX shell"
    return None


@attrs.frozen(kw_only=True)
class ShellSettings:
    """Host settings of the shell executor: ``[executors.shell]`` (the executor's ``settings_class``)."""

    shell: str | None = attrs.field(default=None, metadata={
        "check": _executable_path, "doc": "Shell program, an executable absolute path; default /bin/bash, else /bin/sh."})
    max_output_bytes: int = attrs.field(default=DEFAULT_MAX_OUTPUT_BYTES, metadata={
        "minimum": 1, "doc": "Cap per output stream; a command writing more is terminated (OUTPUT_LIMIT_EXCEEDED)."})
    kill_grace_s: float = attrs.field(default=DEFAULT_KILL_GRACE_S, metadata={
        "minimum": 0, "maximum": 3600, "doc": "Seconds between SIGTERM and SIGKILL of a command's process group."})
    containment: Literal["auto", "cgroup", "process-group"] = attrs.field(default="auto", metadata={
        "doc": "What a command's processes are killed by: `auto` (a cgroup v2 of its own where the dispatcher may create"
               " one, else the process group), `cgroup` (runs refused CGROUP_UNAVAILABLE without one) or `process-group`"
               " (a child that calls setsid escapes it). `scheduler doctor` says which is active."})


def cgroup_plan(settings: ShellSettings, run_id: str) -> CgroupPlan | None:
    """Where this run's command gets its cgroup, or None for the process group alone (``containment``).

    ``CGROUP_UNAVAILABLE`` when ``containment = "cgroup"`` and this host offers none (the run is
    refused before anything starts); ``auto`` falls back to the process group.
    """
    if settings.containment == "process-group":
        return None
    place = place_for_runs()
    if isinstance(place, Unavailable):
        if settings.containment == "cgroup":
            raise SchedulerError("CGROUP_UNAVAILABLE", f"[executors.shell] containment is cgroup but {place.reason}")
        return None
    return CgroupPlan(place=place, run_id=run_id, required=settings.containment == "cgroup")


def containment_check(settings: ShellSettings) -> dict[str, Any]:
    """``doctor``'s ``shell_containment`` check: which containment runs get here, and why.

    Fails (``CGROUP_UNAVAILABLE``) when ``containment = "cgroup"`` cannot be had; a warning when
    ``auto`` falls back to process groups (what a ``setsid`` child escapes).
    """
    check: dict[str, Any] = {"check": "shell_containment", "ok": True, "setting": settings.containment}
    place = cached_place() if settings.containment != "process-group" else None
    if isinstance(place, Unavailable) or place is None:
        reason = "containment = process-group" if place is None else place.reason
        failed = settings.containment == "cgroup"
        check.update(mode="process-group", warning=not failed, ok=not failed, detail=(
            ("" if failed else "warning: ") + f"process groups ({reason}): a child that calls setsid or setpgid leaves"
            " its group and outlives its run" + (" (containment = cgroup: shell runs are refused)" if failed else "")))
        if failed:
            check["code"] = "CGROUP_UNAVAILABLE"
        return check
    kill = "cgroup.kill" if place.has_kill else "freeze and SIGKILL each member"
    check.update(mode="cgroup", cgroup=place.directory, detail=f"a cgroup v2 per command under {place.directory} ({kill})")
    return check


def resolve_settings(environ: Mapping[str, str] | None = None) -> ShellSettings:
    """The ``[executors.shell]`` settings with ``SCHEDULER_EXECUTORS_SHELL_*`` overrides read from ``environ``.

    A bad value fails the run that meets it with ``CONFIG_INVALID`` naming the key and
    its source instead of silently using a default. ``shell`` comes back filled in.
    ``ShellExecutor`` resolves them again whenever its overrides change (``_settings_for``).
    """
    settings = plugin_settings("executor", "shell", ShellSettings, environ=environ)
    if settings.shell is None:
        settings = attrs.evolve(settings, shell=default_shell())
    return settings


def default_shell() -> str:
    """The first executable of ``DEFAULT_SHELLS`` (/bin/bash, else /bin/sh): the shell when none is configured."""
    return next((s for s in DEFAULT_SHELLS if os.access(s, os.X_OK)), DEFAULT_SHELLS[-1])


def resolve_account(user: str) -> RunAs:
    """The account ``user`` (a name) as the command will run: uid, gid, supplementary groups, home.

    ``RUN_AS_NOT_ROOT`` when this process cannot switch accounts (not root), ``RUN_AS_USER_UNKNOWN``
    when the account does not exist here (the kernel checked who added the job: ``scheduler.core.run_as``).
    """
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SchedulerError("RUN_AS_USER_UNKNOWN", f"executor_options.user {user!r}: no such account on this host") from None
    if os.geteuid() != 0:
        raise SchedulerError("RUN_AS_NOT_ROOT", f"running as {user!r} needs a dispatcher running as root")
    groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid)
    return RunAs(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=entry.pw_dir,
                 shell=entry.pw_shell)


def _working_dir(working_dir: str | None, run_as: RunAs | None) -> str | None:
    """The command's working directory: ``~`` is the dispatcher's home, or the run-as account's."""
    if not working_dir:
        return None
    if run_as is not None and (working_dir == "~" or working_dir.startswith("~/")):
        return run_as.home + working_dir[1:]
    return os.path.expanduser(working_dir)


def plain_command(shell: str, payload: str, env: Mapping[str, str], cwd: str | None,
                  run_as: RunAs | None) -> DirectCommand | None:
    """The payload as a command the gate execs without bash (``direct.py``), or None for the shell.

    Only where the shell is bash (the detector's rules are bash's), the run stays in the
    dispatcher's working directory and account (``working_dir`` and ``user`` keep the shell
    path) and the gate shell is dash.
    """
    if run_as is not None or cwd is not None or os.path.basename(shell) != "bash":
        return None
    if not gate_shell_usable() or not is_dash(GATE_SHELL):
        return None
    return direct_command(payload, env)


def _signal_name(returncode: int) -> str:
    """``SIGKILL`` for -9, and so on."""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class ShellExecutor:
    """Executor driver ``shell`` (entry point group ``scheduler.executors``)."""

    plugin_api = 3
    capabilities = frozenset({
        "process-group", "timeout", "cancel", "output-capture", "structured-output", "verify", "env-policy", "recover",
        "stdin", "credentials-env", "credentials-file", "credentials-stdin",
    })
    options_class = ShellOptions
    settings_class = ShellSettings

    def __init__(self, *, environ: Mapping[str, str] | None = None) -> None:
        """``environ`` stands for the dispatcher environment; default: ``os.environ`` at each run."""
        self._environ = environ
        #: The settings last resolved, and the override variables they were resolved with.
        self._settings: tuple[tuple[tuple[str, str], ...], ShellSettings] | None = None
        #: The dispatcher environment last read: ``os.environ``'s raw items, that environment decoded (read-only),
        #: and the settings resolved for it (``_dispatcher_environ``).
        self._environ_seen: tuple[tuple[tuple[bytes, bytes], ...], Mapping[str, str], ShellSettings | None] | None = None
        #: The job environments built from the dispatcher environment last read (``_job_environment``): that
        #: environment, and per (env_policy, env_allow) the filtered variables and the warning.
        self._env_built: tuple[Mapping[str, str], dict[tuple[str, tuple[str, ...]], tuple[dict[str, str], str | None]]] | None = None

    def configure(self, settings: ShellSettings) -> None:
        """Nothing to keep: the loader has validated the table (a bad value fails the load with
        ``CONFIG_INVALID``), and each run resolves it again with that run's override variables
        (``_settings_for``), since ``SCHEDULER_EXECUTORS_SHELL_*`` can change between runs."""

    def _dispatcher_environ(self) -> Mapping[str, str]:
        """The dispatcher environment as it is now (read-only): ``os.environ``, or the one given to the constructor.

        Copying ``os.environ`` decodes every variable (about 30 us for 35 of them, the largest
        cost of a run after the spawn); its raw bytes, compared with the last run's, say
        whether it changed, so the decoded copy is made again only when it did.
        """
        if self._environ is not None:
            return types.MappingProxyType(dict(self._environ))
        raw = getattr(os.environ, "_data", None)  # CPython's undecoded variables; without it, a copy per run
        if not isinstance(raw, dict):
            return types.MappingProxyType(dict(os.environ))
        key = tuple(raw.items())
        seen = self._environ_seen
        if seen is not None and seen[0] == key:
            return seen[1]
        environ = types.MappingProxyType(dict(os.environ))
        self._environ_seen = (key, environ, None)
        return environ

    def _settings_for(self, environ: Mapping[str, str]) -> ShellSettings:
        """``resolve_settings(environ)``, resolved again only when the ``SCHEDULER_EXECUTORS_SHELL_*`` variables change.

        The settings file is fixed for the life of an executor (a settings reload loads new
        executors), so its overrides are all that can change from run to run; resolving
        costs far more than the spawn it configures. A bad value is never kept: every run
        that meets it fails ``CONFIG_INVALID``.
        """
        seen = self._environ_seen
        if seen is not None and seen[1] is environ and seen[2] is not None:
            return seen[2]  # the same environment as the last run: its settings
        overrides = tuple(item for item in environ.items() if item[0].startswith(OVERRIDE_PREFIX))
        cached = self._settings
        if cached is not None and cached[0] == overrides:
            settings = cached[1]
        else:
            settings = resolve_settings(environ)
            self._settings = (overrides, settings)
        if seen is not None and seen[1] is environ:
            self._environ_seen = (seen[0], environ, settings)
        return settings

    def _job_environment(self, environ: Mapping[str, str], options: ShellOptions) -> tuple[dict[str, str], str | None]:
        """``build_environment`` for the job's ``env_policy`` and ``env_allow`` from ``environ``: a fresh dict per run.

        Remembered per job shape for as long as ``_dispatcher_environ`` hands out the same environment
        (it does until a variable changes), so a run pays a dict copy, not the filter's lookup (which
        hashes every variable of the dispatcher's environment). ``ValueError`` for an unknown policy, never kept.
        """
        built = self._env_built
        if built is None or built[0] is not environ or len(built[1]) >= ENV_SHAPES_KEPT:
            built = self._env_built = (environ, {})
        key = (options.env_policy, tuple(options.env_allow))
        found = built[1].get(key)
        if found is None:
            found = built[1][key] = build_environment(options.env_policy, environ, allow=options.env_allow)
        return dict(found[0]), found[1]

    def execute(self, request: ExecutionRequest, control: RunControl) -> ExecutionResult:
        """Run one attempt of a shell job and report it; see the module docstring for the guarantees."""
        options = request.options if isinstance(request.options, ShellOptions) else ShellOptions()
        environ = self._dispatcher_environ()
        try:
            settings = self._settings_for(environ)
            plan = cgroup_plan(settings, request.run_id)
            env, env_warning = self._job_environment(environ, options)
        except (SchedulerError, ValueError) as exc:
            err = exc if isinstance(exc, SchedulerError) else SchedulerError("SHELL_CONFIG_INVALID", str(exc))
            return ExecutionResult(status="error", error_code=err.code, error_message=err.message)
        run_as = None
        if options.user is not None:
            try:
                run_as = resolve_account(options.user)
            except SchedulerError as exc:
                return ExecutionResult(status="error", error_code=exc.code, error_message=exc.message)
            # As cron sets them for a crontab's owner: from the password database, SHELL=/bin/sh.
            env.update(HOME=run_as.home, LOGNAME=run_as.name, USER=run_as.name, SHELL="/bin/sh")
        env.update(request.extra_env)
        stdin_text = options.stdin_text
        for credential in request.credentials:  # materialised by the kernel; values never leave memory
            if credential.medium == "env" and credential.key:
                env[credential.key] = credential.value or ""
            elif credential.medium == "file" and credential.key and credential.path:
                env[credential.key] = credential.path
            elif credential.medium == "stdin":
                stdin_text = credential.value
        result = self._run_command(request, control, settings, env, options, stdin_text, run_as, plan)
        return result if env_warning is None else attrs.evolve(result, env_warning=env_warning)

    def check_job(self, options: ShellOptions | None, spec: Any) -> list[dict[str, str]]:
        """Refuse at ``jobs add`` what could only fail every run: a missing or relative ``working_dir``, a loader
        variable in ``env_allow`` (``scheduler_executor_shell.checks``)."""
        return shell_job_problems(options)

    def recover(self, request: RecoveryRequest) -> RecoveryOutcome:
        """Crash recovery: stop the process group a dead dispatcher's run left behind (see ``recovery.py``)."""
        return recover_process_group(request)

    def health_checks(self) -> list[dict[str, Any]]:
        """``doctor``: which process containment this host gives shell runs (``containment_check``)."""
        try:
            settings = self._settings_for(self._dispatcher_environ())
        except SchedulerError as exc:
            return [{"check": "shell_containment", "ok": False, "code": exc.code, "detail": exc.message}]
        return [containment_check(settings)]

    # -- the command ---------------------------------------------------------------------------

    def _run_command(
        self,
        request: ExecutionRequest,
        control: RunControl,
        settings: ShellSettings,
        env: dict[str, str],
        options: ShellOptions,
        stdin_text: str | None,
        run_as: RunAs | None = None,
        plan: CgroupPlan | None = None,
    ) -> ExecutionResult:
        """Spawn, capture and classify the job's command, then verify it when it succeeded."""
        job = request.job
        details: dict[str, Any] = {"shell": settings.shell}
        if run_as is not None:
            details["user"], details["uid"] = run_as.name, run_as.uid
        if control.is_cancelled():
            return _cancelled(control, details, "before the command started")
        cwd = _working_dir(options.working_dir, run_as)
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
                request.stream_recorder(  # redacts the run's presented credential values
                    name,
                    excerpt_bytes=DEFAULT_EXCERPT_BYTES,
                    offload_bytes=DEFAULT_OFFLOAD_BYTES,
                    cap_bytes=settings.max_output_bytes,
                ),
                keep_bytes=DEFAULT_OFFLOAD_BYTES,
            )
            for name in ("stdout", "stderr")
        }
        shell = settings.shell or default_shell()  # resolve_settings filled it in
        direct = plain_command(shell, job.payload_message, env, cwd, run_as)
        if direct is not None:
            details["direct"] = True  # exec'd by the gate without the shell (direct.py)
        outcome = run_process(
            shell=shell,
            payload=job.payload_message,
            cwd=cwd,
            env=env,
            stdin_data=stdin_text.encode("utf-8") if stdin_text is not None else None,
            outputs=dict(sinks),
            deadline=time.monotonic() + remaining_s,
            control=control,
            grace_s=settings.kill_grace_s,
            label="command",
            run_as=run_as,
            cgroup=plan,
            direct=direct,
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
            result = self._verify(result, request, control, settings, env, cwd, run_as, plan)
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
        run_as: RunAs | None = None,
        plan: CgroupPlan | None = None,
    ) -> ExecutionResult:
        """Run ``verify_shell`` like the command (own group and cgroup, env, cwd, cancellation); keep only an audit record."""
        job = request.job
        started_at, t0 = now_ms(), time.monotonic()
        out, err = HashSink(request.redactions), HashSink(request.redactions)
        shell = settings.shell or default_shell()  # resolve_settings filled it in
        outcome = run_process(
            shell=shell,
            payload=job.verify_shell or "",
            cwd=cwd,
            env=env,
            stdin_data=None,
            outputs={"stdout": out, "stderr": err},
            deadline=t0 + job.verify_timeout_s,
            control=control,
            grace_s=settings.kill_grace_s,
            label="verify",
            run_as=run_as,
            cgroup=plan,
            direct=plain_command(shell, job.verify_shell or "", env, cwd, run_as),
        )
        out.finish()
        err.finish()
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
    if outcome.cgroup is not None:
        out["cgroup"] = outcome.cgroup
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


__all__ = ["ShellExecutor", "ShellOptions", "ShellSettings", "resolve_settings"]
