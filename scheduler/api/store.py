"""The public API for store plugins (``scheduler.stores`` entry points, such as scheduler-store-postgres).

A store plugin implements ``Store`` (and the ``Tx`` its transactions yield) and takes
everything dialect-neutral from the kernel, so adding a column never touches a plugin:

* the schema: ``schema_statements(dialect)`` (every statement, idempotent, in order),
  ``schema_fingerprint(dialect)`` (to recognise an unchanged schema without re-applying it),
  and the names it creates (``schema_tables()``, ``schema_indexes()``, ``schema_triggers(dialect)``)
  for health checks and fast paths;
* the migrations: ``upgrade(conn, version, now, step_hook=..., migrations=...)`` runs the one
  migration list (``MIGRATIONS``) and then the schema, inside the store's own write
  transaction, through a ``SchemaConnection`` adapter the store provides (``dialect``,
  ``execute``/``all`` with ``?`` placeholders, ``columns(table)``); it raises
  ``UpgradeFailed(phase, cause)`` for the store to report as ``DB_INIT_FAILED``;
* ``SCHEMA_VERSION``, ``Params``, ``StepHook``, ``Migration``, ``redact_url``, ``now_ms``,
  ``SchedulerError``, ``PLUGIN_API_VERSION``;
* ``open_store(path_or_url, readonly=...)``: open any store as the kernel does (through the
  ``scheduler.stores`` entry points, API checks included), for a plugin's own tests and tools.

The ``Store`` Protocol documents the contract a store must keep: the nesting of
transactions per thread, what ``read()`` inside a transaction means, a read-only
``initialize`` that never writes to an up-to-date database, ``DB_BUSY`` for locks, and
the attributes the kernel asks instead of testing the dialect (``exclusive_dispatch``,
``local_path``).
"""

from __future__ import annotations

from scheduler import PLUGIN_API_VERSION
from scheduler.base.errors import SchedulerError
from scheduler.core.store import redact_url, schema
from scheduler.core.store.base import Params, Store, Tx
from scheduler.core.store.migrations import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Migration,
    SchemaConnection,
    StepHook,
    UpgradeFailed,
    migrate,
    schema_fingerprint,
    schema_statements,
    upgrade,
)
from scheduler.plugins.stores import open_store
from scheduler.base.timeutil import now_ms

#: The dialects the kernel's schema definition renders.
DIALECTS = schema.DIALECTS


def schema_sql(dialect: str) -> str:
    """The whole schema for ``dialect`` as commented SQL text (what ``schema_statements`` runs, for people and docs)."""
    return schema.render(dialect)


def schema_tables() -> frozenset[str]:
    """Every table the schema creates."""
    return schema.table_names()


def schema_indexes() -> frozenset[str]:
    """Every named index the schema creates."""
    return schema.index_names()


def schema_triggers(dialect: str) -> frozenset[tuple[str, str]]:
    """``(trigger, table)`` pairs the schema creates in ``dialect``."""
    return schema.trigger_names(dialect)


__all__ = [
    "DIALECTS",
    "MIGRATIONS",
    "PLUGIN_API_VERSION",
    "SCHEMA_VERSION",
    "Migration",
    "Params",
    "SchedulerError",
    "SchemaConnection",
    "StepHook",
    "Store",
    "Tx",
    "UpgradeFailed",
    "migrate",
    "now_ms",
    "open_store",
    "redact_url",
    "schema_fingerprint",
    "schema_indexes",
    "schema_sql",
    "schema_statements",
    "schema_tables",
    "schema_triggers",
    "upgrade",
]
