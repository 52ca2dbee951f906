"""Loaded providers of one kind, kept for the life of the process (or of the current settings).

Loading a provider through its entry point costs milliseconds (importlib metadata, the
plugin's imports, ``configure(settings)``), and some providers keep state across runs
(an OAuth2 token cache), so every kernel step that calls a provider keeps the loaded
instance. A load failure is remembered for ``retry_s`` and raised as the step's own
``*_NOT_AVAILABLE`` error, then tried again: an operator may install the fix meanwhile.
One class instead of a copy of that logic per provider kind.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.plugins.loader import load_provider
from scheduler.settings import current_settings


class LoadedProviders:
    """Providers of ``kind`` (``executor``, ``channel``, ``evidence``, ``credential``, ``authorization``) by name.

    ``per_settings``: drop the instances when the settings object changes (a reload), so
    providers configured from the settings file are configured afresh.
    """

    def __init__(self, kind: str, *, unavailable_code: str, noun: str, retry_s: float = 5.0, per_settings: bool = False) -> None:
        self.kind = kind
        self.unavailable_code = unavailable_code
        self.noun = noun
        self.retry_s = retry_s
        self.per_settings = per_settings
        self._cache: dict[str, Any] = {}
        self._settings: Any = None
        self._lock = threading.Lock()

    def get(self, name: str) -> Any:
        """The loaded provider ``name``; raises the kind's ``*_NOT_AVAILABLE`` error (``details.cause``: the loader's code)."""
        if self.per_settings:
            self._check_settings()
        cached = self._cache.get(name)
        if cached is None or (type(cached) is _Failure and time.monotonic() >= cached.retry_at):
            with self._lock:  # workers asking together load a provider once
                cached = self._cache.get(name)
                if cached is None or (type(cached) is _Failure and time.monotonic() >= cached.retry_at):
                    cached = self._load(name)
                    self._cache[name] = cached
        if type(cached) is _Failure:
            raise cached.error
        return cached

    def peek(self, name: str) -> Any:
        """The provider if it is already loaded, else None (never loads, never raises)."""
        cached = self._cache.get(name)
        return None if cached is None or type(cached) is _Failure else cached

    def failed(self) -> list[str]:
        """Names whose last load failed (their failure is remembered until a retry): what metrics and doctor report."""
        with self._lock:
            return sorted(name for name, cached in self._cache.items() if type(cached) is _Failure)

    def forget(self) -> None:
        """Drop every loaded provider and remembered failure (a settings reload, tests)."""
        with self._lock:
            self._cache.clear()

    def _check_settings(self) -> None:
        settings = current_settings()
        if self._settings is not settings:
            with self._lock:
                self._cache.clear()
                self._settings = settings

    def _load(self, name: str) -> Any:
        try:
            return load_provider(self.kind, name)
        except SchedulerError as exc:
            error = SchedulerError(self.unavailable_code, f"{self.noun} {name!r} is not available: {exc.message}",
                                   details={"provider": name, "cause": exc.code})
            return _Failure(error, time.monotonic() + self.retry_s)


class _Failure:
    """A remembered load failure: the error to raise until ``retry_at`` (monotonic seconds)."""

    __slots__ = ("error", "retry_at")

    def __init__(self, error: SchedulerError, retry_at: float) -> None:
        self.error = error
        self.retry_at = retry_at
