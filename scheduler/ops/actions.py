"""Acting on the scheduler as the CLI does: run a job now, enable or disable it, cancel, decide approvals, re-arm parts.

One function per acting command (``jobs run``, ``jobs enable``, ``jobs disable``, ``jobs pause``,
``jobs resume``, ``jobs cancel``,
``runs cancel``, ``approvals approve`` / ``reject``, ``jobs approve`` / ``reject``,
``deliveries retry``): the CLI prints what it returns under ``--json`` and ``scheduler.api.ops``
hands the same value to plugins, so each thing is done one way. The state changes themselves
are core's and the features' (``enqueue_manual``, ``set_enabled``, ``cancel_run``, ``decide``,
``retry_failed``); this module resolves what the user named and shapes the answer. The actor
recorded is the invoking operating-system account, as for the CLI. A refusal raises
``SchedulerError`` and stores nothing.
"""

from __future__ import annotations

from typing import Any

from scheduler.approvals.decisions import approval_to_json, decide, pending_for_job
from scheduler.base.errors import SchedulerError
from scheduler.core.cancel import cancel_job as cancel_job_work
from scheduler.core.cancel import cancel_run as cancel_run_work
from scheduler.core.events import os_identity
from scheduler.core.jobs import job_to_json, resolve_job, set_enabled
from scheduler.core.jobs import pause_job as pause_core
from scheduler.core.queue import enqueue_manual
from scheduler.core.store.base import Store
from scheduler.delivery.outbox import part_to_json, retry_failed
from scheduler.ops.queries import resolve_run

__all__ = [
    "DECISIONS",
    "cancel_job",
    "cancel_run",
    "decide_approval",
    "decide_for_job",
    "disable_job",
    "enable_job",
    "pause_job",
    "resume_job",
    "retry_delivery",
    "run_job",
]

#: What an approval may be decided as (``approvals approve`` / ``approvals reject``).
DECISIONS = ("approved", "rejected")


def run_job(store: Store, job: str) -> dict[str, Any]:
    """``jobs run``: queue a manual dispatch of ``job`` (id or name) due now; the queued dispatch row.

    ``JOB_DISABLED`` for a disabled or paused job, ``JOB_ALREADY_RUNNING`` for a running job
    whose ``overlap_policy`` is ``skip``. The row is ``id``, ``job_id``, ``kind``, ``status``
    and ``due_at`` (epoch milliseconds, as the CLI prints it).
    """
    return enqueue_manual(store, job)


def enable_job(store: Store, job: str) -> dict[str, Any]:
    """``jobs enable``: enable a disabled job, or resume a paused or auto-paused one (as ``jobs resume``); its next run is recomputed from now. The job view."""
    return job_to_json(set_enabled(store, job, True))


def disable_job(store: Store, job: str) -> dict[str, Any]:
    """``jobs disable``: disable a job (state ``disabled``, replacing a pause); its pending scheduled dispatches are cancelled. The job view."""
    return job_to_json(set_enabled(store, job, False))


def pause_job(store: Store, job: str) -> dict[str, Any]:
    """``jobs pause``: what ``jobs disable`` does (nothing fires, pending work cancelled), state ``paused``. The job view."""
    return job_to_json(pause_core(store, job))


def resume_job(store: Store, job: str) -> dict[str, Any]:
    """``jobs resume``: what ``jobs enable`` does: lifts a pause, an auto-pause or a disable; next run from now. The job view."""
    return job_to_json(set_enabled(store, job, True))


def cancel_run(store: Store, run: str, *, reason: str | None = None) -> dict[str, Any]:
    """``runs cancel``: cancel one run (id or a unique prefix or suffix): a waiting run ends at once, a running one gets its request.

    Returns ``run_id`` (the full id), ``outcome`` (``cancelled`` or ``requested``) and
    ``requested_by``; a finished run is ``RUN_ALREADY_FINISHED``.
    """
    with store.read() as tx:
        full_id = resolve_run(tx, run).id
    return cancel_run_work(store, full_id, reason=reason)


def cancel_job(store: Store, job: str, *, reason: str | None = None) -> dict[str, Any]:
    """``jobs cancel``: cancel a job's queued dispatches and its waiting and running runs.

    Returns ``job_id``, ``runs`` (each ``run_id`` with its ``outcome``), ``dispatches`` (how many
    were cancelled) and ``requested_by``.
    """
    return cancel_job_work(store, job, reason=reason)


def decide_approval(store: Store, approval: str, decision: str, *, note: str | None = None) -> dict[str, Any]:
    """``approvals approve`` / ``approvals reject``: decide one pending approval (id or a unique prefix or suffix); the decided approval.

    ``decision`` is ``approved`` or ``rejected`` (else ``INVALID_ARGUMENT``). ``APPROVAL_CONFLICT``
    when it is no longer pending, ``APPROVAL_SCOPE_MISMATCH`` when this account may not decide it.
    """
    if decision not in DECISIONS:
        raise SchedulerError("INVALID_ARGUMENT", f"an approval is decided as {' or '.join(DECISIONS)}, not {decision!r}")
    return approval_to_json(decide(store, approval, decision, note=note))


def decide_for_job(store: Store, job: str, decision: str, *, note: str | None = None) -> dict[str, Any]:
    """``jobs approve`` / ``jobs reject``: decide the one pending approval of ``job`` (id or name); the decided approval.

    ``NOT_FOUND`` when the job has none, ``APPROVAL_AMBIGUOUS`` when it has several (decide one by id).
    """
    with store.read() as tx:
        approval_id = pending_for_job(tx, resolve_job(tx, job).id)["id"]
    return decide_approval(store, approval_id, decision, note=note)


def retry_delivery(store: Store, part: str) -> dict[str, Any]:
    """``deliveries retry``: re-arm a failed outbox part (id or a unique prefix or suffix) and its message's failed parts; the part.

    ``DELIVERY_NOT_FAILED`` for a part that is not failed.
    """
    return part_to_json(retry_failed(store, part, actor=os_identity()))
