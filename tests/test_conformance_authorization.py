"""Conformance kind ``authorization``: the corpus, the three shipped providers, and broken providers reported failing.

The shipped providers (cedar, policyfile, the teams example) are loaded through their entry
points with their setup adapters, as CI runs them. The broken ones are in-process variants
of an honest reference provider written here (its policy ref says the policy and what it
tests), plus the side-loaded ``brokenauthz`` (permits everything) through its entry point:
each must be reported failing on the cases its defect breaks, and the honest one must pass,
so a failure is the defect's and not the harness's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.api import PLUGIN_API_VERSION, AuthorizationDecision, AuthorizationRequest, SchedulerError
from scheduler.conformance.engine import Report, load_cases, run_kind

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


# -- an honest reference provider and its setup adapter ---------------------------------------------


class _Setup:
    def __init__(self, ref: str) -> None:
        self.settings: dict[str, Any] = {}
        self.policy_ref = ref
        self.provider_config: dict[str, Any] = {}
        self.secrets: dict[str, str] = {}

    def close(self) -> None:
        pass


class RefPolicies:
    """Writes the policy into the ref: ``<policy>:<condition>`` (``slow`` is declined: skipped)."""

    def conformance_policy(self, request: Any) -> _Setup:
        if request.policy == "slow":
            raise NotImplementedError("the reference provider has no slow policy")
        return _Setup(f"{request.policy}:{request.condition}")


class Honest:
    """Decides the ref's policy about the request's principal or job; never guesses a part the request lacks."""

    plugin_api = PLUGIN_API_VERSION
    capabilities = frozenset({"escalate"})

    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        return [f"policy {policy_ref!r} cannot be used"] if policy_ref.split(":")[0] in ("invalid", "missing") else []

    def subject(self, request: AuthorizationRequest, condition: str) -> bool | None:
        if condition == "principal":
            return None if request.identity is None else request.identity.get("principal") == "service:conformance"
        return None if not request.job else request.job.get("name") == "conformance-job"

    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        policy, condition = request.policy_ref.split(":")
        if policy in ("invalid", "missing"):
            raise SchedulerError("REF_POLICY_UNUSABLE", f"policy {policy} cannot be evaluated")
        subject = self.subject(request, condition)
        if subject is None:
            return AuthorizationDecision(decision="deny", reason=f"the request carries no {condition}")
        if policy == "deny":
            return AuthorizationDecision(decision="deny" if subject else "permit", reason="the deny policy")
        if not subject:
            return AuthorizationDecision(decision="deny", reason="not the subject")
        return AuthorizationDecision(decision=policy, reason=f"the {policy} policy")  # type: ignore[arg-type]


class DenyAll(Honest):
    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        return AuthorizationDecision(decision="deny", reason="deny everything")


class Flaky(Honest):
    """Answers right the first time it sees a request, then the opposite of a permit."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        answer = super().resolve_authorization(request)
        key = json.dumps([request.policy_ref, request.job.get("name"), (request.identity or {}).get("principal")])
        if key in self.seen and answer.decision == "deny":
            return AuthorizationDecision(decision="permit", reason="changed its mind")
        self.seen.add(key)
        return answer


class Mutates(Honest):
    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        answer = super().resolve_authorization(request)
        if isinstance(request.job, dict):
            request.job["name"] = "rewritten"
        return answer


class NoReason(Honest):
    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        answer = super().resolve_authorization(request)
        return AuthorizationDecision(decision=answer.decision, reason="")


class GuessesIdentity(Honest):
    """Treats a request without an identity as the subject's."""

    def subject(self, request: AuthorizationRequest, condition: str) -> bool | None:
        found = super().subject(request, condition)
        return True if found is None else found


class BlindCheck(Honest):
    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        return []


class AlarmedCheck(Honest):
    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        return ["everything looks wrong"]


class RaisesOnValid(Honest):
    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        raise RuntimeError("the policy engine is down")


class NoEscalate(Honest):
    """Answers permit where its policy says escalate."""

    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        answer = super().resolve_authorization(request)
        return AuthorizationDecision(decision="permit", reason="no approval needed") if answer.decision == "escalate" else answer


class EscalatesUndeclared(Honest):
    """Answers escalate where its policy says so, without declaring the capability (issue 27 finding 3)."""

    capabilities = frozenset()


class DeclinesUndeclared(Honest):
    """Does not declare escalate, and denies where its policy would escalate: what such a provider must do."""

    capabilities = frozenset()

    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        answer = super().resolve_authorization(request)
        return AuthorizationDecision(decision="deny", reason="approvals not supported") if answer.decision == "escalate" else answer


def run(provider: Any, name: str = "reference") -> Report:
    return run_kind("authorization", name, provider=provider, service_adapter=RefPolicies())


def failed(report: Report) -> set[str]:
    return {r.id for r in report.results if r.outcome == "failed"}


# -- the corpus --------------------------------------------------------------------------------------


def test_the_corpus_covers_the_issue() -> None:
    cases = {c.id: c for c in load_cases("authorization")}
    for needed in ("permit", "deny", "escalate", "exception", "timeout", "malformed-decision", "slow-provider",
                   "unknown-decision", "wrong-return-type", "request-include-without-identity", "request-stranger-denied",
                   "policy-invalid-exception", "policy-missing"):
        assert f"authorization.{needed}" in cases, needed
    assert {c.input.get("fault") for c in cases.values()} >= {"raise", "late", "wrong_type", "unknown_decision", "malformed"}
    assert cases["authorization.escalate"].requires == ("escalate",)


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c["expect"].update(decision="deny", error_code="AUTHORIZATION_DENIED"), "positive authorization case"),
    (lambda c: c["expect"].update(error_code="AUTHORIZATION_DENIED"), "a permit has no error_code"),
    (lambda c: c["input"].update(fault="raise"), "fault case"),
    (lambda c: c["input"].update(policy="nonsense"), "is not one of"),
    (lambda c: c["expect"].update(surprise=True), "Additional properties"),
])
def test_invalid_cases_are_refused_at_load(tmp_path: Path, change: Any, message: str) -> None:
    case = {"id": "authorization.extra", "description": "d", "kind": "authorization", "polarity": "positive",
            "input": {"policy": "permit"}, "expect": {"decision": "permit"}}
    change(case)
    (tmp_path / "authorization").mkdir()
    (tmp_path / "authorization" / "extra.json").write_text(json.dumps({"kind": "authorization", "cases": [case]}))
    with pytest.raises(SchedulerError) as info:
        load_cases("authorization", extra=[tmp_path])
    assert info.value.code == "CONFORMANCE_FIXTURE_INVALID"
    assert message in info.value.message + json.dumps(info.value.details), info.value.message


def test_escalate_without_the_capability_requirement_is_refused(tmp_path: Path) -> None:
    case = {"id": "authorization.extra", "description": "d", "kind": "authorization", "polarity": "negative",
            "input": {"policy": "escalate"}, "expect": {"decision": "escalate", "error_code": "AUTHORIZATION_ESCALATED"}}
    (tmp_path / "authorization").mkdir()
    (tmp_path / "authorization" / "extra.json").write_text(json.dumps({"kind": "authorization", "cases": [case]}))
    with pytest.raises(SchedulerError, match="requires the escalate capability"):
        load_cases("authorization", extra=[tmp_path])


# -- the shipped providers ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cedar", "policyfile", "teams"])
def test_shipped_providers_pass(name: str) -> None:
    report = run_kind("authorization", name)
    assert report.error is None, report.error
    assert report.ok, [r.to_json() for r in report.results if r.outcome == "failed"]
    skipped = {r.id for r in report.results if r.outcome == "skipped"}
    # Each declares escalate: the cases for providers that do not are skipped (issue 27 finding 3).
    undeclared = {"authorization.escalate-policy-without-capability", "authorization.escalate-undeclared-refused"}
    if name == "teams":  # decides by principal only: the job-name cases are declined, never passed; no host settings
        assert skipped == {"authorization.permit-by-job", "authorization.deny-by-job", "authorization.request-other-job-denied",
                           "authorization.request-include-job-only", "authorization.unconfigured-denies", *undeclared}
    else:
        assert skipped == undeclared and report.passed == len(load_cases("authorization")) - len(undeclared)


def test_cli_runs_cedar_and_reports_json(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    out = subprocess.run([str(BIN / "scheduler"), "conformance", "run", "authorization", "cedar", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    body = json.loads(out.stdout)
    assert out.returncode == 0 and body["ok"] and body["failed"] == 0, out.stdout + out.stderr
    assert {r["id"] for r in body["results"] if r["outcome"] == "passed"} >= {"authorization.timeout", "authorization.escalate"}


# -- broken providers are reported failing ----------------------------------------------------------


def test_the_honest_reference_passes() -> None:
    report = run(Honest())
    assert report.ok, [r.to_json() for r in report.results if r.outcome == "failed"]
    assert {r.id for r in report.results if r.outcome == "skipped"} == {
        "authorization.timeout", "authorization.unconfigured-denies",  # no host settings to leave out
        "authorization.escalate-policy-without-capability", "authorization.escalate-undeclared-refused"}  # declares escalate


def test_an_escalate_without_the_capability_fails_and_a_deny_passes() -> None:
    """Issue 27 finding 3: the corpus checks that a provider without escalate never answers it, and the kernel refuses one."""
    report = run(EscalatesUndeclared())
    assert failed(report) == {"authorization.escalate-policy-without-capability"}, [r.to_json() for r in report.results]
    (result,) = [r for r in report.results if r.outcome == "failed"]
    assert "does not declare the escalate capability" in result.message
    honest = run(DeclinesUndeclared())
    assert honest.ok, [r.to_json() for r in honest.results if r.outcome == "failed"]
    passed = {r.id for r in honest.results if r.outcome == "passed"}
    assert {"authorization.escalate-policy-without-capability", "authorization.escalate-undeclared-refused"} <= passed


@pytest.mark.parametrize(("provider", "must_fail", "why"), [
    (DenyAll(), {"authorization.permit", "authorization.permit-by-job", "authorization.escalate",
                 "authorization.request-include-job-only"}, "decision: expected"),
    (Flaky(), {"authorization.deny", "authorization.deny-by-job"}, "asked again"),
    (Mutates(), {"authorization.permit", "authorization.deny"}, "changed the request"),
    (NoReason(), {"authorization.deny", "authorization.request-stranger-denied"}, "without a reason"),
    (GuessesIdentity(), {"authorization.request-include-without-identity"}, "decision: expected deny, got permit"),
    (BlindCheck(), {"authorization.policy-invalid-exception", "authorization.policy-missing"}, "check_policy found nothing"),
    (AlarmedCheck(), {"authorization.permit", "authorization.deny"}, "check_policy reports problems"),
    (RaisesOnValid(), {"authorization.permit", "authorization.deny", "authorization.exception"}, "was not decided"),
    (NoEscalate(), {"authorization.escalate"}, "decision: expected escalate, got permit"),
], ids=lambda v: type(v).__name__ if not isinstance(v, (set, str)) else "")
def test_broken_providers_are_reported_failing(provider: Any, must_fail: set[str], why: str) -> None:
    report = run(provider)
    assert not report.ok and report.error is None
    assert must_fail <= failed(report), (must_fail - failed(report), [r.to_json() for r in report.results])
    messages = " ".join(r.message for r in report.results if r.outcome == "failed")
    assert why in messages, messages


class _SecretPolicies(RefPolicies):
    """The reference setups, each with a secret in the environment the provider may read (never quote)."""

    def conformance_policy(self, request: Any) -> _Setup:
        setup = super().conformance_policy(request)
        setup.secrets = {"CONFORMANCE_AUTHZ_TOKEN": "tok-9d8e7f6a5b4c"}
        return setup


class QuotesTheToken(Honest):
    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        answer = super().resolve_authorization(request)
        token = os.environ.get("CONFORMANCE_AUTHZ_TOKEN", "")
        return answer if answer.decision == "permit" else AuthorizationDecision(
            decision=answer.decision, reason=f"{answer.reason} (asked with token {token})")


class QuotesThePayload(Honest):
    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        answer = super().resolve_authorization(request)
        return answer if answer.decision == "permit" else AuthorizationDecision(
            decision=answer.decision, reason=f"{answer.reason} for {request.job.get('payload_message')}")


def test_values_leaking_into_a_reason_are_reported() -> None:
    """Issue 27: a secret of the setup or the job's payload in a decision's reason fails the case; the honest one passes."""
    def report(provider: Any) -> Report:
        return run_kind("authorization", "reference", provider=provider, adapter=_SecretPolicies())

    assert report(Honest()).ok
    token, payload = report(QuotesTheToken()), report(QuotesThePayload())
    assert "authorization.deny" in failed(token) and "authorization.deny" in failed(payload)
    assert "a secret of the setup" in " ".join(r.message for r in token.results if r.outcome == "failed")
    assert "the job's payload appears" in " ".join(r.message for r in payload.results if r.outcome == "failed")


@pytest.fixture
def brokenauthz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from kernel_testing import sideloaded

    from scheduler.pipeline import authorization

    with sideloaded(REPO / "tests" / "support" / "scheduler-authorization-testkit", into=tmp_path_factory.mktemp("site")):
        authorization.forget_providers()
        yield
    authorization.forget_providers()


def test_brokenauthz_through_its_entry_point_is_reported_failing(brokenauthz: None) -> None:
    alone = run_kind("authorization", "brokenauthz")  # no setup adapter: one failure, not one per case
    assert alone.error is not None and alone.error["code"] == "CONFORMANCE_NO_SETUP_ADAPTER" and alone.failed == 1
    report = run_kind("authorization", "brokenauthz", service_adapter=RefPolicies())
    assert not report.ok
    assert {"authorization.deny", "authorization.deny-by-job", "authorization.request-stranger-denied",
            "authorization.request-include-without-identity", "authorization.policy-missing"} <= failed(report)
    assert "authorization.escalate" not in failed(report)  # it declares no escalate: skipped, never passed
    assert {r.id for r in report.results if r.outcome == "skipped"} >= {"authorization.escalate"}
    assert "authorization.escalate" not in {r.id for r in report.results if r.outcome == "passed"}


def test_pytest_adapter_reports_a_broken_provider(tmp_path: Path) -> None:
    """A plugin author's test class over a permit-everything provider fails the deny cases in pytest too."""
    (tmp_path / "test_mine.py").write_text(
        "from scheduler.api import PLUGIN_API_VERSION, AuthorizationDecision\n"
        "from scheduler.testing import AuthorizationProviderConformance\n"
        "class Setup:\n"
        "    settings = {}; provider_config = {}; secrets = {}\n"
        "    def __init__(self, ref): self.policy_ref = ref\n"
        "    def close(self): pass\n"
        "class Adapter:\n"
        "    def conformance_policy(self, request): return Setup(request.policy + ':' + request.condition)\n"
        "class PermitAll:\n"
        "    plugin_api = PLUGIN_API_VERSION\n"
        "    capabilities = frozenset()\n"
        "    def resolve_authorization(self, request): return AuthorizationDecision(decision='permit', reason='yes')\n"
        "class TestMine(AuthorizationProviderConformance):\n"
        "    provider_name = 'mine'\n"
        "    setup_adapter = Adapter\n"
        "    case_filter = ['authorization.permit', 'authorization.deny']\n"
        "    def make_provider(self): return PermitAll()\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "1 failed, 1 passed" in out.stdout, out.stdout + out.stderr
    assert "authorization.deny" in out.stdout and "decision: expected deny, got permit" in out.stdout
