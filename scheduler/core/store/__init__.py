"""Opening a store: the built-in SQLite file, or a ``scheduler.stores`` plugin chosen by URL scheme."""

from __future__ import annotations

import os
from pathlib import Path

from scheduler.base.errors import SchedulerError
from scheduler.core.store.base import Store, Tx

__all__ = ["Store", "Tx", "default_db_path", "local_path_of", "open_store", "redact_url"]


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/scheduler/scheduler.db`` (``~/.local/share`` when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "scheduler" / "scheduler.db"


def redact_url(url: str) -> str:
    """A URL safe to print: any password replaced by ``***``."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


def _split_target(target: str | os.PathLike[str] | None) -> tuple[str | None, str]:
    """``(driver, raw)``: driver None for a SQLite file (``raw`` its path), else the ``scheduler.stores`` name."""
    raw = os.fspath(target) if target is not None else str(default_db_path())
    if raw.startswith("sqlite:///"):
        raw = raw[len("sqlite://") :]
    if "://" not in raw:
        return None, raw
    scheme = raw.split("://", 1)[0].lower()
    return {"postgresql": "postgres", "postgres": "postgres"}.get(scheme, scheme), raw


def local_path_of(target: str | os.PathLike[str] | None) -> Path | None:
    """The database file ``target`` names when it is a local SQLite file, else None; opens nothing.

    For commands that show where things would go without opening the database
    (``scheduler config``); an open store says the same as ``Store.local_path``.
    """
    driver, raw = _split_target(target)
    return Path(raw).expanduser() if driver is None else None


def open_store(target: str | os.PathLike[str] | None = None, *, initialize: bool = True, readonly: bool = False) -> Store:
    """Open (and by default initialise) the store for a path or URL.

    A plain path or ``sqlite:///path`` uses the built-in SQLite store; any other
    ``scheme://`` loads the ``scheduler.stores`` driver named by the scheme
    (``postgresql://`` and ``postgres://`` select ``postgres``). ``readonly=True`` is for
    commands that only read: initialisation then never writes, and a database that would
    need creating or migrating is refused with ``DB_INIT_FAILED`` saying so.
    """
    driver, raw = _split_target(target)
    if driver is not None:
        from scheduler.plugins.loader import load_driver

        factory = load_driver("scheduler.stores", driver)
        store: Store = factory(raw)
    else:
        from scheduler.core.store.sqlite import SQLiteStore

        store = SQLiteStore(raw)
    if initialize:
        # Only read-only opens pass the keyword, so a store written before it existed still opens for writing.
        if readonly:
            store.initialize(readonly=True)
        else:
            store.initialize()
    return store
