"""The engine's adapter for kind ``authorization``: decide a run through a provider exactly as the kernel does.

Per case, the provider's **setup adapter** writes a policy in the provider's own language
(a Cedar policy set, a policyfile rules file, a team's members) that says the case's
``policy`` about the conformance subject, and says how to point the provider at it. A
setup adapter is any object with

    conformance_policy(request: PolicyRequest) -> setup

and the setup has ``settings`` (the ``[providers.NAME]`` table), ``policy_ref`` (what the
job writes after the colon of its ``authorization_ref``), optionally ``provider_config``
(the job's ``authorization.provider_config``), ``secrets`` (environment variables set while
the case runs) and ``close()``. The policies (``POLICIES``): ``permit`` / ``deny`` /
``escalate`` the subject's runs (a ``deny`` policy also permits everyone else, so that the
deny must win), ``invalid`` (a policy the provider cannot evaluate: a syntax error),
``missing`` (the ref names no policy), ``slow`` (evaluating it takes longer than the
kernel waits: a FIFO where the file should be). ``condition`` says what the policy tests:
the run's ``principal`` (``service:conformance``, the default) or the ``job`` name
(``conformance-job``). A policy the adapter cannot write raises ``NotImplementedError("why")``:
the case is skipped with the reason, never passed. The adapter is found as the other kinds
find theirs: the one given (``--adapter MODULE:ATTR``), the provider's own
``conformance_policy`` method, the entry point named like the provider in
``scheduler.conformance_adapters``; else ``CONFORMANCE_NO_SETUP_ADAPTER``.

A case is decided by the kernel's own code, not a copy: ``scheduler.pipeline.authorization.decide_with``
builds the options (``options_class``), the request (``authorization.request.include``),
makes the bounded call (``scheduler.core.bounded.call_bounded``, ``CALL_LIMIT_S`` here), checks
the answer (``check_answer``), applies the mapping and records the decision. Every case's job
carries the payload ``PAYLOAD``. The request is
asked by the subject, or (``input.request``) by a ``stranger`` principal, for ``other`` job,
or with parts left out. ``fault`` cases take the provider's own permit and then do what a
faulty build would (raise after deciding, return a dict, an unknown decision, a malformed
decision, answer too late): the kernel must deny each with its code, and the provider's own
answer must first have been a well-formed permit, or the case proves nothing.

Whatever the case expects, the engine also checks: an answer from the provider passes the
kernel's answer check; a ``deny`` or ``escalate`` carries a reason; a valid policy is decided,
not refused with an exception; asking again gives the same decision; the provider does not
change the request it was handed; neither the job's payload nor a secret of the setup (a
``secrets`` value, a settings value under a secret-looking key, ``SECRET_KEYS``) appears in the
decision's reason, message or record; and ``check_policy`` (when the provider has one: what
``jobs validate`` and ``doctor`` call) reports a problem for an ``invalid`` or ``missing``
policy and none for a valid one.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.options import build_options
from scheduler.base.timeutil import now_ms
from scheduler.conformance.engine import Case, CaseCheck, KindAdapter, _patched_environ, register_adapter
from scheduler.conformance.kinds import ProviderContext, adapter_label, configure_provider, expected_codes, provider_context
from scheduler.conformance.kinds import resolve_adapter as _resolve_adapter
from scheduler.core.members import PolicyChecking, options_class_of
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.queue import StartedRun
from scheduler.core.rows import JobRow
from scheduler.core.spec import validate_spec
from scheduler.pipeline.authorization import DECISIONS, check_answer, decide_with, policy_problems
from scheduler.pipeline.identity import ResolvedIdentity
from scheduler.plugins.protocols import AuthorizationDecision

#: The method every setup adapter has.
POLICY_METHOD = "conformance_policy"
#: What the policy says about the subject's runs (the schema's ``authorization_input.policy`` lists the same).
POLICIES: dict[str, str] = {
    "permit": "permit the subject's runs",
    "deny": "deny the subject's runs (and permit everyone else's, so the deny must win)",
    "escalate": "permit the subject's runs only after an approval",
    "invalid": "a policy the provider cannot evaluate (a syntax error)",
    "missing": "the policy ref names no policy",
    "slow": "a policy whose evaluation takes longer than the kernel waits",
}
#: What a policy tests about the request (``authorization_input.condition``).
CONDITIONS = ("principal", "job")
#: What a faulty build does with the provider's own permit (``authorization_input.fault``).
FAULTS: dict[str, str] = {
    "raise": "raises after deciding",
    "wrong_type": "returns a dict instead of an AuthorizationDecision",
    "unknown_decision": "answers a decision that is not permit, deny or escalate ('allow')",
    "malformed": "answers a decision whose reason is not a string",
    "late": "answers after the kernel stopped waiting",
    "escalate": "answers escalate instead (cases for providers that do not declare the escalate capability)",
}
#: What the provider is configured with (``authorization_input.settings``).
SETTINGS: dict[str, str] = {
    "configured": "the setup's settings",
    "empty": "an empty [providers.NAME] table (a host that never configured the provider)",
}
#: The subject every policy is written about.
JOB_NAME = "conformance-job"
OTHER_JOB_NAME = "conformance-other-job"
PRINCIPAL_KIND = "service"
PRINCIPAL_NAME = "conformance"
STRANGER_NAME = "conformance-stranger"
#: The kernel's bound on one decision in the engine (``[authorization] timeout_s`` in production).
CALL_LIMIT_S = 2.0
#: Every case's job payload: a marker that must never appear in a decision's reason or record.
PAYLOAD = "true # conformance-payload-7f3c9a61d2"
#: Settings keys whose values are secret-looking (never in a reason); a value shorter than ``MIN_SECRET_CHARS`` is not searched.
SECRET_KEYS = ("secret", "token", "password", "api_key", "credential")
MIN_SECRET_CHARS = 8


@attrs.frozen(kw_only=True)
class PolicyRequest:
    """What a setup adapter is asked for: a policy saying ``policy`` about the subject, testing ``condition``."""

    case_id: str
    provider: str
    policy: str
    condition: str
    workdir: Path
    job_name: str = JOB_NAME
    principal_kind: str = PRINCIPAL_KIND
    principal_name: str = PRINCIPAL_NAME

    @property
    def principal(self) -> str:
        """``KIND:NAME`` of the subject (as ``AuthorizationRequest.identity["principal"]``)."""
        return f"{self.principal_kind}:{self.principal_name}"


class PolicySetup:
    """What a file-based setup adapter returns: a ``policy_dir`` and the ref of one policy in it.

    ``close`` releases a FIFO (the ``slow`` policy) that a provider may still be blocked reading.
    """

    def __init__(self, policy_dir: Path, policy_ref: str, fifo: Path | None = None) -> None:
        self.settings: dict[str, Any] = {"policy_dir": str(policy_dir)}
        self.policy_ref = policy_ref
        self.provider_config: dict[str, Any] = {}
        self.secrets: dict[str, str] = {}
        self.fifo = fifo

    def close(self) -> None:
        """Open the FIFO for writing and close it at once: a provider blocked reading it gets an empty file and returns."""
        if self.fifo is None:
            return
        with contextlib.suppress(OSError):
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        with contextlib.suppress(OSError):
            self.fifo.unlink()


def write_policy_setup(request: PolicyRequest, policy_dir: Path, texts: dict[str, str], *, suffix: str, missing_ref: str,
                       slow_fifo: Path) -> PolicySetup:
    """The setup of a provider whose policies are files in ``policy_dir`` (``[providers.NAME] policy_dir``).

    ``texts`` holds the provider's text for the written policies (``permit``, ``deny``,
    ``escalate``, ``invalid``): the case's one is written as ``conformance{suffix}`` (ref
    ``conformance``). ``missing`` refers to ``missing_ref``, which names nothing; ``slow`` makes
    ``slow_fifo`` a FIFO (ref ``slow``), so reading it blocks until ``close``. Any other
    policy raises ``NotImplementedError`` (the engine skips the case with the reason).
    """
    if request.policy in texts:
        (policy_dir / f"conformance{suffix}").write_text(texts[request.policy])
        return PolicySetup(policy_dir, "conformance")
    if request.policy == "missing":
        return PolicySetup(policy_dir, missing_ref)
    if request.policy == "slow":
        slow_fifo.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(slow_fifo)
        return PolicySetup(policy_dir, "slow", slow_fifo)
    raise NotImplementedError(f"no policy file for {request.policy!r}")


def _check_authorization_case(case: Case) -> None:
    """What the schema cannot say: an expectation that fits the case."""
    inp, expect = case.input, case.expect
    decision = expect["decision"]
    if (case.polarity == "positive") != (decision == "permit"):
        raise ValueError("a positive authorization case expects decision permit, a negative one deny or escalate")
    if decision == "permit" and expected_codes(expect):
        raise ValueError("a permit has no error_code")
    if decision != "permit" and not expected_codes(expect):
        raise ValueError("a negative authorization case names its error_code(s)")
    if "fault" in inp and (inp.get("policy") != "permit" or decision != "deny"):
        raise ValueError("a fault case starts from a permit policy and expects deny")
    if decision == "escalate" and "escalate" not in case.requires:
        raise ValueError("a case expecting escalate requires the escalate capability")


# --------------------------------------------------------------------------- per provider


def resolve_policy_adapter(name: str | None, provider: Any, explicit: Any = None) -> Any:
    """The setup adapter of authorization provider ``name`` (explicit, the provider's own method, the entry point)."""
    return _resolve_adapter(name, provider, explicit, method=POLICY_METHOD, role="setup", subject="authorization",
                            missing_code="CONFORMANCE_NO_SETUP_ADAPTER", missing_why="there is no policy to decide by")


def _prepare_authorization(name: str | None, provider: Any, adapter: Any) -> ProviderContext:
    return provider_context(name, resolve_policy_adapter(name, provider, adapter), "conformance-authz")


# --------------------------------------------------------------------------- faults


class _Faulty:
    """The provider under test, and then what a faulty build does with its answer (``FAULTS``)."""

    def __init__(self, inner: Any, fault: str, release: threading.Event) -> None:
        self.inner, self.fault, self.release = inner, fault, release
        self.plugin_api = inner.plugin_api
        self.capabilities = inner.capabilities
        self.options_class = options_class_of(inner)
        self.own: list[Any] = []

    def resolve_authorization(self, request: Any) -> Any:
        answer = self.inner.resolve_authorization(request)
        self.own.append(answer)
        decision, reason = getattr(answer, "decision", None), getattr(answer, "reason", "")
        if self.fault == "raise":
            raise RuntimeError("conformance fault: the evaluation raised after deciding")
        if self.fault == "wrong_type":
            return {"decision": decision, "reason": reason}
        if self.fault == "unknown_decision":
            return AuthorizationDecision(decision="allow", reason=str(reason))  # type: ignore[arg-type]
        if self.fault == "malformed":
            return AuthorizationDecision(decision=decision, reason=None)  # type: ignore[arg-type]
        if self.fault == "escalate":
            return AuthorizationDecision(decision="escalate", reason="conformance fault: escalate without the capability")
        self.release.wait(CALL_LIMIT_S * 10)  # late: the kernel has stopped waiting long before
        return answer


# --------------------------------------------------------------------------- running one case


def _spec(case: Case, name: str, setup: Any) -> Any:
    request = case.input.get("request") or {}
    authorization: dict[str, Any] = {}
    config = getattr(setup, "provider_config", None)
    if config:
        authorization["provider_config"] = dict(config)
    if "include" in request:
        authorization["request"] = {"include": list(request["include"])}
    job = JOB_NAME if request.get("job", "subject") == "subject" else OTHER_JOB_NAME
    fields: dict[str, Any] = {"name": job, "schedule_kind": "manual", "payload_message": PAYLOAD,
              "authorization_ref": f"{name}:{setup.policy_ref}"}
    if authorization:
        fields["authorization"] = authorization
    return validate_spec(fields, check_past=False, plugin_options=False)


def _started(spec: Any, case: Case) -> Any:
    request = case.input.get("request") or {}
    principal = PRINCIPAL_NAME if request.get("principal", "subject") == "subject" else STRANGER_NAME
    now = now_ms()
    job = {**spec.to_json(), "id": str(uuid.uuid4()), "artifact_digest": "sha256:" + "c0" * 32}
    outcomes = RunOutcomes()
    outcomes.identity = ResolvedIdentity(subject_kind=PRINCIPAL_KIND, subject_principal=principal, trust_level="operator",
                                         declared_level="operator", source="declared")
    run_id = str(uuid.uuid4())
    return StartedRun(run_id=run_id, dispatch_id=f"{job['id']}:manual:{now}", dispatch_kind="manual", job=JobRow.from_row(job), attempt=1,
                      scheduled_for=now, started_at=now, parent_run_id=None, outcomes=outcomes)


@attrs.define
class _Asked:
    """One decision: the final one (permit/deny/escalate), the kernel's code, the record, the request, the time."""

    decision: str | None = None
    code: str | None = None
    message: str = ""
    record: dict[str, Any] | None = None
    request: Any = None
    request_copy: Any = None
    error: BaseException | None = None
    duration_ms: int = 0

    def describe(self) -> str:
        if self.error is not None:
            return f"engine error {type(self.error).__name__}: {self.error}"
        record = self.record or {}
        return (f"decision={self.decision!r} code={self.code!r} provider_decision={record.get('provider_decision')!r} "
                f"reason={record.get('reason')!r}")[:600]


def _ask(provider: Any, spec: Any, case: Case) -> _Asked:
    """One decision through the kernel's ``decide_with``."""
    started = _started(spec, case)
    asked = _Asked()

    def keep(request: Any) -> None:
        asked.request = request
        asked.request_copy = copy.deepcopy((dict(request.job), dict(request.trigger),
                                            None if request.identity is None else dict(request.identity)))

    begin = time.monotonic()
    try:
        decide_with(provider, started, spec, started.outcomes, limit_s=CALL_LIMIT_S, on_request=keep)
        asked.decision = "permit"
    except SchedulerError as exc:
        asked.code, asked.message = exc.code, exc.message
        asked.decision = "escalate" if exc.code == "AUTHORIZATION_ESCALATED" else "deny"
    except Exception as exc:  # noqa: BLE001 - the kernel's step must never raise anything else
        asked.error = exc
    asked.duration_ms = int((time.monotonic() - begin) * 1000)
    raw = started.outcomes.columns.get("authorization_json")
    asked.record = json.loads(raw) if raw else None
    return asked


def _run_authorization_case(provider: Any, case: Case, workdir: Path, context: Any) -> CaseCheck:
    """One case: a policy from the setup adapter, the provider configured at it, the kernel's decision, the checks."""
    declared = set(getattr(provider, "capabilities", ()) or ())
    unless = sorted(c for c in case.input.get("unless_declared", ()) if c in declared)
    if unless:
        return CaseCheck(skipped=f"the provider declares {', '.join(unless)}; this case is for providers that do not")
    adapter = context.adapter
    request = PolicyRequest(case_id=case.id, provider=context.name, policy=case.input["policy"],
                            condition=case.input.get("condition", "principal"), workdir=workdir)
    try:
        setup = getattr(adapter, POLICY_METHOD)(request)
    except NotImplementedError as exc:
        return CaseCheck(skipped=f"setup adapter {adapter_label(adapter)} cannot write this case's policy: {exc or 'no reason given'}")
    except Exception as exc:  # noqa: BLE001 - an adapter bug fails the case
        return CaseCheck(problems=(f"setup adapter {adapter_label(adapter)} raised {type(exc).__name__}: {exc}",))
    try:
        secrets = {str(k): str(v) for k, v in dict(getattr(setup, "secrets", None) or {}).items()}
        with _patched_environ(secrets):
            return _run_with_policy(provider, case, context, setup)
    finally:
        with contextlib.suppress(Exception):
            setup.close()


def _run_with_policy(provider: Any, case: Case, context: Any, setup: Any) -> CaseCheck:
    unconfigured = case.input.get("settings", "configured") == "empty"
    if unconfigured:
        if not dict(getattr(setup, "settings", None) or {}):
            return CaseCheck(skipped="the provider's setup configures nothing on the host (its policy is the job's own)")
        if configure_provider(provider, context.name, {}, role="setup", which="empty settings") is not None:
            return CaseCheck()  # the host refuses to configure (load) the provider without its table: fail closed
    else:
        problem = configure_provider(provider, context.name, getattr(setup, "settings", None), role="setup")
        if problem:
            return CaseCheck(problems=(problem,))
    try:
        spec = _spec(case, context.name, setup)
    except SchedulerError as exc:
        return CaseCheck(problems=(f"the setup's policy ref or provider_config makes no valid job: {exc.code}: {exc.message}",))
    inp, expect = case.input, case.expect
    fault = inp.get("fault")
    release = threading.Event()
    asked_provider = _Faulty(provider, fault, release) if fault else provider
    try:
        asked = _ask(asked_provider, spec, case)
    finally:
        release.set()
    if asked.error is not None:
        return CaseCheck(problems=(f"the kernel's decision raised {type(asked.error).__name__}: {asked.error}",))
    problems: list[str] = []
    if asked.decision != expect["decision"]:
        problems.append(f"decision: expected {expect['decision']}, got {asked.decision}"
                        + (f" ({asked.code}: {asked.message})" if asked.code else ""))
    codes = expected_codes(expect)
    if codes and asked.code not in codes:
        problems.append(f"error_code: expected {' or '.join(codes)}, got {asked.code!r}")
    if "max_duration_ms" in expect and asked.duration_ms > expect["max_duration_ms"]:
        problems.append(f"the decision took {asked.duration_ms} ms, more than {expect['max_duration_ms']} ms")
    record = asked.record
    if record is None or record.get("decision") != asked.decision:
        problems.append(f"the decision was not recorded as {asked.decision} (authorization_json: {record!r})")
    problems += _answer_problems(case, asked, asked_provider if fault else None)
    problems += _leak_problems(asked, setup)
    if asked.request is not None and asked.request_copy != (dict(asked.request.job), dict(asked.request.trigger),
                                                            None if asked.request.identity is None
                                                            else dict(asked.request.identity)):
        problems.append("the provider changed the request it was handed (job, trigger or identity)")
    if not fault and inp["policy"] in ("permit", "deny", "escalate") and not problems:
        again = _ask(provider, spec, case)
        if again.decision != asked.decision:
            problems.append(f"asked again, the provider decided {again.decision} ({again.describe()}), not {asked.decision}")
    if not fault and not unconfigured and inp["policy"] != "slow" and not problems:  # a FIFO's check blocks too
        problems += _policy_check_problems(provider, context.name, setup, spec, inp["policy"], expect, policy_problems)
    observed = {"decision": asked.describe(), "policy_ref": setup.policy_ref}
    return CaseCheck(problems=tuple(problems), observed=observed if problems else None)


def _answer_problems(case: Case, asked: _Asked, faulty: _Faulty | None) -> list[str]:
    """What the provider's own answer must be, whatever the case expects."""
    record = asked.record or {}
    problems: list[str] = []
    if faulty is not None:
        own = faulty.own[0] if faulty.own else None
        try:
            decision, _, _ = check_answer(own, "provider under test")
        except SchedulerError as exc:
            return [f"the provider's own answer to a permit policy (before the fault) was refused: {exc.message}"]
        if decision != "permit":
            problems.append(f"the provider's own answer to a permit policy (before the fault) was {decision!r}, not permit:"
                            " the fault proves nothing")
        return problems
    policy = case.input["policy"]
    code = asked.code
    if code == "AUTHORIZATION_DECISION_INVALID":
        problems.append(f"the provider's answer fails the kernel's check: {asked.message}")
    # A request without parts, or a provider without its settings, may be refused instead of decided.
    complete = "include" not in (case.input.get("request") or {}) and case.input.get("settings", "configured") == "configured"
    if policy in ("permit", "deny", "escalate") and complete and code in ("AUTHORIZATION_PROVIDER_FAILED", "AUTHORIZATION_TIMEOUT",
                                                             "AUTHORIZATION_OPTIONS_INVALID"):
        problems.append(f"a valid {policy} policy was not decided: {code}: {asked.message}")
    provider_decision = record.get("provider_decision")
    if provider_decision in DECISIONS and provider_decision != "permit" and not str(record.get("reason") or "").strip():
        problems.append(f"the provider answered {provider_decision} without a reason")
    if code == "AUTHORIZATION_ESCALATE_UNDECLARED":
        problems.append("the provider answered escalate but does not declare the escalate capability (the kernel denies it)")
    return problems


def _leak_problems(asked: _Asked, setup: Any) -> list[str]:
    """Neither the job's payload nor a secret of the setup (its ``secrets``, secret-looking settings) is in the reason or record."""
    settings = dict(getattr(setup, "settings", None) or {})
    secrets = [str(v) for v in dict(getattr(setup, "secrets", None) or {}).values()]
    secrets += [str(v) for k, v in settings.items() if isinstance(v, str) and any(w in str(k).lower() for w in SECRET_KEYS)]
    seen = asked.message + "\n" + json.dumps(asked.record or {}, default=str)
    problems = ["the job's payload appears in the decision's reason or record"] if PAYLOAD in seen else []
    if any(len(v) >= MIN_SECRET_CHARS and v in seen for v in secrets):
        problems.append("a secret of the setup (an environment value or a secret-looking setting) appears in the decision's"
                        " reason or record")
    return problems


def _policy_check_problems(provider: Any, name: str, setup: Any, spec: Any, policy: str, expect: dict[str, Any],
                           policy_problems: Any) -> list[str]:
    """``check_policy`` (``jobs validate``, ``doctor``) must flag an invalid or missing policy and pass a valid one."""
    if not isinstance(provider, PolicyChecking):
        return []
    cls = options_class_of(provider)
    raw = (spec.authorization or {}).get("provider_config") or {}
    options = build_options(cls, raw, "authorization.provider_config") if cls is not None else None
    found = policy_problems(provider, name, setup.policy_ref, options)
    want = expect.get("policy_check", "problems" if policy in ("invalid", "missing") else "clean")
    if want == "problems" and not found:
        return [f"check_policy found nothing wrong with a {policy} policy (jobs validate and doctor would pass it)"]
    if want == "clean" and found:
        return [f"check_policy reports problems with a valid {policy} policy: {'; '.join(p['error'] for p in found)}"]
    return []


register_adapter(
    KindAdapter(kind="authorization", check_case=_check_authorization_case, run=_run_authorization_case,
                prepare=_prepare_authorization)
)


__all__ = ["CALL_LIMIT_S", "CONDITIONS", "FAULTS", "PAYLOAD", "POLICIES", "POLICY_METHOD", "SETTINGS", "PolicyRequest", "PolicySetup",
           "resolve_policy_adapter", "write_policy_setup"]
