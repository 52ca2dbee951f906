"""The evidence payload of a run, built from its persisted run row and its execution artifact alone.

One function, ``build_document(run, artifact, duration_ms=...)``, serves both ends:

* the worker, before the completion transaction, passes the run row it claimed (read back
  from the database) overlaid with ``scheduler.core.completion.result_columns(result)`` and the
  pipeline's ``outcomes.columns``, i.e. exactly the values completion is about to write;
* re-verification (``scheduler.evidence.verify``) passes the stored run row, and must get
  the same document, hence the same json-sort-v1 bytes.

So the document holds only run fields that are fixed before the completion transaction:
ids, attempt, slot and start time, lineage, the fence (owner and token), the command
projection and the evidence declaration from the run's own artifact, the result (status,
error code, exit code, signal, timeout, SHA-256 and size of the *complete* stdout and
stderr as the stream recorder hashed them, offloaded or not, the structured-output digest),
the post-success verification record, and the trust outcomes present (identity, trust
level, delegation, governance, credential presentation).

Not in it: ``finished_at``, ``terminal_at`` and the run's ``duration_ms``, which the
completion transaction sets after attestation. The payload's ``result.duration_ms`` is
measured when the worker attests (execution and verification, from ``started_at``); it is
therefore at most the run's recorded ``duration_ms`` and re-verification checks exactly that.
Error *messages* are not in it either (completion may append "cancellation won").

Secret-like keys (``scheduler.core.artifact.SECRET_KEY_RE``) inside the verification
record and the outcomes become ``{"redacted": true, "value_hash": ...}``.

Version 2 makes the declaration's ``payload.bind`` and ``collect``
shape the document: ``bindings`` (``requested``: the declaration's names; ``enforced``: the
core set, the requested names and every outcome present), a requested or collected outcome
the run lacks bound as ``null``, the authorization decision and verified proof in
``outcomes``, and ``collected`` with a bounded excerpt of each collected stream's stored
(already redacted) excerpt. Version 1 payloads are rebuilt with version 1 rules.

Version 3 (``PAYLOAD_VERSION``) binds the parsed structured output too: ``result.structured.parsed_sha256`` is the
``sha256:`` digest of the run's ``output_parsed`` column (the compact JSON text completion
writes; null when nothing was parsed or stored inline), and ``result.structured`` is present
whenever the run has an ``output_format`` *or* a parsed value. ``output_sha256`` covers the raw
stream only, so before version 3 a rewritten ``output_parsed`` still re-verified
(``parsed_digest`` is what ``runs get`` checks the value it shows against).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from scheduler.core.artifact import redact_secrets

PAYLOAD_SCHEMA = "scheduler.evidence.payload"
#: The version the worker builds. Re-verification rebuilds a stored payload with the rules of the version it
#: carries (``build_document(..., version=)``), so a payload attested by an older builder stays verifiable.
PAYLOAD_VERSION = 3
#: Every version ``build_document`` can build (1: before ``bind`` / ``collect`` shaped the payload; 2: before the
#: parsed structured output was bound).
PAYLOAD_VERSIONS = (1, 2, 3)
#: The first version binding ``result.structured.parsed_sha256``.
PARSED_OUTPUT_VERSION = 3
#: ``schema`` of a handoff v4 artifact (``scheduler.artifacts.handoff.ARTIFACT_SCHEMA``; not imported, to keep this module light).
HANDOFF_ARTIFACT_SCHEMA = "openclaw.scheduler.handoff-artifact"

#: Run columns holding a JSON outcome of the pipeline, and their name in the payload's ``outcomes``.
OUTCOME_COLUMNS = (
    ("identity_json", "identity"),
    ("trust_level", "trust_level"),
    ("delegation_json", "delegation"),
    ("governance_json", "governance"),
    ("credentials_json", "credential_presentation"),
)

#: Version 2 also binds the authorization decision and the verified proof (version 1 left them out).
OUTCOME_COLUMNS_V2 = OUTCOME_COLUMNS + (("authorization_json", "authorization"), ("proof_json", "authorization_proof"))

#: Bindings every payload enforces, whatever the declaration asks (the reference's core set): the run's ids
#: (``run_id``, ``job_id``, ``dispatch_id``), ``command``, ``target`` (the contract), ``result`` and ``verification``.
CORE_BINDINGS = ("command", "contract", "execution_id", "postcondition", "result")
#: ``payload.bind`` names bound to an entry of the payload's ``outcomes`` (present when the run has it; when the
#: declaration asks for it and the run has none, recorded as ``null``: the payload then binds its absence).
OUTCOME_BINDINGS = {
    "identity": "identity", "trust": "trust_level", "authorization": "authorization",
    "authorization_proof": "authorization_proof", "delegation": "delegation", "credential_handoff": "credential_presentation",
}
#: ``collect`` names bound to an entry of ``outcomes`` (``result`` and ``exit_code`` are always in ``result``).
OUTCOME_COLLECTS = {"identity": "identity", "authorization": "authorization", "governance": "governance"}
#: ``collect`` names whose output excerpt goes into the payload's ``collected``.
STREAM_COLLECTS = ("stdout", "stderr")
#: At most this many UTF-8 bytes of a collected stream's stored (already redacted) excerpt enter the payload.
COLLECT_EXCERPT_BYTES = 4096

_HEX64 = re.compile(r"[0-9a-f]{64}")


def _digest(value: Any) -> Any:
    """A stored digest in the one payload form: ``sha256:<hex>`` (bare hex gets the prefix; None stays None)."""
    if isinstance(value, str) and _HEX64.fullmatch(value):
        return "sha256:" + value
    return value


def _parsed(value: Any) -> Any:
    """A JSON text column parsed (a value that is not JSON text is kept as it is)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def parsed_digest(text: str | None) -> str | None:
    """The ``sha256:`` digest of a run's stored ``output_parsed`` text (None when the column is NULL).

    The stored text itself is hashed, not a canonical form of the value: structured output may hold
    values json-sort-v1 refuses (integers beyond 2^53, ``__proto__`` keys), and the text is exactly what
    completion wrote and what ``runs get`` parses.
    """
    if text is None:
        return None
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def requested_bindings(declaration: Mapping[str, Any] | None) -> list[str]:
    """The ``payload.bind`` names a stored declaration asks for, sorted (the payload's ``bindings.requested``)."""
    payload = (declaration or {}).get("payload") or {}
    return sorted(set(payload.get("bind") or ()))


def _excerpt(run: Mapping[str, Any], stream: str) -> dict[str, Any] | None:
    """A collected stream: the head of its stored excerpt (at most ``COLLECT_EXCERPT_BYTES``), None when never captured.

    The stored excerpt is what the stream recorder kept after redaction (every presented
    credential value already replaced), so nothing here sees unredacted output. ``complete``
    says whether the excerpt is the whole stream (its bytes hash to the stream's SHA-256).
    """
    text, size = run.get(f"{stream}_excerpt"), run.get(f"{stream}_bytes")
    if text is None and size is None:
        return None
    raw = (text or "").encode("utf-8")[:COLLECT_EXCERPT_BYTES]
    cut = raw.decode("utf-8", errors="ignore")  # never half a character
    data = cut.encode("utf-8")
    return {"excerpt": cut, "excerpt_bytes": len(data),
            "complete": _digest(run.get(f"{stream}_sha256")) == "sha256:" + hashlib.sha256(data).hexdigest()}


def build_document(run: Mapping[str, Any], artifact: Mapping[str, Any] | None, *, duration_ms: int | None,
                   version: int = PAYLOAD_VERSION) -> dict[str, Any]:
    """The evidence payload document of ``run`` (a run row as completion writes it) bound to its ``artifact`` payload.

    ``artifact`` is the parsed execution artifact the run is bound to (None when the run has
    none: the payload then says so). Deterministic: the same row and artifact give the same
    document, so its canonical bytes can be rebuilt later from history. ``version`` selects
    the builder's rules (``PAYLOAD_VERSIONS``; re-verification passes the stored payload's);
    another value is ``ValueError``.
    """
    if version not in PAYLOAD_VERSIONS:
        raise ValueError(f"evidence payload version {version!r} is not one of {PAYLOAD_VERSIONS}")
    art = artifact or {}
    status = run.get("status")
    outcomes: dict[str, Any] = {}
    for column, name in (OUTCOME_COLUMNS if version == 1 else OUTCOME_COLUMNS_V2):
        value = run.get(column)
        if value is not None:
            outcomes[name] = redact_secrets(_parsed(value))
    declared = art.get("evidence") or {}
    extra: dict[str, Any] = {}
    if version >= 2:
        requested = requested_bindings(declared)
        collect = set(declared.get("collect") or ())
        for name in requested:  # asked for and absent: bound as null
            if name in OUTCOME_BINDINGS:
                outcomes.setdefault(OUTCOME_BINDINGS[name], None)
        for name in sorted(collect & set(OUTCOME_COLLECTS)):
            outcomes.setdefault(OUTCOME_COLLECTS[name], None)
        present = {n for n, key in OUTCOME_BINDINGS.items() if outcomes.get(key) is not None}
        if ((declared.get("payload") or {}).get("context")) is not None:
            present.add("context")
        extra = {
            "bindings": {"requested": requested, "enforced": sorted(set(CORE_BINDINGS) | set(requested) | present)},
            "collected": {name: _excerpt(run, name) for name in STREAM_COLLECTS if name in collect},
        }
    verification = None
    if run.get("verify_status") is not None or run.get("verify_json") is not None:
        verification = {"status": run.get("verify_status"), "record": redact_secrets(_parsed(run.get("verify_json")))}
    structured: dict[str, Any] | None = None
    binds_parsed = version >= PARSED_OUTPUT_VERSION
    if run.get("output_format") is not None or (binds_parsed and run.get("output_parsed") is not None):
        structured = {
            "format": run.get("output_format"),
            "valid": _flag(run.get("output_valid")),
            "bytes": run.get("output_bytes"),
            "sha256": _digest(run.get("output_sha256")),
        }
        if binds_parsed:
            structured["parsed_sha256"] = parsed_digest(run.get("output_parsed"))
    return {
        "schema": PAYLOAD_SCHEMA,
        "version": version,
        "canonicalization": "json-sort-v1",
        "run_id": run.get("id"),
        "job_id": run.get("job_id"),
        "dispatch_id": run.get("dispatch_id"),
        "dispatch_kind": run.get("dispatch_kind"),
        "attempt": run.get("attempt"),
        "scheduled_for": run.get("scheduled_for"),
        "started_at": run.get("started_at"),
        "executor": run.get("executor"),
        "artifact_digest": run.get("artifact_digest"),
        "lineage": {
            "source_run_id": run.get("source_run_id"),
            "source_artifact_digest": run.get("source_artifact_digest"),
            "parent_run_id": run.get("parent_run_id"),
            "retry_of_run_id": run.get("retry_of_run_id"),
            "replay_of_run_id": run.get("replay_of_run_id"),
        },
        "actor": {"dispatcher_owner": run.get("dispatcher_owner"), "dispatcher_token": run.get("dispatcher_token")},
        "command": art.get("command"),
        "target": art.get("target"),
        "declaration": art.get("evidence"),
        "result": {
            "status": status,
            "error_code": run.get("error_code"),
            "exit_code": run.get("exit_code"),
            "signal": run.get("process_signal"),
            "timed_out": status == "timeout",
            "duration_ms": duration_ms,
            "stdout_sha256": _digest(run.get("stdout_sha256")),
            "stdout_bytes": run.get("stdout_bytes"),
            "stderr_sha256": _digest(run.get("stderr_sha256")),
            "stderr_bytes": run.get("stderr_bytes"),
            "structured": structured,
        },
        "verification": verification,
        "outcomes": outcomes,
        **extra,
        # Only for a run bound to a handoff v4 artifact (the key is absent otherwise, so no other payload changes):
        # the handoff bindings the reference's v4 payload carries, read from the artifact. Providers may key on it
        # (the ssh provider signs in namespace ``agentcli`` by default, as AgentCLI's envelope does).
        **({"handoff": {
            "version": art["handoff_version"],
            "manifest_digest": (art.get("manifest") or {}).get("digest"),
            "workflow_id": (art.get("manifest") or {}).get("workflow_id"),
            "task_id": (art.get("manifest") or {}).get("task_id"),
            "effective_task_hash": (art.get("compiled") or {}).get("effective_task_hash"),
        }} if art.get("schema") == HANDOFF_ARTIFACT_SCHEMA else {}),
    }


__all__ = ["CORE_BINDINGS", "OUTCOME_COLUMNS", "PARSED_OUTPUT_VERSION", "PAYLOAD_SCHEMA", "PAYLOAD_VERSION", "PAYLOAD_VERSIONS",
           "build_document", "parsed_digest", "requested_bindings"]
