"""The observers core tells about committed run transitions, and asks for dispatch vetoes.

Core calls them through this Protocol only; ``scheduler.plugins.hooks.Hooks`` (pluggy) is the
implementation the composition root (``scheduler.runtime``) hands in. Code that commits a
transition without naming its observers (``committing(store)``, a CLI ``runs cancel``) tells
the process's default observers: whatever ``install_default`` was given (the runtime installs
the entry-point hook modules), built only when there is something to tell. A process that
installed none, such as a script using core alone, has no observers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler.core.rows import JSONObject, SQLValue


class Observers(Protocol):
    """The hook calls core makes (``scheduler.plugins.hookspecs`` documents each)."""

    def wants(self, name: str) -> bool:
        """Whether any observer implements the hook ``name`` (skip building arguments nobody reads)."""
        ...

    def run_state_changed(self, run_id: str, job_id: str, old_status: str | None, new_status: str, at_ms: int) -> None:
        """Tell observers of a committed transition; never raises."""
        ...

    def run_completed(self, run: JSONObject) -> None:
        """Tell observers that a run's completion committed (``run``: its JSON view); never raises."""
        ...

    def dispatch_veto(self, job: dict[str, SQLValue], dispatch_kind: str) -> str | None:
        """The first veto reason of any observer about a dispatch of ``job`` (its row), or None; a failing observer
        vetoes (fail closed)."""
        ...


_default: Callable[[], Observers] | None = None


def install_default(factory: Callable[[], Observers] | None) -> None:
    """Make ``factory`` build the observers of transitions committed without naming theirs (None: no observers)."""
    global _default
    _default = factory


def default() -> Observers | None:
    """The process's default observers, freshly built (None when none were installed)."""
    factory = _default
    return factory() if factory is not None else None
