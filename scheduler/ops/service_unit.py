"""A systemd unit for ``scheduler run``: render, install, inspect and remove it.

Why these settings:

- ``KillMode=mixed``: ``systemctl stop`` sends SIGTERM to the dispatcher alone, which
  stops claiming and gives running work its grace period, then cancels it (each run's
  process group is its own, stopped by its executor). Only what is still alive after
  ``TimeoutStopSec`` gets SIGKILL, across the whole cgroup. The default
  (``control-group``) would SIGTERM every job's processes at once, behind the
  dispatcher's back.
- ``TimeoutStopSec`` covers the grace period plus the kill grace plus slack, so systemd
  never SIGKILLs a dispatcher that is still draining on schedule.
- ``Restart=on-failure``: a crash (or ``LEASE_LOST``) restarts it; the new dispatcher
  recovers orphaned runs. A clean stop stays stopped.
- ``ExecReload=/bin/kill -HUP $MAINPID``: ``systemctl reload`` re-reads the settings file
  (see ``Dispatcher.request_reload``).
- The environment is pinned at install time: the database (``SCHEDULER_DB``), the
  settings file (``SCHEDULER_CONFIG``), the artifacts directory when set, and a clean
  ``PATH``: the virtualenv's ``bin`` then the standard system directories, each once (the
  installing shell's ``PATH`` is not copied: pyenv shims and duplicates do not belong in a
  service).
- Only the system unit orders itself after ``network-online.target`` (a user manager has no
  such target to wait for) and is sandboxed (``SYSTEM_HARDENING``: a user manager cannot
  apply most of it). ``ProtectSystem=strict`` leaves writable only the database directory
  and the artifacts root (``ReadWritePaths``, ``-``: a missing one is no start failure) and
  the private ``/tmp``; ``sandbox_conflicts`` finds jobs that would write elsewhere.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core.spec import executor_name_of
from scheduler.core.store import Store, default_artifacts_root, local_path_of
from scheduler.settings import current_settings, settings_path

DEFAULT_UNIT = "scheduler.service"
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
#: Seconds on top of the drain (grace + kill grace) before systemd may SIGKILL the cgroup.
STOP_SLACK_S = 15
#: The unit's ``PATH`` after the virtualenv's ``bin`` (the installing shell's is not copied).
STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
#: The system unit's sandbox (docs/operations.md says which a job may need relaxed, with a drop-in). Namespaces,
#: devices, capabilities and system calls are left alone: jobs run containers, sandboxed agents and root tools.
SYSTEM_HARDENING = (
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=read-only",
    "PrivateTmp=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "LockPersonality=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "SystemCallArchitectures=native",
)
#: Where a job may write under the system unit besides its ``ReadWritePaths``: the private temporary directories
#: (``PrivateTmp``) and the device nodes (``/dev/null``, ``/dev/stderr``...).
SANDBOX_WRITABLE = ("/tmp", "/var/tmp", "/dev")


def user_unit_dir(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/systemd/user`` (``~/.config`` when unset or relative): where user units live."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path("~/.config").expanduser()
    return root / "systemd" / "user"


def unit_path(name: str, *, system: bool) -> Path:
    """Where the unit file ``name`` goes for a user (default) or system installation."""
    return (SYSTEM_UNIT_DIR if system else user_unit_dir()) / name


def check_unit_name(name: str) -> str:
    """A plain ``NAME.service`` (``.service`` added when missing); anything with a path is ``INVALID_ARGUMENT``."""
    if not name.endswith(".service"):
        name += ".service"
    stem = name[: -len(".service")]
    if not stem or "/" in name or name.startswith(".") or not all(c.isalnum() or c in "-_.@" for c in stem):
        raise SchedulerError("INVALID_ARGUMENT", f"bad unit name {name!r}: letters, digits, '-', '_', '.', '@' only")
    return name


def _escape(value: str) -> str:
    """One systemd word: specifiers (``%``) doubled, quoted with C escapes when it holds space, quote or backslash."""
    value = value.replace("%", "%%")
    if any(c in value for c in " \t\"'\\"):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


@attrs.frozen(kw_only=True)
class UnitSpec:
    """Everything the unit says: what runs, with which environment, under which policies."""

    name: str = DEFAULT_UNIT
    system: bool = False
    exec_start: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]
    working_directory: str
    stop_timeout_s: int
    user: str | None = None
    #: The system unit's ``ReadWritePaths`` (the database directory, the artifacts root); unused by a user unit.
    read_write_paths: tuple[str, ...] = ()

    def render(self) -> str:
        """The unit file's text."""
        env_lines = "\n".join(f"Environment={_escape(f'{k}={v}')}" for k, v in self.environment)
        sandbox = [*SYSTEM_HARDENING, *(f"ReadWritePaths={_escape('-' + p)}" for p in self.read_write_paths)] if self.system else []
        lines = [
            "# Written by `scheduler service install`; `scheduler service uninstall` removes it.",
            "[Unit]",
            "Description=scheduler dispatcher (scheduler run)",
            "Documentation=https://github.com/scheduler-kernel/scheduler/blob/main/docs/operations.md",
            # a user manager has no network-online.target: ordering after it would do nothing
            *(["After=network-online.target", "Wants=network-online.target"] if self.system else []),
            "",
            "[Service]",
            "Type=simple",
            f"ExecStart={' '.join(_escape(a) for a in self.exec_start)}",
            "ExecReload=/bin/kill -HUP $MAINPID",
            env_lines,
            # a path setting takes the rest of the line literally (no quotes); only specifiers are escaped
            f"WorkingDirectory={self.working_directory.replace('%', '%%')}",
            *([f"User={self.user}"] if self.user else []),
            *sandbox,
            "Restart=on-failure",
            "RestartSec=5s",
            "KillMode=mixed",
            "KillSignal=SIGTERM",
            f"TimeoutStopSec={self.stop_timeout_s}s",
            "SyslogIdentifier=scheduler",
            "",
            "[Install]",
            f"WantedBy={'multi-user.target' if self.system else 'default.target'}",
            "",
        ]
        return "\n".join(lines)


def scheduler_executable() -> tuple[str, ...]:
    """How to start this very installation: the ``scheduler`` script beside this Python, else ``python -m scheduler``.

    ``sys.executable`` is not resolved: a virtualenv's ``bin/python`` is a symlink to the
    base interpreter, which would lose the virtualenv.
    """
    bindir = Path(sys.executable).absolute().parent
    script = bindir / "scheduler"
    if script.is_file() and os.access(script, os.X_OK):
        return (str(script),)
    return (str(Path(sys.executable).absolute()), "-m", "scheduler")


def build_spec(db: str, *, name: str = DEFAULT_UNIT, system: bool = False, config: str | None = None,
               environ: dict[str, str] | None = None) -> UnitSpec:
    """The unit for ``scheduler run`` on ``db`` as this process sees its environment.

    ``db`` is a SQLite path (made absolute) or a database URL; a URL with an embedded
    password is refused (the unit file is readable): put it in ``~/.pgpass`` /
    ``PGPASSFILE`` instead. The settings file is pinned when it exists (or ``config``
    names it), so the service reads the file the installer sees.
    """
    env = dict(os.environ if environ is None else environ)
    name = check_unit_name(name)
    local = local_path_of(db)
    if local is None:
        if urlsplit(db).password is not None:
            raise SchedulerError("INVALID_ARGUMENT", "the database URL carries a password, which the unit file would expose:"
                                                     " keep it in ~/.pgpass (or PGPASSFILE) and pass the URL without it")
        db_value = db
    else:
        db_value = str(local.expanduser().absolute())
    environment: list[tuple[str, str]] = [("SCHEDULER_DB", db_value)]
    if config:
        cfg = Path(config).expanduser().absolute()
        if not cfg.is_file():
            raise SchedulerError("NOT_FOUND", f"settings file not found: {cfg}")
        environment.append(("SCHEDULER_CONFIG", str(cfg)))
    else:
        cfg, _source = settings_path(env)
        if cfg.is_file() or env.get("SCHEDULER_CONFIG"):
            environment.append(("SCHEDULER_CONFIG", str(cfg)))
    if env.get("SCHEDULER_ARTIFACTS_DIR"):
        environment.append(("SCHEDULER_ARTIFACTS_DIR", str(Path(env["SCHEDULER_ARTIFACTS_DIR"]).expanduser().absolute())))
    environment.append(("PATH", clean_path()))
    dispatcher = current_settings().dispatcher
    stop = int(dispatcher.grace_s + dispatcher.kill_grace_s) + STOP_SLACK_S
    user = None
    if system:
        user = pwd.getpwuid(os.getuid()).pw_name
    workdir = str(local.expanduser().absolute().parent) if local is not None else str(Path.home())
    return UnitSpec(name=name, system=system, exec_start=(*scheduler_executable(), "run"),
                    environment=tuple(environment), working_directory=workdir, stop_timeout_s=stop, user=user,
                    read_write_paths=writable_paths(local, env) if system else ())


def clean_path() -> str:
    """The unit's ``PATH``: this Python's ``bin`` (the virtualenv's) then ``STANDARD_PATH``, each directory once."""
    bindir = str(Path(sys.executable).absolute().parent)
    return ":".join(dict.fromkeys([bindir, *STANDARD_PATH]))


def writable_paths(local: Path | None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """What the system unit leaves writable for the database on ``local`` (None: a server database): its directory
    (the database, its WAL and the dispatcher's pid file), the artifacts root and ``SCHEDULER_CREDENTIALS_DIR`` when
    set (file credentials; by default they go to the private ``/tmp``)."""
    env = os.environ if environ is None else environ
    paths: list[str] = []
    db_file = local.expanduser().absolute() if local is not None else None
    if db_file is not None:
        paths.append(str(db_file.parent))
    if env.get("SCHEDULER_ARTIFACTS_DIR"):
        artifacts = Path(env["SCHEDULER_ARTIFACTS_DIR"]).expanduser().absolute()
    elif db_file is not None:
        artifacts = db_file.parent / "artifacts"  # default_artifacts_root's choice beside a local database
    else:
        artifacts = default_artifacts_root(None).expanduser().absolute()
    if db_file is None or not artifacts.is_relative_to(db_file.parent):
        paths.append(str(artifacts))
    if env.get("SCHEDULER_CREDENTIALS_DIR"):
        paths.append(str(Path(env["SCHEDULER_CREDENTIALS_DIR"]).expanduser().absolute()))
    return tuple(dict.fromkeys(paths))


@attrs.frozen
class SandboxConflict:
    """A job that would probably fail under the system unit's ``ProtectSystem=strict`` / ``ProtectHome=read-only``."""

    job: str
    reason: str
    #: The paths outside the writable ones its command writes to (empty: a reason without one, an imported crontab).
    paths: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """``{"job", "reason", "paths"}``."""
        return {"job": self.job, "reason": self.reason, "paths": list(self.paths)}


#: ``> path``, ``>> path``, ``2> path``, ``&> path``, ``>| path`` (not ``>&2``): the target of an output redirection.
_REDIRECT = re.compile(r"(?:^|[^<>&\d])(?:\d|&)?>>?\|?\s*([^\s;|&<>()`]+)")
#: ``tee [-a] [-i] path``: the first file ``tee`` writes.
_TEE = re.compile(r"\btee\s+(?:-[a-z]+\s+)*([^\s;|&<>()`-][^\s;|&<>()`]*)")
#: The name ``scheduler import crontab`` derives: ``cron-<command>-<8 hex>`` (``-2``... for repeated lines).
_CRONTAB_NAME = re.compile(r"^cron-.+-[0-9a-f]{8}(?:-\d+)?$")


def _written_paths(command: str, working_dir: str | None) -> list[str]:
    """Paths a shell command visibly writes: the targets of its redirections and of ``tee``, made absolute.

    A cheap heuristic, not a shell parser: a target with a variable (other than ``$HOME``) or
    a command substitution is skipped, a relative one counts only when the job has a
    ``working_dir`` (otherwise it runs in the unit's working directory, which is writable), and
    writes by the programs themselves (``cp``, ``rsync``, ``logrotate``) are not seen.
    """
    home = str(Path.home())
    found = []
    for target in [*_REDIRECT.findall(command), *_TEE.findall(command)]:
        target = target.strip("'\"")
        if target.startswith(("$HOME/", "${HOME}/")):
            target = home + target[target.index("/"):]
        elif target.startswith("~"):
            target = os.path.expanduser(target)
        if not target or "$" in target or target.startswith("&"):
            continue
        if not target.startswith("/"):
            if not working_dir:
                continue
            target = os.path.join(os.path.expanduser(working_dir), target)
        found.append(os.path.normpath(target))
    return list(dict.fromkeys(found))


def sandbox_conflicts(store: Store, writable: tuple[str, ...]) -> list[SandboxConflict]:
    """Jobs of ``store`` that would probably fail under the system unit's sandbox, where only ``writable`` (its
    ``ReadWritePaths``) and ``SANDBOX_WRITABLE`` may be written: shell jobs whose command writes elsewhere
    (``_written_paths``), and jobs imported from a crontab (cron ran them on a writable system, often as root,
    in ``$HOME``, which is read-only here). A heuristic, for ``service install --system`` and ``doctor`` to warn.
    """
    allowed = [Path(p) for p in (*writable, *SANDBOX_WRITABLE)]
    with store.read() as tx:
        rows = tx.all("SELECT name, executor, session_target, payload_message, executor_options FROM jobs ORDER BY name")
    out = []
    for row in rows:
        if executor_name_of(row) != "shell":
            continue
        try:
            options = json.loads(row["executor_options"] or "{}")
        except ValueError:
            options = {}
        working_dir = options.get("working_dir") if isinstance(options, dict) else None
        outside = tuple(p for p in _written_paths(str(row["payload_message"] or ""), working_dir)
                        if not any(Path(p).is_relative_to(a) for a in allowed))
        if outside:
            out.append(SandboxConflict(job=row["name"], reason="writes outside the unit's writable paths", paths=outside))
        elif _CRONTAB_NAME.match(row["name"]):
            out.append(SandboxConflict(job=row["name"], reason="imported from a crontab: cron ran it on a writable system"
                                                             f" in {working_dir or '~'}; check what it writes"))
    return out


def sandbox_check(store: Store) -> dict[str, Any]:
    """``doctor``'s ``service_sandbox`` check: a warning (never a failure) naming the jobs ``sandbox_conflicts`` finds
    against the paths a system unit for ``store`` would leave writable."""
    conflicts = sandbox_conflicts(store, writable_paths(store.local_path))
    detail = (f"warning: {sandbox_summary(conflicts)}" if conflicts
              else "no job writes outside the system unit's writable paths, as far as a look at the commands tells")
    return {"check": "service_sandbox", "ok": True, "warning": bool(conflicts), "detail": detail,
            "jobs": [c.to_json() for c in conflicts]}


def sandbox_summary(conflicts: list[SandboxConflict]) -> str:
    """One line naming the jobs that may fail under the system unit's sandbox, and how to relax it."""
    named = "; ".join(f"{c.job} ({', '.join(c.paths)})" if c.paths else f"{c.job} ({c.reason})" for c in conflicts[:10])
    more = f" and {len(conflicts) - 10} more" if len(conflicts) > 10 else ""
    return (f"{len(conflicts)} job(s) may fail under the system unit's ProtectSystem=strict / ProtectHome=read-only:"
            f" {named}{more}; relax it with `systemctl edit` (docs/operations.md, Sandbox)")


def install(spec: UnitSpec, *, dry_run: bool = False) -> dict[str, Any]:
    """Write the unit file (atomically: beside, then renamed) unless ``dry_run``; returns path, text and next steps."""
    path = unit_path(spec.name, system=spec.system)
    text = spec.render()
    scope = [] if spec.system else ["--user"]
    steps = [" ".join(["systemctl", *scope, "daemon-reload"]), " ".join(["systemctl", *scope, "enable", "--now", spec.name])]
    result = {"unit": spec.name, "path": str(path), "scope": "system" if spec.system else "user", "text": text,
              "written": False, "replaced": path.exists(), "next": steps}
    if dry_run:
        return result
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(text)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except PermissionError as exc:
        raise SchedulerError("SERVICE_UNSUPPORTED", f"cannot write {path}: {exc.strerror}"
                                                    + (" (a system unit needs root: sudo)" if spec.system else "")) from None
    result["written"] = True
    return result


def verify(path: Path) -> dict[str, Any] | None:
    """``systemd-analyze verify`` of a unit file, when the tool exists: ``{"ok", "output"}``; None without it."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return None
    proc = subprocess.run([tool, "verify", str(path)], capture_output=True, text=True, timeout=60)
    return {"ok": proc.returncode == 0, "output": (proc.stdout + proc.stderr).strip()}


def _systemctl(args: list[str], *, system: bool) -> dict[str, Any]:
    tool = shutil.which("systemctl")
    if tool is None:
        return {"available": False, "state": None, "detail": "systemctl not found: cannot tell whether the unit runs"}
    try:
        proc = subprocess.run([tool, *([] if system else ["--user"]), *args], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"available": False, "state": None, "detail": f"systemctl failed: {exc}"}
    out = proc.stdout.strip()
    err = proc.stderr.strip()
    # is-active / is-enabled print the state on stdout even when they exit non-zero (inactive, disabled...)
    return {"available": bool(out), "state": out or None, "detail": err or out}


def status(name: str, *, system: bool) -> dict[str, Any]:
    """Is the unit file there (and is it ours), and what systemd says: ``is-active`` / ``is-enabled``."""
    name = check_unit_name(name)
    path = unit_path(name, system=system)
    installed = path.is_file()
    text = path.read_text() if installed else None
    active = _systemctl(["is-active", name], system=system)
    enabled = _systemctl(["is-enabled", name], system=system)
    exec_start = next((ln.split("=", 1)[1] for ln in (text or "").splitlines() if ln.startswith("ExecStart=")), None)
    db = next((ln.split("=", 2)[2].strip('"') for ln in (text or "").splitlines()
               if ln.startswith(("Environment=SCHEDULER_DB=", 'Environment="SCHEDULER_DB='))), None)
    return {"unit": name, "path": str(path), "scope": "system" if system else "user", "installed": installed,
            "ours": bool(text and text.startswith("# Written by `scheduler service install`")),
            "exec_start": exec_start, "database": db, "active": active["state"], "enabled": enabled["state"],
            "systemctl": active["detail"] if not active["available"] else None}


def require_manager(result: dict[str, Any]) -> None:
    """``SERVICE_MANAGER_UNREACHABLE`` (``details``: what ``status`` read) when systemd gave no answer: no
    ``systemctl``, or no bus to reach the (user) manager, so whether the unit runs is unknown."""
    if result["active"] is None:
        raise SchedulerError("SERVICE_MANAGER_UNREACHABLE",
                             f"cannot ask systemd whether {result['unit']} runs: {result['systemctl']}", details=result)


def uninstall(name: str, *, system: bool) -> dict[str, Any]:
    """Remove the unit file: ``SERVICE_NOT_INSTALLED`` when there is none, ``SERVICE_ACTIVE`` while systemd runs it,
    ``SERVICE_UNSUPPORTED`` for a file ``install`` did not write (left alone)."""
    name = check_unit_name(name)
    path = unit_path(name, system=system)
    if not path.is_file():
        raise SchedulerError("SERVICE_NOT_INSTALLED", f"no unit file at {path}")
    if not path.read_text().startswith("# Written by `scheduler service install`"):
        raise SchedulerError("SERVICE_UNSUPPORTED", f"{path} was not written by `scheduler service install`: left alone")
    scope = [] if system else ["--user"]
    active = _systemctl(["is-active", name], system=system)["state"]
    if active in ("active", "activating", "reloading", "deactivating"):
        raise SchedulerError("SERVICE_ACTIVE", f"{name} is {active}: `systemctl {' '.join(scope + ['disable', '--now', name])}`"
                                               " first, so the dispatcher drains before its unit disappears")
    path.unlink()
    return {"unit": name, "path": str(path), "removed": True, "next": [" ".join(["systemctl", *scope, "daemon-reload"])]}
