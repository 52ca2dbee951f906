"""The ``ExecutionRequest`` of one attempt: the one builder the dispatcher, the conformance engine and
``scheduler.testing`` share.

What the executor may be asked to enforce is decided before the request is built: by the
pipeline's governance step in a run, by ``scheduler.pipeline.governance.request_for`` for
callers outside the dispatcher. This module only turns a validated spec into the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.options import build_options
from scheduler.core.execution import Constraints, CredentialPresentation, ExecutionRequest, TriggerContext
from scheduler.core.members import options_class_of
from scheduler.core.outputs import run_dir
from scheduler.core.run_as import check_at_run
from scheduler.core.spec import JobSpec

#: What a job declaring no constraints demands (frozen, so every such run is given this one).
_UNCONSTRAINED = Constraints()


def constraints_of(spec: JobSpec) -> Constraints:
    """The job's ``constraints`` as a ``Constraints`` instance (asked twice a run: by governance and the request)."""
    if not spec.constraints:
        return _UNCONSTRAINED
    raw = dict(spec.constraints)
    if "allowed_paths" in raw and raw["allowed_paths"] is not None:
        raw["allowed_paths"] = tuple(raw["allowed_paths"])
    return Constraints(**raw)


def build_request(
    executor: object,
    spec: JobSpec,
    *,
    run_id: str,
    job_id: str,
    artifacts_root: Path,
    started_at_ms: int,
    attempt: int = 1,
    scheduled_for_ms: int | None = None,
    dispatch_kind: str = "manual",
    credentials: tuple[CredentialPresentation, ...] = (),
    trigger: TriggerContext | None = None,
    state: Mapping[str, Any] | None = None,
    artifact_digest: str | None = None,
) -> ExecutionRequest:
    """The request of one attempt: options built by ``executor``'s class, constraints, deadline, kernel variables.

    ``executor`` may be None (not installed: the caller runs its own object), then ``options`` is None.
    A job naming ``executor_options.user`` is refused here unless its recorded adder may (``run_as.check_at_run``).
    """
    check_at_run(spec)
    return ExecutionRequest(
        run_id=run_id, job_id=job_id, job=spec, options=executor_options_for(executor, spec) if executor is not None else None,
        constraints=constraints_of(spec), credentials=credentials, dispatch_kind=dispatch_kind, attempt=attempt,
        trigger=trigger, state=state, artifact_digest=artifact_digest,
        scheduled_for_ms=scheduled_for_ms, started_at_ms=started_at_ms, deadline_ms=started_at_ms + spec.run_timeout_ms,
        artifacts_dir=run_dir(artifacts_root, run_id, create=False), artifacts_root=artifacts_root,
        extra_env={"SCHEDULER_RUN_ID": run_id, "SCHEDULER_JOB_ID": job_id, "SCHEDULER_JOB_NAME": spec.name,
                   "SCHEDULER_ATTEMPT": str(attempt)},
    )


def executor_options_for(executor: object, spec: JobSpec) -> object:
    """The executor's options instance for a run (``None`` when it declares no options class).

    Raises ``EXECUTOR_OPTIONS_INVALID`` when the stored object no longer fits (the plugin
    changed, or the job was added while the plugin was missing).
    """
    cls = options_class_of(executor)
    if cls is None:
        if spec.executor_options:
            raise SchedulerError("EXECUTOR_OPTIONS_INVALID", f"executor {spec.executor_name()!r} takes no options")
        return None
    try:
        return build_options(cls, spec.executor_options, "executor_options")
    except SchedulerError as exc:
        raise SchedulerError("EXECUTOR_OPTIONS_INVALID", exc.message, details=exc.details) from None
