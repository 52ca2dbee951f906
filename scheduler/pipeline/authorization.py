"""authorization_ref: the pipeline step asking the job's authorization provider, and the job fields it reads.

A job may name a policy decision point: ``authorization_ref`` (``<provider>:<policy-ref>``, at most
256 characters) and, optionally, ``authorization`` (how the provider is asked). After identity
and proof, before credentials and the payload (the run plan, ``scheduler.pipeline.DEFAULT_STEPS``), the provider's
``resolve_authorization(request)`` decides ``permit``, ``deny`` or ``escalate``:

* ``permit``: the run goes on;
* ``deny``: the run ends ``error`` / ``AUTHORIZATION_DENIED`` with the provider's reason;
* ``escalate``: the run waits in ``awaiting_approval`` (an approval of ``gate_kind``
  ``authorization``); an approval resumes it without asking the provider again (the approved
  escalation *is* the permit, and is recorded as such), a rejection cancels it.

Every failure denies, each with its own code: provider not installed or not loadable
(``AUTHORIZATION_NOT_AVAILABLE``), ``provider_config`` that no longer fits
(``AUTHORIZATION_OPTIONS_INVALID``), an exception (``AUTHORIZATION_PROVIDER_FAILED``), no
answer within ``[authorization] timeout_s`` (``AUTHORIZATION_TIMEOUT``), an answer that is
not an ``AuthorizationDecision`` or names an unknown decision (``AUTHORIZATION_DECISION_INVALID``).
``on_error`` exists so that a job says so explicitly; it can only be ``deny``.

The decision (provider, policy ref, decision, reason, code) is recorded on the run
(``runs.authorization_json``) and as an ``authorization.decided`` event. A job without
``authorization_ref`` returns at once: no import, no query (the dispatcher's hot path).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from scheduler.base.errors import SchedulerError
from scheduler.base.options import build_options, option_problems, options_to_json
from scheduler.base.timeutil import to_iso
from scheduler.core.artifact import redact_secrets, section_problems
from scheduler.core.bounded import call_bounded as bounded
from scheduler.core.claimed import ClaimedRun
from scheduler.core.members import PolicyChecking, options_class_of
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.rows import ApprovalRow, JSONObject, JSONValue, json_object
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Normaliser, Problem, Problems, Run, StepBase
from scheduler.core.store.base import Store
from scheduler.plugins.loaded import LoadedProviders
from scheduler.plugins.options import provider_for
from scheduler.plugins.protocols import AuthorizationDecision, AuthorizationProvider, AuthorizationRequest
from scheduler.settings import current_settings

if TYPE_CHECKING:
    from scheduler.core.queue import StartedRun

_T = TypeVar("_T")

#: Longest ``authorization_ref``.
MAX_REF_CHARS = 256
#: ``<provider>:<policy-ref>``: a driver name, a colon, a policy reference without control characters.
_REF_RE = re.compile(r"^([a-z0-9][a-z0-9_.-]{0,63}):([^\x00-\x1f\x7f]{1,255})$")
#: The parts of the request a job may hand its provider (``authorization.request.include``); the policy ref always goes.
INCLUDE_PARTS = ("job", "trigger", "artifact_digest", "identity", "proof")
#: The decisions the kernel acts on.
DECISIONS = ("permit", "deny", "escalate")
#: How strict each decision is: a decision mapping may only map an answer to one at least as strict.
_STRICTNESS = {"permit": 0, "escalate": 1, "deny": 2}
_RISK_LEVELS = ("low", "medium", "high", "critical")
_KEYS = ("provider_config", "request", "decision", "on_error", "escalation")
#: Largest ``authorization`` object (canonical JSON bytes).
MAX_DECLARATION_BYTES = 32 * 1024
#: Longest reason kept on the run and in events.
MAX_REASON_CHARS = 2000
#: A provider that failed to load is not retried for this long (seconds).
PROVIDER_RETRY_S = 5.0
#: The approval gate kind an escalation opens.
GATE_KIND = "authorization"

_providers = LoadedProviders("authorization", unavailable_code="AUTHORIZATION_NOT_AVAILABLE", noun="authorization provider",
                             retry_s=PROVIDER_RETRY_S)


# -- the job fields -----------------------------------------------------------------------------


def _strings(value: JSONValue) -> list[str]:
    """The strings of a JSON list; nothing for anything else."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def split_ref(ref: str) -> tuple[str, str]:
    """``(provider, policy_ref)`` of a valid ``authorization_ref``."""
    provider, _, policy = ref.partition(":")
    return provider, policy


def check_ref(value: object, field: str = "authorization_ref") -> list[dict[str, str]]:
    """Problems of an ``authorization_ref`` value (empty when valid)."""
    if not isinstance(value, str):
        return [{"field": field, "code": "INVALID_TYPE", "error": "must be a string `<provider>:<policy-ref>`"}]
    if len(value) > MAX_REF_CHARS:
        return [{"field": field, "code": "TOO_LARGE", "error": f"must be at most {MAX_REF_CHARS} characters"}]
    if not _REF_RE.match(value) or not value.partition(":")[2].strip():
        return [{"field": field, "code": "INVALID_VALUE",
                 "error": "must be `<provider>:<policy-ref>` (a provider name [a-z0-9_.-], a colon, a policy reference"
                          " without control characters)"}]
    return []


def normalise_declaration(value: object, field: str = "authorization") -> tuple[JSONObject | None, list[dict[str, str]]]:
    """Validate the ``authorization`` object; return it normalised (defaults filled in) and the problems.

    Keys: ``provider_config`` (an object the provider's ``options_class`` validates when the job is
    added), ``request`` {``include``: a subset of ``INCLUDE_PARTS``}, ``decision`` (a mapping of the
    provider's answer values to ``permit``/``deny``/``escalate`` that can only make a decision
    stricter), ``on_error`` (only ``deny``) and ``escalation`` {``risk_level``}. Anything else is refused.
    """
    problems: list[dict[str, str]] = []

    def bad(where: str, code: str, error: str) -> None:
        problems.append({"field": f"{field}{where}", "code": code, "error": error})

    if not isinstance(value, dict):
        bad("", "INVALID_TYPE", "must be an object {provider_config, request, decision, on_error, escalation}")
        return None, problems
    try:
        size = len(json.dumps(value, sort_keys=True).encode("utf-8"))
    except (TypeError, ValueError):
        size = MAX_DECLARATION_BYTES + 1
    if size > MAX_DECLARATION_BYTES:
        bad("", "TOO_LARGE", f"must be at most {MAX_DECLARATION_BYTES} bytes of JSON")
        return None, problems
    for key in value:
        if key not in _KEYS:
            bad(f".{key}", "UNKNOWN_FIELD", f"unknown key {key!r} (known: {', '.join(_KEYS)})")
    out: JSONObject = {"on_error": "deny", "request": {"include": list(INCLUDE_PARTS)}, "decision": {}}
    config = value.get("provider_config", {})
    if not isinstance(config, dict):
        bad(".provider_config", "INVALID_TYPE", "must be an object of the provider's options")
    else:
        out["provider_config"] = dict(config)
    on_error = value.get("on_error", "deny")
    if on_error != "deny":
        bad(".on_error", "INVALID_CHOICE", "can only be deny: a failing provider never permits")
    request = value.get("request", {})
    if not isinstance(request, dict):
        bad(".request", "INVALID_TYPE", "must be an object {include: [...]}")
    else:
        for key in request:
            if key != "include":
                bad(f".request.{key}", "UNKNOWN_FIELD", f"unknown key {key!r} (known: include)")
        include = request.get("include", list(INCLUDE_PARTS))
        if not isinstance(include, list) or not all(isinstance(p, str) for p in include):
            bad(".request.include", "INVALID_TYPE", "must be a list of strings")
        else:
            unknown = [p for p in include if p not in INCLUDE_PARTS]
            if unknown:
                bad(".request.include", "INVALID_CHOICE", f"unknown part(s) {', '.join(unknown)}; known: {', '.join(INCLUDE_PARTS)}")
            else:
                out["request"] = {"include": [p for p in INCLUDE_PARTS if p in include]}
    mapping = value.get("decision", {})
    if not isinstance(mapping, dict):
        bad(".decision", "INVALID_TYPE", "must be an object mapping a provider's answer to permit, deny or escalate")
    else:
        for answer, decided in mapping.items():
            if not isinstance(answer, str) or not 1 <= len(answer) <= 64:
                bad(".decision", "INVALID_VALUE", "each answer must be 1-64 characters")
            elif decided not in DECISIONS:
                bad(f".decision.{answer}", "INVALID_CHOICE", f"must be one of {', '.join(DECISIONS)}")
            elif answer in _STRICTNESS and _STRICTNESS[decided] < _STRICTNESS[answer]:
                bad(f".decision.{answer}", "INVALID_VALUE", f"cannot loosen {answer} to {decided}: a mapping only makes a decision stricter")
        if not any(p["field"].startswith(f"{field}.decision") for p in problems):
            out["decision"] = {k: mapping[k] for k in sorted(mapping)}
    escalation = value.get("escalation")
    if escalation is not None:
        if not isinstance(escalation, dict):
            bad(".escalation", "INVALID_TYPE", "must be an object {risk_level}")
        else:
            for key in escalation:
                if key != "risk_level":
                    bad(f".escalation.{key}", "UNKNOWN_FIELD", f"unknown key {key!r} (known: risk_level)")
            level = escalation.get("risk_level")
            if level is not None and level not in _RISK_LEVELS:
                bad(".escalation.risk_level", "INVALID_CHOICE", f"must be one of {', '.join(_RISK_LEVELS)}")
            elif level is not None:
                out["escalation"] = {"risk_level": level}
    return (None if problems else out), problems


def declaration_of(spec: JobSpec) -> JSONObject:
    """The job's normalised ``authorization`` (the defaults when it sets none)."""
    declared = getattr(spec, "authorization", None)
    if declared:
        return declared
    return {"on_error": "deny", "request": {"include": list(INCLUDE_PARTS)}, "decision": {}}


def provider_problems(spec: JobSpec, load: Callable[[str, str], object]) -> tuple[JSONObject | None, list[dict[str, str]]]:
    """``authorization.provider_config`` against the installed provider's ``options_class`` (``load(kind, name)``
    gives the provider or None), and the provider's own policy check (``check_policy``) when it has one.

    Returns the declaration with its normalised ``provider_config`` (None when unchanged) and the problems.
    """
    ref = getattr(spec, "authorization_ref", None)
    if not ref:
        return None, []
    name, policy = split_ref(ref)
    provider = load("authorization", name)
    if provider is None:
        return None, []  # the missing-plugin rule reports it
    declaration = dict(declaration_of(spec))
    raw = declaration.get("provider_config") or {}
    cls = options_class_of(provider)
    problems: list[dict[str, str]] = []
    options = None
    if cls is None:
        if raw:
            problems.append({"field": "authorization.provider_config", "code": "UNKNOWN_FIELD",
                             "error": f"authorization provider {name!r} takes no provider_config"})
    else:
        kwargs, problems = option_problems(cls, raw, "authorization.provider_config")
        if not problems:
            try:
                options = cls(**kwargs)
                if getattr(spec, "authorization", None):
                    declaration["provider_config"] = options_to_json(options)
            except (TypeError, ValueError) as exc:
                problems.append({"field": "authorization.provider_config", "code": "INVALID_VALUE", "error": str(exc)})
    if not problems:
        problems += policy_problems(provider, name, policy, options)
    changed = getattr(spec, "authorization", None) and declaration != spec.authorization
    return (declaration if changed and not problems else None), problems


def policy_problems(provider: object, name: str, policy: str, options: object) -> list[dict[str, str]]:
    """What the provider's optional ``check_policy(policy_ref, options)`` finds wrong with the policy (syntax errors,
    a missing file), as ``AUTHORIZATION_POLICY_INVALID`` field problems; a crashing check is a problem too, and so
    is one that does not finish within ``[authorization] timeout_s``."""
    if not isinstance(provider, PolicyChecking):
        return []
    check = provider.check_policy
    try:  # bounded like a decision: a check that hangs (a policy server that never answers) must not hang doctor
        found = list(call_bounded(lambda: check(policy, options), timeout_s(), what=f"the policy check of {name!r}",
                                  details={"provider": name, "policy_ref": policy}) or ())
    except SchedulerError as exc:
        found = [f"the policy check failed: {exc.message}" if exc.code == "AUTHORIZATION_TIMEOUT"
                 else f"the policy check failed: {exc.code}: {exc.message}"]
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is reported, never a pass
        found = [f"the policy check failed: {type(exc).__name__}: {exc}"]
    return [{"field": "authorization_ref", "code": "AUTHORIZATION_POLICY_INVALID",
             "error": f"{name}:{policy}: {str(p)[:MAX_REASON_CHARS]}"} for p in found]


# -- the pipeline step ----------------------------------------------------------------------------


def decide(store: Store, started: ClaimedRun, spec: JobSpec, outcomes: RunOutcomes) -> None:
    """Ask the job's ``authorization_ref`` provider; any failure denies (raises), ``escalate`` opens the approval gate.

    Records the decision in ``outcomes`` (``authorization_json`` and an ``authorization.decided``
    event). ``escalate`` sets ``outcomes.escalate`` and raises ``AUTHORIZATION_ESCALATED``: the
    completion transaction turns the run into ``awaiting_approval`` instead of ending it.
    """
    ref = getattr(spec, "authorization_ref", None)
    if not ref:
        return
    _Decision(store, started, spec, ref, outcomes).run()


def authorization_provider(name: str) -> Any:
    """The loaded provider ``name``, kept for the life of the process; ``AUTHORIZATION_NOT_AVAILABLE`` when it
    cannot be loaded (remembered for ``PROVIDER_RETRY_S``, then tried again: a fix may be installed)."""
    return _providers.get(name)


def forget_providers() -> None:
    """Drop the loaded providers (tests; a settings reload)."""
    _providers.forget()


def timeout_s() -> float:
    """``[authorization] timeout_s``: the longest a provider may take to decide."""
    return float(current_settings().kernel["authorization"].value.timeout_s)


def call_bounded(fn: Callable[[], _T], limit_s: float, *, what: str, details: Mapping[str, object]) -> _T:
    """``fn()`` in a daemon thread, waited for at most ``limit_s`` (``AUTHORIZATION_TIMEOUT`` after that).

    A late answer is never read: a hung provider cannot hold the run, and a permit that comes
    too late permits nothing.
    """
    return bounded(fn, limit_s, code="AUTHORIZATION_TIMEOUT", what=what, details=details, name="authorization-decide")


def check_answer(answer: object, provider_name: str, where: JSONObject | None = None) -> tuple[str, str, JSONObject]:
    """The kernel's check of a provider's answer: ``(decision, reason, details)`` of a well-formed
    ``AuthorizationDecision``, else ``AUTHORIZATION_DECISION_INVALID``.

    The decision is not yet checked against ``DECISIONS`` (a job's ``authorization.decision``
    mapping may name other answers); ``details`` is made JSON-safe and capped, ``reason`` capped.
    The conformance engine (``scheduler.conformance.authorization``) holds providers to this same check.
    """
    where = dict(where or {"provider": provider_name})
    if not isinstance(answer, AuthorizationDecision):
        raise SchedulerError("AUTHORIZATION_DECISION_INVALID",
                             f"authorization provider {provider_name!r} returned {type(answer).__name__},"
                             " not an AuthorizationDecision", details=where)
    decision, reason = answer.decision, answer.reason
    if not isinstance(decision, str) or not isinstance(reason, str) or not 1 <= len(decision) <= 64:
        raise SchedulerError("AUTHORIZATION_DECISION_INVALID",
                             f"authorization provider {provider_name!r} returned a malformed decision"
                             f" ({type(decision).__name__} decision, {type(reason).__name__} reason)", details=where)
    details: JSONObject
    try:
        details = json.loads(json.dumps(dict(answer.details or {}), sort_keys=True, default=str))
    except (TypeError, ValueError):
        details = {}
    if len(json.dumps(details)) > 4096:
        details = {"truncated": True}
    return decision, reason[:MAX_REASON_CHARS], details


def decide_with(provider: AuthorizationProvider, started: ClaimedRun | StartedRun, spec: JobSpec, outcomes: RunOutcomes, *,
                limit_s: float | None = None, on_request: Callable[[AuthorizationRequest], object] | None = None) -> None:
    """The pipeline step's decision for a run with an already loaded ``provider`` (no store: no approval resume).

    Exactly what ``decide`` does after loading the provider: options through its
    ``options_class``, the request per ``authorization.request.include``, the bounded call
    (``limit_s``, else ``[authorization] timeout_s``, never past the run's timeout), the answer
    check, the job's decision mapping, the record in ``outcomes``; raises ``SchedulerError``
    (``AUTHORIZATION_DENIED``, ``..._ESCALATED``, ...) on anything but a permit. The conformance
    engine runs providers through this, so it checks them with the kernel's code, not a copy.
    """
    ref = spec.authorization_ref
    if ref is None:
        raise ValueError(f"job {spec.name!r} names no authorization_ref: there is nothing to decide")
    _Decision(None, ClaimedRun.of(started), spec, ref, outcomes).decide(lambda: provider, limit_s, on_request)


class _Decision:
    """One run's authorization decision, from the provider's answer to what is recorded."""

    def __init__(self, store: Store | None, started: ClaimedRun, spec: JobSpec, ref: str, outcomes: RunOutcomes) -> None:
        self.store, self.started, self.spec, self.outcomes = store, started, spec, outcomes
        self.ref = ref
        self.provider_name, self.policy_ref = split_ref(ref)
        self.declaration = declaration_of(spec)
        self.t0 = time.monotonic()

    def run(self) -> None:
        """Resume an approved escalation, or ask the job's provider."""
        if self._resume_approved():
            return
        self.decide(lambda: authorization_provider(self.provider_name))

    def decide(self, get_provider: Callable[[], AuthorizationProvider], limit_s: float | None = None,
               on_request: Callable[[AuthorizationRequest], object] | None = None) -> None:
        """Ask the provider ``get_provider()`` returns, check and map its answer, record it (raises on anything but permit).

        ``limit_s`` replaces ``[authorization] timeout_s`` (the conformance engine's own bound);
        ``on_request(request)`` sees the request before the provider does (the engine keeps it).
        """
        try:
            provider = get_provider()
            options = self._options(provider)
            request = self._request(options)
            if on_request is not None:
                on_request(request)
            answer = self._ask(provider, request, limit_s)
            provider_decision, reason, details = self._check(answer)
            self._check_declared(provider, provider_decision)
        except SchedulerError as exc:
            self._record("deny", provider_decision=None, reason=exc.message, code=exc.code,
                         details=exc.details if isinstance(exc.details, dict) else None)
            raise
        except Exception as exc:  # noqa: BLE001 - anything unexpected while deciding is a deny
            message = f"authorization failed: {type(exc).__name__}: {exc}"
            self._record("deny", provider_decision=None, reason=message, code="AUTHORIZATION_PROVIDER_FAILED")
            raise SchedulerError("AUTHORIZATION_PROVIDER_FAILED", message) from None
        decision = json_object(self.declaration.get("decision", {})).get(provider_decision, provider_decision)
        if decision not in DECISIONS:
            message = f"authorization provider {self.provider_name!r} answered {provider_decision!r}, not permit, deny or escalate"
            self._record("deny", provider_decision=provider_decision, reason=message, code="AUTHORIZATION_DECISION_INVALID")
            raise SchedulerError("AUTHORIZATION_DECISION_INVALID", message, details=self._where())
        if decision == "permit":
            self._record("permit", provider_decision=provider_decision, reason=reason, details=details)
            return
        if decision == "deny":
            message = f"denied by {self.ref}" + (f": {reason}" if reason else "")
            self._record("deny", provider_decision=provider_decision, reason=reason, code="AUTHORIZATION_DENIED", details=details)
            raise SchedulerError("AUTHORIZATION_DENIED", message, details={**self._where(), "reason": reason})
        risk = self._risk_level(details)
        self._record("escalate", provider_decision=provider_decision, reason=reason, details=details, risk_level=risk)
        self.outcomes.escalate = {"gate_kind": GATE_KIND, "risk_level": risk, "reason": reason, "provider": self.provider_name,
                                  "policy_ref": self.policy_ref}
        raise SchedulerError("AUTHORIZATION_ESCALATED", f"escalated by {self.ref} to an approval" + (f": {reason}" if reason else ""),
                             details={**self._where(), "risk_level": risk})

    # -- steps --

    def _check_declared(self, provider: AuthorizationProvider, provider_decision: str) -> None:
        """``AUTHORIZATION_ESCALATE_UNDECLARED`` (a deny) when a provider answers ``escalate`` without declaring it.

        A provider that does not declare the ``escalate`` capability promised it never asks for an
        approval; an ``escalate`` from it is an answer outside that promise (a bug, or a policy the
        operator never agreed to gate on), so the run is denied instead of waiting for an approval.
        """
        if provider_decision == "escalate" and "escalate" not in provider.capabilities:
            raise SchedulerError("AUTHORIZATION_ESCALATE_UNDECLARED",
                                 f"authorization provider {self.provider_name!r} answered escalate but does not declare the"
                                 " escalate capability", details=self._where())

    def _where(self) -> JSONObject:
        return {"provider": self.provider_name, "policy_ref": self.policy_ref}

    def _resume_approved(self) -> bool:
        """A run resumed after an approved escalation: the approval is the permit (the provider is not asked again)."""
        store = self.store
        if store is None:  # ``decide_with``: a provider asked without a store has no approval to resume
            return False
        with store.read() as tx:
            row = tx.one(
                "SELECT id, decided_by, decided_uid, note, approved_at FROM approvals WHERE run_id = ? AND gate_kind = ?"
                " AND status = 'dispatched' ORDER BY requested_at DESC LIMIT 1", (self.started.run_id, GATE_KIND))
            if row is None:
                return False
            earlier = tx.scalar("SELECT authorization_json FROM runs WHERE id = ?", (self.started.run_id,))
        approval = ApprovalRow.from_row(row)
        escalated = json.loads(earlier) if earlier else None
        self._record("permit", provider_decision=None,
                     reason=f"escalation approved by {approval.decided_by}" + (f": {approval.note}" if approval.note else ""),
                     via="approval", approval_id=approval.id, escalated=escalated)
        return True

    def _options(self, provider: object) -> object:
        """The provider's options instance from ``provider_config`` (None: it declares no options class)."""
        cls = options_class_of(provider)
        raw = self.declaration.get("provider_config") or {}
        if cls is None:
            if raw:
                raise SchedulerError("AUTHORIZATION_OPTIONS_INVALID",
                                     f"authorization provider {self.provider_name!r} takes no provider_config", details=self._where())
            return None
        try:
            return build_options(cls, raw, "authorization.provider_config")
        except SchedulerError as exc:
            raise SchedulerError("AUTHORIZATION_OPTIONS_INVALID", exc.message, details=exc.details) from None

    def _request(self, options: object) -> AuthorizationRequest:
        """The request per ``authorization.request.include``: the parts of the run the job hands its provider."""
        include = set(_strings(json_object(self.declaration.get("request", {})).get("include", list(INCLUDE_PARTS))))
        s, outcomes = self.started, self.outcomes
        job: JSONObject = {**self.spec.to_json(), "id": s.job.id} if "job" in include else {}
        trigger = {
            "dispatch_kind": s.dispatch_kind, "attempt": s.attempt, "source_run_id": s.source_run_id,
            "parent_run_id": s.parent_run_id, "run_id": s.run_id, "scheduled_for": to_iso(s.scheduled_for),
            "started_at": to_iso(s.started_at),
        } if "trigger" in include else {}
        identity = None
        if "identity" in include and outcomes.identity is not None:
            identity = outcomes.identity.as_mapping() if hasattr(outcomes.identity, "as_mapping") else dict(outcomes.identity)
        proof = None
        if "proof" in include:
            proof = getattr(outcomes, "proof", None)
            text = outcomes.columns.get("proof_json")
            if proof is None and isinstance(text, str) and text:
                proof = json.loads(text)
        digest = s.job.artifact_digest if "artifact_digest" in include else None
        return AuthorizationRequest(policy_ref=self.policy_ref, job=job, trigger=trigger, artifact_digest=digest,
                                    identity=identity, proof=proof, options=options,
                                    executor=self.spec.executor_name() if "job" in include else None)

    def _ask(self, provider: AuthorizationProvider, request: AuthorizationRequest, limit_s: float | None = None) -> object:
        """The provider's answer, asked within ``[authorization] timeout_s`` and what is left of the run's timeout."""
        left_s = (self.started.started_at + int(self.spec.run_timeout_ms) - int(time.time() * 1000)) / 1000.0
        limit = min(timeout_s() if limit_s is None else limit_s, left_s)
        if limit <= 0:
            raise SchedulerError("AUTHORIZATION_TIMEOUT", "no time left in the run's run_timeout_ms to ask the authorization provider",
                                 details=self._where())
        try:
            return call_bounded(lambda: provider.resolve_authorization(request), limit,
                                what=f"authorization provider {self.provider_name!r}", details=self._where())
        except SchedulerError as exc:
            if exc.code == "AUTHORIZATION_TIMEOUT":
                raise
            raise SchedulerError("AUTHORIZATION_PROVIDER_FAILED",
                                 f"authorization provider {self.provider_name!r} failed: {exc.message}",
                                 details={**self._where(), "cause": exc.code}) from None
        except Exception as exc:  # noqa: BLE001 - the provider's bug is a deny
            raise SchedulerError("AUTHORIZATION_PROVIDER_FAILED",
                                 f"authorization provider {self.provider_name!r} raised {type(exc).__name__}: {exc}"[:MAX_REASON_CHARS],
                                 details=self._where()) from None

    def _check(self, answer: object) -> tuple[str, str, JSONObject]:
        """``check_answer`` for this run's provider."""
        return check_answer(answer, self.provider_name, self._where())

    def _risk_level(self, details: JSONObject) -> str:
        """The escalation's risk level: the declaration's, else the job's; a provider may raise it, never lower it."""
        declared = json_object(self.declaration.get("escalation", {})).get("risk_level")
        level = str(declared or self.started.job.approval_risk_level or "medium")
        asked = details.get("risk_level")
        if isinstance(asked, str) and asked in _RISK_LEVELS and _RISK_LEVELS.index(asked) > _RISK_LEVELS.index(level):
            level = asked
        return level

    def _record(self, decision: str, *, provider_decision: str | None, reason: str, code: str | None = None,
                details: JSONObject | None = None, **extra: JSONValue) -> None:
        """The decision on the run (``authorization_json``) and as an ``authorization.decided`` event."""
        record: JSONObject = {"provider": self.provider_name, "policy_ref": self.policy_ref, "decision": decision,
                  "provider_decision": provider_decision, "reason": (reason or "")[:MAX_REASON_CHARS], "code": code,
                  "duration_ms": int((time.monotonic() - self.t0) * 1000), **extra}
        if details:
            record["details"] = details
        self.outcomes.columns["authorization_json"] = json.dumps(record, sort_keys=True, default=str)
        self.outcomes.record("authorization.decided", record)


__all__ = [
    "DECISIONS",
    "GATE_KIND",
    "INCLUDE_PARTS",
    "MAX_REF_CHARS",
    "authorization_provider",
    "call_bounded",
    "check_answer",
    "check_ref",
    "decide",
    "decide_with",
    "declaration_of",
    "forget_providers",
    "normalise_declaration",
    "policy_problems",
    "provider_problems",
    "split_ref",
]


def _normalise_ref(value: object, field: str) -> tuple[str | None, list[Problem]]:
    found = check_ref(value, field)
    return (None if found or not isinstance(value, str) else value), found


class AuthorizationStep(StepBase):
    """The pipeline step: the job's ``authorization_ref`` provider permits, denies or escalates every run."""

    name = "authorization"
    fields: Mapping[str, Normaliser | None] = {"authorization_ref": _normalise_ref, "authorization": normalise_declaration}
    sections = ("authorization_ref", "authorization")

    def project(self, spec: JobSpec) -> JSONObject:
        """The policy decision point and how it is asked (normalised, secrets redacted); null when none."""
        return {"authorization_ref": spec.authorization_ref,
                "authorization": redact_secrets(spec.authorization) if spec.authorization else None}

    def check(self, values: Mapping[str, Any], problems: Problems) -> None:
        """``authorization`` configures the ``authorization_ref`` provider: not without it."""
        if values.get("authorization") is not None and values.get("authorization_ref") is None \
                and not problems.has("authorization_ref"):
            problems.add("authorization", "is only valid with authorization_ref", "CONFLICT")

    def check_installed(self, spec: JobSpec) -> tuple[JSONObject, list[Problem]]:
        """``provider_config`` against the installed provider, and the provider's own policy check."""
        if not spec.authorization_ref:
            return {}, []
        authorization, found = provider_problems(spec, provider_for)
        return ({} if authorization is None else {"authorization": authorization}), found

    def check_section(self, name: str, value: object, sections: Mapping[str, Any]) -> list[Problem]:
        """A compiled ``authorization_ref`` / ``authorization`` must be what ``jobs add`` accepts."""
        if value is None:
            return []
        if name == "authorization_ref":
            return section_problems(check_ref(value, "authorization_ref"))
        found = section_problems(normalise_declaration(value, "authorization")[1])
        if sections.get("authorization_ref") is None:
            found.append({"field": "authorization", "code": "CONFLICT",
                          "error": "is only valid with authorization_ref (the provider it configures)"})
        return found

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Jobs that name an ``authorization_ref``."""
        return sections.get("authorization_ref") is not None

    def before(self, run: Run) -> None:
        """Ask the provider; deny on any failure; ``escalate`` waits for an approval (``AUTHORIZATION_ESCALATED``)."""
        decide(run.store, run.started, run.spec, run.outcomes)
