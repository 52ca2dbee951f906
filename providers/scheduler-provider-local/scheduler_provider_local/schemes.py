"""Settings references through these providers: ``{credential = "command:NAME"}`` and a stricter ``file:``.

The kernel's registry of reference schemes (``scheduler_toolkit.settings.register_secret_scheme``)
has ``env:`` and ``file:`` built in; this module adds

* ``command:NAME``: the standard output of the command ``NAME`` of
  ``[providers.command] commands``, with the same limits as the ``command`` driver
  (timeout, output cap, no shell, small environment);
* optionally a ``file:`` that, unlike the built-in one, refuses a file that is not
  regular, not owned by the dispatcher's user (or root), accessible by group or other,
  or larger than 64 KiB (symlinks are followed: the settings file is trusted).

Nothing is registered on import (registration changes process-wide state, and
importing a plugin must not): call ``register_secret_schemes()`` once, or let a kernel
that loads the ``scheduler.secret_schemes`` entry points do it (``COMMAND_SCHEME``).
"""

from __future__ import annotations

import errno
import os

import attrs
from scheduler_toolkit.settings import plugin_settings, register_secret_scheme

from scheduler_provider_local.command import COMMAND_NAME, CommandFailed, CommandSettings, run_named_command
from scheduler_provider_local.file import read_private_file


@attrs.frozen
class Scheme:
    """One reference scheme as ``register_secret_scheme`` takes it: name, reader, load-time check."""

    name: str
    read: object
    check: object

    def register(self) -> None:
        """Add (or replace) this scheme in the kernel's registry."""
        register_secret_scheme(self.name, self.read, check=self.check)  # type: ignore[arg-type]


def read_command(target: str) -> str | None:
    """The output of configured command ``target``; None when no such command is configured.

    Other failures are ``OSError`` whose ``strerror`` names the code and the command
    (``SecretRef.resolve`` reports them as ``SECRET_UNRESOLVED``), never its output.
    """
    settings = plugin_settings("credential", "command", CommandSettings)
    if target not in settings.commands:
        return None
    try:
        value, _ = run_named_command(target, settings, os.environ)
    except CommandFailed as failed:
        raise OSError(errno.EIO, f"{failed.code}: {failed.message}") from None
    if isinstance(value, bytes):
        raise OSError(errno.EINVAL, f"command {target!r} printed bytes that are not UTF-8 text")
    return value


def check_command(target: str) -> str | None:
    """Load-time check of a ``command:`` target."""
    return None if COMMAND_NAME.match(target) else "the name of a [providers.command] command ([a-z0-9][a-z0-9_.-]{0,63})"


def check_file(target: str) -> str | None:
    """Load-time check of a ``file:`` target (as the built-in one: an absolute path)."""
    return None if os.path.isabs(os.path.expanduser(target)) else "an absolute path (file:/path or file:~/path)"


COMMAND_SCHEME = Scheme("command", read_command, check_command)
STRICT_FILE_SCHEME = Scheme("file", read_private_file, check_file)


def register_secret_schemes(*, strict_file: bool = False) -> list[str]:
    """Register ``command:`` (and, with ``strict_file``, replace ``file:`` by the checked reader); the names registered."""
    schemes = [COMMAND_SCHEME, *([STRICT_FILE_SCHEME] if strict_file else [])]
    for scheme in schemes:
        scheme.register()
    return [s.name for s in schemes]
