"""Per-job options owned by plugins, and constraints checked against executor capabilities.

The job spec carries one JSON object per plugin it names (``executor_options``,
``delivery_options``); the plugin declares what it accepts as an attrs
``options_class``. The kernel validates the object with that class when the job is
added or updated (when the plugin is installed) and again when a run starts, and
never names an option itself. ``constraints`` are kernel-level: a constraint the
executor's ``capabilities`` cannot enforce refuses the job and the run.
"""

from __future__ import annotations

from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.options import build_options, option_problems, options_to_json

#: Spec field -> (provider kind, attribute of JobSpec naming the driver).
OPTION_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("executor_options", "executor", "executor_name"),
    ("delivery_options", "channel", "delivery_channel"),
)


def _driver(spec: Any, attr: str) -> str | None:
    value = getattr(spec, attr)
    return value() if callable(value) else value


#: Providers loaded for validation in this process: validating an array of jobs loads each plugin once.
_validators: dict[tuple[str, str], Any] = {}
#: Plugins that could not be loaded, and until when that answer is kept (monotonic seconds): a miss costs a
#: metadata scan, so 500 jobs naming a missing plugin must not pay it 500 times; a fix is seen seconds later.
_misses: dict[tuple[str, str], float] = {}
MISS_TTL_S = 5.0


def _provider(kind: str, name: str) -> Any | None:
    """The loaded provider, or None when it is not installed or cannot load (the missing-plugin rule reports that)."""
    import time

    from scheduler.plugins.loader import load_provider

    key = (kind, name)
    if key in _validators:
        return _validators[key]
    if _misses.get(key, 0.0) > time.monotonic():
        return None
    try:
        _validators[key] = load_provider(kind, name)
    except SchedulerError:
        _misses[key] = time.monotonic() + MISS_TTL_S
        return None
    return _validators[key]


def option_problems_of(spec: Any) -> tuple[dict[str, dict[str, Any]], list[dict[str, str]]]:
    """Validate every plugin-owned options object of a spec against its installed plugin.

    Returns the normalised objects (non-default values only) by field, and per-field
    problems. A plugin that is not installed leaves its object as given.
    """
    normalised: dict[str, dict[str, Any]] = {}
    problems: list[dict[str, str]] = []
    for field, kind, attr in OPTION_FIELDS:
        raw = getattr(spec, field)
        name = _driver(spec, attr)
        if name is None:
            if raw:
                problems.append({"field": field, "code": "CONFLICT", "error": f"options given but the job names no {kind}"})
            continue
        provider = _provider(kind, name)
        if provider is None:
            continue
        cls = getattr(provider, "options_class", None)
        if cls is None:
            if raw:
                problems.append({"field": field, "code": "UNKNOWN_FIELD", "error": f"{kind} {name!r} takes no options"})
            continue
        kwargs, found = option_problems(cls, raw, field)
        problems += found
        if not found:
            try:
                normalised[field] = options_to_json(cls(**kwargs))
            except (TypeError, ValueError) as exc:
                problems.append({"field": field, "code": "INVALID_VALUE", "error": str(exc)})
    if getattr(spec, "evidence", None):  # the declaration against its provider: methods it performs, its provider_config
        from scheduler.evidence.declaration import provider_problems

        evidence, found = provider_problems(spec.evidence, _provider)
        problems += found
        if evidence is not None:
            normalised["evidence"] = evidence
    executor = _provider("executor", spec.executor_name())
    if executor is not None:
        problems += constraint_problems(spec, executor)
    if getattr(spec, "credentials", None):
        from scheduler.pipeline.credentials.bindings import credential_problems

        problems += credential_problems(spec, executor)
    if getattr(spec, "authorization_ref", None):  # provider_config against its options_class, the policy's own check
        from scheduler.pipeline.authorization import provider_problems as authorization_problems

        authorization, found = authorization_problems(spec, _provider)
        problems += found
        if authorization is not None:
            normalised["authorization"] = authorization
    return normalised, problems


def constraint_problems(spec: Any, executor: Any) -> list[dict[str, str]]:
    """What governance would deny (``SCHEDULER_GOVERNANCE_DENIED``): one problem per constraint, or ``verify_shell``
    check, the executor's capabilities cannot enforce. ``scheduler.pipeline.governance`` decides; credential media are
    reported by the credential checks. Nothing is run unenforced: such a job is refused.
    """
    from scheduler.pipeline.governance import problems

    return problems(spec, executor, credentials=False)


def request_for(
    executor: Any,
    spec: Any,
    *,
    run_id: str,
    job_id: str,
    artifacts_root: Any,
    started_at_ms: int,
    attempt: int = 1,
    scheduled_for_ms: int | None = None,
    dispatch_kind: str = "manual",
    credentials: tuple[Any, ...] = (),
    trigger: Any = None,
    state: Any = None,
    artifact_digest: str | None = None,
) -> Any:
    """The ``ExecutionRequest`` of one attempt: the one builder the dispatcher, the conformance engine and
    ``scheduler.testing`` share (options validated by ``executor``, constraints, deadline, kernel variables).

    ``executor`` may be None (not installed: the caller runs its own object), then ``options`` is None.
    """
    from scheduler.core.outputs import run_dir
    from scheduler.core.execution import ExecutionRequest
    from scheduler.core.spec import constraints_of

    return ExecutionRequest(
        run_id=run_id, job_id=job_id, job=spec, options=executor_options_for(executor, spec) if executor is not None else None,
        constraints=constraints_of(spec), credentials=credentials, dispatch_kind=dispatch_kind, attempt=attempt,
        trigger=trigger, state=state, artifact_digest=artifact_digest,
        scheduled_for_ms=scheduled_for_ms, started_at_ms=started_at_ms, deadline_ms=started_at_ms + spec.run_timeout_ms,
        artifacts_dir=run_dir(artifacts_root, run_id, create=False), artifacts_root=artifacts_root,
        extra_env={"SCHEDULER_RUN_ID": run_id, "SCHEDULER_JOB_ID": job_id, "SCHEDULER_JOB_NAME": spec.name,
                   "SCHEDULER_ATTEMPT": str(attempt)},
    )


def executor_options_for(executor: Any, spec: Any) -> Any:
    """The executor's options instance for a run (``None`` when it declares no options class).

    Raises ``EXECUTOR_OPTIONS_INVALID`` when the stored object no longer fits (the plugin
    changed, or the job was added while the plugin was missing) and
    ``SCHEDULER_GOVERNANCE_DENIED`` when the executor cannot enforce the job's constraints (the dispatcher's
    governance step denies such a run first; this covers every other caller of ``request_for``).
    """
    if spec.constraints or spec.verify_shell is not None:
        problems = constraint_problems(spec, executor)
        if problems:
            raise SchedulerError("SCHEDULER_GOVERNANCE_DENIED", problems[0]["error"], details=problems)
    cls = getattr(executor, "options_class", None)
    if cls is None:
        if spec.executor_options:
            raise SchedulerError("EXECUTOR_OPTIONS_INVALID", f"executor {spec.executor_name()!r} takes no options")
        return None
    try:
        return build_options(cls, spec.executor_options, "executor_options")
    except SchedulerError as exc:
        raise SchedulerError("EXECUTOR_OPTIONS_INVALID", exc.message, details=exc.details) from None


def channel_options_for(channel: Any, raw: Any) -> Any:
    """A channel's options instance for a part (from the job's stored ``delivery_options``); None without an options class.

    ``DELIVERY_OPTIONS_INVALID`` when the stored object no longer fits the channel's class.
    """
    cls = getattr(channel, "options_class", None)
    if cls is None:
        if raw:
            raise SchedulerError("DELIVERY_OPTIONS_INVALID", "the channel takes no delivery_options")
        return None
    try:
        return build_options(cls, raw or {}, "delivery_options")
    except SchedulerError as exc:
        raise SchedulerError("DELIVERY_OPTIONS_INVALID", exc.message, details=exc.details) from None
