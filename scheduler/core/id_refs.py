"""Matching what a user types for an id: a unique start or end of it (jobs, dispatches, runs, approvals, parts).

Listings show each id short (``jobs list`` the shortest unique piece, ``queue list`` a
dispatch id's end, ``runs list`` a run id's random end: ``scheduler.base.run_ids``, ``deliveries list`` a
part id's end, ``approvals list`` an approval id's start), and the
commands that take an id take such a piece back. One query finds the ids that start or end
with it, whichever end the listing showed.
"""

from __future__ import annotations

from scheduler.core.store.base import Tx

#: The tables whose ids ``ids_with_end`` matches (the name goes into the SQL text).
_TABLES = frozenset({"jobs", "job_dispatch_queue", "runs", "approvals", "delivery_outbox"})


def escape_like(text: str) -> str:
    """``text`` as a literal inside a LIKE pattern with ``ESCAPE '\\'``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def ids_with_end(tx: Tx, table: str, piece: str, *, limit: int = 50) -> list[str]:
    """The ids in ``table`` that start or end with ``piece`` (exact case), at most ``limit`` of them.

    The ids alone are read, so SQLite walks the primary key's index rather than the rows (about
    a third of a second for a million runs; a full id never comes here). Two or more is an
    ambiguous piece for the caller to refuse.
    """
    if table not in _TABLES:
        raise ValueError(f"ids_with_end: unknown table {table!r}")
    like = escape_like(piece)
    found = tx.all(f"SELECT id FROM {table} WHERE id LIKE ? ESCAPE '\\' OR id LIKE ? ESCAPE '\\' LIMIT ?",
                   (like + "%", "%" + like, limit))
    # LIKE ignores case on SQLite: only exact starts and ends count
    return [r["id"] for r in found if r["id"].startswith(piece) or r["id"].endswith(piece)]


__all__ = ["escape_like", "ids_with_end"]
