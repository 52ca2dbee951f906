"""Names that moved: a module ``__getattr__`` that answers the old import for one more release, with a warning.

When a public name leaves a module (``scheduler.api.canonical_json`` is now
``scheduler_toolkit.canonical.canonical_json``), code that still imports it from the old place
keeps working for one release: the old module's ``__getattr__`` (PEP 562) returns the very
object of the new home and raises a ``DeprecationWarning`` that names the import to write
instead. Every such module uses this one helper::

    __getattr__ = moved_names(__name__, {
        "PooledHttpClient": "scheduler_toolkit.http",
        "canonical_json": ("scheduler_toolkit.canonical", "scheduler.base.canonical"),
    })

A name maps to its new module, or to ``(new module, kernel module)`` when the new home only
re-exports kernel code: the object is then read from the kernel module, so it is the same
object and the old import works even where the new home's distribution is not installed.
Nothing is imported until an old name is asked for, so the old module costs no more to import
than what it still defines, and a moved name never becomes a public attribute of it again
(it is not cached in the module: every use warns).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from typing import Any

import attrs

#: A moved name's new module, or (new module, the kernel module that holds the object the new module re-exports).
Move = str | tuple[str, str]


@attrs.frozen
class MovedNames:
    """The ``__getattr__`` of module ``module`` for the names ``moves`` lists (old name -> its new home)."""

    module: str
    moves: Mapping[str, Move]

    def new_module(self, name: str) -> str:
        """The module ``name`` is imported from now (what the warning tells callers to write)."""
        move = self.moves[name]
        return move if isinstance(move, str) else move[0]

    def __call__(self, name: str) -> Any:
        """The object ``name`` names in its new home, with a ``DeprecationWarning`` naming the new import.

        ``AttributeError`` for a name that never lived here (what a module without a
        ``__getattr__`` would raise); ``ModuleNotFoundError`` naming the new home when it
        cannot be imported (its distribution is not installed).
        """
        move = self.moves.get(name)
        if move is None:
            raise AttributeError(f"module {self.module!r} has no attribute {name!r}")
        new, source = (move, move) if isinstance(move, str) else move
        try:
            home = importlib.import_module(source)
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(f"{self.module}.{name} moved to {new}, which cannot be imported here: {exc}",
                                      name=exc.name) from exc
        value = getattr(home, name)
        warnings.warn(f"{self.module}.{name} moved: import it with `from {new} import {name}`"
                      f" (the old name goes away in the next release)", DeprecationWarning, stacklevel=2)
        return value


def moved_names(module: str, moves: Mapping[str, Move]) -> MovedNames:
    """The module ``__getattr__`` for names that left ``module`` (``__getattr__ = moved_names(__name__, {...})``)."""
    return MovedNames(module, dict(moves))


__all__ = ["Move", "MovedNames", "moved_names"]
