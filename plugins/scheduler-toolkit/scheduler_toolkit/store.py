"""What a store plugin (``scheduler.stores`` entry points, such as scheduler-store-postgres) builds its database from.

A store plugin implements ``Store`` and the ``Tx`` its transactions yield (the Protocols are
the contract: ``scheduler.api.store``) and takes everything dialect-neutral from here, so
adding a column never touches a plugin:

* the schema: ``schema_statements(dialect)`` (every statement, idempotent, in order),
  ``schema_fingerprint(dialect)`` (to recognise an unchanged schema without re-applying it),
  ``schema_sql(dialect)`` (the same as commented SQL text, for people and docs), and the
  names it creates (``schema_tables()``, ``schema_indexes()``, ``schema_triggers(dialect)``)
  for health checks and fast paths; ``DIALECTS`` are the dialects it renders;
* the migrations: ``upgrade(conn, version, now, step_hook=..., migrations=...)`` runs the one
  migration list (``MIGRATIONS``) and then the schema, inside the store's own write
  transaction, through a ``SchemaConnection`` adapter the store provides (``dialect``,
  ``execute``/``all`` with ``?`` placeholders, ``columns(table)``); it raises
  ``UpgradeFailed(phase, cause)`` for the store to report as ``DB_INIT_FAILED``;
  ``migrate`` runs the migrations alone;
* the named statements every store runs (``NAMED_STATEMENTS``: each change of a run, dispatch,
  approval, job and outbox part, ``scheduler.core.state``): ``statement_probes(statements)`` is what
  a store compiles or plans at ``initialize()`` (``EXPLAIN``, every parameter NULL) and
  ``statement_init_failed(name, location, cause)`` its ``DB_INIT_FAILED`` for one it cannot run;
* ``SCHEMA_VERSION``, ``Params`` (the parameters of one statement), ``StepHook``,
  ``Migration``, ``redact_url`` (a store URL without its password, for messages);
* ``open_store(path_or_url, readonly=...)``: open any store as the kernel does (through the
  ``scheduler.stores`` entry points, API checks included), for a plugin's own tests and tools.

The kernel's own schema and migrations (``scheduler.core.store``), re-exported; the
``schema_*`` name functions read them.
"""

from __future__ import annotations

from scheduler.core.state import STATEMENTS as NAMED_STATEMENTS
from scheduler.core.state import Probe as StatementProbe
from scheduler.core.state import probes as statement_probes
from scheduler.core.state import unrunnable as statement_init_failed
from scheduler.core.store import redact_url, schema
from scheduler.core.store.base import Params
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

#: The dialects the kernel's schema definition renders.
DIALECTS = schema.DIALECTS


def schema_sql(dialect: str) -> str:
    """The whole schema for ``dialect`` as commented SQL text (what ``schema_statements`` runs, for people and docs)."""
    return schema.render(dialect)


def schema_tables() -> frozenset[str]:
    """Every table the schema creates (a store's health check asks that they all exist)."""
    return schema.table_names()


def schema_indexes() -> frozenset[str]:
    """Every named index the schema creates."""
    return schema.index_names()


def schema_triggers(dialect: str) -> frozenset[tuple[str, str]]:
    """``(trigger, table)`` pairs the schema creates in ``dialect`` (the guard rules, as that dialect writes them)."""
    return schema.trigger_names(dialect)


__all__ = [
    "DIALECTS",
    "MIGRATIONS",
    "NAMED_STATEMENTS",
    "SCHEMA_VERSION",
    "Migration",
    "Params",
    "SchemaConnection",
    "StatementProbe",
    "StepHook",
    "UpgradeFailed",
    "migrate",
    "open_store",
    "redact_url",
    "schema_fingerprint",
    "schema_indexes",
    "schema_sql",
    "schema_statements",
    "schema_tables",
    "schema_triggers",
    "statement_init_failed",
    "statement_probes",
    "upgrade",
]
