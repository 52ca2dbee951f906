"""authorization_ref: the job fields, and decisions through a real dispatcher on SQLite and PostgreSQL.

The provider is the side-loaded ``testauthz`` (``tests/support/scheduler-authorization-testkit``),
whose policy ref says how it answers. Payloads are testkit ``touch:FILE`` steps, so "the
payload never started" is a file that does not exist.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.base.errors import SchedulerError
from scheduler.core.queue import enqueue_manual

REPO = Path(__file__).resolve().parents[1]
TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


@pytest.fixture(scope="module")
def _sideloaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    from kernel_testing import sideloaded

    with sideloaded(REPO / "tests" / "support" / "scheduler-authorization-testkit", into=tmp_path_factory.mktemp("site")) as paths:
        yield paths


@pytest.fixture(autouse=True)
def testauthz(_sideloaded: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """``testauthz`` is visible, provider caches are fresh, requests are logged to a file of this test."""
    from scheduler.pipeline import authorization
    from scheduler.plugins import options as plugin_options

    authorization.forget_providers()
    plugin_options._misses.clear()
    plugin_options._validators.clear()
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("AUTHZ_TESTKIT_LOG", str(log))
    yield log
    authorization.forget_providers()


def requests(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def events(store: Any, run_id: str, kind: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        rows = tx.all("SELECT kind, data FROM runtime_events WHERE run_id = ? AND kind = ? ORDER BY id", (run_id, kind))
    return [json.loads(r["data"]) if isinstance(r["data"], str) else r["data"] for r in rows]


def finished(store: Any, job_id: str, count: int = 1) -> list[dict[str, Any]]:
    return wait_for(lambda: [r for r in run_rows(store, job_id) if r["status"] in TERMINAL] if
                    len([r for r in run_rows(store, job_id) if r["status"] in TERMINAL]) >= count else None,
                    timeout=30, what="the run to finish")


def run_once(store: Any, dispatcher: Any, tmp_path: Path, policy: str, **spec: Any) -> tuple[dict[str, Any], Path]:
    """A testkit job touching a marker, authorised by ``testauthz:<policy>``, run once through a real dispatcher."""
    marker = tmp_path / f"ran-{policy.replace(':', '_').replace('/', '_')}"
    job = add_job(store, payload_message=f"touch:{marker}", authorization_ref=f"testauthz:{policy}", **spec)
    enqueue_manual(store, job["id"])
    d = dispatcher()
    try:
        (run,) = finished(store, job["id"])
    finally:
        d.stop()
    return run, marker


# -- the job fields -------------------------------------------------------------------------------


def spec(**extra: Any) -> dict[str, Any]:
    return {"name": "a", "schedule_kind": "manual", "payload_message": "true", **extra}


def fields_of(exc: pytest.ExceptionInfo[SchedulerError]) -> dict[str, str]:
    return {d["field"]: d["code"] for d in exc.value.details}


def test_fields_are_validated_and_normalised() -> None:
    from scheduler.core.spec import validate_spec

    s = validate_spec(spec(authorization_ref="testauthz:permit",
                           authorization={"provider_config": {"tag": "x"}, "request": {"include": ["identity", "job"]},
                                          "decision": {"allow": "permit", "permit": "escalate"},
                                          "escalation": {"risk_level": "high"}}))
    assert s.authorization_ref == "testauthz:permit"
    assert s.authorization == {"on_error": "deny", "request": {"include": ["job", "identity"]},
                               "decision": {"allow": "permit", "permit": "escalate"}, "provider_config": {"tag": "x"},
                               "escalation": {"risk_level": "high"}}


@pytest.mark.parametrize(("extra", "expected"), [
    ({"authorization_ref": "noprovider"}, {"authorization_ref": "INVALID_VALUE"}),
    ({"authorization_ref": "testauthz:"}, {"authorization_ref": "INVALID_VALUE"}),
    ({"authorization_ref": "Bad Name:x"}, {"authorization_ref": "INVALID_VALUE"}),
    ({"authorization_ref": "testauthz:" + "p" * 250}, {"authorization_ref": "TOO_LARGE"}),
    ({"authorization_ref": "testauthz:a\nb"}, {"authorization_ref": "INVALID_VALUE"}),
    ({"authorization_ref": 7}, {"authorization_ref": "INVALID_TYPE"}),
    ({"authorization": {}}, {"authorization": "CONFLICT"}),
    ({"authorization_ref": "testauthz:permit", "authorization": {"on_error": "permit"}}, {"authorization.on_error": "INVALID_CHOICE"}),
    ({"authorization_ref": "testauthz:permit", "authorization": {"mode": "x"}}, {"authorization.mode": "UNKNOWN_FIELD"}),
    ({"authorization_ref": "testauthz:permit", "authorization": {"decision": {"deny": "permit"}}},
     {"authorization.decision.deny": "INVALID_VALUE"}),
    ({"authorization_ref": "testauthz:permit", "authorization": {"decision": {"escalate": "permit"}}},
     {"authorization.decision.escalate": "INVALID_VALUE"}),
    ({"authorization_ref": "testauthz:permit", "authorization": {"decision": {"allow": "yes"}}},
     {"authorization.decision.allow": "INVALID_CHOICE"}),
    ({"authorization_ref": "testauthz:permit", "authorization": {"request": {"include": ["secrets"]}}},
     {"authorization.request.include": "INVALID_CHOICE"}),
    ({"authorization_ref": "testauthz:permit", "authorization": {"escalation": {"risk_level": "huge"}}},
     {"authorization.escalation.risk_level": "INVALID_CHOICE"}),
    ({"authorization_ref": "testauthz:permit", "authorization": {"provider_config": {"nope": 1}}},
     {"authorization.provider_config.nope": "UNKNOWN_FIELD"}),
    ({"authorization_ref": "testauthz:bad-policy"}, {"authorization_ref": "AUTHORIZATION_POLICY_INVALID"}),
])
def test_bad_fields_are_refused(extra: dict[str, Any], expected: dict[str, str]) -> None:
    from scheduler.core.spec import validate_spec

    with pytest.raises(SchedulerError) as exc:
        validate_spec(spec(**extra))
    assert exc.value.code == "VALIDATION_FAILED"
    assert fields_of(exc) == expected


def test_missing_provider_is_refused_and_nothing_is_stored(store: Any) -> None:
    from scheduler.core.jobs import create_jobs
    from scheduler.core.spec import validate_spec
    from scheduler.plugins.refs import require_plugins

    s = validate_spec(spec(authorization_ref="nosuchauthz:policy"))
    with pytest.raises(SchedulerError) as exc:
        require_plugins([s])
    assert exc.value.code == "AUTHORIZATION_NOT_AVAILABLE"
    assert exc.value.details[0]["field"] == "authorization_ref"
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM jobs") == 0
    assert create_jobs  # the CLI path (jobs add) is covered in test_authorization_cli


def test_artifact_carries_the_declaration_and_jobs_without_keep_their_digest() -> None:
    from scheduler.core.artifact import native_digest, native_payload
    from scheduler.core.spec import validate_spec

    plain = validate_spec(spec())
    authorised = validate_spec(spec(authorization_ref="testauthz:permit", authorization={"decision": {"allow": "permit"}}))
    payload = native_payload(authorised, "job-1")
    assert payload["authorization_ref"] == "testauthz:permit"
    assert payload["authorization"]["decision"] == {"allow": "permit"}
    assert native_payload(plain, "job-1")["authorization_ref"] is None
    assert native_payload(plain, "job-1")["authorization"] is None
    assert native_digest(plain, "job-1") != native_digest(authorised, "job-1")
    other = validate_spec(spec(authorization_ref="testauthz:deny", authorization={"decision": {"allow": "permit"}}))
    assert native_digest(other, "job-1") != native_digest(authorised, "job-1")


def test_a_job_without_authorization_ref_never_touches_the_store() -> None:
    from scheduler.core.outcomes import RunOutcomes
    from scheduler.core.spec import validate_spec
    from scheduler.pipeline import authorization

    class NoStore:
        def read(self) -> Any:
            raise AssertionError("the hot path must not query")

    outcomes = RunOutcomes()
    authorization.decide(NoStore(), object(), validate_spec(spec()), outcomes)
    assert outcomes.columns == {} and outcomes.events == []


# -- decisions through a real dispatcher ----------------------------------------------------------


def test_permit_runs_and_records_the_decision(store: Any, dispatcher: Any, tmp_path: Path, testauthz: Path) -> None:
    run, marker = run_once(store, dispatcher, tmp_path, "permit", authorization={"provider_config": {"tag": "t1"}})
    assert run["status"] == "ok" and marker.exists()
    decision = json.loads(run["authorization_json"])
    assert decision["decision"] == "permit" and decision["provider"] == "testauthz" and decision["policy_ref"] == "permit"
    assert decision["reason"] == "policy says permit" and decision["code"] is None
    (event,) = events(store, run["id"], "authorization.decided")
    assert event["decision"] == "permit"
    (req,) = requests(testauthz)
    assert req["tag"] == "t1"
    assert req["trigger"]["dispatch_kind"] == "manual" and req["trigger"]["attempt"] == 1 and req["trigger"]["run_id"] == run["id"]
    assert req["artifact_digest"] == run["artifact_digest"]
    assert req["job"]["id"] == run["job_id"] and req["job"]["authorization_ref"] == "testauthz:permit"
    assert req["identity"]["principal"].startswith("job:")
    assert req["executor"] == req["job"]["executor"] == "testkit"  # the executor the run uses, as the kernel resolved it


def test_request_include_leaves_parts_out(store: Any, dispatcher: Any, tmp_path: Path, testauthz: Path) -> None:
    run, _marker = run_once(store, dispatcher, tmp_path, "permit", authorization={"request": {"include": ["trigger"]}})
    assert run["status"] == "ok"
    (req,) = requests(testauthz)
    assert req["job"] == {} and req["identity"] is None and req["artifact_digest"] is None and req["proof"] is None
    assert req["executor"] is None  # sent with the job part only
    assert req["trigger"]["dispatch_kind"] == "manual"


@pytest.mark.parametrize(("policy", "code"), [
    ("deny", "AUTHORIZATION_DENIED"),
    ("raise", "AUTHORIZATION_PROVIDER_FAILED"),
    ("error", "AUTHORIZATION_PROVIDER_FAILED"),
    ("wrongtype", "AUTHORIZATION_DECISION_INVALID"),
    ("nonstr", "AUTHORIZATION_DECISION_INVALID"),
    ("answer:maybe", "AUTHORIZATION_DECISION_INVALID"),
])
def test_every_failure_denies_before_the_payload(store: Any, dispatcher: Any, tmp_path: Path, policy: str, code: str) -> None:
    run, marker = run_once(store, dispatcher, tmp_path, policy)
    assert run["status"] == "error" and run["error_code"] == code, run["error_message"]
    assert not marker.exists(), "the payload ran although authorization denied"
    decision = json.loads(run["authorization_json"])
    assert decision["decision"] == "deny" and decision["code"] == code and decision["policy_ref"] == policy
    (event,) = events(store, run["id"], "authorization.decided")
    assert event["decision"] == "deny" and event["code"] == code
    if policy == "deny":
        assert "policy says deny" in run["error_message"]
    if policy == "error":
        assert decision["details"]["cause"] == "TESTAUTHZ_BACKEND_DOWN"


def test_timeout_denies_and_a_late_permit_is_discarded(store: Any, dispatcher: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.settings import reload_settings as reset_settings

    monkeypatch.setenv("SCHEDULER_AUTHORIZATION_TIMEOUT_S", "0.3")
    reset_settings()
    try:
        run, marker = run_once(store, dispatcher, tmp_path, "sleep:2")
    finally:
        monkeypatch.delenv("SCHEDULER_AUTHORIZATION_TIMEOUT_S")
        reset_settings()
    assert run["status"] == "error" and run["error_code"] == "AUTHORIZATION_TIMEOUT"
    assert not marker.exists()
    assert json.loads(run["authorization_json"])["decision"] == "deny"


def test_provider_not_installed_at_run_time_denies(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    from scheduler.core.jobs import create_jobs
    from scheduler.core.spec import validate_spec

    marker = tmp_path / "ran"
    (job,) = create_jobs(store, [validate_spec({"name": "gone", "schedule_kind": "manual", "executor": "testkit",
                                                "payload_message": f"touch:{marker}", "authorization_ref": "nosuchauthz:p"})])
    enqueue_manual(store, job.id)
    d = dispatcher()
    try:
        (run,) = finished(store, job.id)
    finally:
        d.stop()
    assert run["status"] == "error" and run["error_code"] == "AUTHORIZATION_NOT_AVAILABLE" and not marker.exists()


def test_decision_mapping_applies(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    run, marker = run_once(store, dispatcher, tmp_path, "answer:allow", authorization={"decision": {"allow": "permit"}})
    assert run["status"] == "ok" and marker.exists()
    decision = json.loads(run["authorization_json"])
    assert decision["provider_decision"] == "allow" and decision["decision"] == "permit"
    run2, marker2 = run_once(store, dispatcher, tmp_path, "permit", name="stricter", authorization={"decision": {"permit": "deny"}})
    assert run2["status"] == "error" and run2["error_code"] == "AUTHORIZATION_DENIED" and not marker2.exists()


# -- escalation: the approval gate -----------------------------------------------------------------


def _escalated(store: Any, dispatcher: Any, tmp_path: Path, **spec: Any) -> tuple[Any, dict[str, Any], dict[str, Any], Path]:
    marker = tmp_path / "ran-escalated"
    job = add_job(store, payload_message=f"touch:{marker}", authorization_ref=spec.pop("ref", "testauthz:escalate"), **spec)
    enqueue_manual(store, job["id"])
    d = dispatcher()
    (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "awaiting_approval"], timeout=30,
                      what="the run to wait for approval")
    with store.read() as tx:
        (approval,) = tx.all("SELECT * FROM approvals WHERE run_id = ?", (run["id"],))
    return d, job, {"run": run, "approval": approval}, marker


def test_escalate_waits_for_approval_and_approve_resumes_without_asking_again(
        store: Any, dispatcher: Any, tmp_path: Path, testauthz: Path) -> None:
    from scheduler.approvals.decisions import decide

    d, job, found, marker = _escalated(store, dispatcher, tmp_path, approval_risk_level="low",
                                       authorization={"escalation": {"risk_level": "high"}})
    try:
        run, approval = found["run"], found["approval"]
        assert approval["gate_kind"] == "authorization" and approval["status"] == "pending" and approval["risk_level"] == "high"
        assert approval["artifact_digest"] == run["artifact_digest"]
        assert not marker.exists()
        assert json.loads(run["authorization_json"])["decision"] == "escalate"
        with store.read() as tx:
            assert tx.scalar("SELECT status FROM job_dispatch_queue WHERE id = ?", (run["dispatch_id"],)) == "awaiting_approval"
        assert len(requests(testauthz)) == 1
        decide(store, approval["id"], "approved", note="ok by me")
        (done,) = finished(store, job["id"])
    finally:
        d.stop()
    assert done["id"] == run["id"] and done["status"] == "ok" and marker.exists()
    assert len(requests(testauthz)) == 1, "the provider was asked again after the approval"
    decision = json.loads(done["authorization_json"])
    assert decision["decision"] == "permit" and decision["via"] == "approval" and decision["approval_id"] == approval["id"]
    assert decision["escalated"]["decision"] == "escalate" and "ok by me" in decision["reason"]
    kinds = [e["decision"] for e in events(store, run["id"], "authorization.decided")]
    assert kinds == ["escalate", "permit"]
    with store.read() as tx:
        assert tx.scalar("SELECT status FROM approvals WHERE id = ?", (approval["id"],)) == "dispatched"


def test_escalate_from_a_provider_not_declaring_it_is_a_deny(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    """Issue 27 finding 3: an escalate from a provider without the escalate capability denies; no approval is opened."""
    marker = tmp_path / "ran-undeclared"
    job = add_job(store, payload_message=f"touch:{marker}", authorization_ref="noescalate:escalate")
    enqueue_manual(store, job["id"])
    d = dispatcher()
    try:
        (run,) = finished(store, job["id"])
    finally:
        d.stop()
    assert run["status"] == "error" and run["error_code"] == "AUTHORIZATION_ESCALATE_UNDECLARED", run
    assert "does not declare the escalate capability" in run["error_message"]
    assert not marker.exists(), "the payload ran although the escalate was refused"
    decision = json.loads(run["authorization_json"])
    assert decision["decision"] == "deny" and decision["code"] == "AUTHORIZATION_ESCALATE_UNDECLARED"
    with store.read() as tx:
        assert tx.all("SELECT id FROM approvals WHERE run_id = ?", (run["id"],)) == []
    # The same policy from the provider that declares escalate waits for an approval (what the capability allows).
    job2 = add_job(store, name="declared", payload_message=f"touch:{marker}", authorization_ref="testauthz:escalate")
    enqueue_manual(store, job2["id"])
    d = dispatcher()
    try:
        wait_for(lambda: [r for r in run_rows(store, job2["id"]) if r["status"] == "awaiting_approval"], timeout=30,
                 what="the declared escalate to wait for approval")
    finally:
        d.stop()


def test_escalate_then_reject_cancels_and_nothing_runs(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    from scheduler.approvals.decisions import decide

    d, job, found, marker = _escalated(store, dispatcher, tmp_path, ref="testauthz:escalate-critical")
    try:
        assert found["approval"]["risk_level"] == "critical"  # the provider raised the job's medium
        decide(store, found["approval"]["id"], "rejected", note="no")
        (done,) = finished(store, job["id"])
    finally:
        d.stop()
    assert done["status"] == "cancelled" and done["error_code"] == "APPROVAL_REJECTED" and not marker.exists()
    with store.read() as tx:
        assert tx.scalar("SELECT status FROM job_dispatch_queue WHERE id = ?", (done["dispatch_id"],)) == "cancelled"


def test_job_gate_then_authorization_gate(store: Any, dispatcher: Any, tmp_path: Path, testauthz: Path) -> None:
    """A job with approval_required is approved first; the provider then escalates into a second gate."""
    from scheduler.approvals.decisions import decide

    marker = tmp_path / "ran-two-gates"
    job = add_job(store, payload_message=f"touch:{marker}", authorization_ref="testauthz:escalate", approval_required=True)
    enqueue_manual(store, job["id"])
    d = dispatcher()
    try:
        first = wait_for(lambda: _pending(store, job["id"], "job"), timeout=30, what="the job gate")
        assert requests(testauthz) == []  # the job gate comes first, before anything is asked
        decide(store, first["id"], "approved")
        second = wait_for(lambda: _pending(store, job["id"], "authorization"), timeout=30, what="the authorization gate")
        assert second["run_id"] == first["run_id"] and not marker.exists()
        decide(store, second["id"], "approved")
        (done,) = finished(store, job["id"])
    finally:
        d.stop()
    assert done["status"] == "ok" and marker.exists() and len(requests(testauthz)) == 1


def _pending(store: Any, job_id: str, gate: str) -> dict[str, Any] | None:
    with store.read() as tx:
        return tx.one("SELECT * FROM approvals WHERE job_id = ? AND gate_kind = ? AND status = 'pending'", (job_id, gate))
