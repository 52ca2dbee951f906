"""Authorization providers whose policy ref says how they answer (tests only).

``testauthz`` policy refs: ``permit``, ``deny``, ``escalate``, ``escalate-critical`` (asks for
risk critical), ``raise`` (an exception), ``error`` (a ``SchedulerError`` with its own code),
``sleep:S`` (answers permit after S seconds), ``wrongtype`` (returns a dict), ``answer:VALUE``
(decision VALUE, e.g. ``allow``), ``nonstr`` (a decision that is not a string). Every
request is appended as one JSON line to ``$AUTHZ_TESTKIT_LOG`` when set. ``brokenauthz``
permits everything: the broken reference provider conformance must report failing.
``noescalate`` answers like ``testauthz`` but does not declare the ``escalate`` capability (the
kernel denies its ``escalate`` with ``AUTHORIZATION_ESCALATE_UNDECLARED``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import attrs

from scheduler.api import AuthorizationDecision, AuthorizationRequest, SchedulerError


@attrs.frozen(kw_only=True)
class TestAuthzOptions:
    """``authorization.provider_config`` of ``testauthz``."""

    tag: str = ""


def _log(request: AuthorizationRequest) -> None:
    path = os.environ.get("AUTHZ_TESTKIT_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"policy_ref": request.policy_ref, "job": dict(request.job), "trigger": dict(request.trigger),
                                 "artifact_digest": request.artifact_digest,
                                 "identity": dict(request.identity) if request.identity is not None else None,
                                 "proof": dict(request.proof) if request.proof is not None else None,
                                 "executor": request.executor,
                                 "tag": getattr(request.options, "tag", None)}, default=str) + "\n")


class TestAuthorizationProvider:
    """Answers as its policy ref says."""

    plugin_api = 3
    capabilities = frozenset({"escalate"})
    options_class = TestAuthzOptions

    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        """``bad-policy`` is reported as a syntax error; everything else passes."""
        return ["line 1: unexpected token"] if policy_ref == "bad-policy" else []

    def resolve_authorization(self, request: AuthorizationRequest) -> Any:
        _log(request)
        ref = request.policy_ref
        if ref.startswith("sleep:"):
            time.sleep(float(ref.split(":", 1)[1]))
            return AuthorizationDecision(decision="permit", reason="slow permit")
        if ref == "raise":
            raise RuntimeError("policy engine exploded")
        if ref == "error":
            raise SchedulerError("TESTAUTHZ_BACKEND_DOWN", "the policy backend is down")
        if ref == "wrongtype":
            return {"decision": "permit"}
        if ref == "nonstr":
            return AuthorizationDecision(decision=1, reason="")  # type: ignore[arg-type]
        if ref.startswith("answer:"):
            return AuthorizationDecision(decision=ref.split(":", 1)[1], reason="custom answer")  # type: ignore[arg-type]
        if ref == "escalate-critical":
            return AuthorizationDecision(decision="escalate", reason="needs a human", details={"risk_level": "critical"})
        if ref in ("permit", "deny", "escalate"):
            return AuthorizationDecision(decision=ref, reason=f"policy says {ref}")
        return AuthorizationDecision(decision="deny", reason=f"unknown test policy {ref!r}")


class PermitEverything:
    """A broken provider: permits every request, whatever the policy says (fails conformance)."""

    plugin_api = 3
    capabilities = frozenset()

    def resolve_authorization(self, request: AuthorizationRequest) -> AuthorizationDecision:
        return AuthorizationDecision(decision="permit", reason="permit everything")


class UndeclaredEscalation(TestAuthorizationProvider):
    """Answers as its policy ref says, escalate included, without declaring the ``escalate`` capability."""

    capabilities = frozenset()
