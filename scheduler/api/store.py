"""The store plugin contract (``scheduler.stores`` entry points, such as scheduler-store-postgres): ``Store`` and ``Tx``.

A store plugin implements ``Store`` (and the ``Tx`` its transactions yield). The ``Store``
Protocol documents the contract a store must keep: the nesting of transactions per thread,
what ``read()`` inside a transaction means, a read-only ``initialize`` that never writes to an
up-to-date database, ``DB_BUSY`` for locks, and the attributes the kernel asks instead of
testing the dialect (``exclusive_dispatch``, ``local_path``).

Everything dialect-neutral a store builds its database from (the schema statements and
fingerprint, the migration list and ``upgrade``, ``SCHEMA_VERSION``, ``redact_url``,
``open_store`` ...) is ``scheduler_toolkit.store``, so adding a column never touches a plugin.
The names this module exported before still import from here for one release, with a
``DeprecationWarning`` naming their new import.
"""

from __future__ import annotations

from scheduler.base.deprecation import moved_names as _moved_names
from scheduler.core.store.base import Store, Tx

__all__ = ["Store", "Tx"]

_STORE = "scheduler_toolkit.store"

#: Every name this module exported before the contract was cut down -> where it lives now (one release).
__getattr__ = _moved_names(__name__, {
    # moved into the toolkit (thin readers of the kernel's schema)
    **dict.fromkeys(("DIALECTS", "schema_indexes", "schema_sql", "schema_tables", "schema_triggers"), _STORE),
    # re-exported by the toolkit: the kernel keeps the code (it uses it too)
    **dict.fromkeys(("MIGRATIONS", "SCHEMA_VERSION", "Migration", "SchemaConnection", "StepHook", "UpgradeFailed", "migrate",
                     "schema_fingerprint", "schema_statements", "upgrade"), (_STORE, "scheduler.core.store.migrations")),
    "Params": (_STORE, "scheduler.core.store.base"),
    "redact_url": (_STORE, "scheduler.core.store"),
    "open_store": (_STORE, "scheduler.plugins.stores"),
    "now_ms": ("scheduler_toolkit.timeutil", "scheduler.base.timeutil"),
    # the contract's own names live in scheduler.api
    "PLUGIN_API_VERSION": ("scheduler.api", "scheduler"),
    "SchedulerError": ("scheduler.api", "scheduler.base.errors"),
})
