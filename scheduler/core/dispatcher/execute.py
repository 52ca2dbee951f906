"""The worker-side run: what a worker thread does with a run the dispatcher's pass started.

The run pipeline as a loop over the run's plan (``scheduler.core.steps``): the artifact check
binds the plan (``scheduler.core.artifact.bind_plan``), the executor is loaded, every step's
``before`` decides in order, every ``around`` context is entered, the executor runs, the contexts
are left (credentials cleaned), and every ``after`` hook gets the result (evidence). This module
names no step. The result is handed back to the loop (``finished``), which commits it under its
fence (group commit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core.artifact import KERNEL_SECTIONS, bind_plan, execution_sections
from scheduler.core.claimed import ClaimedRun
from scheduler.core.execution import (
    EXECUTION_STATUSES,
    SOURCE_OUTPUT_CHARS,
    CancellationToken,
    ExecutionResult,
    TriggerContext,
)
from scheduler.core.request import build_request
from scheduler.core.rows import JSONObject
from scheduler.core.spec import JobSpec, spec_from_row
from scheduler.core.steps import Plan, Run, derive_plan
from scheduler.core.store.base import Store

log = logging.getLogger("scheduler.core.dispatcher")


@attrs.define(eq=False)
class RunExecution:
    """Runs one started run on the calling worker thread and hands its result to the loop."""

    store: Store
    #: The loaded executor of a name (a load failure is remembered for a short while, then retried).
    executor: Callable[[str], Any]
    artifacts_root: Path
    #: Where results go for the loop to commit (group commit, under its fence).
    finished: queue.SimpleQueue[tuple[ClaimedRun, ExecutionResult]]
    #: Set after a result is handed over: wakes the loop.
    wake: threading.Event
    #: The trigger context of attempts that follow no run, per (dispatch kind, attempt): frozen, so one serves them all.
    _plain_triggers: dict[tuple[str, int], TriggerContext] = attrs.field(factory=dict, init=False)

    def execute(self, s: ClaimedRun, control: CancellationToken) -> None:
        """One run through its plan; every step records into ``s.outcomes``. A refusal (``SchedulerError``) or a
        crash ends the run ``error`` with its code; the ``after`` hooks see that result too."""
        spec = spec_from_row(s.job)
        run = Run(store=self.store, started=s, spec=spec)
        plan: Plan | None = None
        try:
            plan = bind_plan(self.store, s.job, spec)
            name = spec.executor_name()
            executor = run.executor = self.executor(name)
            for before in plan.before:
                before(run)
            trigger, state = self.run_context(s, name, "state" in getattr(executor, "capabilities", ()))
            with _entered(plan, run):
                request = build_request(
                    executor, spec, run_id=s.run_id, job_id=s.job.id, artifacts_root=self.artifacts_root,
                    started_at_ms=s.started_at, attempt=s.attempt, scheduled_for_ms=s.scheduled_for, dispatch_kind=s.dispatch_kind,
                    trigger=trigger, state=state, artifact_digest=s.job.artifact_digest, credentials=run.credentials,
                )
                result = executor.execute(request, control)
            if not isinstance(result, ExecutionResult) or result.status not in EXECUTION_STATUSES:
                result = ExecutionResult(status="error", error_code="EXECUTOR_INVALID_RESULT",
                                         error_message=f"executor {spec.executor_name()!r} returned {type(result).__name__}")
            else:
                run.executed = True
        except SchedulerError as exc:
            details = exc.details if isinstance(exc.details, dict) else {}
            result = ExecutionResult(status="error", error_code=exc.code, error_message=exc.message, details=details)
        except Exception as exc:
            log.exception("executor crashed")
            result = ExecutionResult(status="error", error_code="EXECUTOR_CRASHED", error_message=f"{type(exc).__name__}: {exc}")
        for after in (plan or _unbound_plan(s, spec)).after:
            result = _after(after, run, result)
        self.finished.put((s, result))  # the loop commits it (group commit), under its fence
        if not self.wake.is_set():  # a loop not yet woken by another result (setting it again would wake no one)
            self.wake.set()

    def run_context(self, s: ClaimedRun, executor: str, keeps_state: bool) -> tuple[TriggerContext, JSONObject | None]:
        """The attempt's trigger context (with the run it follows and a bounded excerpt of its output) and the
        state the executor kept for this job after its last ok run (executors declaring ``state``): one read, or none."""
        if not s.source_run_id and not keeps_state:
            trigger = self._plain_triggers.get((s.dispatch_kind, s.attempt))
            if trigger is None:
                trigger = self._plain_triggers[(s.dispatch_kind, s.attempt)] = TriggerContext(
                    dispatch_kind=s.dispatch_kind, attempt=s.attempt)
            return trigger, None
        source, state, row = None, None, None
        with self.store.read() as tx:
            if s.source_run_id:
                source = tx.one("SELECT id, status, error_code, stdout_excerpt FROM runs WHERE id = ?", (s.source_run_id,))
            if keeps_state:
                row = tx.one("SELECT state FROM executor_state WHERE job_id = ? AND executor = ?", (s.job.id, executor))
        if row is not None:
            state = json.loads(row["state"])
        output = (source or {}).get("stdout_excerpt") or None
        trigger = TriggerContext(
            dispatch_kind=s.dispatch_kind, attempt=s.attempt, source_run_id=s.source_run_id,
            source_status=source["status"] if source else None, source_error_code=source["error_code"] if source else None,
            source_output=output[:SOURCE_OUTPUT_CHARS] if output else None,
            source_output_truncated=bool(output and len(output) > SOURCE_OUTPUT_CHARS),
        )
        return trigger, state


def _entered(plan: Plan, run: Run) -> AbstractContextManager[object]:
    """The plan's ``around`` contexts as one (the common cases without an ``ExitStack``)."""
    if not plan.around:
        return contextlib.nullcontext()
    if len(plan.around) == 1:
        return plan.around[0](run)
    stack = contextlib.ExitStack()
    try:
        for around in plan.around:
            stack.enter_context(around(run))
    except BaseException:
        stack.close()
        raise
    return stack


def _after(hook: Callable[[Run, ExecutionResult], ExecutionResult], run: Run, result: ExecutionResult) -> ExecutionResult:
    """One ``after`` hook; a hook that raises turns the result into an error, never leaves the run unfinished
    (``EXECUTOR_CRASHED`` for a bug, as when it ran inside the executor's guard)."""
    try:
        return hook(run, result)
    except SchedulerError as exc:
        return ExecutionResult(status="error", error_code=exc.code, error_message=exc.message,
                               details=exc.details if isinstance(exc.details, dict) else {})
    except Exception as exc:  # a step's bug must not leave the run unfinished
        log.exception("pipeline step after-hook of run %s crashed", run.started.run_id)
        return ExecutionResult(status="error", error_code="EXECUTOR_CRASHED", error_message=f"{type(exc).__name__}: {exc}")


def _unbound_plan(s: ClaimedRun, spec: JobSpec) -> Plan:
    """The ``after`` hooks of a run refused before its plan was bound (artifact check failed): the steps the job's own
    projection names, so its refusal still gets its evidence; never cached (the job does not match its artifact)."""
    try:
        return derive_plan(str(s.job.artifact_digest), execution_sections(spec), KERNEL_SECTIONS)
    except Exception:  # noqa: BLE001 - nothing to add to a run that cannot even be projected
        return Plan(steps=(), before=(), around=(), after=())

