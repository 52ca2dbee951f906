"""Formerly the CLI's output contract for plugin commands; it is ``scheduler_toolkit.cli`` now (``emit``, ``table``).

Both names still import from here for one release, with a ``DeprecationWarning`` naming
their new import; the module defines no names of its own.
"""

from __future__ import annotations

from scheduler.base.deprecation import moved_names as _moved_names

__all__: list[str] = []

#: Every name this module exported -> where it lives now (one release).
__getattr__ = _moved_names(__name__, dict.fromkeys(("emit", "table"), ("scheduler_toolkit.cli", "scheduler.toolkit.cli_output")))
