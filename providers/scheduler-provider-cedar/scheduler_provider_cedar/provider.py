"""The ``cedar`` authorization provider: Cedar policies from a directory, evaluated in-process with cedarpy.

``authorization_ref: "cedar:<ref>"``: ``<ref>`` names a policy file ``<ref>.cedar`` (or
``<ref>`` itself) in ``[providers.cedar] policy_dir``, or a sub-directory whose ``*.cedar``
files form one policy set. The request the kernel hands over becomes a Cedar request:

* principal: the run's identity, ``<Kind>::"<name>"`` (``User``, ``Service``, ``Agent``,
  ``Workload`` or ``Job``), or ``Job::"<job name>"`` when the request carries no identity;
  its entity has the attribute ``trust_level`` (when known);
* action: ``Action::"<dispatch kind>"`` (``schedule``, ``manual``, ``chain``, ``retry``, ...);
* resource: ``Job::"<job name>"`` with attributes ``executor``, ``schedule_kind``, ``risk``;
* context: ``trigger`` {``dispatch_kind``, ``attempt``, ``source_run``?}, ``time`` {``epoch_s``,
  ``hour``, ``minute``, ``weekday`` (``mon``..``sun``)} in ``provider_config.tz`` (UTC by
  default), ``trust_level`` and ``artifact_digest`` when carried.

``Allow`` is ``permit``, unless every policy that allowed carries ``@escalate("...")``: then
``escalate`` (the annotation's value, when a risk level, is asked for). ``Deny`` (nothing
permits, or a ``forbid`` matches) is ``deny``. A policy that does not parse, an evaluation
error or a missing file is an exception (the kernel denies), never a permit; ``check_policy``
reports the same problems at ``jobs validate`` and ``doctor``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from scheduler_toolkit.files import read_capped

from scheduler.api import AuthorizationDecision, AuthorizationRequest, SchedulerError

__version__ = "0.1.0"

MAX_POLICY_BYTES = 1024 * 1024
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
RISK_LEVELS = ("low", "medium", "high", "critical")
_KINDS = {"user": "User", "service": "Service", "agent": "Agent", "workload": "Workload", "job": "Job"}


def _check_tz(value: str) -> str | None:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {value!r}"
    return None


@attrs.frozen(kw_only=True)
class CedarSettings:
    """``[providers.cedar]``."""

    policy_dir: str | None = attrs.field(default=None, metadata={
        "doc": "Directory of the .cedar policy files and policy-set sub-directories a policy ref names"
               " (unset: every decision fails, a deny)."})


@attrs.frozen(kw_only=True)
class CedarOptions:
    """``authorization.provider_config`` of a job using ``cedar``."""

    tz: str = attrs.field(default="UTC", metadata={"doc": "Zone of context.time (hour, minute, weekday).", "check": _check_tz})


def _entity_ref(kind: str, name: str) -> str:
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'{kind}::"{escaped}"'


def _drop_none(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if v is not None}


def cedar_request(request: AuthorizationRequest, tz: str = "UTC") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Cedar request and entities for a kernel ``AuthorizationRequest`` (see the module docstring)."""
    job = request.job or {}
    trigger = request.trigger or {}
    name = str(job.get("name") or job.get("id") or "unknown")
    identity = request.identity
    if identity:
        subject = identity.get("subject") or {}
        kind = _KINDS.get(str(subject.get("kind") or "").lower(), "Job")
        principal_name = str(subject.get("principal") or str(identity.get("principal", "")).partition(":")[2] or name)
    else:
        kind, principal_name = "Job", name
    principal = {"type": kind, "id": principal_name}
    resource = {"type": "Job", "id": name}
    started = trigger.get("started_at")
    instant = (datetime.fromisoformat(started) if isinstance(started, str) and started
               else datetime.now(UTC)).astimezone(ZoneInfo(tz))
    context: dict[str, Any] = {
        "trigger": _drop_none({"dispatch_kind": trigger.get("dispatch_kind"), "attempt": trigger.get("attempt"),
                               "source_run": trigger.get("source_run_id")}),
        "time": {"epoch_s": int(instant.timestamp()), "hour": instant.hour, "minute": instant.minute,
                 "weekday": DAYS[instant.weekday()]},
    }
    if identity and identity.get("trust_level"):
        context["trust_level"] = identity["trust_level"]
    if request.artifact_digest:
        context["artifact_digest"] = request.artifact_digest
    executor = request.executor or job.get("executor")  # the kernel resolves session_target's default executor
    entities: list[dict[str, Any]] = [
        {"uid": principal, "attrs": _drop_none({"trust_level": (identity or {}).get("trust_level")}), "parents": []},
        {"uid": resource, "attrs": _drop_none({"executor": executor, "schedule_kind": job.get("schedule_kind"),
                                               "risk": job.get("approval_risk_level")}), "parents": []},
    ]
    if principal == resource:
        entities = [{"uid": resource, "attrs": {**entities[1]["attrs"], **entities[0]["attrs"]}, "parents": []}]
    action = trigger.get("dispatch_kind") or "manual"
    cedar = {"principal": _entity_ref(kind, principal_name), "action": _entity_ref("Action", str(action)),
             "resource": _entity_ref("Job", name), "context": context}
    return cedar, entities


class CedarProvider:
    """The ``cedar`` authorization provider (entry point ``scheduler.authorization_providers:cedar``)."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset({"escalate"})
    settings_class = CedarSettings
    options_class = CedarOptions

    def __init__(self) -> None:
        self.policy_dir: str | None = None

    def configure(self, settings: CedarSettings) -> None:
        """Take ``policy_dir`` (``~`` expanded)."""
        self.policy_dir = os.path.expanduser(settings.policy_dir) if settings.policy_dir else None

    # -- policies --

    def _paths(self, policy_ref: str) -> list[str]:
        if not self.policy_dir:
            raise SchedulerError("CEDAR_NOT_CONFIGURED", "[providers.cedar] policy_dir is not set")
        if os.path.isabs(policy_ref) or ".." in policy_ref.split("/") or "\\" in policy_ref:
            raise SchedulerError("CEDAR_POLICY_REF_INVALID", f"policy ref {policy_ref!r} must be a relative name inside policy_dir")
        base = os.path.join(self.policy_dir, policy_ref)
        if os.path.isdir(base):
            files = sorted(os.path.join(base, f) for f in os.listdir(base) if f.endswith(".cedar"))
            if not files:
                raise SchedulerError("CEDAR_POLICY_NOT_FOUND", f"policy set {base} holds no .cedar file")
            return files
        for candidate in (base + ".cedar", base):
            if os.path.isfile(candidate):
                return [candidate]
        raise SchedulerError("CEDAR_POLICY_NOT_FOUND", f"no policy file {base}.cedar (or {base}) and no policy set directory {base}")

    def load_policies(self, policy_ref: str) -> str:
        """The policy text a ref names, checked to parse (``CEDAR_POLICY_INVALID`` naming the file otherwise)."""
        import cedarpy

        texts = []
        for path in self._paths(policy_ref):
            data = read_capped(path, MAX_POLICY_BYTES, what="Cedar policy", unreadable="CEDAR_POLICY_NOT_FOUND",
                               too_large="CEDAR_POLICY_INVALID")
            text = data.decode("utf-8", errors="replace")
            try:
                cedarpy.policies_to_json_str(text)
            except ValueError as exc:
                raise SchedulerError("CEDAR_POLICY_INVALID", f"{path}: {exc}".strip()) from None
            texts.append(text)
        return "\n".join(texts)

    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        """Problems of the policy a ref names (``jobs validate``, ``doctor``): missing, unreadable, syntax errors."""
        try:
            self.load_policies(policy_ref)
        except SchedulerError as exc:
            return [f"{exc.code}: {exc.message}"]
        return []

    # -- decisions --

    def resolve_authorization(self, request: AuthorizationRequest) -> AuthorizationDecision:
        """Evaluate the policy set for the request (the files are read afresh: an edit applies to the next run)."""
        import json

        import cedarpy

        text = self.load_policies(request.policy_ref)
        tz = getattr(request.options, "tz", "UTC") or "UTC"
        cedar, entities = cedar_request(request, tz)
        result = cedarpy.is_authorized(cedar, text, entities)
        errors = list(result.diagnostics.errors or [])
        if errors:
            raise SchedulerError("CEDAR_EVALUATION_FAILED", "; ".join(str(e) for e in errors)[:2000])
        reasons = list(result.diagnostics.reasons or [])
        decision = str(result.decision).rsplit(".", 1)[-1]
        if decision == "Deny":
            why = f"forbidden by {', '.join(reasons)}" if reasons else "no policy permits it"
            return AuthorizationDecision(decision="deny", reason=why, details={"policies": reasons})
        if decision != "Allow":
            raise SchedulerError("CEDAR_EVALUATION_FAILED", f"cedar gave no decision ({decision})")
        annotations = {pid: p.get("annotations", {}) for pid, p in
                       json.loads(cedarpy.policies_to_json_str(text)).get("staticPolicies", {}).items()}
        named = [annotations.get(r, {}).get("id", r) for r in reasons]
        marks = [annotations.get(r, {}).get("escalate") for r in reasons]
        if reasons and all(m is not None for m in marks):
            risk = max((m for m in marks if m in RISK_LEVELS), key=RISK_LEVELS.index, default=None)
            return AuthorizationDecision(decision="escalate", reason=f"permitted only with an approval by {', '.join(named)}",
                                         details=_drop_none({"policies": named, "risk_level": risk}))
        return AuthorizationDecision(decision="permit", reason=f"permitted by {', '.join(named)}", details={"policies": named})
