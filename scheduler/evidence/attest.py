"""Evidence: the run pipeline step that attests a run's evidence payload, and the row it commits.

A job that declares ``evidence`` (``scheduler.evidence.declaration``) gets, for every run
that executes, an evidence row committed in the run's completion transaction:

1. ``attest_run`` (in the worker, after execution and post-success verification, before
   the completion transaction) reads the claimed run row and its execution artifact, overlays
   what completion will write (``result_columns(result)`` and the pipeline's
   ``outcomes.columns``), and builds the payload document (``scheduler.evidence.build``);
   its json-sort-v1 bytes and their digest go to the declared provider (entry point group
   ``scheduler.evidence_providers``, loaded by ``scheduler.evidence.providers``), which
   ``attest``s them, and ``verify``s the envelope when the declaration says ``verify.required``.
2. The row (``outcomes.evidence``) and ``runs.evidence_status`` (``attested``, ``verified``
   or ``failed``) commit with the terminal state (``scheduler.evidence.store.insert_record``,
   which completion calls through its evidence participant); an ``evidence.*`` runtime event
   says what happened.
3. With ``verify.required``, a failed attestation or verification ends the run ``error``
   (``EVIDENCE_ATTESTATION_FAILED`` / ``EVIDENCE_VERIFICATION_FAILED``) and suppresses its
   consequences (no delivery, no children). Without it, the failure is recorded (row status
   ``failed``, its code) and the run keeps its status.

A job that declares no evidence costs one attribute read here. Crash recovery gives an
interrupted run of an evidence job a terminal ``interrupted`` row
(``scheduler.evidence.store.record_interrupted``). Re-verification from history lives in
``scheduler.evidence.verify`` (``verify_run``).
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from scheduler.base.canonical import canonical_bytes, canonical_json, hash_bytes
from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core.artifact import load_artifact
from scheduler.core.completion import result_columns
from scheduler.core.execution import ExecutionResult
from scheduler.core.outcomes import RunOutcomes
from scheduler.evidence.build import build_document
from scheduler.evidence.providers import PROVIDERS, envelope_json, to_provider_declaration
from scheduler.plugins.protocols import EvidenceEnvelope, EvidencePayload, EvidenceVerification

log = logging.getLogger(__name__)


def attest_run(store: Any, started: Any, spec: Any, result: ExecutionResult, outcomes: RunOutcomes) -> ExecutionResult:
    """Attest the run's evidence when its job declares it; the row goes into ``outcomes.evidence``.

    Returns the result to commit: unchanged, or ``error`` with ``EVIDENCE_ATTESTATION_FAILED`` /
    ``EVIDENCE_VERIFICATION_FAILED`` when a required attestation or verification failed.
    """
    declaration = getattr(spec, "evidence", None)
    if not declaration:
        return result
    return _attest(store, started, spec, declaration, result, outcomes)


def _attest(store: Any, started: Any, spec: Any, declaration: dict[str, Any], result: ExecutionResult,
            outcomes: RunOutcomes) -> ExecutionResult:
    required = bool(declaration.get("verify", {}).get("required"))
    name = declaration.get("provider") or "checksum"
    record: dict[str, Any] = {
        "provider": name, "methods": list(declaration.get("methods") or []), "envelope": None, "verification": None,
        "verified": 0, "status": "failed", "error_code": None, "evidence_ref": getattr(spec, "evidence_ref", None),
        "declaration": canonical_json(declaration), "retention_policy": declaration.get("retention"),
        "artifact_digest": started.job.get("artifact_digest"), "source_run_id": started.source_run_id,
        "canonical_payload": None, "payload_sha256": None,
    }
    failure: tuple[str, str, str] | None = None  # (run code, evidence code, message)
    try:
        payload, record["artifact_digest"], record["source_run_id"] = _payload(store, started, result, outcomes)
        record["canonical_payload"] = payload.canonical.decode("utf-8")
        record["payload_sha256"] = payload.digest.removeprefix("sha256:")
        provider = _provider(name)
        decl = to_provider_declaration(declaration)
        try:
            envelope = provider.attest(payload, decl)
        except SchedulerError as exc:
            raise _Failed("EVIDENCE_ATTESTATION_FAILED", exc.code, exc.message) from None
        except Exception as exc:  # noqa: BLE001 - a provider bug fails closed
            raise _Failed("EVIDENCE_ATTESTATION_FAILED", "EVIDENCE_ATTESTATION_FAILED",
                          f"provider {name!r} crashed while attesting: {type(exc).__name__}: {exc}") from None
        if not isinstance(envelope, EvidenceEnvelope) or envelope.provider != name or envelope.payload_digest != payload.digest:
            raise _Failed("EVIDENCE_ATTESTATION_FAILED", "EVIDENCE_ENVELOPE_INVALID",
                          f"provider {name!r} returned an envelope that is not its own for this payload")
        record["envelope"] = envelope_json(envelope)
        method = envelope.data.get("method") if isinstance(envelope.data, dict) else None
        if isinstance(method, str) and not record["methods"]:
            record["methods"] = [method]
        if required:
            verification = _verify(provider, envelope, payload, decl, name)
            record["verification"] = canonical_json(verification)
            if not verification["verified"]:
                raise _Failed("EVIDENCE_VERIFICATION_FAILED", verification.get("code") or "EVIDENCE_VERIFICATION_FAILED",
                              verification.get("reason") or "the provider did not verify the envelope")
            record["verified"] = 1
        record["status"] = "attested"
    except _Failed as exc:
        failure = (exc.run_code, exc.code, exc.message)
    except SchedulerError as exc:
        failure = ("EVIDENCE_ATTESTATION_FAILED", exc.code, exc.message)
    if record["canonical_payload"] is None:  # nothing could be built: the row still says what failed, for this run
        stub = canonical_bytes({"schema": "scheduler.evidence.failure", "version": 1, "run_id": started.run_id,
                                "job_id": started.job.get("id"), "error_code": failure[1] if failure else None})
        record["canonical_payload"] = stub.decode("utf-8")
        record["payload_sha256"] = hash_bytes(stub).removeprefix("sha256:")
    event = {"provider": name, "methods": record["methods"], "payload_sha256": record["payload_sha256"]}
    if failure is None:
        state = "verified" if record["verified"] else "attested"
        outcomes.columns["evidence_status"] = state
        outcomes.record(f"evidence.{state}", event)
    else:
        run_code, code, message = failure
        record["error_code"] = code
        outcomes.columns["evidence_status"] = "failed"
        outcomes.record("evidence.failed", {**event, "code": code, "error": message[:500], "required": required})
        if required:
            outcomes.suppress_consequences = True
            result = attrs.evolve(result, status="error", error_code=run_code,
                                  error_message=f"{code}: {message}"[:4096])
        else:
            log.warning("evidence of run %s was not attested (%s: %s); the run keeps its status", started.run_id, code, message)
    if not (outcomes.evidence or {}).get("interrupted"):  # a run the dispatcher committed without us keeps that row
        outcomes.evidence = record
    return result


def interrupt(outcomes: RunOutcomes, code: str) -> None:
    """The dispatcher commits this run without its worker (abandoned): the completion gives it an interrupted row.

    Whatever the cut-loose worker attests later describes a result that is discarded, so it
    never replaces this marker; ``scheduler.evidence.store.insert_record`` turns it into an ``interrupted`` row.
    """
    outcomes.evidence = {"interrupted": code}


class _Failed(Exception):
    def __init__(self, run_code: str, code: str, message: str) -> None:
        super().__init__(message)
        self.run_code, self.code, self.message = run_code, code, message


def _payload(store: Any, started: Any, result: ExecutionResult, outcomes: RunOutcomes) -> tuple[Any, str | None, str | None]:
    """The run's ``EvidencePayload`` as completion will persist it, with the run's artifact digest and source run."""
    with store.read() as tx:
        run = tx.one("SELECT * FROM runs WHERE id = ?", (started.run_id,))
        if run is None:
            raise SchedulerError("EVIDENCE_ATTESTATION_FAILED", f"run {started.run_id} is not stored")
        artifact = load_artifact(tx, run["artifact_digest"]).payload if run.get("artifact_digest") else None
    row = {**run, **result_columns(result), **outcomes.columns, "status": result.status}
    started_at = run.get("started_at") or started.started_at
    document = build_document(row, artifact, duration_ms=max(0, now_ms() - started_at) if started_at else None)
    canonical = canonical_bytes(document)
    return (EvidencePayload(document=document, canonical=canonical, digest=hash_bytes(canonical)),
            run.get("artifact_digest"), run.get("source_run_id"))


def _provider(name: str) -> Any:
    """The evidence provider ``name`` (``plugin_api`` checked by the loader), kept loaded for later runs."""
    try:
        return PROVIDERS.get(name)
    except SchedulerError as exc:
        raise _Failed("EVIDENCE_ATTESTATION_FAILED", "EVIDENCE_PROVIDER_NOT_LOADED", exc.message) from None


def _verify(provider: Any, envelope: Any, payload: Any, decl: Any, name: str) -> dict[str, Any]:
    """The provider's verification as a JSON object; anything but a clean ``verified=True`` is a failure."""
    try:
        outcome = provider.verify(envelope, payload, decl)
    except Exception as exc:  # noqa: BLE001 - verify must not raise; if it does, it did not verify
        return {"verified": False, "provider": name, "code": "EVIDENCE_VERIFICATION_FAILED",
                "reason": f"provider {name!r} raised while verifying: {type(exc).__name__}: {exc}"}
    if not isinstance(outcome, EvidenceVerification):
        return {"verified": False, "provider": name, "code": "EVIDENCE_VERIFICATION_FAILED",
                "reason": f"provider {name!r} returned {type(outcome).__name__}, not an EvidenceVerification"}
    verified = outcome.verified is True and outcome.provider == name and outcome.code is None
    return {"verified": verified, "provider": outcome.provider, "code": None if verified else (outcome.code or "EVIDENCE_VERIFICATION_FAILED"),
            "reason": outcome.reason}


__all__ = ["attest_run", "interrupt"]
