"""The policyfile provider: rules, modes, time windows, default deny, and every broken file reported, never a permit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from scheduler_provider_policyfile import PolicyFileProvider, PolicyFileSettings

from scheduler.api import AuthorizationDecision, AuthorizationRequest, SchedulerError

RULES = """
mode = "first-match"
[[rule]]
effect = "deny"
jobs = ["danger-*"]
reason = "never"
[[rule]]
effect = "escalate"
principals = ["user:*"]
reason = "humans need a second pair of eyes"
[[rule]]
effect = "permit"
jobs = ["backup-*"]
executors = ["shell"]
trust_levels = ["operator", "system"]
dispatch_kinds = ["schedule", "manual"]
days = ["mon", "tue", "wed", "thu", "fri"]
hours = "01:00-05:00"
tz = "Europe/Berlin"
reason = "nightly backups"
"""


def provider(tmp_path: Path, text: str = RULES, name: str = "rules.toml") -> PolicyFileProvider:
    (tmp_path / name).write_text(text)
    p = PolicyFileProvider()
    p.configure(PolicyFileSettings(policy_dir=str(tmp_path)))
    return p


def request(name: str = "backup-db", *, principal: str = "service:backup", level: str = "operator",
            started_at: str = "2026-03-03T01:30:00Z", kind: str = "schedule", identity: bool = True) -> AuthorizationRequest:
    return AuthorizationRequest(
        policy_ref="rules", job={"name": name, "executor": "shell", "session_target": "shell"},
        trigger={"dispatch_kind": kind, "attempt": 1, "started_at": started_at},
        identity={"principal": principal, "trust_level": level} if identity else None,
    )


def test_permit_inside_the_window(tmp_path: Path) -> None:
    answer = provider(tmp_path).resolve_authorization(request())  # Tuesday 02:30 in Berlin
    assert isinstance(answer, AuthorizationDecision)
    assert (answer.decision, answer.reason, answer.details["rule"]) == ("permit", "nightly backups", 2)


@pytest.mark.parametrize("change", [
    {"started_at": "2026-03-03T05:30:00Z"},   # 06:30 Berlin: outside the hours
    {"started_at": "2026-03-07T01:30:00Z"},   # Saturday
    {"level": "user"},                         # trust level not listed
    {"kind": "chain"},                         # dispatch kind not listed
    {"name": "report"},                        # no rule at all: default deny
])
def test_anything_else_is_denied(tmp_path: Path, change: dict[str, Any]) -> None:
    assert provider(tmp_path).resolve_authorization(request(**change)).decision == "deny"


def test_first_match_and_deny_overrides(tmp_path: Path) -> None:
    p = provider(tmp_path)
    assert p.resolve_authorization(request(principal="user:alice")).decision == "escalate"
    assert p.resolve_authorization(request(name="danger-zone")).decision == "deny"
    overrides = provider(tmp_path, RULES.replace('mode = "first-match"', 'mode = "deny-overrides"') +
                         '[[rule]]\neffect = "deny"\nprincipals = ["service:backup"]\n')
    assert overrides.resolve_authorization(request()).decision == "deny"  # a later deny wins over the permit


def test_a_rule_on_a_part_the_request_lacks_fails_closed(tmp_path: Path) -> None:
    with pytest.raises(SchedulerError) as exc:
        provider(tmp_path).resolve_authorization(request(identity=False))
    assert exc.value.code == "POLICYFILE_REQUEST_INCOMPLETE"


@pytest.mark.parametrize(("text", "needle"), [
    ("mode = 'whatever'", "mode"),
    ("[[rule]]\neffect = 'allow'", "effect"),
    ("[[rule]]\neffect = 'permit'\nhours = '25:00-01:00'", "hours"),
    ("[[rule]]\neffect = 'permit'\ntz = 'Mars/Base'", "tz"),
    ("[[rule]]\neffect = 'permit'\ndays = ['someday']", "days"),
    ("[[rule]]\neffect = 'permit'\ncolour = 'red'", "colour"),
    ("this is not toml", "TOML"),
])
def test_broken_files_are_reported_and_never_permit(tmp_path: Path, text: str, needle: str) -> None:
    p = provider(tmp_path, text)
    (problem,) = p.check_policy("rules", None)
    assert "POLICYFILE_INVALID" in problem and needle in problem
    with pytest.raises(SchedulerError) as exc:
        p.resolve_authorization(request())
    assert exc.value.code == "POLICYFILE_INVALID"


def test_missing_file_bad_ref_and_no_directory(tmp_path: Path) -> None:
    p = provider(tmp_path)
    assert p.check_policy("rules", None) == []
    assert "POLICYFILE_NOT_FOUND" in p.check_policy("other", None)[0]
    assert "POLICYFILE_REF_INVALID" in p.check_policy("../etc/passwd", None)[0]
    unconfigured = PolicyFileProvider()
    unconfigured.configure(PolicyFileSettings())
    assert "POLICYFILE_NOT_CONFIGURED" in unconfigured.check_policy("rules", None)[0]


def test_the_executor_comes_from_the_request_the_kernel_resolved(tmp_path: Path) -> None:
    """A job without an ``executor`` field runs on its session_target's default: the kernel says which, in the request."""
    p = provider(tmp_path, RULES.replace('executors = ["shell"]', 'executors = ["agent"]'))
    base = request()
    isolated = attrs.evolve(base, job={"name": "backup-db", "session_target": "isolated"}, executor="agent")
    assert p.resolve_authorization(isolated).decision == "permit"
    # The same job resolved to another executor is not the rule's: no copy of the kernel's defaults decides it.
    assert p.resolve_authorization(attrs.evolve(isolated, executor="shell")).decision == "deny"
