"""Append-only runtime events: the audit trail of every transition (the table refuses update/delete)."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.rows import JSONObject
from scheduler.core.store.base import Tx

#: The event a dispatcher records once its database is writable again after it was full (``DB_DISK_FULL``):
#: no job, ``data`` ``{"since", "until", "attempts"}`` (epoch ms); ``scheduler status`` shows the last one.
DISK_FULL_EVENT = "db.disk_full"

#: Default of ``append_event``'s ``principal``/``trust_level``: read from the run in the same statement.
LOOKUP: object = object()

_COLUMNS = "at, kind, job_id, run_id, dispatch_id, actor, artifact_digest, data, principal, trust_level"
#: Rows per multi-row INSERT of a batch (10 parameters each: well inside every SQLite's and PostgreSQL's limit).
_BATCH_ROWS = 90
#: ``json.dumps(data, sort_keys=True, default=str)``, with the encoder made once (the same options, so the same text).
_encode = json.JSONEncoder(sort_keys=True, default=str).encode
#: The C encoder of those options without the circular-reference check, made once: only for a flat object (string keys,
#: values str, int or None), which cannot refer to itself, so its text is ``_encode``'s (None without the C speedups).
_encode_flat = (c_make_encoder(None, str, encode_basestring_ascii, None, ": ", ", ", True, False, True)
                if c_make_encoder is not None else None)
_FLAT_TYPES = frozenset({str, int, type(None)})


def _data_text(data: Mapping[str, object]) -> str:
    """An event's ``data`` as its row's text: ``json.dumps(data, sort_keys=True, default=str)``, byte for byte.

    The hot path's data (``run.started``, ``run.finished``) is a flat object: one C call for it.
    """
    if _encode_flat is not None and type(data) is dict:
        for key, value in data.items():
            if type(value) not in _FLAT_TYPES or type(key) is not str:
                return _encode(data)
        return "".join(_encode_flat(data, 0))
    return _encode(data)

#: The fully known event rows of the open ``batched`` block on this thread (None: no block open).
_batch: ContextVar[list[tuple[Any, ...]] | None] = ContextVar("scheduler_event_batch", default=None)


@contextmanager
def batched(tx: Tx) -> Iterator[None]:
    """Gather the fully known events appended inside this block and insert them in one multi-row INSERT at its end.

    The dispatcher's pass writes a ``run.started`` and a ``run.finished`` event per run;
    inserted together they cost one statement per pass instead of one per event (each
    statement costs the loop CPU and a GIL hand-off). Nothing is lost or reordered: an
    event that needs lookups flushes the gathered ones first, so ids keep the order the
    events were appended in, and the rows are written in ``tx`` before the block's caller
    commits. When the block raises, the gathered rows are dropped with the transaction.
    Nested blocks join the outermost one.
    """
    if _batch.get() is not None:
        yield
        return
    rows: list[tuple[Any, ...]] = []
    token = _batch.set(rows)
    try:
        yield
    finally:
        _batch.reset(token)
    _flush(tx, rows)


def _flush(tx: Tx, rows: list[tuple[Any, ...]]) -> None:
    """Insert gathered event rows in order (multi-row INSERTs) and empty the list."""
    for i in range(0, len(rows), _BATCH_ROWS):
        chunk = rows[i:i + _BATCH_ROWS]
        marks = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
        tx.execute(f"INSERT INTO runtime_events({_COLUMNS}) VALUES {marks}", [v for row in chunk for v in row])
    rows.clear()


@lru_cache(maxsize=1)
def os_identity() -> str:
    """The invoking operating-system account as ``name(uid)``; recorded as the actor of CLI actions."""
    try:
        name = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry
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
    data: Mapping[str, object] | None = None,
    at: int | None = None,
    artifact_digest: str | None = None,
    principal: str | object | None = LOOKUP,
    trust_level: str | object | None = LOOKUP,
) -> None:
    """Record one event inside the caller's transaction, so the event exists iff the change does.

    The event carries the execution artifact digest of what it is about: ``artifact_digest``
    when given, else the run's binding, else the dispatch's, else the job's current artifact
    (looked up in the same statement, so every caller gets it without passing it). An event of
    a run also carries who the run acts as (``principal``, ``trust_level``) once its identity is
    recorded on the run (``scheduler.pipeline.identity``; the completion transaction writes it before
    its events), read in the same statement: no caller needs to pass it and no query is added.

    The hot path (a run's start and finish) already holds the run's digest, principal and
    trust level: given ``artifact_digest`` and both ``principal`` and ``trust_level`` (None
    included), the row is inserted as is, without the five lookups (inside a ``batched``
    block: gathered and inserted with the block's other such rows).
    """
    pending = _batch.get()
    if artifact_digest is not None and principal is not LOOKUP and trust_level is not LOOKUP:
        row = (now_ms() if at is None else at, kind, job_id, run_id, dispatch_id, actor, artifact_digest,
               _data_text(data) if data else None, principal, trust_level)
        if pending is not None:
            pending.append(row)
        else:
            tx.execute(f"INSERT INTO runtime_events({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        return
    if pending:  # keep the order of ids: what was gathered goes in first
        _flush(tx, pending)
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
            _data_text(data) if data else None,
            run_id,
            run_id,
        ),
    )


def event_to_json(row: Mapping[str, Any]) -> JSONObject:
    """JSON view of an event row."""
    out: JSONObject = dict(row)
    out["at"] = to_iso(row["at"])
    out["data"] = json.loads(row["data"]) if row.get("data") else None
    return out
