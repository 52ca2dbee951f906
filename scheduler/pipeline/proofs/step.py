"""Authorization proofs: the pipeline step verifying a run's proof and claiming it once (docs/proofs.md).

After identity and before ``authorization_ref``, a job that declares ``authorization_proof``
(``scheduler.pipeline.proofs.declaration``) has its proof read afresh from the declared source
(``scheduler.pipeline.proofs.source``) and verified (``scheduler.pipeline.proofs.verify``: the
``proof_verifier`` plugin the declaration names checks the format, the signature and the trust; the
kernel checks its answer, the window with the declared skew and the artifact binding; a verifier
that is not installed is ``PROOF_VERIFIER_NOT_AVAILABLE``). Then, in ONE transaction: the proof
id and key id are looked up in ``proof_revocations`` (``PROOF_REVOKED``), and the proof id is
claimed in ``authorization_proof_replay`` for this dispatch. The insert is ``ON CONFLICT DO
NOTHING``, so of several dispatchers racing for one id exactly one claim wins. An existing claim is reused by the dispatch that made it (a crash replay
of the same dispatch row keeps its dispatch id) and by retries of that dispatch (a retry is a new
dispatch row whose ``source_run_id`` chain leads back to a run of the claiming dispatch); any other
dispatch presenting the id is denied ``PROOF_REPLAYED`` and its job is quarantined (disabled,
``paused_reason`` saying why, a ``job.quarantined`` event) in the same transaction as the claim
attempt.

A run resumed after an approval wait that had already verified its proof (its ``runs.proof_json``
says ``verified``) is not verified from the source again: its recorded window is re-checked with
the recorded skew and its proof and key ids against the revocations, and the claim is not made a
second time. Any failure ends the run ``error`` with a ``PROOF_*`` code before the payload starts;
the decision is recorded on the run (``runs.proof_json``: method, proof id, key id, window, skew,
never the proof) and as an event (``proof.verified`` / ``proof.failed``). A job without a proof
costs one attribute test.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core import state
from scheduler.core.artifact import section_problems
from scheduler.core.claimed import ClaimedRun
from scheduler.core.events import append_event
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.rows import JSONObject
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Normaliser, Problem, Run, StepBase
from scheduler.core.store.base import Store, Tx
from scheduler.core.transitions import cancel_pending_work, committing
from scheduler.pipeline.proofs.declaration import normalise
from scheduler.pipeline.proofs.source import read_source
from scheduler.pipeline.proofs.verify import check_window
from scheduler.pipeline.proofs.verify import verify as verify_proof
from scheduler.plugins.protocols import VerifiedProof

#: How many earlier runs a retry follows back (``retry_of_run_id`` / ``replay_of_run_id``) to find the claiming dispatch.
MAX_LINEAGE = 128


def verify(store: Store, started: ClaimedRun, spec: JobSpec, outcomes: RunOutcomes) -> None:
    """Verify the job's ``authorization_proof`` for this dispatch and claim its id in the replay ledger."""
    declaration = spec.authorization_proof
    if not declaration:
        return
    now = now_ms()
    method = declaration.get("method")
    try:
        recorded = _recorded_verification(store, started.run_id)
        if recorded is not None:
            record = _recheck(store, started, recorded, now)
        else:
            record = _verify_and_claim(store, started, spec, declaration, now)
    except SchedulerError as exc:
        details = exc.details if isinstance(exc.details, dict) else {}
        denied: JSONObject = {"status": "denied", "error_code": exc.code, "method": method,
                  **{k: details[k] for k in ("proof_id", "key_id") if k in details}}
        outcomes.columns["proof_json"] = json.dumps(denied, sort_keys=True)
        outcomes.record("proof.failed", {**denied, "message": exc.message})
        raise
    except Exception as exc:  # a verifier bug denies, never permits
        denied = {"status": "denied", "error_code": "PROOF_VERIFICATION_FAILED", "method": method}
        outcomes.columns["proof_json"] = json.dumps(denied, sort_keys=True)
        outcomes.record("proof.failed", {**denied, "message": f"{type(exc).__name__}: {exc}"})
        raise SchedulerError("PROOF_VERIFICATION_FAILED", f"proof verification failed: {type(exc).__name__}: {exc}") from exc
    outcomes.columns["proof_json"] = json.dumps(record, sort_keys=True)
    outcomes.record("proof.verified", record)


def approval_columns(outcomes: RunOutcomes) -> dict[str, int | None]:
    """The ``approvals`` columns (``proof_not_before``, ``proof_expires_at``, ``proof_clock_skew_ms``) for a gate opened
    after this run's proof was verified (an escalation): the trusted window re-checked when the run resumes. Empty
    when the run verified no proof."""
    text = outcomes.columns.get("proof_json")
    record = json.loads(text) if isinstance(text, str) and text else None
    if not record or record.get("status") != "verified":
        return {}
    return {"proof_not_before": record.get("not_before"), "proof_expires_at": record.get("expires_at"),
            "proof_clock_skew_ms": record.get("clock_skew_ms")}


# --------------------------------------------------------------------------- steps


def _recorded_verification(store: Store, run_id: str) -> JSONObject | None:
    """The proof this run verified before an approval wait (its ``proof_json``), or None for a run not verified yet."""
    with store.read() as tx:
        text = tx.scalar("SELECT proof_json FROM runs WHERE id = ?", (run_id,))
    if not text:
        return None
    record = json.loads(text)
    return record if isinstance(record, dict) and record.get("status") == "verified" else None


def _recheck(store: Store, started: ClaimedRun, recorded: JSONObject, now: int) -> JSONObject:
    """After an approval wait: the recorded window and skew again, revocations again, the claim still this dispatch's."""
    check_window(recorded, now)
    with store.read() as tx:
        _check_revocations(tx, str(recorded["proof_id"]), str(recorded["key_id"]))
        claim = tx.one("SELECT dispatch_id FROM authorization_proof_replay WHERE proof_id = ?", (recorded["proof_id"],))
    if claim is None or claim["dispatch_id"] != started.dispatch_id:
        raise SchedulerError("PROOF_REPLAYED", f"proof {recorded['proof_id']} is no longer claimed by this dispatch",
                             details={"proof_id": recorded["proof_id"], "key_id": recorded["key_id"]})
    return {**recorded, "claim": "rechecked-after-approval", "checked_at": now}


def _verify_and_claim(store: Store, started: ClaimedRun, spec: JobSpec, declaration: JSONObject, now: int) -> JSONObject:
    """Read the proof afresh, verify it, then check revocations and claim its id (one transaction)."""
    artifact_digest = started.job.artifact_digest
    job_id = started.job.id
    verified = verify_proof(declaration, read_source(declaration), artifact_digest=artifact_digest, now_ms=now)
    record: JSONObject = {"status": "verified", **verified.to_json()}
    replayed: SchedulerError | None = None

    with committing(store) as tx:
        _check_revocations(tx, verified.proof_id, verified.key_id)
        inserted = tx.execute(
            "INSERT INTO authorization_proof_replay(proof_id, artifact_digest, run_id, claimed_at, expires_at, dispatch_id,"
            " job_id, method, key_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (proof_id) DO NOTHING",
            (verified.proof_id, artifact_digest, started.run_id, now, verified.expires_at_ms, started.dispatch_id,
             job_id, verified.method, verified.key_id),
        )
        if inserted == 1:
            record["claim"] = "claimed"
        else:
            claim = tx.one("SELECT * FROM authorization_proof_replay WHERE proof_id = ?", (verified.proof_id,))
            if claim is not None and _same_dispatch(tx, started, claim):
                record["claim"] = "reused"
                record["claimed_by_run"] = claim["run_id"]
            else:
                replayed = _quarantine(tx, started, verified, claim, now)
    if replayed is not None:
        store.notify_change()
        raise replayed
    return record


def _check_revocations(tx: Tx, proof_id: str, key_id: str) -> None:
    """``PROOF_REVOKED`` when the proof id or its key id has a row in ``proof_revocations``."""
    row = tx.one("SELECT id, proof_id, key_id, reason, revoked_by FROM proof_revocations WHERE proof_id = ? OR key_id = ?"
                 " ORDER BY revoked_at LIMIT 1", (proof_id, key_id))
    if row is not None:
        what = f"proof {proof_id}" if row["proof_id"] == proof_id else f"key {key_id}"
        raise SchedulerError("PROOF_REVOKED", f"{what} was revoked by {row['revoked_by'] or 'someone'}"
                                              f"{': ' + row['reason'] if row['reason'] else ''} (revocation {row['id']})",
                             details={"proof_id": proof_id, "key_id": key_id, "revocation_id": row["id"]})


def _same_dispatch(tx: Tx, started: ClaimedRun, claim: Mapping[str, object]) -> bool:
    """Whether ``claim`` belongs to this dispatch: the same dispatch row (a crash replay keeps it) or, for a retry,
    a dispatch of the run it retries, followed back through earlier retries and replays of that slot."""
    if claim["dispatch_id"] == started.dispatch_id:
        return True
    job_id = started.job.id
    if started.dispatch_kind != "retry" or claim["job_id"] != job_id:
        return False
    current, seen = started.source_run_id, 0
    while current and seen < MAX_LINEAGE:
        row = tx.one("SELECT dispatch_id, retry_of_run_id, replay_of_run_id FROM runs WHERE id = ? AND job_id = ?",
                     (current, job_id))
        if row is None:
            return False
        if row["dispatch_id"] == claim["dispatch_id"]:
            return True
        current, seen = row["retry_of_run_id"] or row["replay_of_run_id"], seen + 1
    return False


def _quarantine(tx: Tx, started: ClaimedRun, verified: VerifiedProof, claim: Mapping[str, object] | None,
                now: int) -> SchedulerError:
    """Disable the job of a dispatch that presented an already-claimed proof (same transaction); the error to raise."""
    job_id = started.job.id
    owner = (claim or {}).get("dispatch_id")
    reason = (f"quarantined: proof {verified.proof_id} presented again (claimed by dispatch {owner}); PROOF_REPLAYED")[:500]
    state.execute(tx, "quarantine_job", job_id=job_id, now=now, reason=reason)
    cancel_pending_work(tx, job_id, reason="job quarantined (PROOF_REPLAYED)", now=now, actor="proofs")
    append_event(tx, "job.quarantined", job_id=job_id, run_id=started.run_id, dispatch_id=started.dispatch_id,
                 actor="proofs", at=now, data={"code": "PROOF_REPLAYED", "proof_id": verified.proof_id,
                                               "key_id": verified.key_id, "claimed_by_dispatch": owner,
                                               "claimed_by_run": (claim or {}).get("run_id")})
    return SchedulerError("PROOF_REPLAYED", f"proof {verified.proof_id} was already used by dispatch {owner}; the job is"
                                            " quarantined (disabled) until an operator re-enables it",
                          details={"proof_id": verified.proof_id, "key_id": verified.key_id, "claimed_by_dispatch": owner})


# --------------------------------------------------------------------------- the CLI's operations


def revoke(store: Store, *, proof_id: str | None, key_id: str | None, reason: str | None, revoked_by: str,
           now: int | None = None) -> JSONObject:
    """Append a revocation of a proof id and/or key id (append-only table); it applies before every later use."""
    now = now_ms() if now is None else now
    row: JSONObject = {"id": str(uuid.uuid4()), "proof_id": proof_id, "key_id": key_id, "reason": reason, "revoked_by": revoked_by,
           "revoked_at": now}
    with committing(store) as tx:
        tx.execute("INSERT INTO proof_revocations(id, proof_id, key_id, reason, revoked_by, revoked_at) VALUES (?, ?, ?, ?, ?, ?)",
                   (row["id"], proof_id, key_id, reason, revoked_by, now))
        append_event(tx, "proof.revoked", actor=revoked_by, at=now,
                     data={"revocation_id": row["id"], "proof_id": proof_id, "key_id": key_id, "reason": reason})
    return row


def listing(store: Store, *, limit: int = 50) -> dict[str, list[JSONObject]]:
    """Every revocation and the ``limit`` most recent claims of the replay ledger."""
    with store.read() as tx:
        revocations = tx.all("SELECT id, proof_id, key_id, reason, revoked_by, revoked_at FROM proof_revocations"
                             " ORDER BY revoked_at, id")
        claims = tx.all("SELECT r.proof_id, r.method, r.key_id, r.job_id, j.name AS job_name, r.dispatch_id, r.run_id,"
                        " r.claimed_at, r.expires_at, r.artifact_digest FROM authorization_proof_replay r"
                        " LEFT JOIN jobs j ON j.id = r.job_id ORDER BY r.claimed_at DESC, r.proof_id LIMIT ?", (limit,))
    return {"revocations": revocations, "claims": claims}


class ProofStep(StepBase):
    """The pipeline step: a job declaring ``authorization_proof`` presents a fresh, bound, unrevoked proof per dispatch."""

    name = "proofs"
    fields: Mapping[str, Normaliser | None] = {"authorization_proof": normalise}
    sections = ("authorization_proof",)

    def check_section(self, name: str, value: object, sections: Mapping[str, Any]) -> list[Problem]:
        """A compiled proof declaration must be one ``normalise`` accepts."""
        return [] if value is None else section_problems(normalise(value, "authorization_proof")[1])

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Jobs that declare a proof."""
        return bool(sections.get("authorization_proof"))

    def before(self, run: Run) -> None:
        """Verify and claim this dispatch's proof (``PROOF_*`` refusals)."""
        verify(run.store, run.started, run.spec, run.outcomes)
