"""Append-only runtime events: the audit trail of every transition (the table refuses update/delete)."""

from __future__ import annotations

import getpass
import json
import os
from functools import lru_cache
from typing import Any

from scheduler.store.base import Tx
from scheduler.timeutil import now_ms, to_iso


#: Default of ``append_event``'s ``principal``/``trust_level``: read from the run in the same statement.
LOOKUP: Any = object()


@lru_cache(maxsize=1)
def os_identity() -> str:
    """The invoking operating-system account as ``name(uid)``; recorded as the actor of CLI actions."""
    try:
        name = getpass.getuser()
    except Exception:  # no passwd entry
        name = "unknown"
    return f"{name}(uid:{os.getuid()})"


def append_event(
    tx: Tx,
    kind: str,
    *,
    job_id: str | None = None,
    run_id: str | None = None,
    dispatch_id: str | None = None,
    actor: str | None = None,
    data: dict[str, Any] | None = None,
    at: int | None = None,
    artifact_digest: str | None = None,
    principal: Any = LOOKUP,
    trust_level: Any = LOOKUP,
) -> None:
    """Record one event inside the caller's transaction, so the event exists iff the change does.

    The event carries the execution artifact digest of what it is about: ``artifact_digest``
    when given, else the run's binding, else the dispatch's, else the job's current artifact
    (looked up in the same statement, so every caller gets it without passing it). An event of
    a run also carries who the run acts as (``principal``, ``trust_level``) once its identity is
    recorded on the run (``scheduler.identity``; the completion transaction writes it before
    its events), read in the same statement: no caller needs to pass it and no query is added.

    The hot path (a run's start and finish) already holds the run's digest, principal and
    trust level: given ``artifact_digest`` and both ``principal`` and ``trust_level`` (None
    included), the row is inserted as is, without the five lookups.
    """
    if artifact_digest is not None and principal is not LOOKUP and trust_level is not LOOKUP:
        tx.execute(
            "INSERT INTO runtime_events(at, kind, job_id, run_id, dispatch_id, actor, artifact_digest, data, principal, trust_level)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (now_ms() if at is None else at, kind, job_id, run_id, dispatch_id, actor, artifact_digest,
             json.dumps(data, sort_keys=True, default=str) if data else None, principal, trust_level),
        )
        return
    tx.execute(
        "INSERT INTO runtime_events(at, kind, job_id, run_id, dispatch_id, actor, artifact_digest, data, principal, trust_level)"
        " VALUES (?, ?, ?, ?, ?, ?, COALESCE(?, (SELECT artifact_digest FROM runs WHERE id = ?),"
        " (SELECT artifact_digest FROM job_dispatch_queue WHERE id = ?), (SELECT artifact_digest FROM jobs WHERE id = ?)), ?,"
        " (SELECT principal FROM runs WHERE id = ?), (SELECT trust_level FROM runs WHERE id = ?))",
        (
            now_ms() if at is None else at,
            kind,
            job_id,
            run_id,
            dispatch_id,
            actor,
            artifact_digest,
            run_id,
            dispatch_id,
            job_id,
            json.dumps(data, sort_keys=True, default=str) if data else None,
            run_id,
            run_id,
        ),
    )


def event_to_json(row: dict[str, Any]) -> dict[str, Any]:
    """JSON view of an event row."""
    out = dict(row)
    out["at"] = to_iso(row["at"])
    out["data"] = json.loads(row["data"]) if row.get("data") else None
    return out
