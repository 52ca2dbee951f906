"""The cedar provider: Cedar policies decide permit, deny and escalate; syntax errors are problems, never a permit."""

from __future__ import annotations

from pathlib import Path

import pytest
from scheduler_provider_cedar import CedarOptions, CedarProvider, CedarSettings, cedar_request

from scheduler.api import AuthorizationRequest, SchedulerError

POLICY = """
@id("backups at night")
permit(principal == Service::"backup", action == Action::"schedule", resource == Job::"backup-db")
when { context.time.hour < 5 && principal.trust_level == "operator" };

@id("manual runs need approval") @escalate("high")
permit(principal, action == Action::"manual", resource == Job::"backup-db");

@id("never retry more than twice")
forbid(principal, action == Action::"retry", resource) when { context.trigger.attempt > 2 };
"""


def provider(tmp_path: Path, text: str = POLICY) -> CedarProvider:
    (tmp_path / "ops.cedar").write_text(text)
    p = CedarProvider()
    p.configure(CedarSettings(policy_dir=str(tmp_path)))
    return p


def request(kind: str = "schedule", started_at: str = "2026-03-03T03:00:00Z", attempt: int = 1,
            principal: str = "backup", level: str = "operator", policy: str = "ops") -> AuthorizationRequest:
    return AuthorizationRequest(
        policy_ref=policy, job={"name": "backup-db", "executor": "shell", "schedule_kind": "cron"},
        trigger={"dispatch_kind": kind, "attempt": attempt, "started_at": started_at},
        identity={"principal": f"service:{principal}", "subject": {"kind": "service", "principal": principal}, "trust_level": level},
        options=CedarOptions(),
    )


def test_permit_deny_escalate(tmp_path: Path) -> None:
    p = provider(tmp_path)
    permit = p.resolve_authorization(request())
    assert permit.decision == "permit" and "backups at night" in permit.reason
    assert p.resolve_authorization(request(started_at="2026-03-03T13:00:00Z")).decision == "deny"
    assert p.resolve_authorization(request(level="user")).decision == "deny"
    assert p.resolve_authorization(request(principal="intruder")).decision == "deny"
    escalate = p.resolve_authorization(request(kind="manual"))
    assert escalate.decision == "escalate" and escalate.details["risk_level"] == "high"
    assert p.resolve_authorization(request(kind="retry", attempt=3)).decision == "deny"


def test_policy_set_directory(tmp_path: Path) -> None:
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "a.cedar").write_text('permit(principal, action == Action::"schedule", resource);')
    (tmp_path / "set" / "b.cedar").write_text('forbid(principal, action, resource) when { context.time.weekday == "sat" };')
    p = provider(tmp_path)
    assert p.resolve_authorization(request(policy="set")).decision == "permit"
    assert p.resolve_authorization(request(policy="set", started_at="2026-03-07T03:00:00Z")).decision == "deny"


def test_syntax_error_is_a_problem_and_never_a_permit(tmp_path: Path) -> None:
    p = provider(tmp_path, 'permit(principal, action resource);')
    (problem,) = p.check_policy("ops", None)
    assert problem.startswith("CEDAR_POLICY_INVALID")
    with pytest.raises(SchedulerError) as exc:
        p.resolve_authorization(request())
    assert exc.value.code == "CEDAR_POLICY_INVALID"


def test_missing_policy_and_unconfigured(tmp_path: Path) -> None:
    p = provider(tmp_path)
    assert p.check_policy("ops", None) == []
    assert p.check_policy("nope", None)[0].startswith("CEDAR_POLICY_NOT_FOUND")
    assert p.check_policy("../x", None)[0].startswith("CEDAR_POLICY_REF_INVALID")
    bare = CedarProvider()
    bare.configure(CedarSettings())
    with pytest.raises(SchedulerError) as exc:
        bare.resolve_authorization(request())
    assert exc.value.code == "CEDAR_NOT_CONFIGURED"


def test_request_mapping_without_identity() -> None:
    cedar, entities = cedar_request(AuthorizationRequest(policy_ref="x", job={"name": 'we"ird', "executor": "shell"},
                                                         trigger={"dispatch_kind": "chain", "attempt": 2}))
    assert cedar["principal"] == 'Job::"we\\"ird"' and cedar["action"] == 'Action::"chain"'
    assert cedar["context"]["trigger"] == {"dispatch_kind": "chain", "attempt": 2}
    assert len(entities) == 1  # principal and resource are the same job


def test_the_resource_executor_is_the_one_the_kernel_resolved() -> None:
    """A job without ``executor`` (session_target ``isolated``) is the executor the request names, not a copied default."""
    job = {"name": "turn", "session_target": "isolated"}
    _cedar, entities = cedar_request(AuthorizationRequest(policy_ref="x", job=job, trigger={"dispatch_kind": "manual"},
                                                          executor="agent"))
    assert entities[0]["attrs"]["executor"] == "agent"
    _cedar, entities = cedar_request(AuthorizationRequest(policy_ref="x", job=job, trigger={"dispatch_kind": "manual"},
                                                          executor="my-agent"))
    assert entities[0]["attrs"]["executor"] == "my-agent"
