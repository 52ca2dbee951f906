"""Handoff v4 artifacts (``scheduler.artifacts.handoff``): the conformance fixture, every validation step, submissions, bound jobs.

Pure logic: no database. Stored v4 jobs are checked through a stand-in transaction that
answers ``load_artifact``'s one query, with rows built by ``spec_to_row`` as the store does.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest

from scheduler.artifacts.handoff import (
    BINDING_EXCLUDED_FIELDS,
    MANIFEST_V1_FIELDS,
    SUBMISSION_FIELDS,
    Submission,
    check_bound_job,
    compile_submission,
    compile_v4,
    effective_task_hash,
    hydrate,
    job_binding,
    job_binding_digest,
    manifest_spec,
    names_credential,
    split_submission,
    submission_fields,
    validate_v4,
)
from scheduler.base.canonical import canonical_digest, canonical_json
from scheduler.base.errors import SchedulerError
from scheduler.core.artifact import check_job, execution_sections, native_payload, put_artifact
from scheduler.core.spec import SPEC_FIELDS, JobSpec, spec_to_row, validate_spec

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_PATH = ROOT / "conformance-fixtures" / "v1" / "handoff" / "conformance.json"
FIXTURE: dict[str, Any] = json.loads(FIXTURE_PATH.read_text(encoding="utf-8"))
#: The positive artifact exactly as the revision that froze the digests compiled it (before the trust fields existed).
FROZEN_ARTIFACT_TEXT = (FIXTURE_PATH.parent / "positive-artifact.json").read_text(encoding="utf-8")
JOB_ID = FIXTURE["compile"]["job_id"]

CODES = {
    "HANDOFF_ARTIFACT_INVALID", "HANDOFF_ARTIFACT_DIGEST_MISMATCH", "HANDOFF_ARTIFACT_BINDING_MISMATCH",
    "HANDOFF_ARTIFACT_MISMATCH", "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED", "HANDOFF_ARTIFACT_UNSUPPORTED",
    "HANDOFF_ARTIFACT_MISSING",
}


# --------------------------------------------------------------------------- helpers


def fixture_spec() -> JobSpec:
    return validate_spec(FIXTURE["spec"])


def fixture_payload() -> dict[str, Any]:
    return compile_v4(fixture_spec(), **FIXTURE["compile"])


def apply_changes(payload: dict[str, Any], changes: list[dict[str, Any]]) -> dict[str, Any]:
    """A deep copy of ``payload`` with the fixture's ``set`` / ``delete`` changes applied."""
    out = copy.deepcopy(payload)
    for change in changes:
        *parents, last = change["path"]
        target = out
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            last = int(last)
        if change["op"] == "set":
            target[last] = copy.deepcopy(change["value"])
        elif change["op"] == "delete":
            del target[last]
        else:  # pragma: no cover - a broken fixture
            raise AssertionError(f"unknown op {change['op']!r}")
    return out


def refused(payload: Any, code: str, **kwargs: Any) -> SchedulerError:
    """Validate ``payload``, expect ``code``, check the details' form, and return the error."""
    with pytest.raises(SchedulerError) as info:
        validate_v4(payload, **kwargs)
    err = info.value
    assert err.code == code, (err.code, err.message)
    assert isinstance(err.details, list) and err.details
    for item in err.details:
        assert set(item) == {"field", "code", "error"}, item
    return err


def with_changes(*changes: tuple[str, Any]) -> dict[str, Any]:
    """The fixture payload with ``("dotted.path", value)`` set (``...`` deletes)."""
    ops = [
        {"op": "delete", "path": path.split(".")} if value is ... else {"op": "set", "path": path.split("."), "value": value}
        for path, value in changes
    ]
    return apply_changes(fixture_payload(), ops)


#: Normalised declarations, as ``validate_spec`` stores them and ``execution_sections`` puts them in the artifact.
GOOD_PROOF = {
    "method": "jwt", "source": {"env": "DEPLOY_PROOF"}, "clock_skew_s": 30, "issuer": "https://issuer.example",
    "audience": "scheduler", "algorithms": ["ES256", "RS256"], "jwks_url": "https://issuer.example/jwks.json",
}
#: AgentCLI's proof form: what the reference's fixture uses for its downgrade case.
AGENTCLI_PROOF = {
    "method": "jwt", "ref": "proof-provider:deploy", "issuer": "https://issuer.example", "audience": "scheduler",
    "artifact_binding_required": True, "replay_protection": True, "revocation_check": True,
}
GOOD_IDENTITY = {"subject": {"kind": "service", "principal": "deploy-bot"}, "trust": {"level": "operator"},
                 "delegation": {"mode": "none"}}
GOOD_BINDING = {"name": "api", "provider": "env", "ref": "DEPLOY_API", "present": {"medium": "env", "key": "API_TOKEN"},
                "required": True}
GOOD_EVIDENCE = {"provider": "checksum", "methods": [], "provider_config": {},
                 "payload": {"bind": ["command", "result"], "context": {"ticket": "OPS-1"}, "format": "canonical-json"},
                 "verify": {"required": True}, "collect": ["stdout"], "retention": "30d"}
GOOD_AUTHORIZATION = {"on_error": "deny", "request": {"include": ["job", "trigger"]}, "decision": {}, "provider_config": {}}
#: The raw job fields that declare all of the above (``declared_spec``).
DECLARED_FIELDS: dict[str, Any] = {
    "identity": {"subject": {"kind": "service", "principal": "deploy-bot"}, "trust": {"level": "operator"}},
    "credentials": [{"name": "api", "provider": "env", "ref": "DEPLOY_API", "present": {"medium": "env", "key": "API_TOKEN"}}],
    "child_credential_policy": "inherit",
    "authorization_ref": "policyfile:deploy",
    "authorization": {"request": {"include": ["job", "trigger"]}},
    "authorization_proof": {"method": "jwt", "source": {"env": "DEPLOY_PROOF"}, "issuer": "https://issuer.example",
                            "audience": "scheduler", "jwks_url": "https://issuer.example/jwks.json"},
    "evidence": {"provider": "checksum", "payload": {"bind": ["command", "result"], "context": {"ticket": "OPS-1"}},
                 "verify": {"required": True}, "collect": ["stdout"], "retention": "30d"},
    "evidence_ref": "soc2-deploy",
}


def declared_spec(**changes: Any) -> JobSpec:
    """The fixture job declaring identity, credentials, authorization, a proof and evidence (kernel rules only)."""
    return validate_spec({**FIXTURE["spec"], **DECLARED_FIELDS, **changes}, plugin_options=False)


# --------------------------------------------------------------------------- the conformance fixture


def test_fixture_format() -> None:
    assert FIXTURE["fixture_version"] == 1
    assert set(FIXTURE) == {"fixture_version", "spec", "compile", "expected", "negative_artifact_cases"}
    assert set(FIXTURE["expected"]) == {"artifact_digest", "effective_task_hash", "scheduler_job_binding_digest", "manifest_digest"}
    assert len(FIXTURE["negative_artifact_cases"]) == 7
    for case in FIXTURE["negative_artifact_cases"]:
        assert set(case) == {"name", "changes", "expected_code", "expected_error", "use_expected_digest"}
        assert case["expected_code"] in CODES


def test_fixture_compiles_to_the_frozen_digests() -> None:
    """A change of the projection (execution sections, job binding, header) changes these digests."""
    payload = fixture_payload()
    expected = FIXTURE["expected"]
    assert canonical_digest(payload) == expected["artifact_digest"]
    assert payload["compiled"]["effective_task_hash"] == expected["effective_task_hash"] == effective_task_hash(fixture_spec())
    assert payload["scheduler_job_binding"]["digest"] == expected["scheduler_job_binding_digest"]
    assert payload["manifest"]["digest"] == expected["manifest_digest"]
    assert payload["compiled"]["job_id"] == JOB_ID
    assert payload["manifest"]["workflow_id"] == "fixture" and payload["manifest"]["task_id"] == "positive"


def test_fixture_artifact_is_accepted() -> None:
    payload = fixture_payload()
    digest = FIXTURE["expected"]["artifact_digest"]
    assert validate_v4(payload) == digest
    assert validate_v4(payload, expected_digest=digest) == digest
    assert validate_v4(payload, expected_digest=digest, spec=fixture_spec(), job_id=JOB_ID) == digest
    # Round trip through JSON text, as a submission arrives.
    assert validate_v4(json.loads(json.dumps(payload)), expected_digest=digest, spec=fixture_spec()) == digest


@pytest.mark.parametrize("case", FIXTURE["negative_artifact_cases"], ids=lambda c: c["name"])
def test_fixture_negative_cases(case: dict[str, Any]) -> None:
    tampered = apply_changes(fixture_payload(), case["changes"])
    kwargs = {"expected_digest": FIXTURE["expected"]["artifact_digest"]} if case["use_expected_digest"] else {}
    err = refused(tampered, case["expected_code"], **kwargs)
    assert case["expected_error"] in err.message, err.message


@pytest.mark.parametrize(
    "case", [c for c in FIXTURE["negative_artifact_cases"] if not c["use_expected_digest"]], ids=lambda c: c["name"]
)
def test_negative_cases_are_named_before_the_digest_and_the_job_are_compared(case: dict[str, Any]) -> None:
    """Steps 1-4 come before the digest (5) and the job (6): the finding is the same with both given."""
    tampered = apply_changes(fixture_payload(), case["changes"])
    err = refused(tampered, case["expected_code"], expected_digest=FIXTURE["expected"]["artifact_digest"],
                  spec=fixture_spec(), job_id=JOB_ID)
    assert case["expected_error"] in err.message


def test_the_frozen_artifact_digest_is_what_javascript_computes() -> None:
    """The digest is sha256 of ``JSON.stringify(sortKeysDeep(payload))``, as a Node tool recomputes it."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = ROOT / "tests" / "support" / "canonical_node.js"
    line = json.dumps(fixture_payload(), ensure_ascii=False)
    out = subprocess.run([node, str(script)], input=line + "\n", capture_output=True, text=True, timeout=30, check=True)
    js_bytes = base64.b64decode(out.stdout.strip())
    assert js_bytes == canonical_json(fixture_payload()).encode("utf-8")
    assert "sha256:" + hashlib.sha256(js_bytes).hexdigest() == FIXTURE["expected"]["artifact_digest"]


# --------------------------------------------------------------------------- the artifact's layout


def test_artifact_holds_the_header_and_every_execution_section() -> None:
    payload = fixture_payload()
    sections = execution_sections(fixture_spec())
    header = ["schema", "artifact_schema_version", "handoff_version", "scheduler_schema_min", "canonicalization",
              "execution_binding_version", "scheduler_job_binding", "manifest", "compiled"]
    assert list(payload) == header + list(sections)
    assert {k: payload[k] for k in sections} == sections
    assert payload["schema"] == "openclaw.scheduler.handoff-artifact"
    assert (payload["artifact_schema_version"], payload["handoff_version"], payload["scheduler_schema_min"]) == (1, 4, 29)
    assert payload["canonicalization"] == {"name": "json-sort-v1", "version": 1, "digest": "sha256", "undefined": "null"}
    assert payload["execution_binding_version"] == 2
    assert payload["scheduler_job_binding"] == {"version": 1, "digest": job_binding_digest(fixture_spec())}
    assert payload["compiled"] == {"target": "scheduler", "job_id": JOB_ID, "effective_task_hash": canonical_digest(sections),
                                   "source": "scheduler handoff compile"}
    assert payload["manifest"] == {"version": "scheduler-spec-1", "digest": canonical_digest(manifest_spec(fixture_spec())),
                                   "workflow_id": "fixture", "task_id": "positive"}


def test_the_frozen_artifact_is_byte_for_byte_what_the_compiler_still_writes() -> None:
    """``positive-artifact.json`` was written by the revision that froze the digests; fields added since change nothing."""
    assert canonical_digest(json.loads(FROZEN_ARTIFACT_TEXT)) == FIXTURE["expected"]["artifact_digest"]
    assert canonical_json(fixture_payload()) == FROZEN_ARTIFACT_TEXT
    frozen = json.loads(FROZEN_ARTIFACT_TEXT)
    assert validate_v4(frozen, expected_digest=FIXTURE["expected"]["artifact_digest"], spec=fixture_spec(), job_id=JOB_ID)


def test_the_manifest_covers_the_first_field_set_and_later_fields_only_when_set() -> None:
    """``scheduler-spec-1``: every field of the first set; a field added later counts only when it is not its default."""
    spec = fixture_spec()
    covered = manifest_spec(spec)
    assert set(covered) == set(MANIFEST_V1_FIELDS) and set(FIXTURE["spec"]) <= set(covered)
    assert {"identity", "credentials", "evidence", "authorization_proof", "retention"}.isdisjoint(covered)
    assert canonical_digest(covered) == FIXTURE["expected"]["manifest_digest"]
    for name, value in (("identity", GOOD_IDENTITY), ("retention", {"keep_runs": 5}), ("evidence_ref", "x")):
        changed = manifest_spec(attrs.evolve(spec, **{name: value}))
        assert changed[name] == value and canonical_digest(changed) != FIXTURE["expected"]["manifest_digest"], name
    # A field of the first set counts even at its default, exactly as before.
    assert covered["notify"] is True and covered["description"] == FIXTURE["spec"]["description"]


#: A different value for every job field (JobSpec is built without validation: only the projection matters here).
OTHER_VALUES: dict[str, Any] = {
    "name": "renamed", "description": "described", "enabled": False, "parent_id": "parent",
    "schedule_kind": "every", "schedule_cron": "18 3 * * *", "schedule_every": "5m", "schedule_at": 1_900_000_000_000,
    "schedule_tz": "Europe/Berlin", "dst_gap_policy": "skip", "dst_fold_policy": "twice", "misfire_policy": "skip",
    "allow_past_at": True, "trigger_on": "failure", "trigger_delay_s": 5, "trigger_condition": "contains:x",
    "session_target": "isolated", "executor": "other-executor", "executor_options": {"mode": "fast"},
    "constraints": {"sandbox": True}, "run_timeout_ms": 30001, "max_retries": 2, "retry_backoff_ms": 1000,
    "overlap_policy": "queue", "queue_limit": 3, "max_consecutive_failures": 9, "delivery_guarantee": "at-least-once",
    "delivery_mode": "always", "delivery_channel": "chat", "delivery_to": "ops", "delivery_options": {"thread": "t"}, "notify": False,
    "output_format": "json", "verify_shell": "true", "verify_timeout_s": 5, "verify_on_failure": "warn",
    "approval_required": False, "approval_timeout_s": 60, "approval_timeout_action": "approve", "approval_risk_level": "high",
    "approval_approver_scope": "ops", "watchdog_alert_channel": "chat", "watchdog_alert_to": "ops",
    "watchdog_self_destruct": True, "job_type": "watchdog", "provenance": "external", "payload_message": "echo other",
    # The trust declarations are bound through their execution sections; retention is the operator's housekeeping.
    "identity": GOOD_IDENTITY, "credentials": [GOOD_BINDING], "child_credential_policy": "inherit",
    "authorization_ref": "policyfile:deploy", "authorization": GOOD_AUTHORIZATION, "authorization_proof": GOOD_PROOF,
    "evidence": GOOD_EVIDENCE, "evidence_ref": "soc2", "retention": {"keep_runs": 5},
}
#: Fields that only exist beside another one (``evidence_ref`` needs ``evidence``): changed on a spec that has it.
ALONGSIDE: dict[str, dict[str, Any]] = {"evidence_ref": {"evidence": GOOD_EVIDENCE}}


def test_every_job_field_is_bound_or_explicitly_excluded() -> None:
    """A new job field fails here until it is put in the binding projection or in BINDING_EXCLUDED_FIELDS."""
    assert set(OTHER_VALUES) == {f.name for f in SPEC_FIELDS}
    for name, value in OTHER_VALUES.items():
        spec = attrs.evolve(fixture_spec(), **ALONGSIDE.get(name, {}))
        base = job_binding_digest(spec)
        assert getattr(spec, name) != value, name
        changed = job_binding_digest(attrs.evolve(spec, **{name: value}))
        if name in BINDING_EXCLUDED_FIELDS:
            assert changed == base, f"{name} is excluded but changes the job binding"
        else:
            assert changed != base, f"{name} is not covered by the job binding"


def test_job_binding_layout_and_task_hash_independence() -> None:
    spec = fixture_spec()
    binding = job_binding(spec)
    assert set(binding) == set(execution_sections(spec)) | {"invocation", "reliability", "lifecycle"}
    assert binding["invocation"]["schedule_cron"] == "17 3 * * *"
    assert binding["lifecycle"] == {"job_type": "standard", "provenance": "user_added"}
    at = attrs.evolve(spec, schedule_kind="at", schedule_cron=None, schedule_at=1_900_000_000_000)
    assert job_binding(at)["invocation"]["schedule_at"] == "2030-03-17T17:46:40.000Z"
    # The effective task hash names what runs, not when: a new schedule keeps it, a new timeout does not.
    rescheduled = attrs.evolve(spec, schedule_cron="18 3 * * *")
    assert effective_task_hash(rescheduled) == effective_task_hash(spec)
    assert job_binding_digest(rescheduled) != job_binding_digest(spec)
    assert effective_task_hash(attrs.evolve(spec, run_timeout_ms=30001)) != effective_task_hash(spec)


# --------------------------------------------------------------------------- step 1: structure


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("extra", "extra"),
        ("approval.extra", "approval.extra"),
        ("canonicalization.extra", "canonicalization.extra"),
        ("manifest.extra", "manifest.extra"),
        ("compiled.extra", "compiled.extra"),
        ("constraints.extra", "constraints.extra"),
        ("verification.extra", "verification.extra"),
        ("credential_presentation.extra", "credential_presentation.extra"),
    ],
)
def test_unknown_keys_are_refused_at_every_level(path: str, field: str) -> None:
    err = refused(with_changes((path, 1)), "HANDOFF_ARTIFACT_INVALID")
    assert err.details[0] == {"field": field, "code": "UNKNOWN_FIELD",
                              "error": f"{field} is not a known property of a handoff v4 artifact"}


def test_unknown_keys_in_declarations_are_named_as_what_the_kernel_cannot_enforce() -> None:
    """Declarations are the kernel's own objects: a key its validator does not know is not enforced, and named."""
    binding = {**GOOD_BINDING, "extra": 1}
    err = refused(with_changes(("credential_presentation.bindings", [binding])), "HANDOFF_ARTIFACT_UNSUPPORTED")
    assert [d["field"] for d in err.details] == ["credential_presentation.bindings.0.extra"]
    err = refused(with_changes(("authorization_proof", {**GOOD_PROOF, "nonce_window_s": 30})), "HANDOFF_ARTIFACT_UNSUPPORTED")
    assert [d["field"] for d in err.details] == ["authorization_proof.nonce_window_s"]


def test_an_unknown_key_holding_only_a_redacted_stand_in_is_just_unknown() -> None:
    stand_in = {"redacted": True, "value_hash": "sha256:" + "0" * 64}
    err = refused(with_changes(("approval.api_token", stand_in)), "HANDOFF_ARTIFACT_INVALID")
    assert err.details[0]["code"] == "UNKNOWN_FIELD"


@pytest.mark.parametrize(
    ("path", "value", "code", "message"),
    [
        ("approval.required", "yes", "INVALID_TYPE", "approval.required must be a boolean"),
        ("approval.required", ..., "REQUIRED", "approval.required must be a boolean"),
        ("approval.approver_scope", 7, "INVALID_TYPE", "approval.approver_scope must be a string or null"),
        ("runtime.timeout_ms", "30000", "INVALID_TYPE", "runtime.timeout_ms must be an integer"),
        ("runtime.timeout_ms", True, "INVALID_TYPE", "runtime.timeout_ms must be an integer"),
        ("runtime.timeout_ms", 1.5, "INVALID_TYPE", "runtime.timeout_ms must be an integer"),
        ("runtime.timeout_ms", 0, "OUT_OF_RANGE", "runtime.timeout_ms must be >= 1"),
        ("output.format", "xml", "INVALID_CHOICE", "output.format must be one of text, json, ndjson"),
        ("target.executor_options", [], "INVALID_TYPE", "target.executor_options must be an object"),
        ("compiled.effective_task_hash", "sha256:" + "A" * 64, "INVALID_VALUE",
         "compiled.effective_task_hash must be a lowercase sha256 digest"),
        ("manifest.digest", None, "INVALID_TYPE", "manifest.digest must be a lowercase sha256 digest"),
        ("verification.shell_sha256", "deadbeef", "INVALID_VALUE",
         "verification.shell_sha256 must be a lowercase sha256 digest or null"),
        ("credential_presentation.bindings", {}, "INVALID_TYPE", "credential_presentation.bindings must be an array"),
        ("identity", "me", "INVALID_TYPE", "identity must be an object or null"),
        ("compiled", ..., "REQUIRED", "compiled must be an object"),
        ("evidence", ..., "REQUIRED", "evidence must be an object or null"),
    ],
)
def test_wrong_types_name_the_field(path: str, value: Any, code: str, message: str) -> None:
    err = refused(with_changes((path, value)), "HANDOFF_ARTIFACT_INVALID")
    assert err.details[0] == {"field": path, "code": code, "error": message}
    assert err.message.startswith(message)


def test_an_integral_float_is_an_integer_as_in_javascript() -> None:
    payload = with_changes(("runtime.timeout_ms", 30000.0))
    assert validate_v4(payload, expected_digest=FIXTURE["expected"]["artifact_digest"]) == FIXTURE["expected"]["artifact_digest"]


def test_every_structural_problem_is_listed() -> None:
    err = refused(with_changes(("approval.required", "yes"), ("runtime.timeout_ms", "x"), ("extra", 1)), "HANDOFF_ARTIFACT_INVALID")
    assert {d["field"] for d in err.details} == {"approval.required", "runtime.timeout_ms", "extra"}
    assert "(and 2 more)" in err.message


@pytest.mark.parametrize("payload", [None, [], "artifact", 4])
def test_a_payload_that_is_not_an_object(payload: Any) -> None:
    err = refused(payload, "HANDOFF_ARTIFACT_INVALID")
    assert "the artifact must be an object" in err.message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**60])
def test_values_without_a_canonical_form_are_refused(value: Any) -> None:
    err = refused(with_changes(("delivery.options", {"n": value})), "HANDOFF_ARTIFACT_INVALID")
    assert "no json-sort-v1 form" in err.message


# --------------------------------------------------------------------------- step 2: contract constants


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("schema", "agentcli.artifact", "schema \"agentcli.artifact\" is unsupported"),
        ("artifact_schema_version", 2, "artifact_schema_version 2 is unsupported"),
        ("handoff_version", 3, "handoff_version 3 is unsupported"),
        ("handoff_version", 5, "handoff_version 5 is unsupported"),
        ("scheduler_schema_min", 30, "scheduler_schema_min 30 is unsupported"),
        ("execution_binding_version", 3, "execution_binding_version 3 is unsupported"),
        ("scheduler_job_binding.version", 2, "scheduler_job_binding.version 2 is unsupported"),
        ("compiled.target", "openclaw", "compiled.target \"openclaw\" is unsupported"),
        ("canonicalization.name", "jcs", "canonicalization contract is unsupported"),
        ("canonicalization.digest", "sha512", "canonicalization contract is unsupported"),
        ("canonicalization.undefined", "omit", "canonicalization contract is unsupported"),
    ],
)
def test_other_contract_versions_are_unsupported(path: str, value: Any, message: str) -> None:
    err = refused(with_changes((path, value)), "HANDOFF_ARTIFACT_INVALID")
    assert message in err.message and err.details[0]["field"] == path


# --------------------------------------------------------------------------- step 3: raw credential material


@pytest.mark.parametrize(
    "key",
    ["value", "raw_value", "proof_value", "credential", "credentials", "secret", "token", "password", "private_key",
     "private-key", "apiKey", "api_key", "API-KEY", "access_token", "accessToken", "GITHUB_TOKEN", "client_secret",
     "dbPassword", "cookie"],
)
def test_credential_named_keys_in_plugin_options_are_raw_material(key: str) -> None:
    err = refused(with_changes(("target.executor_options", {key: "hunter2"})), "HANDOFF_ARTIFACT_INVALID")
    assert err.message.startswith(f"raw credential material at target.executor_options.{key}")
    assert err.details == [{"field": f"target.executor_options.{key}", "code": "RAW_CREDENTIAL", "error": err.message}]


def test_credential_material_is_found_nested_and_in_lists() -> None:
    options = {"headers": [{"name": "X-Trace", "value": "abc"}], "auth": {"nested": {"refreshToken": "r"}}}
    err = refused(with_changes(("delivery.options", options)), "HANDOFF_ARTIFACT_INVALID")
    assert {d["field"] for d in err.details} == {"delivery.options.headers.0.value", "delivery.options.auth.nested.refreshToken"}


def test_a_pem_private_key_is_refused_wherever_it_is() -> None:
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----"
    err = refused(with_changes(("delivery.to", pem)), "HANDOFF_ARTIFACT_INVALID")
    assert err.details[0]["field"] == "delivery.to" and "raw credential material" in err.message


def test_redacted_stand_ins_and_nulls_are_allowed() -> None:
    """What ``redact_secrets`` writes passes: the compiler's own output for a job with secret-like options."""
    spec = attrs.evolve(fixture_spec(), executor_options={"api_token": "s3cret", "password": None, "mode": "fast"})
    payload = compile_v4(spec, **FIXTURE["compile"])
    assert payload["target"]["executor_options"]["api_token"]["redacted"] is True
    assert "s3cret" not in canonical_json(payload)
    assert validate_v4(payload, spec=spec) == canonical_digest(payload)


def test_the_artifacts_own_keys_never_count_as_credentials() -> None:
    """``credential_presentation`` and friends are known properties: only keys the artifact does not define are judged."""
    assert names_credential("credential_presentation")  # the name alone would match ...
    assert validate_v4(fixture_payload())  # ... yet the artifact that holds it is accepted
    for key in ("payload_sha256", "value_hash", "redacted", "timeout_ms", "key", "name", "medium"):
        assert not names_credential(key), key


def test_the_compiler_refuses_what_it_cannot_redact() -> None:
    """An option named ``value`` is not redacted by ``redact_secrets``: such a job cannot be handed off."""
    spec = attrs.evolve(fixture_spec(), delivery_options={"value": "x"})
    with pytest.raises(SchedulerError) as info:
        compile_v4(spec, **FIXTURE["compile"])
    assert info.value.code == "HANDOFF_ARTIFACT_INVALID" and "raw credential material" in info.value.message


# --------------------------------------------------------------------------- step 4: proofs and unenforced sections


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"artifact_binding_required": False}, "authorization_proof.artifact_binding_required"),
        ({"replay_protection": False}, "authorization_proof.replay_protection"),
        ({"revocation_check": None}, "authorization_proof.revocation_check"),
        ({"method": "none"}, "authorization_proof.method"),
        ({"method": "sha256"}, "authorization_proof.method"),
        ({"method": ["jwt"]}, "authorization_proof.method"),
    ],
)
@pytest.mark.parametrize("base", [GOOD_PROOF, AGENTCLI_PROOF], ids=["kernel-form", "agentcli-form"])
def test_weakened_proofs_are_downgrades(base: dict[str, Any], changes: dict[str, Any], field: str) -> None:
    err = refused(with_changes(("authorization_proof", {**base, **changes})), "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED")
    assert "authorization proofs require artifact binding, replay protection, and revocation" in err.message
    assert [d["field"] for d in err.details] == [field]


def test_every_declaration_the_kernel_enforces_is_accepted_when_it_is_the_jobs_own() -> None:
    """identity, credential bindings, authorization_ref/authorization, a proof and evidence: compiled, accepted, bound."""
    spec = declared_spec()
    payload = compile_v4(spec, **FIXTURE["compile"])
    sections = execution_sections(spec)
    assert payload["identity"] == GOOD_IDENTITY == sections["identity"]
    assert payload["credential_presentation"] == {"bindings": [GOOD_BINDING], "child_policy": "inherit"}
    assert payload["authorization_ref"] == "policyfile:deploy"
    assert payload["authorization"] == {**GOOD_AUTHORIZATION}
    assert payload["authorization_proof"] == GOOD_PROOF
    assert payload["evidence"] == {**GOOD_EVIDENCE, "ref": "soc2-deploy"}
    digest = canonical_digest(payload)
    assert validate_v4(payload) == digest
    assert validate_v4(json.loads(json.dumps(payload)), expected_digest=digest, spec=spec, job_id=JOB_ID) == digest
    assert payload["manifest"]["digest"] == canonical_digest(manifest_spec(spec)) != FIXTURE["expected"]["manifest_digest"]
    # Submitted the way `jobs add` receives it.
    rest, sub = split_submission({**FIXTURE["spec"], **DECLARED_FIELDS, **submission_fields(payload)})
    assert sub is not None and sub.verify(validate_spec(rest, plugin_options=False), job_id=JOB_ID) == digest


def test_a_secret_like_provider_option_reaches_the_artifact_only_as_a_stand_in() -> None:
    spec = declared_spec(credentials=[{**DECLARED_FIELDS["credentials"][0], "options": {"client_secret": "s3cret"}}])
    payload = compile_v4(spec, **FIXTURE["compile"])
    assert payload["credential_presentation"]["bindings"][0]["options"]["client_secret"]["redacted"] is True
    assert "s3cret" not in canonical_json(payload)
    assert validate_v4(payload, spec=spec, job_id=JOB_ID) == canonical_digest(payload)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("identity", {**GOOD_IDENTITY, "subject": {"kind": "user", "principal": "deploy-bot"}}),
        ("identity.trust.level", "system"),
        ("identity.delegation", {"mode": "inherit", "max_depth": 1, "allowed_delegators": ["*"]}),
        ("credential_presentation.bindings.0.ref", "OTHER_API"),
        ("credential_presentation.bindings.0.present.key", "API_KEY2"),
        ("credential_presentation.child_policy", "independent"),
        ("authorization_ref", "cedar:deploy"),
        ("authorization.request.include", ["job"]),
        ("authorization_proof.audience", "someone-else"),
        ("authorization_proof.jwks_url", "https://attacker.example/jwks.json"),
        ("evidence.verify.required", False),
        ("evidence.ref", "other-label"),
        ("evidence.retention", "1d"),
    ],
)
def test_a_declaration_edited_behind_correct_hashes_is_a_mismatch_naming_the_path(path: str, value: Any) -> None:
    """Exactly the job's own declaration, nothing weaker or stronger: every contract field is compared."""
    spec = declared_spec()
    payload = apply_changes(compile_v4(spec, **FIXTURE["compile"]), [{"op": "set", "path": path.split("."), "value": value}])
    if payload == compile_v4(spec, **FIXTURE["compile"]):
        pytest.fail(f"{path} = {value!r} is what the job compiles to; pick another value")
    err = refused(payload, "HANDOFF_ARTIFACT_MISMATCH", spec=spec, job_id=JOB_ID)
    assert err.details and all(d["field"] == path or d["field"].startswith(path + ".") for d in err.details), err.details


@pytest.mark.parametrize(
    "field", ["identity", "credentials", "child_credential_policy", "authorization_ref", "authorization",
              "authorization_proof", "evidence", "evidence_ref"],
)
def test_a_job_whose_declaration_changed_after_compiling_is_a_binding_mismatch(field: str) -> None:
    payload = compile_v4(declared_spec(), **FIXTURE["compile"])
    default = next(f.default for f in SPEC_FIELDS if f.name == field)
    changed = attrs.evolve(declared_spec(), **{field: default.factory() if isinstance(default, attrs.Factory) else default})
    err = refused(payload, "HANDOFF_ARTIFACT_BINDING_MISMATCH", expected_digest=canonical_digest(payload), spec=changed)
    assert err.details[0]["field"] == "scheduler_job_binding.digest"


def test_checking_a_job_without_declarations_imports_nothing() -> None:
    """The hot path: a v4 job that declares nothing is checked before every run with what the installed steps
    already imported (the declaration validators are the steps' own modules, imported once when they are installed)."""
    code = (
        "import json, sys\n"
        "from scheduler.core import steps\n"
        "from scheduler.pipeline import installed_steps\n"
        "steps.install(installed_steps)\n"
        "from scheduler.core.spec import validate_spec\n"
        "from scheduler.artifacts.handoff import compile_v4, validate_v4\n"
        f"fixture = json.load(open({str(FIXTURE_PATH)!r}))\n"
        "spec = validate_spec(fixture['spec'], plugin_options=False)\n"
        "before = set(sys.modules)\n"
        "validate_v4(compile_v4(spec, **fixture['compile']), spec=spec)\n"
        "names = ('scheduler.pipeline.identity', 'scheduler.pipeline.credentials.bindings', 'scheduler.pipeline.authorization',"
        " 'scheduler.pipeline.proofs.declaration', 'scheduler.evidence.declaration')\n"
        "print(json.dumps(sorted(n for n in names if n in sys.modules and n not in before)))\n"
    )
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize(
    ("path", "value", "fields"),
    [
        # AgentCLI's identity keys: authentication, presentation and delegation chains are not this kernel's.
        ("identity", {**GOOD_IDENTITY, "auth": {"mode": "oauth2"}, "presentation": {}},
         ["identity.auth", "identity.presentation"]),
        ("identity", {"subject": {"kind": "job", "principal": "x"}}, ["identity.subject.kind"]),
        ("identity", {"trust": {"level": "root"}}, ["identity.trust.level"]),
        ("identity", {"delegation": {"mode": "inherit"}}, ["identity.delegation.allowed_delegators"]),
        # AgentCLI's presentation binding form names no provider and no reference to resolve.
        ("credential_presentation.bindings", [{"name": "api", "medium": "env", "key": "API_KEY_NAME"}],
         ["credential_presentation.bindings.0.key", "credential_presentation.bindings.0.medium",
          "credential_presentation.bindings.0.present", "credential_presentation.bindings.0.provider",
          "credential_presentation.bindings.0.ref"]),
        ("credential_presentation.bindings", [{**GOOD_BINDING, "present": {"medium": "gateway-env-header"}}],
         ["credential_presentation.bindings.0.present.medium"]),
        ("credential_presentation.bindings", [{**GOOD_BINDING, "present": {"medium": "env", "key": "LD_PRELOAD"}}],
         ["credential_presentation.bindings.0.present.key"]),
        ("credential_presentation.bindings", [GOOD_BINDING, {**GOOD_BINDING, "name": "API"}],
         ["credential_presentation.bindings.1.name", "credential_presentation.bindings.1.present"]),
        ("credential_presentation.child_policy", "inherit", ["credential_presentation.child_policy"]),
        ("authorization_ref", "no provider", ["authorization_ref"]),
        ("authorization", GOOD_AUTHORIZATION, ["authorization"]),
        ("authorization_proof", {**GOOD_PROOF, "algorithms": ["HS256"]}, ["authorization_proof.algorithms"]),
        ("authorization_proof", {**GOOD_PROOF, "jwks_url": "http://idp.example/jwks"}, ["authorization_proof.jwks_url"]),
        ("authorization_proof", {"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a"},
         ["authorization_proof"]),
        ("authorization_proof", AGENTCLI_PROOF,
         ["authorization_proof.ref", "authorization_proof.source", "authorization_proof",
          "authorization_proof.artifact_binding_required", "authorization_proof.replay_protection",
          "authorization_proof.revocation_check"]),
        ("evidence", {"provider": "ssh", "methods": ["ssh-signature"]}, ["evidence.ref"]),
        ("evidence", {"provider": "ssh", "methods": ["sha256"], "ref": None}, ["evidence.methods"]),
        ("evidence", {"provider": "checksum", "format": "json", "ref": None}, ["evidence.format"]),
        ("evidence", {"collect": ["stdout_content"], "ref": None}, ["evidence.collect"]),
        ("evidence", {"retention": "forever-ish", "ref": None}, ["evidence.retention"]),
    ],
)
def test_declarations_this_kernel_cannot_enforce_are_unsupported_and_named(path: str, value: Any, fields: list[str]) -> None:
    section = path.split(".")[0]
    err = refused(with_changes((path, value)), "HANDOFF_ARTIFACT_UNSUPPORTED")
    assert err.message.startswith(f"{section} declares what this scheduler cannot enforce (nothing is accepted that is not enforced)")
    assert sorted(d["field"] for d in err.details) == sorted(fields), err.details
    assert all(d["code"] == "HANDOFF_ARTIFACT_UNSUPPORTED" and d["error"].startswith(d["field"] + ": ") for d in err.details)


def test_every_section_that_cannot_be_enforced_is_named() -> None:
    err = refused(with_changes(("identity", {"auth": {}}), ("evidence", {"unknown": 1, "ref": None})), "HANDOFF_ARTIFACT_UNSUPPORTED")
    assert err.message.startswith("identity, evidence declare what this scheduler cannot enforce")
    assert [d["field"] for d in err.details] == ["identity.auth", "evidence.unknown"]


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("authorization_proof", {**GOOD_PROOF, "proof": "abc.def.ghi"}, "authorization_proof.proof"),
        ("authorization_proof", {**GOOD_PROOF, "signature": "-----BEGIN SSH SIGNATURE-----"}, "authorization_proof.signature"),
        ("authorization_proof", {**GOOD_PROOF, "proof_value": "x"}, "authorization_proof.proof_value"),
        ("authorization_proof", {**GOOD_PROOF, "JWT": "x"}, "authorization_proof.JWT"),
        ("evidence", {**GOOD_EVIDENCE, "ref": None,
                      "payload": {"bind": [], "context": {"note": "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJkZXBsb3kifQ.c2ln"},
                                  "format": "canonical-json"}}, "evidence.payload.context.note"),
        ("credential_presentation.bindings", [{**GOOD_BINDING, "options": {"client_secret": "hunter2"}}],
         "credential_presentation.bindings.0.options.client_secret"),
        ("credential_presentation.bindings", [{**GOOD_BINDING, "value": "hunter2"}], "credential_presentation.bindings.0.value"),
        ("identity", {**GOOD_IDENTITY, "token": "hunter2"}, "identity.token"),
        ("authorization", {**GOOD_AUTHORIZATION, "provider_config": {"api_key": "hunter2"}}, "authorization.provider_config.api_key"),
    ],
)
def test_proofs_and_credential_values_in_declarations_are_raw_material(path: str, value: Any, field: str) -> None:
    """Before anything is judged enforceable: a proof or a secret in a declaration is raw material (step 3)."""
    err = refused(with_changes((path, value), ("authorization_ref", "policyfile:deploy")), "HANDOFF_ARTIFACT_INVALID")
    assert [d["field"] for d in err.details] == [field] and err.details[0]["code"] == "RAW_CREDENTIAL"
    assert "raw credential material" in err.message


# --------------------------------------------------------------------------- steps 5 and 6: digest and job


def test_malformed_expected_digest() -> None:
    err = refused(fixture_payload(), "HANDOFF_ARTIFACT_INVALID", expected_digest="sha256:XYZ")
    assert err.details[0]["field"] == "handoff_artifact_digest"


@pytest.mark.parametrize(
    "field", ["run_timeout_ms", "schedule_cron", "max_retries", "approval_required", "provenance", "payload_message"]
)
def test_a_job_that_changed_after_compiling_is_a_binding_mismatch(field: str) -> None:
    payload = fixture_payload()
    changed = attrs.evolve(fixture_spec(), **{field: OTHER_VALUES[field]})
    err = refused(payload, "HANDOFF_ARTIFACT_BINDING_MISMATCH", expected_digest=canonical_digest(payload), spec=changed)
    assert err.details[0]["field"] == "scheduler_job_binding.digest"


def test_labels_and_state_may_change_without_a_new_artifact() -> None:
    payload = fixture_payload()
    relabelled = attrs.evolve(fixture_spec(), name="renamed", description=None, enabled=False)
    assert validate_v4(payload, spec=relabelled, job_id=JOB_ID) == FIXTURE["expected"]["artifact_digest"]


def test_job_id_mismatch() -> None:
    err = refused(fixture_payload(), "HANDOFF_ARTIFACT_BINDING_MISMATCH", spec=fixture_spec(), job_id="another-job")
    assert err.details[0]["field"] == "compiled.job_id" and "another-job" in err.message


def test_a_forged_effective_task_hash_is_a_binding_mismatch() -> None:
    payload = with_changes(("compiled.effective_task_hash", "sha256:" + "1" * 64))
    err = refused(payload, "HANDOFF_ARTIFACT_BINDING_MISMATCH", spec=fixture_spec())
    assert err.details[0]["field"] == "compiled.effective_task_hash"


def test_sections_edited_behind_correct_hashes_are_a_mismatch_naming_the_paths() -> None:
    """Hashes copied from the real job do not cover up edited sections: the payload must be exactly the compiled one."""
    payload = with_changes(("runtime.timeout_ms", 30001), ("approval.risk_level", "low"))
    err = refused(payload, "HANDOFF_ARTIFACT_MISMATCH", spec=fixture_spec(), job_id=JOB_ID)
    assert [d["field"] for d in err.details] == ["approval.risk_level", "runtime.timeout_ms"]
    assert err.details[1]["error"] == "the artifact has 30001, the job compiles to 30000"
    assert "approval.risk_level, runtime.timeout_ms" in err.message


def test_a_foreign_compilers_manifest_and_source_are_kept() -> None:
    manifest = {"version": "0.1", "digest": "sha256:" + "3" * 64, "workflow_id": "fixture", "task_id": "positive"}
    payload = compile_v4(fixture_spec(), **FIXTURE["compile"], manifest=manifest, source="agentcli compile")
    assert payload["manifest"] == manifest and payload["compiled"]["source"] == "agentcli compile"
    assert validate_v4(payload, spec=fixture_spec(), job_id=JOB_ID) == canonical_digest(payload)


def test_compile_refuses_a_manifest_for_another_task() -> None:
    manifest = {"version": "0.1", "digest": "sha256:" + "3" * 64, "workflow_id": "fixture", "task_id": "other"}
    with pytest.raises(SchedulerError) as info:
        compile_v4(fixture_spec(), **FIXTURE["compile"], manifest=manifest)
    assert info.value.code == "HANDOFF_ARTIFACT_INVALID" and info.value.details[0]["field"] == "manifest.task_id"


# --------------------------------------------------------------------------- submissions


def _submission_obj() -> dict[str, Any]:
    return {**FIXTURE["spec"], **submission_fields(fixture_payload())}


def test_split_without_submission_fields() -> None:
    obj = dict(FIXTURE["spec"])
    rest, sub = split_submission(obj)
    assert sub is None and rest == obj and rest is not obj


def test_split_a_submission() -> None:
    obj = _submission_obj()
    before = copy.deepcopy(obj)
    rest, sub = split_submission(obj)
    assert obj == before  # not modified
    assert rest == FIXTURE["spec"]
    assert isinstance(sub, Submission)
    assert sub.version == 4 and sub.digest == FIXTURE["expected"]["artifact_digest"]
    assert sub.effective_task_hash == FIXTURE["expected"]["effective_task_hash"]
    assert sub.payload == fixture_payload()
    assert sub.verify(validate_spec(rest), job_id=JOB_ID) == sub.digest


@pytest.mark.parametrize(
    ("changes", "field", "code"),
    [
        ({"handoff_version": 3}, "handoff_version", "INVALID_VALUE"),
        ({"handoff_version": "4"}, "handoff_version", "INVALID_VALUE"),
        ({"handoff_version": True}, "handoff_version", "INVALID_VALUE"),
        ({"handoff_version": None}, "handoff_version", "INVALID_VALUE"),
        ({"handoff_artifact_digest": "sha256:abc"}, "handoff_artifact_digest", "INVALID_VALUE"),
        ({"effective_task_hash": "SHA256:" + "a" * 64}, "effective_task_hash", "INVALID_VALUE"),
        ({"handoff_artifact_payload": "{}"}, "handoff_artifact_payload", "INVALID_TYPE"),
        ({"handoff_artifact_payload": None}, "handoff_artifact_payload", "INVALID_TYPE"),
    ],
)
def test_malformed_submissions(changes: dict[str, Any], field: str, code: str) -> None:
    with pytest.raises(SchedulerError) as info:
        split_submission({**_submission_obj(), **changes})
    assert info.value.code == "HANDOFF_ARTIFACT_INVALID"
    assert info.value.details == [{"field": field, "code": code, "error": info.value.message}]


def test_a_partial_submission_lists_every_missing_field() -> None:
    with pytest.raises(SchedulerError) as info:
        split_submission({**FIXTURE["spec"], "handoff_version": 4})
    assert info.value.code == "HANDOFF_ARTIFACT_INVALID"
    assert [d["field"] for d in info.value.details] == list(SUBMISSION_FIELDS[1:])
    assert all(d["code"] == "REQUIRED" for d in info.value.details)


def test_submitted_values_must_agree_with_each_other() -> None:
    obj = _submission_obj()
    _, sub = split_submission({**obj, "effective_task_hash": "sha256:" + "2" * 64})
    assert sub is not None
    with pytest.raises(SchedulerError) as info:
        sub.verify(fixture_spec(), job_id=JOB_ID)
    assert info.value.code == "HANDOFF_ARTIFACT_BINDING_MISMATCH" and info.value.details[0]["field"] == "effective_task_hash"
    _, sub = split_submission({**obj, "handoff_artifact_digest": "sha256:" + "2" * 64})
    assert sub is not None
    with pytest.raises(SchedulerError) as info:
        sub.verify(fixture_spec(), job_id=JOB_ID)
    assert info.value.code == "HANDOFF_ARTIFACT_DIGEST_MISMATCH"


def test_compile_submission_is_what_jobs_add_accepts() -> None:
    out = compile_submission(FIXTURE["spec"], **FIXTURE["compile"])
    assert out == _submission_obj()
    assert json.loads(json.dumps(out)) == out
    rest, sub = split_submission(out)
    assert sub is not None and sub.verify(validate_spec(rest), job_id=JOB_ID) == FIXTURE["expected"]["artifact_digest"]
    # Recompiling a compiled spec replaces the old submission.
    assert compile_submission({**out, "run_timeout_ms": 30001}, **FIXTURE["compile"])["handoff_artifact_digest"] != sub.digest


# --------------------------------------------------------------------------- stored v4 jobs


class FakeTx:
    """Answers ``load_artifact``'s query from a dict of artifact rows, as ``put_artifact`` would have stored them."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def execute(self, sql: str, params: tuple[Any, ...]) -> None:
        assert sql.startswith("INSERT INTO execution_artifacts")
        digest, kind, job_id, payload, size, created = params
        self.rows.setdefault(digest, {"digest": digest, "kind": kind, "job_id": job_id, "payload": payload,
                                      "payload_bytes": size, "created_at": created})

    def one(self, sql: str, params: tuple[Any, ...]) -> dict[str, Any] | None:
        assert "FROM execution_artifacts WHERE digest = ?" in sql
        row = self.rows.get(params[0])
        return dict(row) if row is not None else None


def stored_job(spec: JobSpec | None = None) -> tuple[FakeTx, dict[str, Any]]:
    spec = spec or fixture_spec()
    tx = FakeTx()
    payload = compile_v4(spec, **FIXTURE["compile"])
    digest = put_artifact(tx, payload, kind="handoff-v4", job_id=JOB_ID, now=0)  # type: ignore[arg-type]
    row = {**spec_to_row(spec), "id": JOB_ID, "artifact_digest": digest, "handoff_version": 4,
           "effective_task_hash": payload["compiled"]["effective_task_hash"]}
    return tx, row


def test_check_bound_job_accepts_the_stored_job() -> None:
    tx, row = stored_job()
    check_bound_job(tx, row, fixture_spec())  # type: ignore[arg-type]
    assert check_job(tx, row) == FIXTURE["expected"]["artifact_digest"]  # type: ignore[arg-type]  # the run pipeline's path


def test_check_bound_job_refuses_drift() -> None:
    tx, row = stored_job()
    with pytest.raises(SchedulerError) as info:
        check_bound_job(tx, {**row, "run_timeout_ms": 30001}, attrs.evolve(fixture_spec(), run_timeout_ms=30001))  # type: ignore[arg-type]
    assert info.value.code == "HANDOFF_ARTIFACT_BINDING_MISMATCH"
    with pytest.raises(SchedulerError) as info:
        check_bound_job(tx, {**row, "effective_task_hash": "sha256:" + "4" * 64}, fixture_spec())  # type: ignore[arg-type]
    assert info.value.code == "HANDOFF_ARTIFACT_BINDING_MISMATCH" and info.value.details[0]["field"] == "effective_task_hash"
    with pytest.raises(SchedulerError) as info:
        check_bound_job(tx, {**row, "id": "another-job"}, fixture_spec())  # type: ignore[arg-type]
    assert info.value.code == "HANDOFF_ARTIFACT_BINDING_MISMATCH" and info.value.details[0]["field"] == "compiled.job_id"


def test_check_bound_job_storage_failures() -> None:
    tx, row = stored_job()
    with pytest.raises(SchedulerError) as info:
        check_bound_job(FakeTx(), row, fixture_spec())  # type: ignore[arg-type]
    assert info.value.code == "EXECUTION_ARTIFACT_MISSING"
    tampered = copy.deepcopy(tx)
    text = tampered.rows[row["artifact_digest"]]["payload"]
    tampered.rows[row["artifact_digest"]]["payload"] = text.replace('"timeout_ms":30000', '"timeout_ms":30001')
    with pytest.raises(SchedulerError) as info:
        check_bound_job(tampered, row, fixture_spec())  # type: ignore[arg-type]
    assert info.value.code == "EXECUTION_ARTIFACT_TAMPERED"
    native = FakeTx()
    digest = put_artifact(native, native_payload(fixture_spec(), JOB_ID), kind="native", job_id=JOB_ID, now=0)  # type: ignore[arg-type]
    with pytest.raises(SchedulerError) as info:
        check_bound_job(native, {**row, "artifact_digest": digest}, fixture_spec())  # type: ignore[arg-type]
    assert info.value.code == "HANDOFF_ARTIFACT_INVALID" and "not handoff-v4" in info.value.message


def test_hydrate() -> None:
    tx, row = stored_job()
    assert hydrate(tx, row) == fixture_payload()  # type: ignore[arg-type]
    with pytest.raises(SchedulerError) as info:
        hydrate(FakeTx(), row)  # type: ignore[arg-type]
    assert info.value.code == "HANDOFF_ARTIFACT_MISSING" and info.value.details[0]["field"] == "artifact_digest"
    with pytest.raises(SchedulerError) as info:
        hydrate(tx, {**row, "artifact_digest": None})  # type: ignore[arg-type]
    assert info.value.code == "HANDOFF_ARTIFACT_MISSING"
    with pytest.raises(SchedulerError) as info:
        hydrate(tx, {**row, "handoff_version": None})  # type: ignore[arg-type]
    assert info.value.code == "HANDOFF_ARTIFACT_INVALID"
    with pytest.raises(SchedulerError) as info:
        hydrate(tx, {**row, "approval_required": 0})  # type: ignore[arg-type]  # the row was edited behind the kernel
    assert info.value.code == "HANDOFF_ARTIFACT_BINDING_MISMATCH"
