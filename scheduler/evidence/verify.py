"""Re-verification of a run's evidence from history alone (``scheduler runs evidence RUN_ID``).

``verify_run(store, run_id) -> EvidenceCheck`` never trusts the job's current state. It reads
the run's evidence row, the run row (when it still exists), the execution artifact the
evidence names (which must still hash to its digest) and the run's offloaded output files,
then checks, in this order, each failure with its own code:

==================================  ==================================================================
``EVIDENCE_RECORD_MISSING``         the run exists but has no evidence row (its job declared none, or
                                    the row is gone)
``EVIDENCE_NOT_VERIFIED``           the row records a failed or interrupted attestation (no envelope)
``EVIDENCE_DIGEST_MISMATCH``        the stored payload does not hash to the row's ``payload_sha256``
``EVIDENCE_PAYLOAD_INVALID``        the stored payload is not one JSON object in json-sort-v1 form
``EVIDENCE_TRANSPLANTED``           payload or envelope belong to another run (its ids, or another
                                    row's payload digest)
``EVIDENCE_ARTIFACT_STALE``         the artifact the evidence names is missing, changed, not the run's,
                                    or its declaration or command are not those in the payload
``EVIDENCE_PAYLOAD_MISMATCH``       the payload rebuilt from the stored run row differs from the stored
                                    one, or the envelope was made for another payload
``EVIDENCE_OUTPUT_UNAVAILABLE``     an offloaded output file is missing or unreadable, or only an
                                    excerpt of a stream was ever kept
``EVIDENCE_OUTPUT_SIZE_MISMATCH``   an output file's size is not the recorded byte count
``EVIDENCE_OUTPUT_DIGEST_MISMATCH`` an output file's SHA-256 is not the recorded digest
``EVIDENCE_PROVIDER_NOT_LOADED``    the provider named by the row cannot be loaded here
(the provider's own code)           the provider did not verify the envelope (``EVIDENCE_*``, see its
                                    README), else ``EVIDENCE_VERIFICATION_FAILED``
==================================  ==================================================================

When the run row is gone (pruned; a ``run_tombstones`` row remains) the stored payload and
envelope are still verified against the artifact and the provider; the run-row comparison
and the output files are skipped and the result says so (``run_present: false``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.canonical import canonical_bytes, hash_bytes
from scheduler.base.errors import SchedulerError
from scheduler.core.artifact import load_artifact
from scheduler.core.outputs import resolve_artifact
from scheduler.core.store import default_artifacts_root
from scheduler.evidence.build import (
    PARSED_OUTPUT_VERSION,
    PAYLOAD_SCHEMA,
    PAYLOAD_VERSIONS,
    build_document,
    parsed_digest,
    requested_bindings,
)
from scheduler.evidence.payload import EvidenceFailure, parse_canonical
from scheduler.evidence.providers import PROVIDERS, to_provider_declaration
from scheduler.plugins.protocols import EvidenceEnvelope, EvidencePayload


@attrs.frozen(kw_only=True)
class EvidenceCheck:
    """The outcome of re-verifying one run's evidence: ``verified``, or the first failure's code and message."""

    run_id: str
    verified: bool
    code: str | None = None
    message: str | None = None
    provider: str | None = None
    method: str | None = None
    status: str | None = None
    run_present: bool = True
    #: What was checked and how it went (``ok``, ``skipped: ...``), in order.
    checks: dict[str, str] = attrs.Factory(dict)
    details: dict[str, Any] = attrs.Factory(dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``runs evidence --json`` prints for a verified run (or as one item of a list)."""
        out: dict[str, Any] = {"ok": self.verified, "verified": self.verified, "run_id": self.run_id, "provider": self.provider,
                               "method": self.method, "status": self.status, "run_present": self.run_present,
                               "checks": dict(self.checks)}
        if not self.verified:
            out.update(code=self.code, error=self.message)
            if self.details:
                out["details"] = dict(self.details)
        return out

    def error(self) -> SchedulerError:
        """This failure as the ``SchedulerError`` the CLI prints (non-zero exit)."""
        return SchedulerError(self.code or "EVIDENCE_VERIFICATION_FAILED", self.message or "evidence not verified",
                              details={k: v for k, v in self.to_json().items() if k not in ("ok", "code", "error")})


class _Fail(Exception):
    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details


def verify_run(store: Any, run_id: str, *, artifacts_root: Path | None = None) -> EvidenceCheck:
    """Re-verify the evidence of run ``run_id`` (a full id) from history alone; never raises for a failed check.

    Raises ``NOT_FOUND`` only when neither the run, its evidence row nor a tombstone exists.
    ``artifacts_root`` defaults to the store's (``scheduler.core.store.default_artifacts_root``).
    """
    root = artifacts_root or default_artifacts_root(store.local_path)
    checks: dict[str, str] = {}
    with store.read() as tx:
        record = tx.one("SELECT * FROM evidence_records WHERE run_id = ?", (run_id,))
        run = tx.one("SELECT * FROM runs WHERE id = ?", (run_id,))
        tombstone = tx.one("SELECT * FROM run_tombstones WHERE run_id = ?", (run_id,)) if run is None else None
        if record is None and run is None and tombstone is None:
            raise SchedulerError("NOT_FOUND", f"no run and no evidence record {run_id!r}")
        state = _State(record=record, run=run, checks=checks)
        try:
            if record is None:
                raise _Fail("EVIDENCE_RECORD_MISSING", f"run {run_id} has no evidence record"
                            + (" (its job declares no evidence)" if run is not None and not run.get("evidence_status") else ""))
            state.provider = record["provider"]
            if record["status"] != "attested" or not record.get("envelope"):
                raise _Fail("EVIDENCE_NOT_VERIFIED", f"the evidence of run {run_id} was not attested: status {record['status']},"
                            f" {record.get('error_code') or 'no envelope'}", record_error_code=record.get("error_code"),
                            verify_status=_payload_verify_status(record))
            document = _check_payload(record, checks)
            envelope = _check_binding(tx, record, document, checks)
            artifact = _check_artifact(tx, record, run, document, checks)
            if run is not None:
                _check_run_row(run, artifact, document, record, checks)
                _check_outputs(root, run, checks)
            elif tombstone is None:
                # No run row and no tombstone: pruning always leaves one, so the row was deleted by other
                # means, and its outputs cannot be checked. Never "verified" by skipping the checks.
                raise _Fail("EVIDENCE_RUN_MISSING", f"run {run_id} is gone and left no tombstone (its row was deleted"
                            " outside pruning): its run row and outputs cannot be checked")
            else:
                checks["run_row"] = "skipped: the run was pruned (tombstone kept)"
                checks["outputs"] = "skipped: the run was pruned"
        except _Fail as failure:
            return state.failed(run_id, failure)
    try:
        method = _check_provider(record, document, envelope, checks)
    except _Fail as failure:
        return state.failed(run_id, failure)
    return EvidenceCheck(run_id=run_id, verified=True, provider=record["provider"], method=method, status=record["status"],
                         run_present=run is not None, checks=checks)


@attrs.define
class _State:
    record: dict[str, Any] | None
    run: dict[str, Any] | None
    checks: dict[str, str]
    provider: str | None = None

    def failed(self, run_id: str, failure: _Fail) -> EvidenceCheck:
        return EvidenceCheck(run_id=run_id, verified=False, code=failure.code, message=failure.message, provider=self.provider,
                             status=(self.record or {}).get("status"), run_present=self.run is not None, checks=self.checks,
                             details=failure.details)


def _payload_verify_status(record: dict[str, Any]) -> str | None:
    """The post-success verification status the row's payload binds (``interrupted`` for a check cut short), if any."""
    try:
        document = json.loads(record.get("canonical_payload") or "null")
    except ValueError:
        return None
    verification = document.get("verification") if isinstance(document, dict) else None
    status = verification.get("status") if isinstance(verification, dict) else None
    return status if isinstance(status, str) else None


def _check_payload(record: dict[str, Any], checks: dict[str, str]) -> dict[str, Any]:
    """The stored payload hashes to the row's digest and is one canonical JSON object."""
    text = record["canonical_payload"]
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text or b"")
    if hashlib.sha256(data).hexdigest() != record["payload_sha256"]:
        raise _Fail("EVIDENCE_DIGEST_MISMATCH", "the stored evidence payload does not hash to the record's payload_sha256")
    try:
        document = parse_canonical(data, "the stored payload")
    except EvidenceFailure as exc:
        raise _Fail("EVIDENCE_PAYLOAD_INVALID", exc.message, cause=exc.code) from None
    version = document.get("version")
    if document.get("schema") != PAYLOAD_SCHEMA or isinstance(version, bool) or version not in PAYLOAD_VERSIONS:
        raise _Fail("EVIDENCE_PAYLOAD_INVALID", f"the stored payload is not a {PAYLOAD_SCHEMA} of a version this kernel"
                                                f" builds ({', '.join(map(str, PAYLOAD_VERSIONS))}): schema"
                                                f" {document.get('schema')!r}, version {version!r}")
    checks["payload_digest"] = "ok"
    return document


def _check_binding(tx: Any, record: dict[str, Any], document: dict[str, Any], checks: dict[str, str]) -> dict[str, Any]:
    """Payload and envelope are this run's: ids, artifact, and the envelope made for this row's payload."""
    for key, column in (("run_id", "run_id"), ("job_id", "job_id"), ("artifact_digest", "artifact_digest")):
        if document.get(key) != record.get(column):
            raise _Fail("EVIDENCE_TRANSPLANTED", f"the payload's {key} is {document.get(key)!r}, not this record's"
                                                 f" {record.get(column)!r}: it was made for another run")
    try:
        envelope = json.loads(record["envelope"])
    except (TypeError, ValueError):
        raise _Fail("EVIDENCE_PAYLOAD_INVALID", "the stored envelope is not JSON") from None
    digest = envelope.get("payload_digest") if isinstance(envelope, dict) else None
    if digest != "sha256:" + record["payload_sha256"]:
        other = None
        if isinstance(digest, str) and digest.startswith("sha256:"):
            other = tx.one("SELECT run_id FROM evidence_records WHERE payload_sha256 = ? AND run_id <> ?",
                           (digest.removeprefix("sha256:"), record["run_id"]))
        if other is not None:
            raise _Fail("EVIDENCE_TRANSPLANTED", f"the envelope was made for the evidence of run {other['run_id']}",
                        from_run_id=other["run_id"])
        raise _Fail("EVIDENCE_PAYLOAD_MISMATCH", "the envelope was made for a different payload (its payload_digest differs)")
    checks["binding"] = "ok"
    return envelope


def _check_artifact(tx: Any, record: dict[str, Any], run: dict[str, Any] | None, document: dict[str, Any],
                    checks: dict[str, str]) -> dict[str, Any] | None:
    """The run's own artifact (not the job's current one): stored, intact, the run's, and what the payload quotes."""
    digest = record.get("artifact_digest")
    if not digest:
        checks["artifact"] = "skipped: the run has no execution artifact"
        return None
    if run is not None and run.get("artifact_digest") != digest:
        raise _Fail("EVIDENCE_ARTIFACT_STALE", f"the evidence names artifact {digest}, the run {run.get('artifact_digest')}")
    try:
        artifact = load_artifact(tx, digest).payload
    except SchedulerError as exc:
        raise _Fail("EVIDENCE_ARTIFACT_STALE", f"the run's execution artifact cannot be used: {exc.code}: {exc.message}",
                    cause=exc.code) from None
    for section, key in (("evidence", "declaration"), ("command", "command"), ("target", "target")):
        if artifact.get(section) != document.get(key):
            raise _Fail("EVIDENCE_ARTIFACT_STALE", f"the payload's {key} is not the {section} of the run's artifact {digest}")
    if document.get("version", 1) >= 2:  # what the declaration asked to bind, checked even when the run is gone
        declared = document.get("bindings")
        bindings: dict[str, Any] = declared if isinstance(declared, dict) else {}
        evidence = artifact.get("evidence")
        requested = requested_bindings(evidence if isinstance(evidence, dict) else None)
        listed = bindings.get("enforced")
        enforced: list[Any] = listed if isinstance(listed, list) else []
        if bindings.get("requested") != requested or not set(requested) <= set(enforced):
            raise _Fail("EVIDENCE_ARTIFACT_STALE", f"the payload's bindings are not those the declaration of the run's"
                                                   f" artifact {digest} asks for ({', '.join(requested) or 'none'})")
    checks["artifact"] = "ok"
    return artifact


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two JSON values differ (for the message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    return [] if a == b else [path or "(root)"]


def _check_run_row(run: dict[str, Any], artifact: dict[str, Any] | None, document: dict[str, Any], record: dict[str, Any],
                   checks: dict[str, str]) -> None:
    """The payload rebuilt from the stored run row alone is byte for byte the stored one."""
    stored = document.get("result")
    result: dict[str, Any] = stored if isinstance(stored, dict) else {}
    duration = result.get("duration_ms")
    row = dict(run)
    if (row.get("status") == "cancelled" and row.get("cancel_requested_at") is not None
            and result.get("status") in ("ok", "error", "timeout")):
        row["status"] = result["status"]  # a cancel request won the completion after the worker attested
        checks["cancellation_won"] = "the run was attested, then a cancel request won its completion"
    rebuilt = build_document(row, artifact, duration_ms=duration, version=document["version"])
    if canonical_bytes(rebuilt) != record["canonical_payload"].encode("utf-8"):
        diff = _differences(rebuilt, document)
        raise _Fail("EVIDENCE_PAYLOAD_MISMATCH", f"the stored run no longer matches its evidence payload ({', '.join(diff[:8])})",
                    fields=diff[:50])
    if duration is not None and (not isinstance(duration, int) or isinstance(duration, bool) or duration < 0
                                 or (run.get("duration_ms") is not None and duration > run["duration_ms"])):
        raise _Fail("EVIDENCE_PAYLOAD_MISMATCH", f"the payload's duration_ms {duration!r} is not within the run's"
                                                 f" recorded duration {run.get('duration_ms')!r}", fields=["result.duration_ms"])
    checks["run_row"] = "ok"


def _hash_file(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _check_outputs(root: Path, run: dict[str, Any], checks: dict[str, str]) -> None:
    """Every output stream recomputed from its complete bytes (the offloaded file, or the exact inline excerpt)."""
    streams = [("stdout", "stdout_artifact", "stdout_sha256", "stdout_bytes"),
               ("stderr", "stderr_artifact", "stderr_sha256", "stderr_bytes"),
               ("structured output", "output_artifact", "output_sha256", "output_bytes")]
    for name, art_col, sha_col, size_col in streams:
        relative, expected, size = run.get(art_col), run.get(sha_col), run.get(size_col)
        expected = expected.removeprefix("sha256:") if isinstance(expected, str) else expected
        if relative:
            try:
                found_size, found = _hash_file(resolve_artifact(root, relative))
            except SchedulerError as exc:
                raise _Fail("EVIDENCE_OUTPUT_UNAVAILABLE", f"{name}: {exc.message}", stream=name) from None
            except OSError as exc:
                raise _Fail("EVIDENCE_OUTPUT_UNAVAILABLE", f"{name}: the offloaded file {relative} cannot be read"
                                                           f" ({type(exc).__name__})", stream=name) from None
            if size is not None and found_size != size:
                raise _Fail("EVIDENCE_OUTPUT_SIZE_MISMATCH", f"{name}: {relative} holds {found_size} bytes, the run recorded {size}",
                            stream=name)
            if found != expected:
                raise _Fail("EVIDENCE_OUTPUT_DIGEST_MISMATCH", f"{name}: {relative} does not hash to the recorded SHA-256",
                            stream=name)
            checks[name.replace(" ", "_")] = f"ok ({found_size} bytes, offloaded)"
        elif name != "structured output" and expected:
            data = (run.get(f"{name}_excerpt") or "").encode("utf-8")
            if run.get(f"{name}_truncated"):
                raise _Fail("EVIDENCE_OUTPUT_UNAVAILABLE", f"{name}: only an excerpt of the stream was kept", stream=name)
            if size is not None and len(data) != size:
                raise _Fail("EVIDENCE_OUTPUT_SIZE_MISMATCH", f"{name}: the stored stream holds {len(data)} bytes, the run"
                                                             f" recorded {size}", stream=name)
            if hashlib.sha256(data).hexdigest() != expected:
                raise _Fail("EVIDENCE_OUTPUT_DIGEST_MISMATCH", f"{name}: the stored stream does not hash to the recorded SHA-256",
                            stream=name)
            checks[name] = f"ok ({len(data)} bytes, inline)"


def _check_provider(record: dict[str, Any], document: dict[str, Any], envelope: dict[str, Any], checks: dict[str, str]) -> str | None:
    """The envelope verified by the provider that made it, loaded here (its trust from this host's settings)."""
    name = record["provider"]
    try:
        provider = PROVIDERS.get(name)
    except SchedulerError as exc:
        raise _Fail("EVIDENCE_PROVIDER_NOT_LOADED", f"evidence provider {name!r} is not loaded here: {exc.message}",
                    cause=(exc.details or {}).get("cause", exc.code)) from None
    try:
        declaration = json.loads(record.get("declaration") or "{}")
    except ValueError:
        declaration = {}
    if not isinstance(declaration, dict) or declaration.get("provider", name) != name:
        raise _Fail("EVIDENCE_PAYLOAD_MISMATCH", "the record's declaration names another provider than the record")
    canonical = record["canonical_payload"].encode("utf-8")
    payload = EvidencePayload(document=document, canonical=canonical, digest=hash_bytes(canonical))
    keys = {"provider", "format", "payload_digest", "data"}
    env: Any = EvidenceEnvelope(**envelope) if isinstance(envelope, dict) and set(envelope) == keys else envelope
    try:
        outcome = provider.verify(env, payload, to_provider_declaration({**declaration, "provider": name}))
    except Exception as exc:  # noqa: BLE001 - a provider that raises did not verify
        raise _Fail("EVIDENCE_VERIFICATION_FAILED", f"provider {name!r} raised while verifying: {type(exc).__name__}") from None
    if getattr(outcome, "verified", False) is not True or getattr(outcome, "code", None) is not None:
        code = getattr(outcome, "code", None)
        code = code if isinstance(code, str) and code.startswith("EVIDENCE_") else "EVIDENCE_VERIFICATION_FAILED"
        raise _Fail(code, f"provider {name!r} did not verify the envelope: {getattr(outcome, 'reason', None) or code}",
                    provider_code=getattr(outcome, "code", None))
    checks["envelope"] = "ok"
    data = envelope.get("data") if isinstance(envelope, dict) else None
    return data.get("method") if isinstance(data, dict) else None


def check_parsed_output(tx: Any, run_id: str, output_parsed: str | None) -> bool:
    """Whether the run's evidence binds the ``output_parsed`` text it stores; ``OUTPUT_TAMPERED`` when it contradicts it.

    What ``runs get`` checks before it shows a parsed value (``output_parsed_verified``): True when
    the run's attested evidence payload (version 3 or later, ``result.structured.parsed_sha256``)
    binds exactly this text (or its absence), False when nothing binds it (no evidence row, a
    failed or interrupted attestation, a payload attested before version 3). Raises
    ``OUTPUT_TAMPERED`` when the stored value is not the one the payload binds, or when the payload
    itself is no longer intact (not its recorded digest, not canonical, another run's), so a value
    rewritten in the database is never shown as the run's. It checks the payload row, not the
    provider's envelope: ``runs evidence`` (``verify_run``) is the full check.
    """
    record = tx.one("SELECT status, canonical_payload, payload_sha256 FROM evidence_records WHERE run_id = ?", (run_id,))
    if record is None or record["status"] != "attested" or not record.get("canonical_payload"):
        return False

    def tampered(reason: str, **details: Any) -> SchedulerError:
        return SchedulerError("OUTPUT_TAMPERED", f"run {run_id}: {reason}; its parsed output is not shown"
                                                 f" (scheduler runs evidence {run_id} re-verifies the whole record)",
                              details={"run_id": run_id, **details})

    data = record["canonical_payload"].encode("utf-8")
    if hashlib.sha256(data).hexdigest() != record["payload_sha256"]:
        raise tampered("its evidence payload no longer hashes to the recorded payload_sha256")
    try:
        document = parse_canonical(data, "the stored payload")
    except EvidenceFailure as exc:
        raise tampered(f"its evidence payload is not intact ({exc.code})") from None
    if document.get("run_id") != run_id:
        raise tampered("its evidence payload was made for another run")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < PARSED_OUTPUT_VERSION:
        return False
    result = document.get("result")
    structured = result.get("structured") if isinstance(result, dict) else None
    expected = structured.get("parsed_sha256") if isinstance(structured, dict) else None
    found = parsed_digest(output_parsed)
    if found != expected:
        raise tampered("the stored output_parsed is not the value its evidence payload binds", expected=expected, found=found)
    return True


#: How many of the newest attested evidence rows ``doctor`` re-verifies (the reference checks the newest 500).
DOCTOR_VERIFY_LIMIT = 200
SAMPLES = 20


def evidence_counts(tx: Any) -> dict[str, Any]:
    """Cheap evidence counts for ``status``: rows by status, runs by ``evidence_status``, and runs whose row is missing.

    No re-verification (``doctor`` does that); two aggregate queries and one anti-join on the
    unique ``evidence_records.run_id``.
    """
    records = {r["status"]: r["n"] for r in tx.all("SELECT status, COUNT(*) AS n FROM evidence_records GROUP BY status")}
    runs = {r["evidence_status"]: r["n"] for r in tx.all(
        "SELECT evidence_status, COUNT(*) AS n FROM runs WHERE evidence_status IS NOT NULL GROUP BY evidence_status")}
    missing = tx.scalar("SELECT COUNT(*) FROM runs r WHERE r.evidence_status IS NOT NULL AND NOT EXISTS"
                        " (SELECT 1 FROM evidence_records e WHERE e.run_id = r.id)")
    return {"total": sum(records.values()), "records": records, "runs": runs, "missing": missing}


def evidence_diagnostics(store: Any, *, limit: int = DOCTOR_VERIFY_LIMIT, artifacts_root: Path | None = None) -> dict[str, Any]:
    """``doctor``'s evidence check: the newest ``limit`` attested rows re-verified, and runs whose row is missing.

    ``{total, checked, unchecked, verification_complete, invalid, invalid_samples, missing, missing_samples,
    not_attested}``; ``invalid`` and ``missing`` make the database unhealthy. Rows recording a failed or
    interrupted attestation are outcomes, not integrity failures: counted as ``not_attested``.
    """
    with store.read() as tx:
        counts = evidence_counts(tx)
        attested = [r["run_id"] for r in tx.all(
            "SELECT run_id FROM evidence_records WHERE status = 'attested' ORDER BY created_at DESC, run_id DESC LIMIT ?",
            (int(limit),))]
        total_attested = counts["records"].get("attested", 0)
        missing = [r["id"] for r in tx.all(
            "SELECT r.id FROM runs r WHERE r.evidence_status IS NOT NULL AND NOT EXISTS"
            " (SELECT 1 FROM evidence_records e WHERE e.run_id = r.id) ORDER BY r.created_at DESC LIMIT ?", (SAMPLES,))]
    invalid: list[dict[str, Any]] = []
    for run_id in attested:
        check = verify_run(store, run_id, artifacts_root=artifacts_root)
        if not check.verified:
            invalid.append({"run_id": run_id, "code": check.code, "error": check.message})
    return {
        "total": counts["total"], "checked": len(attested), "unchecked": total_attested - len(attested),
        "verification_complete": len(attested) == total_attested, "invalid": len(invalid), "invalid_samples": invalid[:SAMPLES],
        "missing": counts["missing"], "missing_samples": missing, "not_attested": counts["total"] - total_attested,
    }


__all__ = ["EvidenceCheck", "check_parsed_output", "evidence_counts", "evidence_diagnostics", "verify_run"]
