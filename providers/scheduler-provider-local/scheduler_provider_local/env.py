"""``env``: a credential read from one variable of the dispatcher's own environment.

The binding's ``ref`` is the variable name. ``[providers.env]`` narrows which
variables jobs may name (``allow`` / ``deny`` glob patterns, deny wins); by default
every variable except the scheduler's own ``SCHEDULER_*`` settings may be read.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping

import attrs
from scheduler_toolkit.settings import plugin_settings

from scheduler.api import CredentialBinding, CredentialContext, ResolvedCredential
from scheduler_provider_local.errors import CredentialError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _patterns(value: list[str]) -> str | None:
    bad = [p for p in value if not p or not re.fullmatch(r"[A-Za-z0-9_*?\[\]!]+", p)]
    return "each pattern is a variable name with * ? [...] wildcards" if bad else None


@attrs.frozen(kw_only=True)
class EnvSettings:
    """``[providers.env]``: which variables of the dispatcher's environment jobs may name."""

    allow: list[str] = attrs.field(factory=lambda: ["*"], metadata={
        "check": _patterns, "doc": "Glob patterns of variables a binding may read (case-sensitive); default every variable."})
    deny: list[str] = attrs.field(factory=lambda: ["SCHEDULER_*"], metadata={
        "check": _patterns, "doc": "Glob patterns never readable, even when allowed; default the scheduler's own SCHEDULER_* settings."})


def check_env_name(name: str) -> str | None:
    """Why ``name`` is not a variable name, or None."""
    return None if ENV_NAME.match(name) else "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"


class EnvCredentialProvider:
    """Credential driver ``env`` (group ``scheduler.credential_providers``)."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset()  # a variable cannot be refreshed or revoked
    settings_class = EnvSettings

    def __init__(self, *, environ: Mapping[str, str] | None = None) -> None:
        """``environ`` stands for the dispatcher's environment (default: ``os.environ``, read at each resolve)."""
        self._environ = environ
        self._settings: EnvSettings | None = None

    def configure(self, settings: EnvSettings) -> None:
        """The loader hands over the validated ``[providers.env]`` table."""
        self._settings = settings

    def _current(self) -> EnvSettings:
        return self._settings if self._settings is not None else plugin_settings("credential", "env", EnvSettings)

    def resolve(self, binding: CredentialBinding, context: CredentialContext) -> ResolvedCredential:
        """The variable's value; ``CREDENTIAL_*`` when it is not a name, not allowed, unset or empty."""
        name = binding.ref
        where = {"binding": binding.name, "provider": "env", "ref": name}
        problem = check_env_name(name)
        if problem:
            raise CredentialError("CREDENTIAL_REF_INVALID", f"credential {binding.name!r}: env ref must be {problem}",
                                  details=where)
        settings = self._current()
        if not any(fnmatch.fnmatchcase(name, p) for p in settings.allow) or any(fnmatch.fnmatchcase(name, p) for p in settings.deny):
            raise CredentialError("CREDENTIAL_REF_DENIED",
                                  f"credential {binding.name!r}: variable {name} is not allowed by [providers.env] allow/deny",
                                  details=where)
        environ = os.environ if self._environ is None else self._environ
        value = environ.get(name)
        if value is None:
            raise CredentialError("CREDENTIAL_NOT_FOUND", f"credential {binding.name!r}: variable {name} is not set in the "
                                  "dispatcher's environment", details=where)
        if value == "":
            raise CredentialError("CREDENTIAL_EMPTY", f"credential {binding.name!r}: variable {name} is empty", details=where)
        return ResolvedCredential.for_binding(binding, value, metadata={"provider": "env", "source": f"env:{name}"})
