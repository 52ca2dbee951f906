"""Governance: the pipeline step that refuses what the job's executor cannot enforce.

Before identity, credentials and execution, every demand a job
makes of its executor is checked against the executor's declared ``capabilities``:

=====================  =================================  =================================
demand                 needs the capability               because
=====================  =================================  =================================
``constraints.sandbox``        ``sandbox``                the work must run isolated
``constraints.network``        ``network-restriction``    no (or loopback-only) network
``constraints.allowed_paths``  ``path-restriction``       file access limited to the paths
``constraints.max_tokens``     ``token-cap``              the turn stops at the token cap
``constraints.max_cost``       ``cost-cap``               the turn stops at the cost cap
``verify_shell``               ``verify``                 a check nobody runs would pass
``credentials[i]`` (medium m)  ``credentials-m``          the value must reach the work
=====================  =================================  =================================

A demand without its capability is denied: ``SCHEDULER_GOVERNANCE_DENIED`` naming it; the
run ends ``error`` and the payload never starts. Nothing is run unenforced, and nothing
else decides: ``jobs add`` / ``jobs validate`` report the same list (``problems``) with
the same code, and ``request_for`` (the request builder for callers outside the dispatcher)
refuses with it too. Any exception while deciding is a deny.

The decision (allowed or denied, each check, the executor and its capabilities) is
recorded on the run (``runs.governance_json``) and as a ``governance.decided`` event, for
jobs that make at least one demand; a job with none is not in its run plan (``GovernanceStep``).
The step also owns the ``constraints`` field (validated against ``Constraints``) and its
artifact section.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.options import option_problems, options_to_json
from scheduler.core.execution import Constraints, ExecutionRequest
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.request import build_request, constraints_of
from scheduler.core.rows import JSONObject, JSONValue
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Normaliser, Problem, Run, StepBase
from scheduler.plugins.options import provider_for

#: The one code of a governance refusal (run ``error_code``; field code at ``jobs add`` / ``jobs validate``).
DENIED = "SCHEDULER_GOVERNANCE_DENIED"

#: Constraint name -> the executor capability that enforces it (``Constraints.required_capabilities``).
CONSTRAINT_CAPABILITIES = {
    "sandbox": "sandbox",
    "network": "network-restriction",
    "allowed_paths": "path-restriction",
    "max_tokens": "token-cap",
    "max_cost": "cost-cap",
}


def has_demands(spec: JobSpec) -> bool:
    """Whether the job asks its executor for anything governance checks (constraints, verification, credentials)."""
    return bool(spec.constraints) or spec.verify_shell is not None or bool(getattr(spec, "credentials", None))


def checks(spec: JobSpec, executor: object) -> list[JSONObject]:
    """Every demand of the job with the capability it needs and whether ``executor`` declares it, in a stable order.

    Each check: ``{"demand": "constraints.network", "requires": "network-restriction", "enforced": bool}``.
    """
    capabilities = frozenset(getattr(executor, "capabilities", ()) or ())
    out: list[JSONObject] = []
    if spec.constraints:
        constraints = constraints_of(spec)
        needed = constraints.required_capabilities()
        for name, capability in CONSTRAINT_CAPABILITIES.items():
            if capability in needed:
                out.append({"demand": f"constraints.{name}", "requires": capability, "enforced": capability in capabilities})
    if spec.verify_shell is not None:
        out.append({"demand": "verify_shell", "requires": "verify", "enforced": "verify" in capabilities})
    for i, binding in enumerate(getattr(spec, "credentials", None) or ()):
        medium = _medium(binding)
        capability = f"credentials-{medium}"
        out.append({"demand": f"credentials[{i}].present.medium", "binding": _name(binding), "medium": medium,
                    "requires": capability, "enforced": capability in capabilities})
    return out


def _medium(binding: object) -> str:
    present = binding.get("present") if isinstance(binding, dict) else getattr(binding, "present", None)
    medium = present.get("medium") if isinstance(present, dict) else getattr(present, "medium", None)
    return str(medium)


def _name(binding: object) -> str:
    return str(binding.get("name") if isinstance(binding, dict) else getattr(binding, "name", ""))


def _reason(spec: JobSpec, check: JSONObject) -> str:
    executor = spec.executor_name()
    demand, capability = str(check["demand"]), check["requires"]
    if demand == "verify_shell":
        return f"verify_shell: executor {executor!r} does not run verification checks (it lacks the capability verify)"
    if demand.startswith("credentials["):
        return (f"credential {check['binding']!r} (medium {check['medium']}): executor {executor!r} cannot present it"
                f" (it lacks the capability {capability})")
    return f"{demand}: executor {executor!r} cannot enforce this constraint (it lacks the capability {capability})"


def problems(spec: JobSpec, executor: object, *, credentials: bool = True) -> list[dict[str, str]]:
    """What governance would deny, one ``{"field", "code", "error", "requires"}`` per demand (``jobs add`` /
    ``jobs validate`` and the request builder). ``credentials=False`` leaves credential media out (validation
    reports those with the credential checks' own, more specific code)."""
    if not has_demands(spec):
        return []
    found = []
    for check in checks(spec, executor):
        if check["enforced"] or (not credentials and str(check["demand"]).startswith("credentials[")):
            continue
        found.append({"field": str(check["demand"]), "code": DENIED, "error": _reason(spec, check),
                      "requires": str(check["requires"])})
    return found


def evaluate(spec: JobSpec, executor: object, outcomes: RunOutcomes) -> None:
    """Deny (``SCHEDULER_GOVERNANCE_DENIED``) a run that demands what its executor does not enforce; record the decision.

    A job without demands returns at once. Any failure while deciding is itself a deny (fail closed).
    """
    if not has_demands(spec):
        return
    found: list[JSONObject]
    capabilities: list[str]
    try:
        found = checks(spec, executor)
        capabilities = sorted(getattr(executor, "capabilities", ()) or ())
        denied = [c for c in found if not c["enforced"]]
        reasons = [_reason(spec, c) for c in denied]
        error = None
    except Exception as exc:  # noqa: BLE001 - a governance step that cannot decide denies
        found, capabilities, denied = [], [], []
        error = f"governance could not decide: {type(exc).__name__}: {exc}"
        reasons = [error]
    decision: JSONObject = {
        "decision": "denied" if (denied or error) else "allowed",
        "executor": _executor_name(spec),
        "capabilities": _values(capabilities),
        "checks": _values(found),
    }
    if denied or error:
        decision.update(code=DENIED, denied=[c["demand"] for c in denied], reasons=_values(reasons))
    outcomes.columns["governance_json"] = json.dumps(decision, sort_keys=True, separators=(",", ":"))
    outcomes.record("governance.decided", decision)
    if denied or error:
        raise SchedulerError(DENIED, "governance denied the run: " + "; ".join(reasons), details=decision)


def _values(items: list[str] | list[JSONObject]) -> list[JSONValue]:
    """``items`` as a JSON list."""
    return list(items)


def _executor_name(spec: JobSpec) -> str | None:
    try:
        return spec.executor_name()
    except Exception:  # noqa: BLE001 - only a label in the record
        return None


def normalise_constraints(value: object, field: str = "constraints") -> tuple[JSONObject | None, list[Problem]]:
    """Validate ``constraints`` against ``Constraints``; normalised to its non-default values."""
    kwargs, problems = option_problems(Constraints, value, field)
    if problems:
        return None, problems
    paths = kwargs.get("allowed_paths") or ()
    if any(not p.startswith("/") or ".." in p.split("/") for p in paths):
        return None, [{"field": f"{field}.allowed_paths", "code": "PATH_TRAVERSAL", "error": "must be absolute paths without '..'"}]
    for key in ("max_tokens", "max_cost"):
        if kwargs.get(key) is not None and kwargs[key] <= 0:
            return None, [{"field": f"{field}.{key}", "code": "OUT_OF_RANGE", "error": "must be greater than 0"}]
    return options_to_json(Constraints(**kwargs)), []


def request_for(executor: object, spec: JobSpec, **fields: Any) -> ExecutionRequest:
    """``scheduler.core.request.build_request`` for callers outside the dispatcher (the conformance engine,
    ``scheduler.testing``): refused with ``SCHEDULER_GOVERNANCE_DENIED`` first when ``executor`` cannot enforce
    the job's constraints or ``verify_shell`` (in a run, the governance step has denied such a run already)."""
    if executor is not None and (spec.constraints or spec.verify_shell is not None):
        found = problems(spec, executor, credentials=False)
        if found:
            raise SchedulerError(DENIED, found[0]["error"], details=found)
    return build_request(executor, spec, **fields)


class GovernanceStep(StepBase):
    """The pipeline step: what the job demands of its executor, against the executor's capabilities."""

    name = "governance"
    fields: Mapping[str, Normaliser | None] = {"constraints": normalise_constraints}
    sections = ("constraints",)

    def check_installed(self, spec: JobSpec) -> tuple[JSONObject, list[Problem]]:
        """Each constraint or ``verify_shell`` check the installed executor cannot enforce (credential media are
        the credential step's to report, with their own code)."""
        executor = provider_for("executor", spec.executor_name())
        return {}, ([] if executor is None else problems(spec, executor, credentials=False))

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Jobs that demand something: constraints, a verification check, credentials."""
        return bool(sections.get("constraints")) or (sections.get("verification") or {}).get("shell_sha256") is not None \
            or bool((sections.get("credential_presentation") or {}).get("bindings"))

    def before(self, run: Run) -> None:
        """Deny (``SCHEDULER_GOVERNANCE_DENIED``) what the executor does not enforce."""
        evaluate(run.spec, run.executor, run.outcomes)
