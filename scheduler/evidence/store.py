"""The evidence rows: inserted in the transaction that ends a run, never changed afterwards.

``insert_record`` writes the row the pipeline built (``scheduler.evidence.attest``) with the
run's terminal state, its retention deadline counted from the completion; a run ended without
its attestation (a crash, a failed completion, a worker abandoned) gets an ``interrupted`` row
from ``record_interrupted``, built from the run as recovered and the run's own artifact.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from scheduler.base.canonical import canonical_bytes, canonical_json, hash_bytes
from scheduler.base.errors import SchedulerError
from scheduler.core import state
from scheduler.core.artifact import load_artifact
from scheduler.core.events import append_event
from scheduler.core.rows import json_object
from scheduler.evidence.build import build_document
from scheduler.evidence.retention import retention_until

log = logging.getLogger(__name__)


def insert_record(tx: Any, run: dict[str, Any], record: dict[str, Any], *, now: int) -> None:
    """Insert the run's evidence row inside its completion transaction (its retention deadline counted from ``now``).

    A record made by ``scheduler.evidence.attest.interrupt`` (an abandoned run) becomes the run's
    ``interrupted`` row instead.
    """
    if record.get("interrupted"):
        record_interrupted(tx, run, now=now, actor=run.get("dispatcher_owner"), error_code=record["interrupted"])
        return
    tx.execute(
        "INSERT INTO evidence_records(id, run_id, job_id, provider, methods, payload_sha256, canonical_payload, envelope,"
        " artifact_digest, verification, verified, created_at, status, error_code, evidence_ref, declaration, source_run_id,"
        " retention_policy, retention_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (str(uuid.uuid4()), run["id"], run["job_id"], record["provider"], json.dumps(list(record["methods"])),
         record["payload_sha256"], record["canonical_payload"], record.get("envelope"), record.get("artifact_digest"),
         record.get("verification"), int(bool(record.get("verified"))), now, record["status"], record.get("error_code"),
         record.get("evidence_ref"), record.get("declaration"), record.get("source_run_id"), record.get("retention_policy"),
         retention_until(record.get("retention_policy"), now)),
    )


def record_interrupted(tx: Any, run: dict[str, Any], *, now: int, actor: str | None, error_code: str = "INTERRUPTED") -> bool:
    """Give an interrupted run of an evidence job its terminal evidence row.

    Called inside the transaction that ended the run without an attestation: crash recovery
    (``crashed`` after ``kill -9``, ``error_code`` ``INTERRUPTED``), a failed completion
    (``COMPLETION_FAILED``) and a run committed without its abandoned worker
    (``EXECUTOR_ABANDONED`` / ``EXECUTOR_DEADLINE_EXCEEDED``). ``run`` needs only ``id``. The
    declaration is read from the run's own execution artifact (what the run executed under);
    a run of a job without evidence, or one that already has its row, gets nothing. The row is
    status ``interrupted`` with the payload of the run as recovered and no envelope (no
    provider is called during recovery); ``runs.evidence_status`` becomes ``interrupted``.
    """
    if "artifact_digest" not in run or "job_id" not in run:
        run = tx.one("SELECT id, job_id, artifact_digest FROM runs WHERE id = ?", (run["id"],)) or {}
    digest = run.get("artifact_digest")
    if not digest:
        return False
    try:
        artifact = load_artifact(tx, digest).payload
    except SchedulerError as exc:  # recovery must still end the run; doctor reports the artifact
        log.warning("no interrupted-evidence row for run %s: %s: %s", run.get("id"), exc.code, exc.message)
        return False
    section = json_object(artifact.get("evidence"))
    if not section:
        return False
    if tx.one("SELECT 1 AS x FROM evidence_records WHERE run_id = ?", (run["id"],)) is not None:
        return False
    row = tx.one("SELECT * FROM runs WHERE id = ?", (run["id"],))
    document = build_document(row, artifact, duration_ms=None)
    canonical = canonical_bytes(document)
    declared = {k: v for k, v in section.items() if k != "ref"}
    insert_record(tx, row, {
        "provider": section.get("provider") or "checksum", "methods": list(methods) if isinstance(methods := section.get("methods"), list) else [],
        "payload_sha256": hash_bytes(canonical).removeprefix("sha256:"), "canonical_payload": canonical.decode("utf-8"),
        "envelope": None, "artifact_digest": digest, "verification": None, "verified": 0, "status": "interrupted",
        "error_code": error_code, "evidence_ref": section.get("ref"),
        "declaration": canonical_json(declared),
        "source_run_id": row.get("source_run_id"), "retention_policy": section.get("retention"),
    }, now=now)
    state.execute(tx, "mark_evidence_interrupted", run_id=run["id"])
    append_event(tx, "evidence.interrupted", job_id=run["job_id"], run_id=run["id"], actor=actor, at=now,
                 data={"provider": section.get("provider"), "payload_sha256": hash_bytes(canonical).removeprefix("sha256:"),
                       "code": error_code})
    return True


__all__ = ["insert_record", "record_interrupted"]
