"""Handoff v4: execution artifacts compiled ahead of time, accepted only when they agree with the job exactly.

A *handoff v4 artifact* (kind ``handoff-v4`` in ``execution_artifacts``) is a job's
execution contract compiled by a tool (``scheduler handoff compile``, or a workflow
compiler speaking the same contract) and submitted with the job. The job is bound to
it: the artifact carries the contract constants of AgentCLI handoff version 4
(artifact schema, canonicalization, binding versions), the provenance of whoever
compiled it (``manifest``, ``compiled``), a digest of the whole job's scheduling
projection (``scheduler_job_binding``) and every execution section that
``scheduler.core.artifact.execution_sections`` gives a native artifact.

The kernel accepts nothing it does not enforce and nothing it cannot recompute:
``validate_v4`` refuses unknown keys at every level, wrong types, other contract
versions, raw credential material, weakened authorization proofs, declarations this
kernel does not enforce yet, a payload that does not hash to its digest, and, given the
job's spec, any difference from what the spec compiles to. Each refusal is a
``SchedulerError`` with a stable ``HANDOFF_ARTIFACT_*`` code and ``details`` naming the
dotted field path. The order of the checks and every code are in docs/handoff-v4.md.

This module is pure logic over dicts and ``JobSpec``; storage goes through
``scheduler.core.artifact`` (``load_artifact``) and the lead modules that call
``split_submission``, ``validate_v4``, ``check_bound_job`` and ``hydrate``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from scheduler.base.canonical import (
    CANONICALIZATION,
    CANONICALIZATION_VERSION,
    canonical_digest,
    canonical_json,
    hash_bytes,
    is_digest,
)
from scheduler.base.errors import SchedulerError
from scheduler.base.options import field_default
from scheduler.base.timeutil import to_iso
from scheduler.core.artifact import SECRET_KEY_RE, execution_sections, load_artifact
from scheduler.core.rows import json_object
from scheduler.core.spec import SPEC_FIELDS, JobSpec, spec_from_row, validate_spec
from scheduler.core.steps import registered

if TYPE_CHECKING:
    from scheduler.core.rows import JobRow
    from scheduler.core.store.base import Tx

# --------------------------------------------------------------------------- contract constants

#: The artifact's ``schema`` and ``artifact_schema_version``.
ARTIFACT_SCHEMA = "openclaw.scheduler.handoff-artifact"
ARTIFACT_SCHEMA_VERSION = 1
#: The handoff protocol version this module implements (the ``handoff_version`` of jobs and artifacts).
HANDOFF_VERSION = 4
#: ``scheduler_schema_min`` of the handoff v4 contract. It is the contract's own number (the
#: scheduler schema the protocol was defined against), not this project's migration number.
SCHEDULER_SCHEMA_MIN = 29
#: The canonicalization block every artifact carries, exactly.
CANONICALIZATION_CONTRACT: Mapping[str, Any] = {
    "name": CANONICALIZATION, "version": CANONICALIZATION_VERSION, "digest": "sha256", "undefined": "null",
}
EXECUTION_BINDING_VERSION = 2
#: ``scheduler_job_binding.version``: the layout of ``job_binding(spec)``.
JOB_BINDING_VERSION = 1
#: ``compiled.target``.
COMPILED_TARGET = "scheduler"
#: ``manifest.version`` when this scheduler compiles from a job spec (the manifest digest is the spec's digest).
MANIFEST_VERSION = "scheduler-spec-1"
#: Default ``compiled.source``: who compiled the artifact.
COMPILER_SOURCE = "scheduler handoff compile"
#: Authorization proof methods this kernel verifies, binds to the artifact, replay-protects and revocation-checks
#: (``scheduler.pipeline.proofs.declaration.METHODS``); any other method (``none`` above all) is a downgrade.
PROOF_METHODS = frozenset({"jwt", "detached-signature", "certificate"})
#: The guarantees a proof declaration may state (AgentCLI's form). This kernel gives all three to every proof,
#: so the compiled section never states them; a submitted one stating any of them other than ``true`` is a downgrade.
PROOF_GUARANTEES = ("artifact_binding_required", "replay_protection", "revocation_check")

#: The job fields of manifest version ``scheduler-spec-1``: ``JobSpec`` as it was when the first v4 artifacts were
#: compiled (and the conformance fixture's digests were frozen). The manifest digest covers all of them, plus each
#: field added later only when it differs from its default (``manifest_spec``), so adding a field leaves every
#: existing manifest digest, hence every existing artifact digest, unchanged. Never edit this tuple.
MANIFEST_V1_FIELDS = (
    "name", "schedule_kind", "payload_message", "description", "enabled", "job_type", "provenance", "schedule_cron",
    "schedule_every", "schedule_at", "schedule_tz", "dst_gap_policy", "dst_fold_policy", "misfire_policy", "allow_past_at",
    "session_target", "executor", "executor_options", "constraints", "run_timeout_ms", "max_retries", "retry_backoff_ms",
    "overlap_policy", "queue_limit", "max_consecutive_failures", "delivery_guarantee", "parent_id", "trigger_on",
    "trigger_delay_s", "trigger_condition", "delivery_mode", "delivery_channel", "delivery_to", "delivery_options", "notify",
    "output_format", "verify_shell", "verify_timeout_s", "verify_on_failure", "approval_required", "approval_timeout_s",
    "approval_timeout_action", "approval_risk_level", "approval_approver_scope", "watchdog_alert_channel",
    "watchdog_alert_to", "watchdog_self_destruct",
)

#: The job-spec keys that carry a handoff submission (they are not job fields).
SUBMISSION_FIELDS = ("handoff_version", "handoff_artifact_digest", "effective_task_hash", "handoff_artifact_payload")

#: Job fields outside the job binding: labels and state that may change without a new artifact.
BINDING_EXCLUDED_FIELDS = ("name", "description", "enabled", "parent_id", "notify", "retention")
#: ``job_binding(spec)["invocation"]``: when and why the job runs.
INVOCATION_FIELDS = (
    "schedule_kind", "schedule_cron", "schedule_every", "schedule_at", "schedule_tz", "dst_gap_policy",
    "dst_fold_policy", "misfire_policy", "allow_past_at", "trigger_on", "trigger_delay_s", "trigger_condition",
)
#: ``job_binding(spec)["reliability"]``: retries, overlap, auto-pause and crash replay.
RELIABILITY_FIELDS = (
    "max_retries", "retry_backoff_ms", "overlap_policy", "queue_limit", "max_consecutive_failures", "delivery_guarantee",
)
#: ``job_binding(spec)["lifecycle"]``.
LIFECYCLE_FIELDS = ("job_type", "provenance")

_HEADER_KEYS = (
    "schema", "artifact_schema_version", "handoff_version", "scheduler_schema_min", "canonicalization",
    "execution_binding_version", "scheduler_job_binding", "manifest", "compiled",
)
#: The trust declarations: each is the job's own normalised declaration (``execution_sections``), null / empty when
#: the job declares none, and held in step 4 to the rules of the kernel module that enforces it at run time.
DECLARATION_SECTIONS = ("identity", "credential_presentation", "authorization_ref", "authorization", "authorization_proof",
                        "evidence")
#: ``credential_presentation.child_policy``: present only when the job's ``child_credential_policy`` is not ``none``.
_CHILD_POLICIES = ("inherit", "downscope", "independent")


# --------------------------------------------------------------------------- the artifact's shape


@attrs.frozen
class _Shape:
    """The expected JSON type of one artifact value (closed objects list their keys)."""

    kind: str  # str, bool, int, number, digest, choice, object (closed), open (plugin-owned object), array
    nullable: bool = False
    choices: tuple[str, ...] = ()
    keys: tuple[tuple[str, _Shape], ...] = ()
    optional: frozenset[str] = frozenset()
    item: _Shape | None = None
    minimum: int | None = None

    def expected(self) -> str:
        """What a value of this shape must be, as the end of an error message."""
        text = {
            "str": "a string", "bool": "a boolean", "int": "an integer", "number": "a number",
            "digest": "a lowercase sha256 digest", "object": "an object", "open": "an object", "array": "an array",
        }.get(self.kind) or "one of " + ", ".join(self.choices)
        return text + " or null" if self.nullable else text


def _str(nullable: bool = False) -> _Shape:
    return _Shape("str", nullable)


def _int(minimum: int | None = None) -> _Shape:
    return _Shape("int", minimum=minimum)


def _choice(field: str, nullable: bool = False) -> _Shape:
    """A string restricted to the choices of job-spec field ``field`` (one catalogue, no drift)."""
    return _Shape("choice", nullable, choices=tuple(_SPEC_CHOICES[field]))


def _obj(keys: dict[str, _Shape], *, optional: Iterable[str] = (), nullable: bool = False) -> _Shape:
    return _Shape("object", nullable, keys=tuple(keys.items()), optional=frozenset(optional))


_SPEC_CHOICES = {f.name: f.metadata["choices"] for f in SPEC_FIELDS if f.metadata["choices"]}
_BOOL = _Shape("bool")
_DIGEST = _Shape("digest")
_OPEN = _Shape("open")
_OPEN_OR_NULL = _Shape("open", True)


ARTIFACT_SHAPE = _obj({
    "schema": _str(),
    "artifact_schema_version": _int(),
    "handoff_version": _int(),
    "scheduler_schema_min": _int(),
    "canonicalization": _obj({"name": _str(), "version": _int(), "digest": _str(), "undefined": _str()}),
    "execution_binding_version": _int(),
    "scheduler_job_binding": _obj({"version": _int(), "digest": _DIGEST}),
    "manifest": _obj({"version": _str(), "digest": _DIGEST, "workflow_id": _str(), "task_id": _str()}),
    "compiled": _obj({"target": _str(), "job_id": _str(), "effective_task_hash": _DIGEST, "source": _str()}),
    "target": _obj({"session_target": _choice("session_target"), "executor": _str(), "executor_options": _OPEN}),
    "command": _obj({
        "kind": _Shape("choice", choices=("shell", "prompt")), "payload_sha256": _DIGEST, "payload_bytes": _int(1),
    }),
    "runtime": _obj({"timeout_ms": _int(1)}),
    "constraints": _obj({
        "sandbox": _BOOL,
        "network": _Shape("choice", True, choices=("none", "loopback")),
        "allowed_paths": _Shape("array", True, item=_str()),
        "max_tokens": _Shape("int", True, minimum=1),
        "max_cost": _Shape("number", True),
    }, optional=("sandbox", "network", "allowed_paths", "max_tokens", "max_cost")),
    "output": _obj({"format": _choice("output_format")}),
    "verification": _obj({
        "shell_sha256": _Shape("digest", True), "timeout_s": _int(1), "on_failure": _choice("verify_on_failure"),
    }),
    "delivery": _obj({"mode": _choice("delivery_mode"), "channel": _str(True), "to": _str(True), "options": _OPEN}),
    "watchdog": _obj({"enabled": _BOOL, "alert_channel": _str(True), "alert_to": _str(True), "self_destruct": _BOOL}),
    "approval": _obj({
        "required": _BOOL,
        "timeout_s": _int(1),
        "timeout_action": _choice("approval_timeout_action"),
        "risk_level": _choice("approval_risk_level"),
        "approver_scope": _str(True),
    }),
    # The trust declarations are kernel-owned objects: step 1 checks only that they are objects (or null), step 3
    # scans them for credential material, step 4 holds them to the kernel's own rules (``_declaration_problems``).
    "identity": _OPEN_OR_NULL,
    "credential_presentation": _obj({
        "bindings": _Shape("array", item=_OPEN), "child_policy": _Shape("choice", choices=_CHILD_POLICIES),
    }, optional=("child_policy",)),
    "authorization_ref": _str(True),
    "authorization": _OPEN_OR_NULL,
    "authorization_proof": _OPEN_OR_NULL,
    "evidence": _OPEN_OR_NULL,
})


# --------------------------------------------------------------------------- raw credential material

#: Key names (lowercased, only letters and digits kept: ``apiKey``, ``api_key``, ``API-KEY`` are all
#: ``apikey``) that name raw credential material.
_RAW_NAMES = frozenset({
    "value", "rawvalue", "proofvalue", "credential", "credentials", "secret", "secrets", "token", "tokens",
    "password", "passwords", "passwd", "privatekey", "apikey", "accesstoken", "refreshtoken", "idtoken",
    "clientsecret", "sessiontoken", "bearertoken", "authtoken",
})
#: Endings of normalised key names that name credential material (``github_token``, ``db_password``).
_RAW_SUFFIXES = ("token", "secret", "password", "passwd", "privatekey", "apikey", "credential", "credentials", "rawvalue", "proofvalue")
_PEM_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
#: A compact JWS/JWT (``eyJ...`` header, ``eyJ...`` claims, signature): a bearer proof or token, never a reference.
_COMPACT_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
#: Keys (normalised like ``_RAW_NAMES``) that would put a proof itself into ``authorization_proof``
#: (``scheduler.pipeline.proofs.declaration`` refuses them in a job too): proofs are read per dispatch from their source.
_PROOF_VALUE_NAMES = frozenset({"proof", "jwt", "signature", "certificatechain", "proofvalue", "value"})


def names_credential(key: str) -> bool:
    """Whether an object key names raw credential material (or is a key ``redact_secrets`` would redact).

    Only keys an artifact does not define are judged: the artifact's own keys (``credential_presentation``,
    ``payload_sha256``...) are known properties and never match.
    """
    norm = re.sub(r"[^a-z0-9]", "", key.lower())
    return norm in _RAW_NAMES or norm.endswith(_RAW_SUFFIXES) or SECRET_KEY_RE.search(key) is not None


def _names_proof(path: str, key: str) -> bool:
    """Whether ``key`` at ``path`` would hold an authorization proof itself (only inside ``authorization_proof``)."""
    return path.startswith("authorization_proof.") and re.sub(r"[^a-z0-9]", "", key.lower()) in _PROOF_VALUE_NAMES


def _harmless(value: Any) -> bool:
    """A value that holds no credential material: null, or the stand-in ``redact_secrets`` writes."""
    return value is None or (
        isinstance(value, dict) and set(value) == {"redacted", "value_hash"}
        and value["redacted"] is True and is_digest(value["value_hash"])
    )


def _raw_problem(path: str) -> dict[str, str]:
    return _problem(path, "RAW_CREDENTIAL",
                    f"raw credential material at {path}: artifacts carry digests and references, never secret values")


# --------------------------------------------------------------------------- problems and errors


def _problem(field: str, code: str, error: str) -> dict[str, str]:
    return {"field": field, "code": code, "error": error}


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _name(path: str) -> str:
    return path or "the artifact"


def _fail(code: str, problems: list[dict[str, str]]) -> SchedulerError:
    """One error for a list of problems: the first one's text as the message, all of them as ``details``."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return SchedulerError(code, problems[0]["error"] + more, details=problems)


def _show(value: Any, limit: int = 80) -> str:
    """A short JSON rendering of an artifact value for messages (artifact values are never secrets)."""
    try:
        text = canonical_json(value)
    except SchedulerError:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(value: Any) -> bool:
    """A JSON number without a fraction (JavaScript has one number type: ``3e4`` is the integer 30000)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _structure(value: Any, shape: _Shape, path: str, out: list[dict[str, str]]) -> None:
    """Step 1: check ``value`` against ``shape``, appending one problem per wrong, missing or unknown value."""
    if value is None:
        if not shape.nullable:
            out.append(_problem(path, "INVALID_TYPE", f"{_name(path)} must be {shape.expected()}"))
        return
    kind = shape.kind
    if kind in ("object", "open"):
        if not isinstance(value, dict):
            out.append(_problem(path, "INVALID_TYPE", f"{_name(path)} must be {shape.expected()}"))
            return
        if kind == "open":
            return  # plugin-owned: the plugin validates it; step 3 scans it for credential material
        known = dict(shape.keys)
        for key in value:
            if key not in known:
                where = _join(path, key)
                if isinstance(key, str) and names_credential(key) and not _harmless(value[key]):
                    out.append(_raw_problem(where))
                else:
                    out.append(_problem(where, "UNKNOWN_FIELD", f"{where} is not a known property of a handoff v4 artifact"))
        for key, sub in shape.keys:
            where = _join(path, key)
            if key in value:
                _structure(value[key], sub, where, out)
            elif key not in shape.optional:
                out.append(_problem(where, "REQUIRED", f"{where} must be {sub.expected()}"))
        return
    if kind == "array":
        if not isinstance(value, list):
            out.append(_problem(path, "INVALID_TYPE", f"{path} must be {shape.expected()}"))
            return
        assert shape.item is not None
        for index, item in enumerate(value):
            _structure(item, shape.item, _join(path, index), out)
        return
    ok = {
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "int": _is_int,
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "digest": is_digest,
        "choice": lambda v: isinstance(v, str) and v in shape.choices,
    }[kind](value)
    if not ok:
        code = "INVALID_CHOICE" if kind == "choice" and isinstance(value, str) else (
            "INVALID_VALUE" if kind == "digest" and isinstance(value, str) else "INVALID_TYPE")
        out.append(_problem(path, code, f"{path} must be {shape.expected()}"))
    elif kind == "int" and shape.minimum is not None and value < shape.minimum:
        out.append(_problem(path, "OUT_OF_RANGE", f"{path} must be >= {shape.minimum}"))


def _contract(payload: dict[str, Any]) -> list[dict[str, str]]:
    """Step 2: the contract constants, exactly."""
    out: list[dict[str, str]] = []

    def unsupported(field: str, actual: Any, expected: Any) -> None:
        out.append(_problem(field, "INVALID_VALUE",
                            f"{field} {_show(actual)} is unsupported (this scheduler reads {_show(expected)})"))

    for field, expected in (
        ("schema", ARTIFACT_SCHEMA),
        ("artifact_schema_version", ARTIFACT_SCHEMA_VERSION),
        ("handoff_version", HANDOFF_VERSION),
        ("scheduler_schema_min", SCHEDULER_SCHEMA_MIN),
    ):
        if payload[field] != expected:
            unsupported(field, payload[field], expected)
    canon = payload["canonicalization"]
    for key, expected in CANONICALIZATION_CONTRACT.items():
        if canon[key] != expected:
            out.append(_problem(
                f"canonicalization.{key}", "INVALID_VALUE",
                f"canonicalization contract is unsupported: canonicalization.{key} is {_show(canon[key])}"
                f" (this scheduler reads {_show(dict(CANONICALIZATION_CONTRACT))})",
            ))
            break
    if payload["execution_binding_version"] != EXECUTION_BINDING_VERSION:
        unsupported("execution_binding_version", payload["execution_binding_version"], EXECUTION_BINDING_VERSION)
    if payload["scheduler_job_binding"]["version"] != JOB_BINDING_VERSION:
        unsupported("scheduler_job_binding.version", payload["scheduler_job_binding"]["version"], JOB_BINDING_VERSION)
    if payload["compiled"]["target"] != COMPILED_TARGET:
        unsupported("compiled.target", payload["compiled"]["target"], COMPILED_TARGET)
    return out


def _credentials(value: Any, shape: _Shape | None, path: str, out: list[dict[str, str]]) -> None:
    """Step 3: credential material anywhere, above all in plugin-owned objects (no fixed key set there).

    ``shape`` is None inside plugin-owned objects: every key is judged by its name, and a
    secret-like key must hold null or a redacted stand-in. Strings holding a PEM private key
    are refused wherever they are.
    """
    if isinstance(value, str):
        if _PEM_PRIVATE_KEY.search(value) or _COMPACT_JWT.search(value):
            out.append(_raw_problem(path))
    elif isinstance(value, list):
        item = shape.item if shape is not None else None
        for index, element in enumerate(value):
            _credentials(element, item, _join(path, index), out)
    elif isinstance(value, dict):
        known = dict(shape.keys) if shape is not None and shape.kind == "object" else None
        for key, element in value.items():
            where = _join(path, key)
            if known is not None:
                _credentials(element, known.get(key), where, out)
            elif isinstance(key, str) and (names_credential(key) or _names_proof(where, key)) and not _harmless(element):
                out.append(_raw_problem(where))
            elif not _harmless(element):
                _credentials(element, None, where, out)


def _declaration_problems(payload: dict[str, Any]) -> list[dict[str, str]]:
    """Step 4b: every declared section must be a declaration the kernel enforces, by the rules of the step that does.

    Each section is checked by the registered pipeline step that owns it (``Step.check_section``:
    identity, credentials, authorization, proofs, evidence), so the handoff contract cannot drift
    from what runs enforce; ``PIPELINE_STEP_NOT_REGISTERED`` when no registered step owns one.
    One problem per finding, each naming the artifact path and what the kernel says about it.
    """
    found: list[dict[str, str]] = []
    installed = registered()
    for name in DECLARATION_SECTIONS:
        value = payload[name]
        if name == "authorization_proof" and value is not None:  # the contract's guarantees are this module's to check
            value = {k: v for k, v in value.items() if k not in PROOF_GUARANTEES}
        for p in installed.owner_of_section(name).check_section(name, value, payload):
            found.append(_problem(p["field"], "HANDOFF_ARTIFACT_UNSUPPORTED", f"{p['field']}: {p['error']}"))
        if name == "authorization_proof" and value is not None:
            for key in PROOF_GUARANTEES:
                if key in payload[name]:
                    field = f"authorization_proof.{key}"
                    found.append(_problem(field, "HANDOFF_ARTIFACT_UNSUPPORTED", f"{field}: this scheduler gives every proof"
                                          " artifact binding, replay protection and revocation checks; its compiled"
                                          " declaration does not state them"))
    return found


def _proof_and_declarations(payload: dict[str, Any]) -> None:
    """Step 4: an authorization proof must be artifact-bound, replay-protected and revocable; every declaration enforceable.

    4a (``HANDOFF_ARTIFACT_DOWNGRADE_REFUSED``): a proof whose method is not one this kernel
    verifies (``none`` above all), or that states one of ``PROOF_GUARANTEES`` as anything but
    true. 4b (``HANDOFF_ARTIFACT_UNSUPPORTED``): a declaration the kernel cannot enforce
    (``_declaration_problems``), every one named.
    """
    proof = payload["authorization_proof"]
    if proof is not None:
        weak = [
            _problem(f"authorization_proof.{key}", "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED", f"authorization_proof.{key} must be true")
            for key in PROOF_GUARANTEES if key in proof and proof[key] is not True
        ]
        method = proof.get("method")
        if not isinstance(method, str) or method not in PROOF_METHODS:
            weak.insert(0, _problem("authorization_proof.method", "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED",
                                    f"authorization_proof.method must be one of {', '.join(sorted(PROOF_METHODS))}"))
        if weak:
            raise SchedulerError(
                "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED",
                "authorization proofs require artifact binding, replay protection, and revocation: "
                + "; ".join(p["error"] for p in weak),
                details=weak,
            )
    found = _declaration_problems(payload)
    if found:
        sections = list(dict.fromkeys(p["field"].split(".")[0] for p in found))
        raise SchedulerError(
            "HANDOFF_ARTIFACT_UNSUPPORTED",
            f"{', '.join(sections)} {'declares' if len(sections) == 1 else 'declare'} what this scheduler cannot enforce"
            f" (nothing is accepted that is not enforced): {found[0]['error']}"
            + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""),
            details=found,
        )


def _check_payload(payload: Any) -> str:
    """Steps 1-4 of ``validate_v4``: everything that needs no digest and no job. Returns the canonical text."""
    problems: list[dict[str, str]] = []
    _structure(payload, ARTIFACT_SHAPE, "", problems)
    text = ""
    if not problems:
        try:
            text = canonical_json(payload)
        except SchedulerError as exc:
            problems.append(_problem("", exc.code, f"the artifact has no json-sort-v1 form: {exc.message}"))
    if problems:
        problems.sort(key=lambda p: p["code"] != "RAW_CREDENTIAL")  # the gravest finding leads the message
        raise _fail("HANDOFF_ARTIFACT_INVALID", problems)
    problems = _contract(payload)
    if problems:
        raise _fail("HANDOFF_ARTIFACT_INVALID", problems)
    _credentials(payload, ARTIFACT_SHAPE, "", problems)
    if problems:
        raise _fail("HANDOFF_ARTIFACT_INVALID", problems)
    _proof_and_declarations(payload)
    return text


# --------------------------------------------------------------------------- projections and compiling


def job_binding(spec: JobSpec) -> dict[str, Any]:
    """The projection of the whole job that ``scheduler_job_binding.digest`` covers.

    Everything except ``BINDING_EXCLUDED_FIELDS`` (name, description, enabled, parent_id, notify, retention):
    the execution sections, plus ``invocation`` (schedule and chain trigger), ``reliability``
    (retries, overlap, auto-pause, delivery guarantee) and ``lifecycle`` (job type,
    provenance). So a v4 job cannot change *when* or *how reliably* it runs, not only *what*
    it runs, without a new artifact; renaming, describing and disabling it need none.
    """
    return _binding_of(spec, execution_sections(spec))


def _binding_of(spec: JobSpec, sections: dict[str, Any]) -> dict[str, Any]:
    invocation = {name: getattr(spec, name) for name in INVOCATION_FIELDS}
    invocation["schedule_at"] = to_iso(spec.schedule_at)
    return {
        **sections,
        "invocation": invocation,
        "reliability": {name: getattr(spec, name) for name in RELIABILITY_FIELDS},
        "lifecycle": {name: getattr(spec, name) for name in LIFECYCLE_FIELDS},
    }


def job_binding_digest(spec: JobSpec) -> str:
    """``canonical_digest(job_binding(spec))``: what ``scheduler_job_binding.digest`` must be."""
    return canonical_digest(job_binding(spec))


def effective_task_hash(spec: JobSpec) -> str:
    """The digest of the job's execution sections alone (``compiled.effective_task_hash``).

    The same for every job that executes the same thing, whatever its schedule: the
    identity of the *task* that approvals, evidence and proofs speak about.
    """
    return canonical_digest(execution_sections(spec))


def manifest_spec(spec: JobSpec) -> dict[str, Any]:
    """What the ``scheduler-spec-1`` manifest digest covers: the normalised spec (``JobSpec.to_json()``) with every
    field of ``MANIFEST_V1_FIELDS``, plus each later field only when it differs from its default.

    So a field added to ``JobSpec`` changes no digest of a job that leaves it at its default
    (the frozen conformance digests and the artifacts of stored v4 jobs stay valid), while a job
    that sets it gets a manifest digest that says so.
    """
    full = spec.to_json()
    out = {name: full[name] for name in MANIFEST_V1_FIELDS}
    for f in SPEC_FIELDS:
        default = field_default(f)
        if f.name not in out and getattr(spec, f.name) != default:
            out[f.name] = full[f.name]
    return out


def spec_manifest(spec: JobSpec, *, workflow_id: str, task_id: str) -> dict[str, Any]:
    """The manifest this scheduler writes when it compiles from a job spec: the digest of ``manifest_spec(spec)``."""
    return {"version": MANIFEST_VERSION, "digest": canonical_digest(manifest_spec(spec)), "workflow_id": workflow_id,
            "task_id": task_id}


def _build(
    spec: JobSpec, *, job_id: str, manifest: dict[str, Any], source: str, sections: dict[str, Any] | None = None,
    binding: str | None = None,
) -> dict[str, Any]:
    """The artifact payload (``sections`` and ``binding`` digest passed in when the caller has them already)."""
    sections = execution_sections(spec) if sections is None else sections
    binding = job_binding_digest(spec) if binding is None else binding
    return {
        "schema": ARTIFACT_SCHEMA,
        "artifact_schema_version": ARTIFACT_SCHEMA_VERSION,
        "handoff_version": HANDOFF_VERSION,
        "scheduler_schema_min": SCHEDULER_SCHEMA_MIN,
        "canonicalization": dict(CANONICALIZATION_CONTRACT),
        "execution_binding_version": EXECUTION_BINDING_VERSION,
        "scheduler_job_binding": {"version": JOB_BINDING_VERSION, "digest": binding},
        "manifest": dict(manifest),
        "compiled": {"target": COMPILED_TARGET, "job_id": job_id, "effective_task_hash": canonical_digest(sections),
                     "source": source},
        **sections,
    }


def compile_v4(
    spec: JobSpec,
    *,
    job_id: str,
    workflow_id: str,
    task_id: str,
    manifest: dict[str, Any] | None = None,
    source: str = COMPILER_SOURCE,
) -> dict[str, Any]:
    """Compile ``spec`` into the handoff v4 artifact payload of job ``job_id``.

    ``manifest`` is the provenance of a foreign compiler (kept as given; its
    ``workflow_id`` and ``task_id`` must be the ones passed); without it the manifest is
    ``spec_manifest(spec, ...)``. The result is checked like a submitted artifact (steps 1-4
    of ``validate_v4``), so the compiler never emits what the validator would refuse: a job
    whose plugin options hold an unredacted credential-like key cannot be handed off.
    """
    if manifest is None:
        manifest = spec_manifest(spec, workflow_id=workflow_id, task_id=task_id)
    elif not isinstance(manifest, dict):
        raise SchedulerError("HANDOFF_ARTIFACT_INVALID", "manifest must be an object",
                             details=[_problem("manifest", "INVALID_TYPE", "manifest must be an object")])
    else:
        for key, given in (("workflow_id", workflow_id), ("task_id", task_id)):
            if manifest.get(key) != given:
                raise SchedulerError(
                    "HANDOFF_ARTIFACT_INVALID", f"manifest.{key} {_show(manifest.get(key))} differs from {key} {_show(given)}",
                    details=[_problem(f"manifest.{key}", "INVALID_VALUE", f"manifest.{key} must be {_show(given)}")],
                )
    payload = _build(spec, job_id=job_id, manifest=manifest, source=source)
    _check_payload(payload)
    return payload


def submission_fields(payload: dict[str, Any]) -> dict[str, Any]:
    """The four ``SUBMISSION_FIELDS`` that carry ``payload`` in a job spec object (what `handoff compile` adds)."""
    return {
        "handoff_version": HANDOFF_VERSION,
        "handoff_artifact_digest": canonical_digest(payload),
        "effective_task_hash": payload["compiled"]["effective_task_hash"],
        "handoff_artifact_payload": payload,
    }


def compile_submission(obj: dict[str, Any], *, job_id: str, workflow_id: str, task_id: str) -> dict[str, Any]:
    """A job spec object plus the submission fields of its compiled artifact (``scheduler handoff compile``).

    Submission fields already in ``obj`` are dropped and compiled afresh. The spec is
    validated as ``jobs add`` validates it, so what this prints is what ``jobs add`` accepts.
    """
    plain, _ = split_submission(obj) if any(k in obj for k in SUBMISSION_FIELDS) else (dict(obj), None)
    payload = compile_v4(validate_spec(plain), job_id=job_id, workflow_id=workflow_id, task_id=task_id)
    return {**plain, **submission_fields(payload)}


# --------------------------------------------------------------------------- validating


def _differences(a: Any, b: Any, path: str, out: list[str]) -> None:
    """Dotted paths at which two JSON values differ (compared in canonical form)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            where = _join(path, key)
            if key not in a or key not in b:
                out.append(where)
            else:
                _differences(a[key], b[key], where, out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _differences(x, y, _join(path, index), out)
    elif canonical_json(a) != canonical_json(b):
        out.append(path or "(artifact)")


def _lookup(value: Any, path: str) -> Any:
    for part in path.split(".") if path and path != "(artifact)" else ():
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def validate_v4(
    payload: Any,
    *,
    expected_digest: str | None = None,
    spec: JobSpec | None = None,
    job_id: str | None = None,
) -> str:
    """Check a handoff v4 artifact payload and return its digest; raise on the first failing step.

    1. structure: every key known, every type right, digests lowercase ``sha256:<64 hex>``;
    2. contract constants exactly (schema, versions, canonicalization);
    3. no raw credential material (plugin-owned objects included);
    4. authorization proofs bound, replay-protected and revocable; no declaration this kernel does not enforce;
    5. with ``expected_digest``: the payload hashes to it;
    6. with ``spec``: binding digest, effective task hash and job id agree, and the payload is
       exactly what ``spec`` compiles to (``job_id`` defaults to the artifact's own).

    Steps 1-3 raise ``HANDOFF_ARTIFACT_INVALID``, step 4 ``..._DOWNGRADE_REFUSED`` or
    ``..._UNSUPPORTED``, step 5 ``..._DIGEST_MISMATCH``, step 6 ``..._BINDING_MISMATCH`` or
    ``..._MISMATCH``. Order matters: a wrong structure is named as such even when the
    digest is also wrong, and nothing is compared with a job before it is known to be a
    well-formed, supported, credential-free artifact.
    """
    text = _check_payload(payload)
    digest = hash_bytes(text.encode("utf-8"))
    if expected_digest is not None:
        if not is_digest(expected_digest):
            raise SchedulerError("HANDOFF_ARTIFACT_INVALID", "handoff_artifact_digest must be a lowercase sha256 digest",
                                 details=[_problem("handoff_artifact_digest", "INVALID_VALUE", "must be a lowercase sha256 digest")])
        if digest != expected_digest:
            raise SchedulerError(
                "HANDOFF_ARTIFACT_DIGEST_MISMATCH",
                f"artifact digest does not match payload: expected {expected_digest}, the payload hashes to {digest}",
                details=[_problem("handoff_artifact_digest", "HANDOFF_ARTIFACT_DIGEST_MISMATCH",
                                  f"the payload hashes to {digest}")],
            )
    if spec is None:
        return digest
    compiled = payload["compiled"]
    sections = execution_sections(spec)
    binding = canonical_digest(_binding_of(spec, sections))
    if payload["scheduler_job_binding"]["digest"] != binding:
        raise SchedulerError(
            "HANDOFF_ARTIFACT_BINDING_MISMATCH",
            f"scheduler_job_binding.digest {payload['scheduler_job_binding']['digest']} does not match the job"
            f" (it binds to {binding}): the job's schedule, reliability or execution fields differ from the artifact's",
            details=[_problem("scheduler_job_binding.digest", "HANDOFF_ARTIFACT_BINDING_MISMATCH", f"the job binds to {binding}")],
        )
    task_hash = canonical_digest(sections)
    if compiled["effective_task_hash"] != task_hash:
        raise SchedulerError(
            "HANDOFF_ARTIFACT_BINDING_MISMATCH",
            f"compiled.effective_task_hash {compiled['effective_task_hash']} does not match the job's {task_hash}",
            details=[_problem("compiled.effective_task_hash", "HANDOFF_ARTIFACT_BINDING_MISMATCH", f"the job's is {task_hash}")],
        )
    if job_id is not None and compiled["job_id"] != job_id:
        raise SchedulerError(
            "HANDOFF_ARTIFACT_BINDING_MISMATCH",
            f"the artifact was compiled for job {compiled['job_id']!r}, not {job_id!r}",
            details=[_problem("compiled.job_id", "HANDOFF_ARTIFACT_BINDING_MISMATCH", f"must be {job_id!r}")],
        )
    expected = _build(spec, job_id=compiled["job_id"], manifest=payload["manifest"], source=compiled["source"],
                      sections=sections, binding=binding)
    if text != canonical_json(expected):
        paths: list[str] = []
        _differences(payload, expected, "", paths)
        shown = ", ".join(paths[:10]) + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
        raise SchedulerError(
            "HANDOFF_ARTIFACT_MISMATCH",
            f"the artifact differs from what the job compiles to at {shown}",
            details=[_problem(p, "HANDOFF_ARTIFACT_MISMATCH",
                              f"the artifact has {_show(_lookup(payload, p))}, the job compiles to {_show(_lookup(expected, p))}")
                     for p in paths],
        )
    return digest


# --------------------------------------------------------------------------- submissions


@attrs.frozen
class Submission:
    """A handoff v4 submission taken out of a job spec object by ``split_submission``.

    Shape-checked only: ``verify`` (or ``validate_v4``) proves the payload against the job.
    """

    version: int
    digest: str
    effective_task_hash: str
    payload: dict[str, Any] = attrs.field(hash=False)

    def verify(self, spec: JobSpec, *, job_id: str | None = None) -> str:
        """Validate the payload against its digest and ``spec`` (all six steps) and return the digest.

        Also requires the submitted ``effective_task_hash`` to be the artifact's, so the three
        values a tool sends cannot disagree with each other.
        """
        digest = validate_v4(self.payload, expected_digest=self.digest, spec=spec, job_id=job_id)
        if self.effective_task_hash != self.payload["compiled"]["effective_task_hash"]:
            raise SchedulerError(
                "HANDOFF_ARTIFACT_BINDING_MISMATCH",
                f"effective_task_hash {self.effective_task_hash} is not the artifact's"
                f" {self.payload['compiled']['effective_task_hash']}",
                details=[_problem("effective_task_hash", "HANDOFF_ARTIFACT_BINDING_MISMATCH", "must equal compiled.effective_task_hash")],
            )
        return digest


def split_submission(obj: dict[str, Any]) -> tuple[dict[str, Any], Submission | None]:
    """Take the ``SUBMISSION_FIELDS`` out of a job spec object: ``(the rest, Submission or None)``.

    ``obj`` is not modified. None when no submission field is present. When any is present
    all four must be, well-formed (``handoff_version`` 4, digests ``sha256:<64 hex>``, the
    payload an object), else ``HANDOFF_ARTIFACT_INVALID`` listing every problem. The
    payload itself is checked by ``validate_v4`` / ``Submission.verify``.
    """
    rest = {k: v for k, v in obj.items() if k not in SUBMISSION_FIELDS}
    present = {k: obj[k] for k in SUBMISSION_FIELDS if k in obj}
    if not present:
        return rest, None
    problems: list[dict[str, str]] = []
    for key in SUBMISSION_FIELDS:
        if key not in present:
            problems.append(_problem(key, "REQUIRED", f"{key} is required with a handoff v4 submission"))
    version = present.get("handoff_version")
    if "handoff_version" in present and (not _is_int(version) or version != HANDOFF_VERSION):
        problems.append(_problem("handoff_version", "INVALID_VALUE",
                                 f"handoff_version {_show(version)} is unsupported (this scheduler accepts 4)"))
    for key in ("handoff_artifact_digest", "effective_task_hash"):
        if key in present and not is_digest(present[key]):
            problems.append(_problem(key, "INVALID_VALUE", f"{key} must be a lowercase sha256 digest"))
    if "handoff_artifact_payload" in present and not isinstance(present["handoff_artifact_payload"], dict):
        problems.append(_problem("handoff_artifact_payload", "INVALID_TYPE", "handoff_artifact_payload must be an object"))
    if problems:
        raise _fail("HANDOFF_ARTIFACT_INVALID", problems)
    return rest, Submission(
        version=HANDOFF_VERSION,
        digest=present["handoff_artifact_digest"],
        effective_task_hash=present["effective_task_hash"],
        payload=present["handoff_artifact_payload"],
    )


# --------------------------------------------------------------------------- stored v4 jobs


def _bound_payload(tx: Tx, row: JobRow | Mapping[str, object], spec: JobSpec, *,
                   missing_code: str | None = None) -> dict[str, Any]:
    """Load a v4 job's artifact, validate it against the row and ``spec`` and return the payload."""
    name = row.get("name")
    if row.get("handoff_version") != HANDOFF_VERSION:
        raise SchedulerError("HANDOFF_ARTIFACT_INVALID", f"job {name!r} is not a handoff v4 job",
                             details=[_problem("handoff_version", "INVALID_VALUE", "must be 4")])
    digest = row.get("artifact_digest")
    try:
        if not is_digest(digest):
            raise SchedulerError("EXECUTION_ARTIFACT_MISSING", f"job {name!r} has no execution artifact")
        stored = load_artifact(tx, digest)
    except SchedulerError as exc:
        if missing_code is not None and exc.code == "EXECUTION_ARTIFACT_MISSING":
            raise SchedulerError(missing_code, f"handoff v4 job {name!r}: {exc.message}",
                                 details=[_problem("artifact_digest", missing_code, exc.message)]) from None
        raise
    if stored.kind != "handoff-v4":
        raise SchedulerError("HANDOFF_ARTIFACT_INVALID", f"artifact {digest} of job {name!r} is a {stored.kind} artifact, not handoff-v4",
                             details=[_problem("artifact_digest", "INVALID_VALUE", "must name a handoff-v4 artifact")])
    payload = stored.payload
    validate_v4(payload, expected_digest=digest, spec=spec, job_id=str(row.get("id")))
    compiled_hash = json_object(payload.get("compiled")).get("effective_task_hash")  # validate_v4 checked its shape
    if row.get("effective_task_hash") != compiled_hash:
        raise SchedulerError(
            "HANDOFF_ARTIFACT_BINDING_MISMATCH",
            f"job {name!r} records effective_task_hash {row.get('effective_task_hash')}, its artifact {compiled_hash}",
            details=[_problem("effective_task_hash", "HANDOFF_ARTIFACT_BINDING_MISMATCH", "must equal compiled.effective_task_hash")],
        )
    return payload


def check_bound_job(tx: Tx, row: JobRow | Mapping[str, object], spec: JobSpec) -> None:
    """Prove that a stored v4 job row still agrees exactly with its stored artifact (the run pipeline's check).

    Loads the artifact (``EXECUTION_ARTIFACT_MISSING`` / ``EXECUTION_ARTIFACT_TAMPERED``),
    runs every step of ``validate_v4`` with the row's digest, ``spec`` and id, and compares
    the row's ``effective_task_hash`` with the artifact's. A job edited outside the kernel,
    or an artifact weakened in storage, stops here instead of running.
    """
    _bound_payload(tx, row, spec)


def hydrate(tx: Tx, row: JobRow | Mapping[str, object]) -> dict[str, Any]:
    """The validated artifact payload of a stored v4 job row (``jobs list --include-handoff-artifacts``).

    Same checks as ``check_bound_job`` with the spec rebuilt from the row; any failure
    raises, so a listing never shows an artifact it could not prove. A missing artifact is
    ``HANDOFF_ARTIFACT_MISSING``; call it only for rows with ``handoff_version`` 4.
    """
    return _bound_payload(tx, row, spec_from_row(row), missing_code="HANDOFF_ARTIFACT_MISSING")
