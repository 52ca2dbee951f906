"""Execution artifacts: every job's execution contract as immutable canonical JSON, bound by digest.

Approvals, evidence, credential presentations and proofs all bind to "exactly what
this job executes". That is the job's *execution artifact*: the json-sort-v1 projection
of its execution contract (executor and options, command digest, timeouts,
constraints, output, verification, delivery routing, and the approval, identity,
credential, authorization and evidence declarations), stored once in
``execution_artifacts`` keyed by its ``sha256:`` digest. Jobs, dispatches, runs,
approvals and events carry the digest; database guards keep artifacts immutable and
bound digests unchanged.

Two kinds share the table: ``native`` (built here from the job) and ``handoff-v4``
(compiled elsewhere, accepted by ``scheduler.artifacts.handoff`` only when it agrees exactly).

The projection never holds raw command text, stdin or secret-like option values:
the command is a digest, and option keys that look secret (``SECRET_KEY_RE``) become
``{"redacted": true, "value_hash": ...}``. Declarations that do not exist yet on a job
are present as ``null`` / empty, so adding such a field later leaves existing digests
unchanged while the field is unset.

Not to be confused with ``scheduler.core.outputs``, the store of offloaded run *output*.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs

from scheduler.base.canonical import canonical_digest, canonical_json, hash_text, is_digest, member_digest, member_template
from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import to_iso
from scheduler.core.rows import JobRow, JSONObject, JSONValue
from scheduler.core.spec import CONTRACT_COLUMN_ORDER, JobSpec, contract_columns, spec_from_row
from scheduler.core.steps import NOT_REGISTERED, Installed, Plan, derive_plan, plan_for, refuse_unowned, registered
from scheduler.settings import current_settings

if TYPE_CHECKING:
    from scheduler.core.store.base import Store, Tx

#: Schema name and version of a native artifact payload.
NATIVE_SCHEMA = "scheduler.execution-artifact"
NATIVE_VERSION = 1
KINDS = ("native", "handoff-v4")

#: Keys whose values never enter an artifact (or evidence) raw: they are replaced by their hash.
SECRET_KEY_RE = re.compile(
    r"(token|secret|passw(or)?d|private[_-]?key|credential|cookie|api[_-]?key|authorization[_-]?header|stdin)", re.IGNORECASE
)


def redacted(value: object) -> JSONObject:
    """The stand-in for a secret-like value: its canonical digest, never the value."""
    return {"redacted": True, "value_hash": hash_text(value) if isinstance(value, str) else canonical_digest(value)}


def redact_secrets(value: JSONValue) -> JSONValue:
    """``value`` with every secret-like key's value replaced by ``redacted(...)``, recursively."""
    if isinstance(value, dict):
        return {k: redacted(v) if SECRET_KEY_RE.search(k) and v is not None else redact_secrets(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_secrets(v) for v in value]
    return value


def artifact_path(field: str, prefix: str = "", replace: str = "") -> str:
    """A spec validation field (``credentials[0].present.key``) as an artifact path
    (``credential_presentation.bindings.0.present.key`` with ``prefix="credentials"``, ``replace="credential_presentation.bindings"``)."""
    if prefix and field.startswith(prefix):
        field = replace + field[len(prefix):]
    return re.sub(r"\[(\d+)\]", r".\1", field)


def section_problems(problems: list[dict[str, str]], prefix: str = "", replace: str = "") -> list[dict[str, str]]:
    """Validation ``problems`` of a spec field as problems of the artifact section it projects to (``artifact_path``)."""
    return [{**p, "field": artifact_path(p["field"], prefix, replace)} for p in problems]


def _text_digest(text: str | None) -> str | None:
    return None if text is None else hash_text(text)


#: The sections the kernel projects itself (each registered step adds its own: ``scheduler.core.steps``).
KERNEL_SECTIONS = frozenset({"target", "command", "runtime", "output", "delivery", "watchdog"})
#: The keys of a native artifact that are not sections (``provenance`` only when it is not the default).
NATIVE_HEADER = frozenset({"schema", "version", "canonicalization", "job_id", "provenance"})
#: The provenance a native artifact leaves out: a default job's digest is what it was before provenance was bound.
DEFAULT_PROVENANCE = "user_added"


class _ContractView:
    """A spec as the artifact sections see it: the fields of its execution contract and ``executor_name()``, and an
    ``AttributeError`` for anything else (the fields in ``NON_CONTRACT_FIELDS``, and methods such as ``schedule()``
    or ``to_json()`` that read them). A section that read one would differ between jobs that share a cached
    projection (``_native``), so it fails loudly instead."""

    __slots__ = ("_spec",)

    def __init__(self, spec: JobSpec) -> None:
        self._spec = spec

    def __getattr__(self, name: str) -> Any:
        if name not in _CONTRACT_VIEW:
            raise AttributeError(f"an execution artifact section may not read the job's {name!r}: only the execution"
                                 " contract (every field but scheduler.core.spec.NON_CONTRACT_FIELDS) and executor_name()")
        return getattr(self._spec, name)


#: What ``_ContractView`` hands on: the contract fields, and the one method that reads only them.
_CONTRACT_VIEW = frozenset(CONTRACT_COLUMN_ORDER) | {"executor_name"}


def execution_sections(spec: JobSpec) -> JSONObject:
    """The execution contract of ``spec`` as artifact sections (no job id, no header): the kernel's, then each
    registered step's (``PIPELINE_NOT_INSTALLED`` without them: an artifact is never projected without its steps).

    Shared by native artifacts and handoff v4 artifacts, so both describe a job the same way. The kernel and the
    steps project a view of ``spec`` without the fields outside the contract (``NON_CONTRACT_FIELDS``).
    """
    steps = registered().steps
    spec = cast("JobSpec", _ContractView(spec))
    payload = spec.payload_message
    sections: JSONObject = {
        "target": {
            "session_target": spec.session_target,
            "executor": spec.executor_name(),
            "executor_options": redact_secrets(spec.executor_options),
        },
        "command": {
            "kind": "shell" if spec.session_target == "shell" else "prompt",
            "payload_sha256": hash_text(payload),
            "payload_bytes": len(payload.encode("utf-8")),
        },
        "runtime": {"timeout_ms": spec.run_timeout_ms},
        "output": {"format": spec.output_format},
        "delivery": {
            "mode": spec.delivery_mode,
            "channel": spec.delivery_channel,
            "to": spec.delivery_to,
            "options": redact_secrets(spec.delivery_options),
        },
        "watchdog": {
            "enabled": spec.job_type == "watchdog",
            "alert_channel": spec.watchdog_alert_channel,
            "alert_to": spec.watchdog_alert_to,
            "self_destruct": spec.watchdog_self_destruct,
        },
    }
    for step in steps:
        sections.update(step.project(spec))
    return sections


def _native_header(job_id: str, provenance: str | None) -> JSONObject:
    """The header of a native artifact. The job's provenance (its trust tier, which decides whether prompt checks
    apply) is bound here when it is not ``user_added``: a row raised to ``static`` by SQL no longer matches its
    artifact, while every default job keeps the digest it had before provenance was bound."""
    header: JSONObject = {"schema": NATIVE_SCHEMA, "version": NATIVE_VERSION, "canonicalization": "json-sort-v1", "job_id": job_id}
    if provenance is not None and provenance != DEFAULT_PROVENANCE:
        header["provenance"] = provenance
    return header


def native_payload(spec: JobSpec, job_id: str) -> JSONObject:
    """The native execution artifact of job ``job_id`` with spec ``spec``."""
    return _native_header(job_id, spec.provenance) | execution_sections(spec)


def native_digest(spec: JobSpec, job_id: str) -> str:
    """The digest of ``native_payload(spec, job_id)`` (what the job row must carry)."""
    return canonical_digest(native_payload(spec, job_id))


def put_artifact(tx: Tx, payload: JSONObject, *, kind: str, job_id: str, now: int) -> str:
    """Store ``payload`` as an artifact (once: an identical one is already there) and return its digest."""
    text = canonical_json(payload)
    digest = canonical_digest(payload)
    tx.execute(
        "INSERT INTO execution_artifacts(digest, kind, job_id, payload, payload_bytes, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
        (digest, kind, job_id, text, len(text.encode("utf-8")), now),
    )
    return digest


@attrs.frozen
class StoredArtifact:
    """An ``execution_artifacts`` row as ``load_artifact`` returns it: verified, its payload parsed."""

    digest: str
    kind: str
    job_id: str | None
    #: The payload parsed (canonical JSON hashing to ``digest``: checked at the load).
    payload: JSONObject
    #: The exact stored text of the payload (its SHA-256 is the digest).
    payload_text: str
    payload_bytes: int
    created_at: int


def load_artifact(tx: Tx, digest: str) -> StoredArtifact:
    """The stored artifact for ``digest``: payload parsed, ``payload_text`` the exact canonical text.

    ``EXECUTION_ARTIFACT_MISSING`` when there is none, ``EXECUTION_ARTIFACT_TAMPERED`` when the
    stored text is not canonical JSON hashing to ``digest``.
    """
    row = tx.one("SELECT * FROM execution_artifacts WHERE digest = ?", (digest,))
    if row is None:
        raise SchedulerError("EXECUTION_ARTIFACT_MISSING", f"execution artifact {digest} is not stored")
    return StoredArtifact(digest=row["digest"], kind=row["kind"], job_id=row["job_id"],
                          payload=parse_stored(row["payload"], digest), payload_text=row["payload"],
                          payload_bytes=row["payload_bytes"], created_at=row["created_at"])


def parse_stored(text: object, digest: str) -> JSONObject:
    """Parse stored artifact text, refusing anything that is not canonical JSON with digest ``digest``."""
    payload: JSONObject | None = None
    try:
        loaded = json.loads(text) if isinstance(text, str) else None
        if isinstance(loaded, dict) and canonical_json(loaded) == text and canonical_digest(loaded) == digest:
            payload = loaded
    except (ValueError, SchedulerError):
        payload = None
    if payload is None:
        raise SchedulerError("EXECUTION_ARTIFACT_TAMPERED", f"stored execution artifact {digest} does not match its digest")
    return payload


def _job(row: JobRow | Mapping[str, object]) -> JobRow:
    """A job row as its class (a caller that read it as a mapping pays one ``from_row``)."""
    return row if isinstance(row, JobRow) else JobRow.from_row(row)


def expected_digest(tx: Tx | None, row: JobRow | Mapping[str, object], spec: JobSpec | None = None) -> str:
    """The digest the job row ``row`` must carry, recomputed from the row itself.

    Native jobs recompute their projection; a job bound to another artifact kind (handoff v4)
    is proven by the registered step that owns that kind (``Step.check_binding``, which reads
    the stored artifact) and keeps its recorded digest. ``spec`` is ``spec_from_row(row)`` when
    the caller already built it (the dispatcher's worker does): it is not rebuilt. ``tx`` may be None for a
    native job (its projection needs no database).
    """
    job = _job(row)
    if job.handoff_version is not None:
        if tx is None:
            raise ValueError(f"job {job.name!r} is bound to a handoff artifact: its binding is proven in a transaction")
        spec = spec if spec is not None else spec_from_row(job)
        values = job.to_dict()
        if not any(step.check_binding(tx, values, spec) for step in registered().binders):
            raise SchedulerError(NOT_REGISTERED, f"job {job.name!r} is bound to a handoff v{job.handoff_version}"
                                 " artifact and no registered pipeline step proves that kind")
        if job.artifact_digest is None:
            raise SchedulerError("EXECUTION_ARTIFACT_MISSING", f"job {job.name!r} has no execution artifact")
        return job.artifact_digest
    return _native(job, spec)[0]


class _Shape:
    """What every native job with the same contract column values shares under one installation of the steps: its
    sections, the canonical text of its artifact around the job id (``member_template``), and its run plan."""

    __slots__ = ("installed", "plan", "provenance", "sections", "template")

    def __init__(self, installed: Installed, sections: JSONObject, provenance: str | None) -> None:
        #: Held so that ``id(installed)`` in the cache key names this installation while the entry lives.
        self.installed = installed
        self.sections = sections
        self.provenance = provenance
        fixed = {k: v for k, v in _native_header("", provenance).items() if k != "job_id"}
        #: None when the header and the sections cannot be composed (a section named like a header key, a key whose
        #: place is not a plain sort's): each digest is then the whole payload's, canonicalised.
        self.template = None if NATIVE_HEADER & sections.keys() else member_template(fixed | sections, "job_id")
        #: Derived on the first run that passed the artifact check (a refused one never derives it).
        self.plan: Plan | None = None

    def digest(self, job_id: str) -> str:
        """The native digest of the job ``job_id`` of this shape (exactly ``canonical_digest`` of its payload)."""
        if self.template is None:
            return canonical_digest(_native_header(job_id, self.provenance) | self.sections)
        return member_digest(self.template, job_id)


def _native(row: JobRow, spec: JobSpec | None) -> tuple[str, _Shape]:
    """``(native digest, shape)`` of a native job row. The projection is a pure function of the row's contract
    columns (``contract_columns``: the provenance of the header among them) and the installed steps, so it is
    remembered per exact stored values of those columns, without the job id: the check before a run, even the
    first run of a job, costs a lookup and one SHA-256 of the composed text, not a projection and a canonicalisation.
    A row changed outside the kernel has other values there, so it is never served another row's projection."""
    installed = registered()
    key = (id(installed), *contract_columns(row))
    try:
        shape, cacheable = _SHAPES.get(key), True
    except TypeError:  # a column read as a mapping (unhashable): projected afresh, never cached
        shape, cacheable = None, False
    if shape is None:
        shape = _Shape(installed, execution_sections(spec if spec is not None else spec_from_row(row)), row.provenance)
        if cacheable:
            if len(_SHAPES) >= _SHAPES_MAX:
                _SHAPES.clear()
            _SHAPES[key] = shape
    return shape.digest(row.id), shape


#: ``(installed steps, contract column values...) -> shape``; bounded, cleared when full.
_SHAPES: dict[tuple[object, ...], _Shape] = {}
_SHAPES_MAX = 4096


def check_job(tx: Tx | None, row: JobRow | Mapping[str, object], spec: JobSpec | None = None) -> str:
    """The job's artifact digest after proving the row still matches it (the run pipeline's artifact check).

    ``EXECUTION_ARTIFACT_MISMATCH`` when the job no longer projects to its recorded
    artifact (the row changed outside the kernel, or a plugin's option normalisation changed).
    ``spec``: ``spec_from_row(row)`` when the caller has it (saves rebuilding it); ``tx`` may be None for a native job.
    """
    job = _job(row)
    recorded = _recorded(job)
    _refuse_mismatch(job, recorded, expected_digest(tx, job, spec))
    return recorded


def _recorded(job: JobRow) -> str:
    """The digest the job row records (``EXECUTION_ARTIFACT_MISSING`` when it has none in the stored form)."""
    recorded = job.artifact_digest
    if recorded is None or not is_digest(recorded):
        raise SchedulerError("EXECUTION_ARTIFACT_MISSING", f"job {job.name!r} has no execution artifact")
    return recorded


def _refuse_mismatch(job: JobRow, recorded: str, actual: str) -> None:
    """``EXECUTION_ARTIFACT_MISMATCH`` unless the job projects to the artifact it records."""
    if actual != recorded:
        raise SchedulerError(
            "EXECUTION_ARTIFACT_MISMATCH",
            f"job {job.name!r} no longer matches its execution artifact {recorded} (it projects to {actual});"
            " re-save the job with `jobs update` to bind a new artifact",
        )


def bind_plan(store: Store, row: JobRow | Mapping[str, object], spec: JobSpec) -> Plan:
    """The run pipeline's artifact check, and the run plan it proves: the first thing every run does.

    The job as claimed must still project to the artifact it is bound to (``check_job``; a handoff
    v4 job reads its stored artifact); the plan is then derived from that artifact's sections: a native
    job's is its shape's (``_native``: one per contract column values), a handoff job's is cached per
    digest (``scheduler.core.steps.plan_for``). A native job that no longer matches
    because its stored artifact declares a section no registered step owns (a step's distribution
    was uninstalled) fails with ``PIPELINE_STEP_NOT_REGISTERED`` instead of the mismatch.
    """
    row = _job(row)
    if row.handoff_version is not None:
        with store.read() as tx:
            digest = check_job(tx, row, spec)
        refuse_untrusted_prompt(row, spec)
        return plan_for(digest, lambda: execution_sections(spec), KERNEL_SECTIONS)
    recorded = _recorded(row)
    actual, shape = _native(row, spec)  # a native projection needs no database
    if actual != recorded:
        _refuse_unowned_sections(store, recorded)
        _refuse_mismatch(row, recorded, actual)
    refuse_untrusted_prompt(row, spec)
    if shape.plan is None:  # two workers may derive it at once: the same plan either way
        shape.plan = derive_plan(recorded, shape.sections, KERNEL_SECTIONS)
    return shape.plan


def refuse_untrusted_prompt(row: JobRow, spec: JobSpec) -> None:
    """The provenance trust gate (``[identity] refuse_external_prompts``): ``PROVENANCE_PROMPT_REFUSED`` for a prompt
    (any target but ``shell``) of an ``external`` job when the host refuses them. Checked after the artifact check, so
    the provenance it reads is the one the artifact binds (a row edited to another tier never gets this far)."""
    if spec.session_target != "shell" and row.provenance == "external" and current_settings().identity.refuse_external_prompts:
        raise SchedulerError("PROVENANCE_PROMPT_REFUSED", f"job {row.name!r} has provenance 'external' and this host refuses"
                             " prompts from external jobs ([identity] refuse_external_prompts)")


def _refuse_unowned_sections(store: Store, digest: str) -> None:
    """``PIPELINE_STEP_NOT_REGISTERED`` when the stored native artifact ``digest`` has a non-empty section no
    registered step owns; nothing when it cannot be read (the caller reports the mismatch)."""
    try:
        with store.read() as tx:
            payload = load_artifact(tx, digest).payload
    except SchedulerError:
        return
    sections = {k: v for k, v in payload.items() if k not in NATIVE_HEADER}
    refuse_unowned(digest, sections, KERNEL_SECTIONS)


def artifact_to_json(artifact: StoredArtifact) -> JSONObject:
    """JSON view of a loaded artifact (``load_artifact``: payload already parsed)."""
    return {"digest": artifact.digest, "kind": artifact.kind, "job_id": artifact.job_id,
            "payload_bytes": artifact.payload_bytes, "created_at": to_iso(artifact.created_at), "payload": artifact.payload}


def verify_stored(tx: Tx, *, limit: int | None = None) -> list[dict[str, str]]:
    """Problems found re-validating stored artifacts and job bindings (``doctor``): one dict per problem."""
    problems: list[dict[str, str]] = []
    sql = "SELECT digest, payload FROM execution_artifacts ORDER BY created_at"
    for row in tx.all(sql + (f" LIMIT {int(limit)}" if limit else "")):
        try:
            parse_stored(row["payload"], row["digest"])
        except SchedulerError as exc:
            problems.append({"digest": row["digest"], "code": exc.code, "error": exc.message})
    for job in tx.all("SELECT * FROM jobs ORDER BY name"):
        try:
            load_artifact(tx, job["artifact_digest"]) if is_digest(job.get("artifact_digest")) else None
            check_job(tx, job)
        except SchedulerError as exc:
            problems.append({"job": job["name"], "digest": str(job.get("artifact_digest")), "code": exc.code, "error": exc.message})
    return problems
