"""Handoff v4 artifacts (``scheduler.handoff``): the conformance fixture, every validation step, submissions, bound jobs.

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

from scheduler.canonical import canonical_digest, canonical_json
from scheduler.errors import SchedulerError
from scheduler.execution_artifacts import check_job, execution_sections, native_payload, put_artifact
from scheduler.handoff import (
    BINDING_EXCLUDED_FIELDS,
    SUBMISSION_FIELDS,
    Submission,
    check_bound_job,
    compile_submission,
    compile_v4,
    effective_task_hash,
    hydrate,
    job_binding,
    job_binding_digest,
    names_credential,
    split_submission,
    submission_fields,
    validate_v4,
)
from scheduler.spec import SPEC_FIELDS, JobSpec, spec_to_row, validate_spec

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_PATH = ROOT / "conformance-fixtures" / "v1" / "handoff" / "conformance.json"
FIXTURE: dict[str, Any] = json.loads(FIXTURE_PATH.read_text(encoding="utf-8"))
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
            target = target[key]
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


GOOD_PROOF = {
    "method": "ed25519", "ref": "proof-provider:deploy", "issuer": "https://issuer.example", "audience": "scheduler",
    "artifact_binding_required": True, "replay_protection": True, "revocation_check": True,
}


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
    assert payload["manifest"] == {"version": "scheduler-spec-1", "digest": canonical_digest(fixture_spec().to_json()),
                                   "workflow_id": "fixture", "task_id": "positive"}


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
}


def test_every_job_field_is_bound_or_explicitly_excluded() -> None:
    """A new job field fails here until it is put in the binding projection or in BINDING_EXCLUDED_FIELDS."""
    assert set(OTHER_VALUES) == {f.name for f in SPEC_FIELDS}
    spec = fixture_spec()
    base = job_binding_digest(spec)
    for name, value in OTHER_VALUES.items():
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


def test_unknown_keys_in_list_items_and_the_proof_are_refused() -> None:
    binding = {"name": "api", "medium": "env", "key": "API_KEY_NAME", "extra": 1}
    err = refused(with_changes(("credential_presentation.bindings", [binding])), "HANDOFF_ARTIFACT_INVALID")
    assert err.details[0]["field"] == "credential_presentation.bindings.0.extra"
    err = refused(with_changes(("authorization_proof", {**GOOD_PROOF, "nonce_window_s": 30})), "HANDOFF_ARTIFACT_INVALID")
    assert err.details[0]["field"] == "authorization_proof.nonce_window_s"


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
        ({"revocation_check": False}, "authorization_proof.revocation_check"),
        ({"method": "none"}, "authorization_proof.method"),
        ({"method": "sha256"}, "authorization_proof.method"),
    ],
)
def test_weakened_proofs_are_downgrades(changes: dict[str, Any], field: str) -> None:
    err = refused(with_changes(("authorization_proof", {**GOOD_PROOF, **changes})), "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED")
    assert "authorization proofs require artifact binding, replay protection, and revocation" in err.message
    assert [d["field"] for d in err.details] == [field]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("authorization_proof", GOOD_PROOF),
        ("identity", {"subject": "deploy-bot"}),
        ("authorization_ref", "authz:deploy"),
        ("authorization", {"provider": "opa"}),
        ("evidence", {"provider": "ssh", "methods": ["ssh-signature"]}),
        ("credential_presentation.bindings", [{"name": "api", "medium": "env", "key": "API_KEY_NAME"}]),
    ],
)
def test_declarations_this_kernel_does_not_enforce_are_unsupported(path: str, value: Any) -> None:
    section = path.split(".")[0]
    err = refused(with_changes((path, value)), "HANDOFF_ARTIFACT_UNSUPPORTED")
    assert err.message.startswith(f"{section} is declared") and "nothing is accepted that is not enforced" in err.message
    assert err.details == [{"field": section, "code": "HANDOFF_ARTIFACT_UNSUPPORTED", "error": f"{section} is not enforced by this scheduler"}]


def test_all_unenforced_sections_are_named() -> None:
    err = refused(with_changes(("identity", {}), ("evidence", {})), "HANDOFF_ARTIFACT_UNSUPPORTED")
    assert err.message.startswith("identity, evidence are declared")


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
