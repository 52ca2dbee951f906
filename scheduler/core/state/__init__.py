"""The state module: every change of a run, dispatch, approval, job and outbox part as one named statement.

Each statement is portable SQL with ``:keyword`` parameters, written once in this package (one
module per table: ``runs``, ``dispatches``, ``approvals``, ``jobs``, ``outbox``, ``debts``; the format is
``named``'s) and parsed once at import. Each table has exactly one INSERT. Callers run a statement
by name with its parameters as keywords::

    state.one(tx, "finish_run", run_id=..., owner=..., token=..., ...)

and never write an UPDATE or INSERT on those five tables themselves (``tests/test_state_statements.py``
greps the tree; the migrations keep their own SQL, since a migration records a fact of its time).
Which change happens, and the events and notices around it, is decided by the callers
(``scheduler.core.transitions`` for the status transitions, with their state tables; ``jobs``,
``queue``, ``completion``, the outbox ...).

Why names and keywords rather than a typed function per statement: the statement's text is the
contract, read and reviewed as SQL in one place; the call names exactly the parameters that text
uses, checked on every call (a missing or unknown keyword is ``StatementError`` before anything
reaches the database); and a store can validate the whole catalogue without knowing any caller.
Every store prepares each statement when it opens the database (``probes``: SQLite compiles each
with ``EXPLAIN``, PostgreSQL plans each), so a statement a store cannot run is ``DB_INIT_FAILED``
naming it at start-up, not an error at first use. Both stores run the same text (``?``
placeholders; the PostgreSQL store translates them as for any kernel SQL).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core.state import approvals, debts, dispatches, jobs, outbox, runs
from scheduler.core.state.named import Rendered, Statement, StatementError, parse
from scheduler.core.store.base import Tx

__all__ = [
    "STATEMENTS", "Probe", "Rendered", "Statement", "StatementError", "catalogue", "execute", "one", "parse", "prepare", "probes", "rows",
    "unrunnable",
]


def catalogue(*sources: str) -> dict[str, Statement]:
    """The statements of several ``-- name:`` sources as one mapping; ``StatementError`` when a name repeats."""
    out: dict[str, Statement] = {}
    for source in sources:
        for name, stmt in parse(source).items():
            if name in out:
                raise StatementError(f"statement {name!r} is named twice")
            out[name] = stmt
    return out


#: Every named statement of the kernel, by name.
STATEMENTS: Mapping[str, Statement] = catalogue(runs.SOURCE, dispatches.SOURCE, approvals.SOURCE, jobs.SOURCE, outbox.SOURCE,
                                                debts.SOURCE)


def _bound(name: str, params: Mapping[str, object]) -> tuple[str, list[Any]]:
    try:
        stmt = STATEMENTS[name]
    except KeyError:
        raise StatementError(f"no named statement {name!r}") from None
    return stmt.bind(params)


def execute(tx: Tx, name: str, /, **params: Any) -> int:
    """Run the statement ``name`` with ``params`` in ``tx``; the number of rows it changed."""
    sql, values = _bound(name, params)
    return tx.execute(sql, values)


def one(tx: Tx, name: str, /, **params: Any) -> dict[str, Any] | None:
    """Run the statement ``name`` (one with RETURNING) with ``params`` in ``tx``; its first row, or None."""
    sql, values = _bound(name, params)
    return tx.one(sql, values)


def rows(tx: Tx, name: str, /, **params: Any) -> list[dict[str, Any]]:
    """Run the statement ``name`` (one with RETURNING) with ``params`` in ``tx``; every row it returned."""
    sql, values = _bound(name, params)
    return tx.all(sql, values)


def prepare(name: str, /, **params: Any) -> Rendered:
    """The statement ``name`` as a call with ``params`` runs it (``Statement.prepare``: checked, to keep per shape)."""
    try:
        stmt = STATEMENTS[name]
    except KeyError:
        raise StatementError(f"no named statement {name!r}") from None
    return stmt.prepare(params)


@attrs.frozen
class Probe:
    """One statement as a store checks it when it opens the database: ``EXPLAIN`` of its text, every parameter NULL."""

    name: str
    sql: str
    params: tuple[None, ...]


def probes(statements: Mapping[str, Statement] | None = None) -> tuple[Probe, ...]:
    """What a store runs at ``initialize()`` to prove it can run every statement (a repeated one with one row).

    ``EXPLAIN`` compiles (SQLite) or plans (PostgreSQL) a statement without running it, so
    a missing column, a typo or a construct the dialect lacks fails here, and the store
    reports ``DB_INIT_FAILED`` naming the statement. ``statements`` defaults to ``STATEMENTS``
    (a store's test hook passes others).
    """
    out = []
    for name, stmt in (STATEMENTS if statements is None else statements).items():
        rendered = stmt.render(1)
        out.append(Probe(name, "EXPLAIN " + rendered.sql, (None,) * len(rendered.slots)))
    return tuple(out)


def unrunnable(name: str, location: str, cause: BaseException | str) -> SchedulerError:
    """``DB_INIT_FAILED`` (phase ``statements``) for a store that cannot run the named statement ``name``."""
    text = " ".join(str(cause).split()) or type(cause).__name__
    return SchedulerError(
        "DB_INIT_FAILED",
        f"database initialisation failed during statements of {location}: the named statement {name!r} cannot run"
        f" on this database: {text}",
        details={"phase": "statements", "path": location, "statement": name},
    )
