"""Opening a store by path or URL: the built-in SQLite file, or a ``scheduler.stores`` plugin chosen by URL scheme.

Core opens only its own SQLite store (``scheduler.core.store.sqlite.open_sqlite``); a store
named by URL is a plugin, so choosing one belongs to the plugin layer. Importing this module
imports the SQLite store and the driver loader (``scheduler.plugins.drivers``), nothing else.
"""

from __future__ import annotations

import os

from scheduler.base.plugin_kinds import kind_named
from scheduler.core.store import split_target
from scheduler.core.store.base import Store
from scheduler.core.store.sqlite import open_sqlite
from scheduler.plugins.drivers import load_driver

#: The entry-point group of store drivers (a URL's scheme names one: ``postgresql://`` selects ``postgres``).
STORES_GROUP = kind_named("store").group


def open_store(target: str | os.PathLike[str] | None = None, *, initialize: bool = True, readonly: bool = False,
               create: bool = True) -> Store:
    """Open (and by default initialise) the store for a path or URL.

    A plain path or ``sqlite:///path`` uses the built-in SQLite store (``None``: the default
    database file); any other ``scheme://`` loads the ``scheduler.stores`` driver named by
    the scheme (``postgresql://`` and ``postgres://`` select ``postgres``). ``readonly=True``
    is for commands that only read: initialisation then never writes, and a database that
    would need creating or migrating is refused with ``DB_INIT_FAILED`` saying so. ``create=False``
    refuses a SQLite path that names no file (``DB_NOT_FOUND``) instead of creating a database
    there (the CLI passes it for every command but those that add jobs); a server database
    (PostgreSQL) has no file to vanish or create, so it ignores ``create``.
    """
    driver, raw = split_target(target)
    if driver is None:
        return open_sqlite(raw, initialize=initialize, readonly=readonly, create=create)
    factory = load_driver(STORES_GROUP, driver)
    store: Store = factory(raw)
    if initialize:
        # Only read-only opens pass the keyword, so a store written before it existed still opens for writing.
        if readonly:
            store.initialize(readonly=True)
        else:
            store.initialize()
    return store
