"""``scheduler import crontab``: a user's crontab (``crontab -l`` by default) as scheduler jobs.

Each line is one of:

* a job: five time fields (or an ``@daily``-style macro) and a command. The command ends at
  the first unescaped ``%``; the rest is its standard input with every unescaped ``%`` turned
  into a newline; ``\\%`` is a literal ``%`` in both (cron's rules). Comment lines directly
  above a job (no blank line between) become its description. ``@reboot`` has no equivalent
  here and is reported (``UNSUPPORTED_SCHEDULE``);
* an environment assignment ``KEY=value`` (quotes optional), in force for the jobs below it:
  ``CRON_TZ`` (and ``TZ``) set the zone the schedule is read in, ``SHELL`` the shell that runs
  the command (``SHELL -c 'command'`` when it is not ``/bin/sh``), ``HOME`` the working
  directory (cron starts commands in ``$HOME``), ``MAILTO`` is reported (mail of output is not
  imported: use a delivery channel), anything else is exported to the command's shell;
* a comment or a blank line; anything else is reported (``UNSUPPORTED_LINE``), never dropped.

A system crontab (``--system``, and always ``/etc/crontab`` and files under ``/etc/cron.d/``) has
a user field after the schedule (``m h dom mon dow USER command``): the job runs as that account
(``executor_options.user``, see ``scheduler.core.run_as``). A user that does not exist here is
``RUN_AS_USER_UNKNOWN``, an importer who may not name other accounts ``RUN_AS_NOT_ALLOWED``; such
a line is reported, never imported with its user as the first word of the command.

The time fields must be Vixie/cronie syntax (numbers, ``*``, ranges, steps, lists, month and day
names): croniter's extensions that cron refuses (``L``, ``W``, ``#``, ``?``, ``H``) are
``CRON_SYNTAX_UNSUPPORTED``.

Job names are derived from the line (``cron-<first word>-<8 hex of its SHA-256>``, ``-2`` ...
for repeated identical lines), so importing the same crontab twice skips what is there.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.core.run_as import adder_identity, may_name_users
from scheduler.ops.importers import ImportItem, export_prefix

_ENV_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")
_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
#: What ``crontab -l`` says (cronie, vixie, busybox) for a user who has none: an empty import.
_NO_CRONTAB = re.compile(r"no crontab for", re.IGNORECASE)


def read_crontab(source: str | None, *, binary: str = "crontab") -> tuple[str, str]:
    """``(location, text)`` of a crontab file, standard input (``-``) or ``crontab -l``."""
    if source == "-":
        return "-", sys.stdin.read()
    if source is not None:
        try:
            return source, Path(source).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SchedulerError("IMPORT_SOURCE_NOT_FOUND", f"{source}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SchedulerError("IMPORT_SOURCE_INVALID", f"cannot read {source} as UTF-8 text: {exc}") from None
    try:
        done = subprocess.run([binary, "-l"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise SchedulerError("IMPORT_SOURCE_NOT_FOUND", f"{binary}: not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError("CRONTAB_COMMAND_FAILED", f"{binary} -l did not answer within 30 s") from None
    if done.returncode != 0:
        if _NO_CRONTAB.search(done.stderr):
            return f"{binary} -l", ""
        raise SchedulerError("CRONTAB_COMMAND_FAILED", f"{binary} -l exited {done.returncode}: {done.stderr.strip()[:500]}")
    return f"{binary} -l", done.stdout


def split_percent(text: str) -> tuple[str, str | None]:
    """Cron's ``%`` rules: ``(command, stdin or None)``; ``\\%`` is a literal percent in both parts."""
    command: list[str] = []
    stdin: list[str] | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] == "%":
            (command if stdin is None else stdin).append("%")
            i += 2
            continue
        if ch == "%":
            if stdin is None:
                stdin = []
            else:
                stdin.append("\n")
        else:
            (command if stdin is None else stdin).append(ch)
        i += 1
    return "".join(command), None if stdin is None else "".join(stdin)


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def local_zone() -> str | None:
    """The host's IANA zone name (``$TZ``, ``/etc/timezone``, or the ``/etc/localtime`` link), or None."""
    tz = os.environ.get("TZ", "").lstrip(":")
    if tz and "/" in tz and not tz.startswith("/"):
        return tz
    try:
        name = Path("/etc/timezone").read_text().strip()
        if name:
            return name
    except OSError:
        pass
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return None
    marker = "zoneinfo/"
    return target.split(marker, 1)[1] if marker in target else None


def _slug(command: str) -> str:
    first = command.strip().split(maxsplit=1)[0] if command.strip() else "job"
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.basename(first)).strip("-.") or "job"
    return base[:32]


#: Files read as system crontabs (with a user field) whatever the flag says.
SYSTEM_FILE, SYSTEM_DIR = "/etc/crontab", "/etc/cron.d/"
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
#: One element of a Vixie/cronie time field: ``*`` or ``a`` or ``a-b``, optionally ``/step``.
_ELEMENT_RE = re.compile(r"^(\*|[0-9a-z]+(-[0-9a-z]+)?)(/[0-9]+)?$")


def is_system_path(source: str | None) -> bool:
    """Whether ``source`` is ``/etc/crontab`` or a file under ``/etc/cron.d/`` (always read with a user field)."""
    if source is None or source == "-":
        return False
    path = os.path.abspath(source)
    return path == SYSTEM_FILE or path.startswith(SYSTEM_DIR)


def vixie_problem(expr: str) -> str | None:
    """Why the five time fields ``expr`` are not Vixie/cronie syntax (croniter accepts more), or None."""
    for index, field in enumerate(expr.lower().split()):
        names = _MONTHS if index == 3 else _DAYS if index == 4 else ()
        for element in field.split(","):
            match = _ELEMENT_RE.match(element)
            values = match.group(1).split("-") if match and match.group(1) != "*" else []
            if not match or any(not (v.isdigit() or v in names) for v in values):
                return f"time field {index + 1} {field!r}: {element!r} is not cron syntax (L, W, #, ? and H are croniter extensions cron refuses)"
    return None


def parse(text: str, *, default_tz: str | None = None, system: bool = False) -> tuple[list[ImportItem], dict[str, Any]]:
    """The crontab's job items (pending, or failed with a code) and what its environment lines did.

    ``system``: the lines have a user field (``/etc/crontab`` format).
    """
    items: list[ImportItem] = []
    env: dict[str, str] = {}
    settings: dict[str, Any] = {"tz": default_tz, "shell": None, "home": None}
    environment: list[dict[str, Any]] = []
    comments: list[str] = []
    names: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            comments = []
            continue
        if line.startswith("#"):
            comments.append(line.lstrip("#").strip())
            continue
        match = _ENV_RE.match(line)
        if match:
            key, value = match.group(1), _unquote(match.group(2))
            environment.append({"line": number, "key": key, "value": value, "handled": _apply_env(key, value, env, settings)})
            comments = []
            continue
        item = _job(number, line, comments, env, settings, names, system=system)
        items.append(item)
        comments = []
    return items, {"environment": environment}


def _apply_env(key: str, value: str, env: dict[str, str], settings: dict[str, Any]) -> str:
    """Take one ``KEY=value`` line into effect for the lines below; say how it was handled."""
    if key == "CRON_TZ":
        settings["tz"] = value
        return "schedule_tz of the jobs below"
    if key == "TZ":
        settings["tz"] = value
        env[key] = value
        return "schedule_tz of the jobs below, and exported to their commands"
    if key == "SHELL":
        settings["shell"] = value
        return "the shell that runs the commands below"
    if key == "HOME":
        settings["home"] = value
        env[key] = value
        return "working_dir of the jobs below, and exported to their commands"
    if key == "MAILTO":
        return "not imported: cron mails output; set a delivery channel (delivery_mode, delivery_channel) instead"
    env[key] = value
    return "exported to the commands below"


def _job(number: int, line: str, comments: list[str], env: dict[str, str], settings: dict[str, Any],
         names: dict[str, int], *, system: bool = False) -> ImportItem:
    """One job line as an item (pending with a spec, or failed with a code)."""
    item = ImportItem(source_id=f"line {number}", extra={"line": number, "text": line})
    user: str | None = None
    if line.startswith("@"):
        macro, _, rest = line.partition(" ")
        macro = macro.lower()
        if macro == "@reboot":
            return item.fail("UNSUPPORTED_SCHEDULE", "@reboot has no equivalent here (jobs run on a schedule, not at boot)")
        if macro not in _MACROS:
            return item.fail("UNSUPPORTED_LINE", f"unknown macro {macro}")
        expr, command_text = macro, rest.strip()
        if system:
            user, _, command_text = command_text.partition(" ")
            command_text = command_text.strip()
    else:
        fields = line.split(None, 6 if system else 5)
        if len(fields) < (7 if system else 6):
            what = "five time fields, a user and a command" if system else "five time fields and a command"
            return item.fail("UNSUPPORTED_LINE", f"neither a job ({what}), an assignment nor a comment")
        expr, command_text = " ".join(fields[:5]), fields[-1]
        if system:
            user = fields[5]
        problem = vixie_problem(expr)
        if problem is not None:
            return item.fail("CRON_SYNTAX_UNSUPPORTED", problem)
    if system:
        item.extra["user"] = user
        if not user or not command_text:
            return item.fail("UNSUPPORTED_LINE", "a system crontab job needs a user and a command after the schedule")
        refusal = _run_as_problem(user)
        if refusal is not None:
            return item.fail(*refusal)
    command, stdin = split_percent(command_text)
    if not command.strip():
        return item.fail("UNSUPPORTED_LINE", "the job line has no command")
    keyed = f"{expr}\n{command_text}" if user is None else f"{expr}\n{user}\n{command_text}"
    digest = hashlib.sha256(keyed.encode()).hexdigest()[:8]
    name = f"cron-{_slug(command)}-{digest}"
    names[name] = names.get(name, 0) + 1
    if names[name] > 1:
        name = f"{name}-{names[name]}"
    shell = settings["shell"]
    run = command if not shell or shell in ("/bin/sh", "sh") else f"{shell} -c {_quote(command)}"
    options: dict[str, Any] = {"working_dir": settings["home"] or "~"}
    if stdin is not None:
        options["stdin_text"] = stdin
    if user is not None:
        options["user"] = user
    spec: dict[str, Any] = {"name": name, "schedule_kind": "cron", "schedule_cron": expr,
                            "payload_message": export_prefix(env) + run, "executor_options": options}
    if settings["tz"]:
        spec["schedule_tz"] = settings["tz"]
    else:
        item.warnings.append("the host's time zone is unknown: the schedule is read in UTC (set CRON_TZ to choose)")
    if comments:
        spec["description"] = "\n".join(comments)
    item.name, item.spec, item.exact_schedule = name, spec, True
    return item


def _run_as_problem(user: str) -> tuple[str, str] | None:
    """``(code, message)`` when a system line's ``user`` cannot be honoured here, else None."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return "RUN_AS_USER_UNKNOWN", f"user {user!r} does not exist on this host: the line is not imported"
    name, uid = adder_identity()
    if not may_name_users(name, uid):
        return "RUN_AS_NOT_ALLOWED", (f"the job runs as {user!r}: only root, or an account listed in [identity]"
                                      f" run_as_users of a root-owned settings file, may import it (you are {name})")
    return None


def _quote(text: str) -> str:
    return shlex.quote(text)
