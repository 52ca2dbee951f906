"""Jobs that run as another OS account (``executor_options.user``): who added them, and who may.

A job whose executor options name a ``user`` (the shell executor runs its command as that
account, as cron does for ``/etc/crontab`` lines) is root-equivalent for whoever adds it. So:

* at add and update (``stamp_adder``) the kernel records the adding process's OS identity in the
  same options object (``added_by``, ``added_by_uid``: the effective uid and its password-database
  name, never ``$USER``), overwriting whatever the spec said. The options object is part of the
  execution artifact (its ``target`` section), so an edited row no longer matches its artifact
  and is refused (``EXECUTION_ARTIFACT_MISMATCH``) before anything runs;
* the adder must be root or listed in ``[identity] run_as_users`` of a root-owned settings file
  that nobody else can write (``RUN_AS_NOT_ALLOWED`` otherwise, nothing stored);
* every run checks again (``check_at_run``): the dispatcher must run as root (``RUN_AS_NOT_ROOT``)
  and the recorded adder must still be allowed (``RUN_AS_NOT_ALLOWED``).

Jobs without ``user`` are untouched (no stamp), so their artifacts do not change.
"""

from __future__ import annotations

import os
import pwd
import stat as st
from pathlib import Path

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core.spec import JobSpec
from scheduler.settings import current_settings

#: The executor option that names the account a job runs as.
USER_KEY = "user"
ADDED_BY_KEY, ADDED_BY_UID_KEY = "added_by", "added_by_uid"


def runs_as(spec: JobSpec) -> str | None:
    """The account ``spec`` runs as (``executor_options.user``), or None for the dispatcher's own."""
    value = spec.executor_options.get(USER_KEY) if isinstance(spec.executor_options, dict) else None
    return value if isinstance(value, str) and value else None


def adder_identity() -> tuple[str, int]:
    """``(name, effective uid)`` of this process from the password database (``uid:N`` without an entry)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return f"uid:{uid}", uid


def _trusted_root_file(path: Path) -> bool:
    """A settings file (and its directory) owned by root that group and others cannot write (a sticky dir is fine)."""
    try:
        for item in (path, path.parent):
            info = os.stat(item)
            if info.st_uid != 0 or info.st_mode & (st.S_IWGRP | st.S_IWOTH):
                if item == path.parent and info.st_uid == 0 and info.st_mode & st.S_ISVTX:
                    continue
                return False
    except OSError:
        return False
    return True


def _listed(name: str, uid: int) -> bool:
    """Whether ``[identity] run_as_users`` of a trusted (root-owned) settings file names this account."""
    resolved = current_settings().kernel.get("identity")
    if resolved is None:
        return False
    entries = tuple(getattr(resolved.value, "run_as_users", ()) or ())
    source = resolved.sources.get("run_as_users", "default")
    if not entries or not source.startswith("file:") or not _trusted_root_file(Path(source[5:])):
        return False
    return any(entry == name or entry == f"uid:{uid}" for entry in entries)


def may_name_users(name: str, uid: int) -> bool:
    """Root, or an account listed in a trusted ``[identity] run_as_users``: who may add a job naming ``user``."""
    return uid == 0 or _listed(name, uid)


def stamp_adder(spec: JobSpec) -> JobSpec:
    """``spec`` with the adding process's identity recorded in its executor options, when it names a ``user``.

    Refuses (``RUN_AS_NOT_ALLOWED``, nothing stored) an adder who may not name other accounts.
    """
    user = runs_as(spec)
    if user is None:
        return spec
    name, uid = adder_identity()
    if not may_name_users(name, uid):
        raise SchedulerError("RUN_AS_NOT_ALLOWED", f"job {spec.name!r} runs as user {user!r}: only root, or an account"
                             " listed in [identity] run_as_users of a root-owned settings file, may add such a job"
                             f" (you are {name}, uid {uid})",
                             details={"field": "executor_options.user", "account": name, "uid": uid})
    options = {**spec.executor_options, ADDED_BY_KEY: name, ADDED_BY_UID_KEY: uid}
    return attrs.evolve(spec, executor_options=options)


def check_at_run(spec: JobSpec) -> None:
    """Before a run of a job naming ``user``: the dispatcher is root and the recorded adder may name users."""
    user = runs_as(spec)
    if user is None:
        return
    if os.geteuid() != 0:
        raise SchedulerError("RUN_AS_NOT_ROOT", f"job {spec.name!r} runs as user {user!r}, which needs a dispatcher"
                             f" running as root (this one runs as uid {os.geteuid()})")
    name, uid = spec.executor_options.get(ADDED_BY_KEY), spec.executor_options.get(ADDED_BY_UID_KEY)
    if not isinstance(uid, int) or isinstance(uid, bool) or not isinstance(name, str) or not may_name_users(name, uid):
        raise SchedulerError("RUN_AS_NOT_ALLOWED", f"job {spec.name!r} runs as user {user!r} but was added by"
                             f" {name!r} (uid {uid!r}), who may not name other accounts")
