"""The environment a shell job sees (``executor_options.env_policy`` and ``env_allow``).

* ``minimal`` (the default for new jobs): only a short allowlist of locale, identity
  and path variables from the dispatcher's environment.
* ``inherit`` (kept for migrated jobs): the dispatcher's whole environment, with a
  warning recorded on the run because it may expose credentials.

Both policies drop the scheduler's own configuration (``SCHEDULER_*``), every
variable whose name looks like a credential (``*_KEY``, ``*_PASS*``, ``*_SECRET*``,
``*_TOKEN*``, ``*_PAT``, ``*WEBHOOK*``, ``DATABASE_URL``, ``PGPASSWORD``... see
``_SECRET_SHAPE``) and every variable whose value holds a URL with a password
(``HTTP_PROXY=http://user:pass@proxy``). ``env_allow`` lets named variables through. The executor adds the kernel's
``request.extra_env`` afterwards; those are set on purpose and are allowed.
This is a filter, not isolation: a job can still read files the dispatcher's user can.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

ENV_POLICIES = ("minimal", "inherit")

#: Variables ``minimal`` passes through (plus every ``LC_*``).
MINIMAL_ALLOWLIST = frozenset({"HOME", "LANG", "LOGNAME", "PATH", "SHELL", "TMPDIR", "TZ", "USER", "TERM"})

#: Warning recorded on every run that uses ``inherit``.
INHERIT_WARNING = "env_policy=inherit exposes the dispatcher's full environment"

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

#: Name shapes of credential variables (compared upper-cased): ``*_KEY``, ``*_PASS*``,
#: ``*_PWD``, ``*_SECRET*``, ``*_TOKEN*``, ``*_PAT``, ``*_SK``, ``*WEBHOOK*``, ``*CREDENTIAL*``,
#: ``*PRIVATE*``, ``*_DSN``, ``*DATABASE_URL*`` and the same words standing alone.
_SECRET_SHAPE = re.compile(
    r"(^|_)(KEY|APIKEY|PAT|SK|DSN)$|_PWD$"
    r"|_(PASS|SECRET|TOKEN)|^(PASS|PASSWD|PASSWORD|PASSPHRASE|SECRET|TOKEN)(_|$)"
    r"|WEBHOOK|CREDENTIAL|PRIVATE|DATABASE_URL|AUTH"
)
#: A URL with a password in it (``scheme://user:pass@host``): proxies and connection strings.
_URL_USERINFO = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@]*@", re.IGNORECASE)

_SCHEDULER_PREFIX = "SCHEDULER_"


def is_secret_name(name: str) -> bool:
    """True when a variable name looks like it holds a credential."""
    upper = name.upper()
    return upper in SECRET_NAMES or bool(_SECRET_SHAPE.search(upper))


def has_url_credentials(value: str) -> bool:
    """True when a value carries a URL with a password (``http://user:pass@proxy``)."""
    return bool(_URL_USERINFO.search(value))


def is_scheduler_name(name: str) -> bool:
    """True for the scheduler's own configuration variables (``SCHEDULER_*``)."""
    return name.upper().startswith(_SCHEDULER_PREFIX)


def build_environment(
    policy: str, base_env: Mapping[str, str], *, allow: Iterable[str] = ()
) -> tuple[dict[str, str], str | None]:
    """The job environment for ``policy`` built from ``base_env`` (the dispatcher's), and a warning or None.

    ``allow`` names variables to pass although the rules would drop them (the job's
    ``env_allow`` option): the explicit way for the rare job that needs one. Raises
    ``ValueError`` for an unknown policy (the options validator rejects those earlier).
    The caller overlays ``request.extra_env`` on the result.
    """
    if policy not in ENV_POLICIES:
        raise ValueError(f"unknown env_policy {policy!r}")
    # The dispatcher's environment is the same run after run: the filtering (a regex or two per variable) is
    # done once per distinct input; every caller gets a fresh dict it may change.
    env = dict(_filtered(policy, frozenset(allow), tuple(base_env.items())))
    return env, (INHERIT_WARNING if policy == "inherit" else None)


@functools.lru_cache(maxsize=16)
def _filtered(policy: str, allowed: frozenset[str], items: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """``build_environment``'s rules applied to ``items`` (a pure function of its arguments, hence cached)."""
    env: dict[str, str] = {}
    for name, value in items:
        if name in allowed:
            env[name] = value
            continue
        if is_scheduler_name(name) or is_secret_name(name) or has_url_credentials(value):
            continue
        if policy == "minimal" and name not in MINIMAL_ALLOWLIST and not name.startswith("LC_"):
            continue
        env[name] = value
    return tuple(env.items())
