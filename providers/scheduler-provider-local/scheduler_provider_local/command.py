"""``command``: a credential printed on standard output by a command the operator configured.

The binding's ``ref`` is the *name* of a command in ``[providers.command] commands``;
the command line itself only ever comes from the settings file, never from a job.
It is split like a POSIX shell would split words (``shlex``) but run without a shell:
no expansion, no pipes, no redirections. The program must be an absolute path.

The command runs in its own session (process group) with standard input closed,
the working directory ``/`` and a small environment: ``PATH``, ``HOME``, ``LANG``,
``LC_ALL``, ``USER``, ``LOGNAME``, ``TMPDIR``, ``TZ`` from the dispatcher, the names
in ``pass_env``, and ``SCHEDULER_CREDENTIAL_NAME`` / ``SCHEDULER_RUN_ID`` /
``SCHEDULER_JOB_ID`` so a helper can log who asked. Past ``timeout_s`` or
``max_output_bytes`` of standard output the whole group is killed (SIGKILL). Standard
error is drained and counted, never kept or shown: a failing helper may print the secret
it was handling.
"""

from __future__ import annotations

import os
import re
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping

import attrs
from scheduler_toolkit.settings import plugin_settings

from scheduler.api import CredentialBinding, CredentialContext, ResolvedCredential
from scheduler_provider_local.errors import CredentialError

COMMAND_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "LOGNAME", "TMPDIR", "TZ")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
#: How long the pipes may stay open after the command itself exited (a child it left behind holds them).
PIPE_GRACE_S = 0.5


def split_command(line: str) -> list[str]:
    """The argv of a configured command line; ``ValueError`` (never quoting the line) when it is not usable."""
    try:
        argv = shlex.split(line, comments=False, posix=True)
    except ValueError as exc:
        raise ValueError(f"cannot be split into words ({exc})") from None
    if not argv:
        raise ValueError("is empty")
    if not os.path.isabs(argv[0]):
        raise ValueError("must start with the absolute path of the program (no shell, no PATH lookup)")
    return argv


def _commands(value: dict[str, str]) -> str | None:
    for name, line in value.items():
        if not COMMAND_NAME.match(name):
            return f"command name {name!r} must match [a-z0-9][a-z0-9_.-]{{0,63}}"
        try:
            split_command(line)
        except ValueError as exc:
            return f"command {name!r} {exc}"
    return None


def _names(value: list[str]) -> str | None:
    bad = [n for n in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
    return "each entry must be an environment variable name" if bad else None


@attrs.frozen(kw_only=True)
class CommandSettings:
    """``[providers.command]``: the commands bindings may name, and their limits."""

    commands: dict[str, str] = attrs.field(factory=dict, metadata={
        "check": _commands, "doc": "Command name -> command line (absolute program path, shlex-split, run without a shell)."})
    timeout_s: float = attrs.field(default=DEFAULT_TIMEOUT_S, metadata={
        "minimum": 0.1, "maximum": 600, "doc": "Seconds a command may run before its process group is killed."})
    max_output_bytes: int = attrs.field(default=DEFAULT_MAX_OUTPUT_BYTES, metadata={
        "minimum": 1, "maximum": 16 * 1024 * 1024, "doc": "Largest standard output accepted, in bytes."})
    pass_env: list[str] = attrs.field(factory=list, metadata={
        "check": _names, "doc": "Extra variables of the dispatcher's environment the commands see (VAULT_ADDR, ...)."})
    strip_newline: bool = attrs.field(default=True, metadata={"doc": "Drop one trailing line end of the output."})


@attrs.frozen(kw_only=True)
class CommandOutcome:
    """What one command did (the output is the only secret here; ``repr`` hides it)."""

    returncode: int | None
    stdout: bytes = attrs.field(repr=False)
    stderr_bytes: int
    timed_out: bool = False
    overflow: bool = False
    seconds: float = 0.0


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: the group id is the child's pid
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited, without reaping it (its pid, our group id, stays reserved until we do)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits without reaping it (``WNOWAIT``); False if it is still running at ``deadline``."""
    delay = 0.001
    while True:
        if _exited(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.02)


def run_bounded(argv: list[str], *, env: Mapping[str, str], timeout_s: float, max_output_bytes: int) -> CommandOutcome:
    """Run ``argv`` without a shell; collect at most ``max_output_bytes`` of stdout within ``timeout_s``.

    ``OSError`` when it cannot be started. Whatever happens, the process group is
    killed and the child reaped before this returns.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(env), cwd="/", close_fds=True, start_new_session=True)
    out = bytearray()
    err_bytes = 0
    timed_out = overflow = False
    assert proc.stdout is not None and proc.stderr is not None
    selector = selectors.DefaultSelector()
    try:
        selector.register(proc.stdout, selectors.EVENT_READ)
        selector.register(proc.stderr, selectors.EVENT_READ)
        leader_gone_at: float | None = None
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if leader_gone_at is None and _exited(proc.pid):
                leader_gone_at = now
            elif leader_gone_at is not None and now - leader_gone_at > PIPE_GRACE_S:
                break  # the command is done; a process it left behind still holds a pipe (killed below)
            for key, _ in selector.select(min(deadline - now, 0.05)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    out += chunk
                    if len(out) > max_output_bytes:
                        overflow = True
                        break
                else:
                    err_bytes += len(chunk)  # counted, never kept
            if overflow:
                break
        if not (timed_out or overflow):
            timed_out = not _wait_unreaped(proc.pid, deadline)
    finally:
        selector.close()
        # The leader is not reaped yet (a zombie at most), so its pid, the group id, cannot have been reused:
        # killing the group stops whatever it left behind (a background child holding our pipes) and nothing else.
        _kill_group(proc)
        proc.stdout.close()
        proc.stderr.close()
        proc.wait()
    stdout = bytes(out)
    out[:] = b"\0" * len(out)  # best effort: do not leave the secret in a reusable buffer
    return CommandOutcome(returncode=proc.returncode, stdout=stdout if not overflow else b"", stderr_bytes=err_bytes,
                          timed_out=timed_out, overflow=overflow, seconds=time.monotonic() - started)


def command_environment(settings: CommandSettings, environ: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The small environment a credential command gets (see the module docstring)."""
    env = {k: environ[k] for k in (*BASE_ENV, *settings.pass_env) if k in environ}
    env.setdefault("PATH", os.defpath)
    env.update(extra)
    return env


class CommandFailed(Exception):
    """A command produced no credential: a ``CREDENTIAL_*`` code and a message without any output."""

    def __init__(self, code: str, message: str, **details: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


def run_named_command(name: str, settings: CommandSettings, environ: Mapping[str, str],
                      extra_env: Mapping[str, str] | None = None) -> tuple[str | bytes, dict[str, object]]:
    """Run the configured command ``name``: (value, non-secret metadata); ``CommandFailed`` otherwise."""
    if not COMMAND_NAME.match(name):
        raise CommandFailed("CREDENTIAL_REF_INVALID", "command ref must be the name of a configured command "
                            "([a-z0-9][a-z0-9_.-]{0,63})")
    line = settings.commands.get(name)
    if line is None:
        known = ", ".join(sorted(settings.commands)) or "none configured"
        raise CommandFailed("CREDENTIAL_NOT_FOUND", f"no command {name!r} in [providers.command] commands (known: {known})")
    try:
        argv = split_command(line)
    except ValueError as exc:
        raise CommandFailed("CREDENTIAL_REF_INVALID", f"command {name!r} {exc}") from None
    env = command_environment(settings, environ, extra_env or {})
    try:
        outcome = run_bounded(argv, env=env, timeout_s=settings.timeout_s, max_output_bytes=settings.max_output_bytes)
    except OSError as exc:
        raise CommandFailed("CREDENTIAL_COMMAND_FAILED", f"command {name!r} could not be started: "
                            f"{exc.strerror or type(exc).__name__}", program=argv[0]) from None
    facts = {"command": name, "exit_code": outcome.returncode, "stderr_bytes": outcome.stderr_bytes,
             "seconds": round(outcome.seconds, 3)}
    if outcome.timed_out:
        raise CommandFailed("CREDENTIAL_COMMAND_TIMEOUT", f"command {name!r} did not finish within {settings.timeout_s:g} s "
                            "and was killed", **facts)
    if outcome.overflow:
        raise CommandFailed("CREDENTIAL_COMMAND_OUTPUT_TOO_LARGE", f"command {name!r} printed more than "
                            f"{settings.max_output_bytes} bytes and was killed", **facts)
    if outcome.returncode != 0:
        raise CommandFailed("CREDENTIAL_COMMAND_FAILED", f"command {name!r} exited with status {outcome.returncode} "
                            f"(its {outcome.stderr_bytes} bytes of stderr are not shown: they may hold secrets)", **facts)
    raw = outcome.stdout
    try:
        value: str | bytes = raw.decode("utf-8")
    except UnicodeDecodeError:
        value = raw
    if isinstance(value, str) and settings.strip_newline:
        value = value[:-2] if value.endswith("\r\n") else value.removesuffix("\n")
    if value in ("", b""):
        raise CommandFailed("CREDENTIAL_EMPTY", f"command {name!r} printed nothing", **facts)
    return value, {"provider": "command", "source": f"command:{name}", "bytes": len(raw)}


class CommandCredentialProvider:
    """Credential driver ``command`` (group ``scheduler.credential_providers``)."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset()  # each resolve runs the command again: no refresh or revoke of its own
    settings_class = CommandSettings

    def __init__(self, *, environ: Mapping[str, str] | None = None) -> None:
        """``environ`` stands for the dispatcher's environment (default: ``os.environ`` at each resolve)."""
        self._environ = environ
        self._settings: CommandSettings | None = None

    def configure(self, settings: CommandSettings) -> None:
        """The loader hands over the validated ``[providers.command]`` table."""
        self._settings = settings

    def _current(self) -> CommandSettings:
        return self._settings if self._settings is not None else plugin_settings("credential", "command", CommandSettings)

    def resolve(self, binding: CredentialBinding, context: CredentialContext) -> ResolvedCredential:
        """Run the command the binding names; its standard output is the credential."""
        environ = os.environ if self._environ is None else self._environ
        extra = {"SCHEDULER_CREDENTIAL_NAME": binding.name, "SCHEDULER_RUN_ID": context.run_id,
                 "SCHEDULER_JOB_ID": context.job_id}
        try:
            value, metadata = run_named_command(binding.ref, self._current(), environ, extra)
        except CommandFailed as failed:
            raise CredentialError(failed.code, f"credential {binding.name!r}: {failed.message}",
                                  details={"binding": binding.name, "provider": "command", "ref": binding.ref,
                                           **failed.details}) from None
        return ResolvedCredential.for_binding(binding, value, metadata=metadata)
