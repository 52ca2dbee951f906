"""The worker-side run: what a worker thread does with a run the dispatcher's pass started.

The pipeline (see ``scheduler.core.outcomes``): the artifact check, the decisions before
execution, the credentials around it, the executor, then evidence. The result is handed
back to the loop (``finished``), which commits it under its fence (group commit).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path
from typing import Any, Callable

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core.execution import (
    EXECUTION_STATUSES,
    SOURCE_OUTPUT_CHARS,
    CancellationToken,
    ExecutionResult,
    TriggerContext,
)
from scheduler.core.queue import StartedRun
from scheduler.core.spec import spec_from_row
from scheduler.core.store.base import Store
from scheduler.plugins.options import request_for

log = logging.getLogger("scheduler.core.dispatcher")


@attrs.define(eq=False)
class RunExecution:
    """Runs one started run on the calling worker thread and hands its result to the loop."""

    store: Store
    #: The loaded executor of a name (a load failure is remembered for a short while, then retried).
    executor: Callable[[str], Any]
    artifacts_root: Path
    #: Where results go for the loop to commit (group commit, under its fence).
    finished: queue.SimpleQueue[tuple[StartedRun, ExecutionResult]]
    #: Set after a result is handed over: wakes the loop.
    wake: threading.Event

    def execute(self, s: StartedRun, control: CancellationToken) -> None:
        """One run through the pipeline (see ``scheduler.core.outcomes``): the decisions before execution, the
        credentials around it, the executor, then evidence; every step records into ``s.outcomes``."""
        from scheduler.pipeline import authorization
        from scheduler.pipeline.credentials import step as credentials
        from scheduler.evidence import attest as evidence
        from scheduler.pipeline import governance
        from scheduler.pipeline import identity
        from scheduler.pipeline.proofs import step as proofs

        spec = spec_from_row(s.job)
        try:
            self.check_artifact(s, spec)
            executor = self.executor(spec.executor_name())
            governance.evaluate(spec, executor, s.outcomes)
            identity.resolve(self.store, s, spec, s.outcomes)
            proofs.verify(self.store, s, spec, s.outcomes)
            authorization.decide(self.store, s, spec, s.outcomes)
            trigger, state = self.run_context(s, spec.executor_name(), "state" in getattr(executor, "capabilities", ()))
            with credentials.presented(self.store, s, spec, executor, s.outcomes) as presented:
                request = request_for(
                    executor, spec, run_id=s.run_id, job_id=s.job["id"], artifacts_root=self.artifacts_root,
                    started_at_ms=s.started_at, attempt=s.attempt, scheduled_for_ms=s.scheduled_for, dispatch_kind=s.dispatch_kind,
                    trigger=trigger, state=state, artifact_digest=s.job.get("artifact_digest"), credentials=presented,
                )
                result = executor.execute(request, control)
            if not isinstance(result, ExecutionResult) or result.status not in EXECUTION_STATUSES:
                result = ExecutionResult(status="error", error_code="EXECUTOR_INVALID_RESULT",
                                         error_message=f"executor {spec.executor_name()!r} returned {type(result).__name__}")
            elif presented:  # what output redaction replaced, recorded on the run: counts per binding, never a value
                from scheduler.core.redaction import record_redactions

                result = record_redactions(result, s.outcomes)
        except SchedulerError as exc:
            details = exc.details if isinstance(exc.details, dict) else {}
            result = ExecutionResult(status="error", error_code=exc.code, error_message=exc.message, details=details)
        except Exception as exc:
            log.exception("executor crashed")
            result = ExecutionResult(status="error", error_code="EXECUTOR_CRASHED", error_message=f"{type(exc).__name__}: {exc}")
        try:
            if s.outcomes.escalate is None:  # an escalated run is not finished: it waits for approval (no evidence yet)
                result = evidence.attest_run(self.store, s, spec, result, s.outcomes)
        except Exception as exc:  # noqa: BLE001 - attestation must never leave a run unfinished
            log.exception("evidence attestation of run %s crashed", s.run_id)
            result = ExecutionResult(status="error", error_code="EVIDENCE_ATTESTATION_FAILED",
                                     error_message=f"evidence attestation crashed: {type(exc).__name__}: {exc}")
        self.finished.put((s, result))  # the loop commits it (group commit), under its fence
        self.wake.set()

    def run_context(self, s: StartedRun, executor: str, keeps_state: bool) -> tuple[TriggerContext, dict[str, Any] | None]:
        """The attempt's trigger context (with the run it follows and a bounded excerpt of its output) and the
        state the executor kept for this job after its last ok run (executors declaring ``state``): one read, or none."""
        source, state, row = None, None, None
        if s.source_run_id or keeps_state:
            with self.store.read() as tx:
                if s.source_run_id:
                    source = tx.one("SELECT id, status, error_code, stdout_excerpt FROM runs WHERE id = ?", (s.source_run_id,))
                if keeps_state:
                    row = tx.one("SELECT state FROM executor_state WHERE job_id = ? AND executor = ?", (s.job["id"], executor))
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

    def check_artifact(self, s: StartedRun, spec: Any = None) -> None:
        """The run pipeline's artifact check: the job as claimed still projects to the artifact it is bound to.

        Fails the run (``EXECUTION_ARTIFACT_*`` / ``HANDOFF_ARTIFACT_*``) before anything executes.
        ``spec`` is the worker's ``spec_from_row(s.job)`` (built once per run, not again here).
        """
        from scheduler.core.artifact import check_job

        if s.job.get("handoff_version") == 4:  # reads the stored artifact
            with self.store.read() as tx:
                check_job(tx, s.job, spec)
        else:
            check_job(None, s.job, spec)  # type: ignore[arg-type]  # a native projection needs no database
