"""The store contract (``Store``, ``Tx``) and what a store target means: a SQLite file path or a plugin's URL.

Parsing a target opens nothing (``split_target``, ``local_path_of``, ``redact_url``), so commands that
only show where things go stay light. Core opens only its SQLite store
(``scheduler.core.store.sqlite.open_sqlite``); opening by URL is ``scheduler.plugins.stores.open_store``.
"""

from __future__ import annotations

import os
from pathlib import Path

from scheduler.core.store.base import Store, Tx

__all__ = ["Store", "Tx", "default_artifacts_root", "default_db_path", "local_path_of", "redact_url", "split_target"]


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/scheduler/scheduler.db`` (``~/.local/share`` when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "scheduler" / "scheduler.db"


def default_artifacts_root(db_file: str | os.PathLike[str] | None) -> Path:
    """``$SCHEDULER_ARTIFACTS_DIR``, else ``artifacts/`` beside a local database file, else the XDG data dir.

    ``db_file`` is the store's ``local_path`` (``local_path_of(target)`` before opening): the
    database file, or None for a server database such as PostgreSQL. Here, beside the database
    path, because the store's health check looks at the artifacts' file modes too.
    """
    env = os.environ.get("SCHEDULER_ARTIFACTS_DIR")
    if env:
        return Path(env)
    if db_file is not None:
        return Path(db_file).expanduser().resolve().parent / "artifacts"
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "scheduler" / "artifacts"


def redact_url(url: str) -> str:
    """A URL safe to print: any password replaced by ``***``."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


def split_target(target: str | os.PathLike[str] | None) -> tuple[str | None, str]:
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
    driver, raw = split_target(target)
    return Path(raw).expanduser() if driver is None else None
