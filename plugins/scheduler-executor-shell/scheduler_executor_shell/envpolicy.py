"""The environment a shell job sees (``shell_env_policy``).

* ``minimal`` (the default for new jobs): only a short allowlist of locale, identity
  and path variables from the dispatcher's environment.
* ``inherit`` (kept for migrated jobs): the dispatcher's whole environment, with a
  warning recorded on the run because it may expose credentials.

Both policies drop the scheduler's own configuration (``SCHEDULER_*``) and every
variable that looks like a credential (``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``,
``*_API_KEY``, ``DATABASE_URL``, ``PGPASSWORD``...). The executor adds the kernel's
``request.extra_env`` afterwards; those are set on purpose and are allowed.
This is a filter, not isolation: a job can still read files the dispatcher's user can.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

ENV_POLICIES = ("minimal", "inherit")

#: Variables ``minimal`` passes through (plus every ``LC_*``).
MINIMAL_ALLOWLIST = frozenset({"HOME", "LANG", "LOGNAME", "PATH", "SHELL", "TMPDIR", "TZ", "USER", "TERM"})

#: Warning recorded on every run that uses ``inherit``.
INHERIT_WARNING = "shell_env_policy=inherit exposes the dispatcher's full environment"

#: Exact names of well-known credential variables (compared upper-cased).
SECRET_NAMES = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AZURE_CLIENT_SECRET",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "GITLAB_TOKEN",
        "NPM_TOKEN",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "DATABASE_URL",
        "PGPASSWORD",
        "MYSQL_PWD",
        "REDIS_PASSWORD",
        "SSH_AUTH_SOCK",
        "VAULT_TOKEN",
    }
)

#: Name shapes of credential variables: the last ``_``-separated words (compared upper-cased).
_SECRET_SUFFIX = re.compile(
    r"(^|_)(TOKEN|SECRET|SECRET_KEY|CLIENT_SECRET|PASSWORD|PASSWD|PASSPHRASE|API_KEY|APIKEY|PRIVATE_KEY|"
    r"ACCESS_KEY|AUTH_TOKEN|ACCESS_TOKEN|REFRESH_TOKEN|CREDENTIALS|DATABASE_URL|DSN|WEBHOOK_URL)$"
)

_SCHEDULER_PREFIX = "SCHEDULER_"


def is_secret_name(name: str) -> bool:
    """True when a variable name looks like it holds a credential."""
    upper = name.upper()
    return upper in SECRET_NAMES or bool(_SECRET_SUFFIX.search(upper))


def is_scheduler_name(name: str) -> bool:
    """True for the scheduler's own configuration variables (``SCHEDULER_*``)."""
    return name.upper().startswith(_SCHEDULER_PREFIX)


def build_environment(policy: str, base_env: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The job environment for ``policy`` built from ``base_env`` (the dispatcher's), and a warning or None.

    Raises ``ValueError`` for an unknown policy (the spec validator rejects those
    earlier). The caller overlays ``request.extra_env`` on the result.
    """
    if policy not in ENV_POLICIES:
        raise ValueError(f"unknown shell_env_policy {policy!r}")
    env: dict[str, str] = {}
    for name, value in base_env.items():
        if is_scheduler_name(name) or is_secret_name(name):
            continue
        if policy == "minimal" and name not in MINIMAL_ALLOWLIST and not name.startswith("LC_"):
            continue
        env[name] = value
    return env, (INHERIT_WARNING if policy == "inherit" else None)
