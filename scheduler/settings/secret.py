"""Secret references: a setting never holds a secret, only where to read it when it is used.

In the settings file a secret field is a table with one key, ``credential``, whose
value is a reference ``SCHEME:TARGET``: ``{credential = "env:SLACK_TOKEN"}`` or
``{credential = "file:/run/secrets/slack"}``. An environment override of a secret
field carries the bare reference (``SCHEDULER_CHANNELS_SLACK_TOKEN=env:SLACK_TOKEN``).
Literal text is refused at load. ``SecretRef.resolve()`` reads the value at use
time, in the kernel or plugin process, and raises ``SECRET_UNRESOLVED`` when it is
missing. Schemes live in a small registry (``env`` and ``file`` built in) that
credential providers extend with ``register_secret_scheme``. Messages never repeat
the text of a rejected value: it may be a pasted secret.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import attrs

from scheduler.base.entry_points import entry_points_of, is_disabled
from scheduler.base.errors import SchedulerError
from scheduler.base.plugin_kinds import kind_named

_REFERENCE = re.compile(r"^([a-z][a-z0-9+.-]{0,31}):(.+)$", re.DOTALL)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class SecretScheme:
    """One reference scheme: how to read a target, and how to check one at load time."""

    name: str
    #: Returns the secret text, or None when the target does not exist; may raise ``OSError``.
    read: Callable[[str], str | None]
    #: Returns an error message for a malformed target (checked at load), or None.
    check: Callable[[str], str | None] | None = None


_SCHEMES: dict[str, SecretScheme] = {}


def register_secret_scheme(
    name: str, read: Callable[[str], str | None], *, check: Callable[[str], str | None] | None = None
) -> None:
    """Add (or replace) a reference scheme, so ``{credential = "NAME:..."}`` becomes valid.

    Credential providers call this when they are imported; a reference is checked
    against the registry when the settings are loaded, so the provider registering
    a scheme must be imported before settings that use it are validated.
    """
    if not _REFERENCE.match(f"{name}:x"):
        raise ValueError(f"bad secret scheme name {name!r}: lower-case letters, digits, '+', '.', '-'")
    _SCHEMES[name] = SecretScheme(name=name, read=read, check=check)


#: The entry-point group through which installed distributions offer more schemes (``command:``, ``oauth2:``).
SCHEME_GROUP = kind_named("secret_scheme").group
#: Scheme names looked up in ``SCHEME_GROUP`` and not found there (a miss is not looked up again in this process).
_missing: set[str] = set()


def load_scheme(name: str) -> bool:
    """Register scheme ``name`` from the ``scheduler.secret_schemes`` entry point of that name; whether it now exists.

    Called only when a reference names a scheme that is not registered yet, so settings
    that use only ``env:``/``file:`` import nothing. The entry point's object carries
    ``name`` (equal to the entry point's), ``read`` and optionally ``check``, as
    ``SecretScheme`` does. A scheme switched off by ``SCHEDULER_DISABLE_PLUGINS``
    (``secret_schemes:NAME``), absent, or broken stays unknown (the reference is refused).
    """
    if name in _SCHEMES:
        return True
    if name in _missing:
        return False
    found = [ep for ep in entry_points_of(SCHEME_GROUP) if ep.name == name]
    if not found or is_disabled(SCHEME_GROUP, name):
        _missing.add(name)
        return False
    try:
        target = found[0].load()
        read, check = target.read, getattr(target, "check", None)
        if getattr(target, "name", name) != name or not callable(read) or (check is not None and not callable(check)):
            raise TypeError("not a scheme (name, read, check)")
    except Exception:  # a broken scheme is an unknown scheme: the reference is refused, never read
        log.warning("secret scheme %r from %s cannot be loaded", name, SCHEME_GROUP, exc_info=True)
        _missing.add(name)
        return False
    register_secret_scheme(name, read, check=check)
    return True


def secret_schemes() -> list[str]:
    """The registered scheme names, sorted (for messages and ``scheduler config``)."""
    return sorted(_SCHEMES)


def not_a_reference() -> str:
    """The message for literal text where a secret reference belongs (it never quotes the text)."""
    return (f"secret values must be references such as {{credential = \"env:NAME\"}} or {{credential = \"file:/path\"}} "
            f"(known schemes: {', '.join(secret_schemes())}), never the secret itself")


@attrs.frozen
class SecretRef:
    """A reference to a secret (``env:NAME``, ``file:/path``); the declared type of every secret setting."""

    scheme: str
    target: str

    @classmethod
    def parse(cls, reference: str) -> SecretRef:
        """A reference from its ``SCHEME:TARGET`` text; ``ValueError`` (never quoting the text) when it is not one."""
        match = _REFERENCE.match(reference) if isinstance(reference, str) else None
        if match is None or (match.group(1) not in _SCHEMES and not load_scheme(match.group(1))):
            raise ValueError(not_a_reference())
        scheme = _SCHEMES[match.group(1)]
        problem = scheme.check(match.group(2)) if scheme.check else None
        if problem:
            raise ValueError(f"a {scheme.name}: reference needs {problem}")
        return cls(scheme.name, match.group(2))

    @property
    def reference(self) -> str:
        """The reference text, safe to show (it says where the secret is, not what it is)."""
        return f"{self.scheme}:{self.target}"

    def to_json(self) -> dict[str, str]:
        """The settings-file form, ``{"credential": "env:NAME"}`` (what ``scheduler config`` shows)."""
        return {"credential": self.reference}

    def resolve(self) -> str:
        """Read the secret now; ``SECRET_UNRESOLVED`` naming the reference when it is missing, unreadable or empty."""
        scheme = _SCHEMES.get(self.scheme) or (_SCHEMES.get(self.scheme) if load_scheme(self.scheme) else None)
        if scheme is None:
            raise SchedulerError("SECRET_UNRESOLVED", f"secret {self.reference}: no scheme {self.scheme!r} is registered")
        try:
            value = scheme.read(self.target)
        except OSError as exc:
            raise SchedulerError("SECRET_UNRESOLVED", f"secret {self.reference} cannot be read: {exc.strerror or exc}") from None
        if value is None:
            raise SchedulerError("SECRET_UNRESOLVED", f"secret {self.reference} does not exist")
        if value == "":
            raise SchedulerError("SECRET_UNRESOLVED", f"secret {self.reference} is empty")
        return value

    def __str__(self) -> str:
        return self.reference


def _check_env(target: str) -> str | None:
    return None if _ENV_NAME.match(target) else "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"


def _read_env(target: str) -> str | None:
    return os.environ.get(target)


def _check_file(target: str) -> str | None:
    return None if os.path.isabs(os.path.expanduser(target)) else "an absolute path (file:/path or file:~/path)"


def _read_file(target: str) -> str | None:
    path = Path(target).expanduser()
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    # one trailing line end is how editors and `echo` save a secret; it is not part of it
    return text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")


register_secret_scheme("env", _read_env, check=_check_env)
register_secret_scheme("file", _read_file, check=_check_file)
