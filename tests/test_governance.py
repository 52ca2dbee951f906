"""Governance (issue 11): what the executor cannot enforce is refused, at add and before every run.

Pure checks of ``scheduler.pipeline.governance``, the refusal at ``jobs validate`` through the real
CLI, and real dispatcher runs of shell jobs on SQLite and PostgreSQL: a job accepted while
its executor declared a capability that it no longer declares ends ``error`` /
``SCHEDULER_GOVERNANCE_DENIED`` and its command never runs (a marker file that must not
appear); the decision is on the run and in an event; a job without demands records nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from kernel_testing import add_job, run_job_once

from scheduler.base.errors import SchedulerError
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.spec import validate_spec
from scheduler.pipeline import governance

DENIED = "SCHEDULER_GOVERNANCE_DENIED"


@attrs.define
class Executor:
    capabilities: frozenset[str] = frozenset()
    plugin_api: int = 1


def spec(**fields: Any) -> Any:
    """A validated spec whose executor is not installed (``nosuch``): validation leaves governance to the run."""
    base = {"name": "g", "schedule_kind": "manual", "payload_message": "true", "executor": "nosuch"}
    return validate_spec({**base, **fields}, plugin_options=False)


BINDING = {"name": "tok", "provider": "env", "ref": "X", "present": {"medium": "env", "key": "API_TOKEN"}}


# -- the decision -------------------------------------------------------------------------------------------------


def test_a_job_without_demands_costs_nothing_and_records_nothing() -> None:
    outcomes = RunOutcomes()

    class Exploding:
        @property
        def capabilities(self) -> frozenset[str]:
            raise AssertionError("governance must not look at the executor of a job without demands")

    governance.evaluate(spec(), Exploding(), outcomes)
    assert outcomes.columns == {} and outcomes.events == []
    assert governance.problems(spec(), Exploding()) == []


@pytest.mark.parametrize("constraints,capability", [
    ({"sandbox": True}, "sandbox"),
    ({"network": "none"}, "network-restriction"),
    ({"network": "loopback"}, "network-restriction"),
    ({"allowed_paths": ["/srv/data"]}, "path-restriction"),
    ({"max_tokens": 100}, "token-cap"),
    ({"max_cost": 0.5}, "cost-cap"),
])
def test_each_constraint_needs_its_capability(constraints: dict[str, Any], capability: str) -> None:
    name = next(iter(constraints))
    job = spec(constraints=constraints)
    outcomes = RunOutcomes()
    with pytest.raises(SchedulerError) as info:
        governance.evaluate(job, Executor(frozenset({"timeout", "verify"})), outcomes)
    assert info.value.code == DENIED and f"constraints.{name}" in info.value.message and capability in info.value.message
    decision = json.loads(outcomes.columns["governance_json"])
    assert decision["decision"] == "denied" and decision["denied"] == [f"constraints.{name}"]
    assert decision["capabilities"] == ["timeout", "verify"] and decision["code"] == DENIED
    assert outcomes.events == [("governance.decided", decision)]
    # declared: allowed, and recorded as such
    outcomes = RunOutcomes()
    governance.evaluate(job, Executor(frozenset({capability})), outcomes)
    allowed = json.loads(outcomes.columns["governance_json"])
    assert allowed["decision"] == "allowed" and allowed["checks"] == [
        {"demand": f"constraints.{name}", "requires": capability, "enforced": True}]
    assert [kind for kind, _ in outcomes.events] == ["governance.decided"]


def test_every_denied_demand_is_named_verify_and_credential_media_too() -> None:
    binding_file = {"name": "key", "provider": "env", "ref": "Y", "present": {"medium": "file"}}
    job = spec(constraints={"sandbox": True, "max_cost": 1.0}, verify_shell="true", credentials=[BINDING, binding_file])
    found = governance.problems(job, Executor(frozenset({"cost-cap", "credentials-env"})))
    assert [(p["field"], p["code"], p["requires"]) for p in found] == [
        ("constraints.sandbox", DENIED, "sandbox"), ("verify_shell", DENIED, "verify"),
        ("credentials[1].present.medium", DENIED, "credentials-file")]
    # validation leaves credential media to the credential checks (their own code); the run-time step checks them
    assert [p["field"] for p in governance.problems(job, Executor(frozenset({"cost-cap"})), credentials=False)] == [
        "constraints.sandbox", "verify_shell"]


def test_an_exception_while_deciding_is_a_deny() -> None:
    class Broken:
        @property
        def capabilities(self) -> frozenset[str]:
            raise RuntimeError("capability table unreadable")

    outcomes = RunOutcomes()
    with pytest.raises(SchedulerError) as info:
        governance.evaluate(spec(constraints={"sandbox": True}), Broken(), outcomes)
    assert info.value.code == DENIED and "RuntimeError" in info.value.message
    assert json.loads(outcomes.columns["governance_json"])["decision"] == "denied"


def test_jobs_validate_reports_what_would_be_denied(cli: Any) -> None:
    job = {"name": "sandboxed", "schedule_kind": "manual", "payload_message": "true",
           "constraints": {"sandbox": True, "network": "loopback"}, "verify_shell": "true"}
    out = cli("--json", "jobs", "validate", json.dumps(job))
    assert out.code != 0, out.out
    data = json.loads(out.out)
    assert data["code"] == "VALIDATION_FAILED"
    assert [(d["field"], d["code"]) for d in data["details"]] == [("constraints.sandbox", DENIED),
                                                                  ("constraints.network", DENIED)]
    assert "network-restriction" in data["details"][1]["error"]
    ok = cli("--json", "jobs", "validate", json.dumps({**job, "constraints": {}}))
    assert ok.code == 0 and json.loads(ok.out)["valid"] is True


# -- through a real dispatcher ----------------------------------------------------------------------------------------


def _run(store: Any, dispatcher: Any, job: dict[str, Any]) -> dict[str, Any]:
    return run_job_once(store, dispatcher, job)


def _events(store: Any, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    with store.read() as tx:
        rows = tx.all("SELECT kind, data FROM runtime_events WHERE run_id = ? ORDER BY id", (run_id,))
    return [(r["kind"], json.loads(r["data"]) if r["data"] else {}) for r in rows]


def _added_while_declaring(store: Any, monkeypatch: pytest.MonkeyPatch, extra: set[str], **fields: Any) -> dict[str, Any]:
    """Add a shell job while the shell executor declares ``extra`` too (as if it did then), then take them back."""
    from scheduler_executor_shell.executor import ShellExecutor

    original = ShellExecutor.capabilities
    monkeypatch.setattr(ShellExecutor, "capabilities", original | extra)
    job = add_job(store, executor="shell", **fields)
    monkeypatch.setattr(ShellExecutor, "capabilities", original)
    return job


def test_a_constraint_the_executor_stopped_enforcing_denies_the_run_before_the_payload(
    store: Any, dispatcher: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "payload-ran"
    job = _added_while_declaring(store, monkeypatch, {"network-restriction"}, name="offline",
                                 payload_message=f"touch {marker}", constraints={"network": "none"})
    run = _run(store, dispatcher, job)
    assert (run["status"], run["error_code"]) == ("error", DENIED), run
    assert "constraints.network" in run["error_message"] and "network-restriction" in run["error_message"]
    assert not marker.exists(), "the payload ran although governance denied it"
    decision = json.loads(run["governance_json"])
    assert decision["decision"] == "denied" and decision["denied"] == ["constraints.network"]
    assert decision["executor"] == "shell" and "network-restriction" not in decision["capabilities"]
    assert "process-group" in decision["capabilities"]
    kinds = [k for k, _ in _events(store, run["id"])]
    assert "governance.decided" in kinds
    assert dict(_events(store, run["id"]))["governance.decided"]["denied"] == ["constraints.network"]


def test_a_credential_medium_the_executor_stopped_declaring_denies_before_anything_is_resolved(
    store: Any, dispatcher: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler_executor_shell.executor import ShellExecutor

    marker = tmp_path / "payload-ran"
    monkeypatch.setenv("X", "s3cret-value-gov")
    job = add_job(store, executor="shell", name="cred", payload_message=f"touch {marker}", credentials=[BINDING])
    monkeypatch.setattr(ShellExecutor, "capabilities", ShellExecutor.capabilities - {"credentials-env"})
    run = _run(store, dispatcher, job)
    assert (run["status"], run["error_code"]) == ("error", DENIED), run
    assert not marker.exists()
    assert json.loads(run["governance_json"])["denied"] == ["credentials[0].present.medium"]
    with store.read() as tx:
        assert tx.all("SELECT id FROM credential_presentations WHERE run_id = ?", (run["id"],)) == []


def test_an_enforced_demand_runs_and_records_an_allowed_decision(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    job = add_job(store, executor="shell", name="verified", payload_message=f"touch {marker}", verify_shell=f"test -f {marker}")
    run = _run(store, dispatcher, job)
    assert run["status"] == "ok", run
    assert marker.exists()
    decision = json.loads(run["governance_json"])
    assert decision["decision"] == "allowed" and decision["checks"] == [
        {"demand": "verify_shell", "requires": "verify", "enforced": True}]
    assert "governance.decided" in [k for k, _ in _events(store, run["id"])]


def test_a_job_without_demands_leaves_no_governance_record(store: Any, dispatcher: Any) -> None:
    run = _run(store, dispatcher, add_job(store, executor="shell", name="plain", payload_message="true"))
    assert run["status"] == "ok" and run["governance_json"] is None
    assert "governance.decided" not in [k for k, _ in _events(store, run["id"])]


def test_new_shell_jobs_get_the_minimal_environment_and_inherit_is_a_recorded_warning(
    store: Any, dispatcher: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOV_VISIBLE_ONLY_WITH_INHERIT", "here")
    plain = add_job(store, executor="shell", name="minimal", payload_message='echo "${GOV_VISIBLE_ONLY_WITH_INHERIT:-absent}"')
    assert plain["executor_options"] in ({}, None, "{}")  # nothing stored: the default, minimal
    run = _run(store, dispatcher, plain)
    assert (run["status"], run["stdout_excerpt"], run["env_policy_warning"]) == ("ok", "absent\n", None)
    inherit = add_job(store, executor="shell", name="inherit", payload_message='echo "${GOV_VISIBLE_ONLY_WITH_INHERIT:-absent}"',
                      executor_options={"env_policy": "inherit"})
    run = _run(store, dispatcher, inherit)
    assert run["stdout_excerpt"] == "here\n"
    assert "env_policy=inherit" in run["env_policy_warning"]
