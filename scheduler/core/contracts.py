"""The small Protocols through which the dispatcher calls what the layers above give it (via ``Parts``).

Each is implemented above core (plugins, features) and handed in by the composition root
(``scheduler.runtime``); core never imports an implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from scheduler.core.store.base import Tx


class LoadedExecutors(Protocol):
    """The loaded executors by name (``scheduler.plugins.loaded.LoadedProviders`` of kind ``executor``)."""

    def get(self, name: str) -> Any:
        """The loaded executor ``name``; raises ``EXECUTOR_NOT_AVAILABLE`` (a failed load is retried after a while)."""
        ...

    def peek(self, name: str) -> Any:
        """The executor if it is already loaded, else None (never loads, never raises)."""
        ...

    def forget(self) -> None:
        """Drop every loaded executor (a settings reload: the next runs load them afresh)."""
        ...


class Expiry(Protocol):
    """Due work the pass enforces in its transaction before it claims (approval timeouts)."""

    def __call__(self, tx: Tx, *, now: int) -> Any:
        """End or release what fell due by ``now`` inside ``tx`` (the pass's fenced transaction)."""
        ...

