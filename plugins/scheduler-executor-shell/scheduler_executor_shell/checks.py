"""What the shell executor refuses when a job is added (``ShellExecutor.check_job``), before anything is stored.

* ``executor_options.working_dir`` must be absolute or start with ``~`` (the dispatcher's home, or
  the ``user`` account's), and be an existing directory on this host (``WORKING_DIR_INVALID``): a
  relative path would depend on the directory the dispatcher happened to start in, so it has no
  documented base and is refused. The run-time check stays (``WORKING_DIR_MISSING``): the directory
  may go away after the job was added.
* ``executor_options.env_allow`` may not name a variable the dynamic loader or libc acts on
  (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT``, every ``LD_*`` and ``DYLD_*``, ``GCONV_PATH``...;
  the one list is ``scheduler_toolkit.process.is_loader_variable``): ``ENV_NAME_RESERVED``.
"""

from __future__ import annotations

import os
import pwd
from typing import Any

from scheduler_toolkit.process import is_loader_variable


def _home_of(user: str | None) -> str | None:
    """The home directory ``~`` means for the job: the ``user`` account's, else the dispatcher's (None: unknown)."""
    if user is None:
        return os.path.expanduser("~")
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return None  # an unknown account is reported by its own check


def working_dir_problem(working_dir: str | None, user: str | None = None) -> str | None:
    """Why ``working_dir`` cannot be the command's directory on this host, or None when it can (or is unset)."""
    if not working_dir:
        return None
    if working_dir == "~" or working_dir.startswith("~/"):
        home = _home_of(user)
        if home is None:
            return None
        path = home + working_dir[1:]
    elif os.path.isabs(working_dir):
        path = working_dir
    else:
        return ("must be an absolute path or start with ~/ (a relative path would depend on where the dispatcher"
                " was started)")
    if not os.path.exists(path):
        return "does not exist on this host"
    if not os.path.isdir(path):
        return "is not a directory"
    return None


def shell_job_problems(options: Any) -> list[dict[str, str]]:
    """The shell executor's add-time problems of a job's validated ``ShellOptions`` (``{"field", "code", "error"}``)."""
    problems: list[dict[str, str]] = []
    if options is None:
        return problems
    problem = working_dir_problem(options.working_dir, getattr(options, "user", None))
    if problem:
        problems.append({"field": "executor_options.working_dir", "code": "WORKING_DIR_INVALID",
                         "error": f"executor_options.working_dir {problem}"})
    loader = [name for name in options.env_allow if is_loader_variable(name)]
    if loader:
        problems.append({"field": "executor_options.env_allow", "code": "ENV_NAME_RESERVED",
                         "error": f"executor_options.env_allow may not pass {', '.join(sorted(loader))}: the dynamic loader"
                                  " or libc loads code from it into the command (LD_*, DYLD_*, GCONV_PATH, ...)"})
    return problems
