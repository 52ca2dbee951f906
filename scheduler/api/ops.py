"""Acting on the scheduler from a plugin (a web view, a chat bot): the CLI's operations, as functions.

Each function is the one the CLI command calls (``scheduler.ops.queries`` for reading,
``scheduler.ops.actions`` for acting), so a plugin and the CLI read and change the scheduler
one way: same checks, same state changes, same ``SchedulerError`` codes, and the value
returned is what the command prints under ``--json`` (the CLI wraps it as
``{"ok": true, KEY: value}``; for the cancels the payload is the value itself).

``store`` is an open ``Store`` (kept open) or a path or URL, as ``open_store`` takes it
(opened for the call and closed after; read-only for the reads). The first call in a
process installs the process's defaults as the CLI does (``scheduler.runtime.install``:
the run pipeline, the handoff v4 kind, the hook modules as observers of what the call
commits). Every action is recorded as the invoking operating-system account.

Read (each returns JSON-ready dicts):

=====================================================  ==========================  ===========================================
operation                                              CLI command                 returns (the ``--json`` key)
=====================================================  ==========================  ===========================================
``list_jobs(store, enabled=, state=, limit=,           ``jobs list``               list of job views with ``state`` and
include_handoff_artifacts=)``                                                      ``next_run_at`` (``jobs``)
``get_job(store, job)``                                ``jobs get JOB``            one job view (``job``)
``next_runs(store, job, count=5)``                     ``jobs next JOB -n N``      ``job_id`` and its next ``fires`` (local,
                                                                                   offset, utc)
``list_runs(store, job=, status=, limit=20,            ``runs list [JOB]``         run views, newest first (``runs``);
before=, since_ms=, until_ms=)``                                                   ``before`` (a keyset cursor: the page after
                                                                                   that run) and the creation-time window are
                                                                                   the facade's own
``job_names(store)``                                   ``runs list`` (its table)   every job's name by id
``get_run(store, run)``                                ``runs get RUN``            the full run view (``run``)
``run_events(store, run)``                             ``runs events RUN``         the run's audit trail, oldest first
                                                                                   (``events``)
``run_output(store, run)``                             ``runs output RUN --both``  both streams, verified against their
                                                                                   digests (``streams``: ``content``, ...)
``verify_evidence(store, run)``                        ``runs evidence RUN``       the re-verified evidence verdict (raises
                                                                                   its ``EVIDENCE_*`` code when it fails)
``list_approvals(store, pending=, job=, limit=100)``   ``approvals list``          approval views, newest first (``approvals``)
``get_approval(store, approval)``                      ``approvals show ID``       one approval view (``approval``)
``list_deliveries(store, status=, job=, run=,          ``deliveries list``         outbox part views (``deliveries``); ``run``
limit=100)``                                                                       (a run's parts) is the facade's own filter
``get_delivery(store, part)``                          ``deliveries show PART``    one part with body and receipt (``delivery``)
``list_queue(store, status=, job=, limit=100)``        ``queue list``              dispatch rows with attempts, claim and last
                                                                                   error, latest due first (``dispatches``)
``get_dispatch(store, dispatch)``                      ``queue show ID``           one dispatch with its ``events`` and
                                                                                   ``errors`` (``dispatch``)
``status(store)``                                      ``status``                  leases, queue, runs, outbox, approvals,
                                                                                   evidence counts (``status``)
``doctor(store)``                                      ``doctor``                  ``healthy`` and every check (``checks``);
                                                                                   returned, not raised, when unhealthy
=====================================================  ==========================  ===========================================

Act:

=====================================================  ==========================  ===========================================
operation                                              CLI command                 returns (the ``--json`` key)
=====================================================  ==========================  ===========================================
``run_job(store, job)``                                ``jobs run JOB``            the queued manual dispatch row (``dispatch``)
``enable_job(store, job)``                             ``jobs enable JOB``         the job view (``job``)
``disable_job(store, job)``                            ``jobs disable JOB``        the job view (``job``)
``pause_job(store, job)``                              ``jobs pause JOB``          the job view (``job``)
``resume_job(store, job)``                             ``jobs resume JOB``         the job view (``job``)
``cancel_run(store, run, reason=)``                    ``runs cancel RUN``         ``run_id``, ``outcome``, ``requested_by``
``cancel_job(store, job, reason=)``                    ``jobs cancel JOB``         ``job_id``, ``runs``, ``dispatches``,
                                                                                   ``requested_by``
``approve(store, approval, note=)``                    ``approvals approve ID``    the decided approval (``approval``)
``reject(store, approval, note=)``                     ``approvals reject ID``     the decided approval (``approval``)
``approve_job(store, job, note=)``                     ``jobs approve JOB``        the decided approval (``approval``)
``reject_job(store, job, note=)``                      ``jobs reject JOB``         the decided approval (``approval``)
``retry_delivery(store, part)``                        ``deliveries retry PART``   the re-armed part (``delivery``)
=====================================================  ==========================  ===========================================

A job view's ``state`` is one of ``scheduler.ops.queries.JOB_STATES`` (``enabled``, ``paused``,
``auto-paused``, ``disabled``, ``done``; docs/cli.md, "Job states"), and its ``next_run_at`` is
null unless it is ``enabled``. ``pause_job`` does what ``disable_job`` does (nothing fires, its
pending work is cancelled) and leaves the job ``paused``; ``disable_job`` leaves it ``disabled``;
``resume_job`` and ``enable_job`` are one operation and lift either, or the scheduler's own
``auto-paused``. ``list_jobs(state=)`` keeps the jobs in one state (an unknown one is
``INVALID_ARGUMENT``). References are what the CLI takes: a job by id, name, or a unique prefix or
suffix of its id (8 characters or more, what ``jobs list`` shows), a run by id or a unique prefix or suffix (6 characters or more; listings show its last 8), an approval or a part by id or a unique prefix or suffix (8 characters or more).
Refusals: ``NOT_FOUND`` (unknown job, run, approval, part, dispatch), ``INVALID_ARGUMENT`` (a bad
limit or status, an ambiguous prefix), ``JOB_DISABLED``, ``JOB_ALREADY_RUNNING``,
``RUN_ALREADY_FINISHED``, ``APPROVAL_CONFLICT`` (already decided), ``APPROVAL_AMBIGUOUS``,
``APPROVAL_SCOPE_MISMATCH``, ``DELIVERY_NOT_FAILED``; a refused action stores nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.core.store.base import Store
from scheduler.ops import actions, health, queries
from scheduler.plugins.health import provider_checks
from scheduler.plugins.stores import open_store
from scheduler.runtime import install

__all__ = [
    "JsonObject",
    "StoreTarget",
    "approve",
    "approve_job",
    "cancel_job",
    "cancel_run",
    "disable_job",
    "doctor",
    "enable_job",
    "get_approval",
    "get_delivery",
    "get_dispatch",
    "get_job",
    "get_run",
    "job_names",
    "list_approvals",
    "list_deliveries",
    "list_jobs",
    "list_queue",
    "list_runs",
    "next_runs",
    "open_store",
    "pause_job",
    "reject",
    "reject_job",
    "resume_job",
    "retry_delivery",
    "run_events",
    "run_job",
    "run_output",
    "status",
    "verify_evidence",
]

#: A JSON-ready object, as the CLI prints it under ``--json``.
JsonObject = dict[str, Any]
#: What every operation takes as ``store``: an open store, or a path or URL for ``open_store``.
StoreTarget = Store | str | os.PathLike[str]


@functools.cache
def _process_defaults() -> None:
    """Install the process's defaults once, as every CLI command does (``scheduler.runtime.install``)."""
    install()


@contextlib.contextmanager
def _opened(store: StoreTarget, *, readonly: bool = False) -> Iterator[Store]:
    """The store to use: ``store`` itself, or the one at that path or URL (closed afterwards)."""
    _process_defaults()
    if isinstance(store, (str, os.PathLike)):
        opened = open_store(store, readonly=readonly)
        try:
            yield opened
        finally:
            opened.close()
    elif isinstance(store, Store):
        yield store
    else:
        raise SchedulerError("INVALID_ARGUMENT", f"store must be a Store or a path or URL, not {type(store).__name__}")


# -- read ------------------------------------------------------------------------------------------


def list_jobs(store: StoreTarget, *, enabled: bool | None = None, state: str | None = None, limit: int | None = None,
              include_handoff_artifacts: bool = False) -> list[JsonObject]:
    """``jobs list``: every job by name with its ``state`` and ``next_run_at`` (only enabled or not with ``enabled``, one state with ``state``)."""
    with _opened(store, readonly=True) as s:
        return queries.list_jobs(s, enabled=enabled, state=state, limit=limit,
                                 include_handoff_artifacts=include_handoff_artifacts)


def get_job(store: StoreTarget, job: str) -> JsonObject:
    """``jobs get``: one job by id, name, or a unique prefix or suffix of its id."""
    with _opened(store, readonly=True) as s:
        return queries.get_job(s, job)


def next_runs(store: StoreTarget, job: str, count: int = 5) -> JsonObject:
    """``jobs next``: the job's next ``count`` fire times in its zone, with UTC offsets (none for a job that never fires)."""
    with _opened(store, readonly=True) as s:
        return queries.next_runs(s, job, count)


def list_runs(store: StoreTarget, *, job: str | None = None, status: str | None = None, limit: int = 20,
              before: str | None = None, since_ms: int | None = None, until_ms: int | None = None) -> list[JsonObject]:
    """``runs list``: recent runs, newest first, of one job and of one status when given; ``before`` pages on
    (the runs created before that run), ``since_ms``/``until_ms`` keep a window of creation times."""
    with _opened(store, readonly=True) as s:
        return queries.list_runs(s, job=job, status=status, limit=limit, before=before, since_ms=since_ms,
                                 until_ms=until_ms)


def job_names(store: StoreTarget) -> dict[str, str]:
    """Every job's name by id, as ``runs list`` names the job of each run in its table (one cheap read)."""
    with _opened(store, readonly=True) as s:
        return queries.job_names(s)


def get_run(store: StoreTarget, run: str) -> JsonObject:
    """``runs get``: everything recorded about one run (id or a unique prefix or suffix)."""
    with _opened(store, readonly=True) as s:
        return queries.get_run(s, run)


def run_events(store: StoreTarget, run: str) -> list[JsonObject]:
    """``runs events``: the audit trail of one run (id or a unique prefix or suffix), oldest first."""
    with _opened(store, readonly=True) as s:
        return queries.run_events(s, run)


def run_output(store: StoreTarget, run: str) -> JsonObject:
    """``runs output --both``: both output streams of one run, verified against their recorded digests (``ARTIFACT_TAMPERED``)."""
    with _opened(store, readonly=True) as s:
        return queries.run_output(s, run)


def verify_evidence(store: StoreTarget, run: str) -> JsonObject:
    """``runs evidence``: re-verify one run's evidence from history; the verdict, or its ``EVIDENCE_*`` code raised."""
    with _opened(store, readonly=True) as s:
        return queries.verify_evidence(s, run)


def list_approvals(store: StoreTarget, *, pending: bool = False, job: str | None = None, limit: int = 100) -> list[JsonObject]:
    """``approvals list``: approvals newest first (``pending=True``: only those waiting for a decision)."""
    with _opened(store, readonly=True) as s:
        return queries.list_approvals(s, pending=pending, job=job, limit=limit)


def get_approval(store: StoreTarget, approval: str) -> JsonObject:
    """``approvals show``: one approval (id or a unique prefix or suffix)."""
    with _opened(store, readonly=True) as s:
        return queries.get_approval(s, approval)


def list_deliveries(store: StoreTarget, *, status: str | None = None, job: str | None = None, run: str | None = None,
                    limit: int = 100) -> list[JsonObject]:
    """``deliveries list``: outbox parts newest first; ``run`` keeps the parts of one run's messages."""
    with _opened(store, readonly=True) as s:
        return queries.list_deliveries(s, status=status, job=job, run=run, limit=limit)


def get_delivery(store: StoreTarget, part: str) -> JsonObject:
    """``deliveries show``: one outbox part (id or a unique prefix or suffix) with its body and receipt."""
    with _opened(store, readonly=True) as s:
        return queries.get_delivery(s, part)


def list_queue(store: StoreTarget, *, status: str | None = None, job: str | None = None, limit: int = 100) -> list[JsonObject]:
    """``queue list``: dispatch rows, latest due first, with attempts, claim and last error; of one status or job when given."""
    with _opened(store, readonly=True) as s:
        return queries.list_queue(s, status=status, job=job, limit=limit)


def get_dispatch(store: StoreTarget, dispatch: str) -> JsonObject:
    """``queue show``: one dispatch (id, unique prefix or suffix) with its runtime events and its error history."""
    with _opened(store, readonly=True) as s:
        return queries.get_dispatch(s, dispatch)


def status(store: StoreTarget) -> JsonObject:
    """``status``: leases (the dispatcher's holder), queue, runs, outbox, approvals and evidence counts at a glance."""
    with _opened(store, readonly=True) as s:
        return health.collect_status(s)


def doctor(store: StoreTarget) -> JsonObject:
    """``doctor``: ``{"healthy", "checks"}``, every check the command prints (the command exits 1 when one fails)."""
    with _opened(store, readonly=True) as s:
        checks = [*health.store_checks(s), health.plugin_check(), *provider_checks()]
    return {"healthy": all(c["ok"] for c in checks), "checks": checks}


# -- act -------------------------------------------------------------------------------------------


def run_job(store: StoreTarget, job: str) -> JsonObject:
    """``jobs run``: queue a manual run of ``job`` now; the dispatch row (a running dispatcher starts it at once)."""
    with _opened(store) as s:
        return actions.run_job(s, job)


def enable_job(store: StoreTarget, job: str) -> JsonObject:
    """``jobs enable``: enable a disabled job or resume a paused or auto-paused one (as ``resume_job``); the job view."""
    with _opened(store) as s:
        return actions.enable_job(s, job)


def disable_job(store: StoreTarget, job: str) -> JsonObject:
    """``jobs disable``: disable a job and cancel its pending scheduled work; the job view."""
    with _opened(store) as s:
        return actions.disable_job(s, job)


def pause_job(store: StoreTarget, job: str) -> JsonObject:
    """``jobs pause``: pause a job (as ``disable_job``: nothing fires, pending work cancelled; state ``paused``); the job view."""
    with _opened(store) as s:
        return actions.pause_job(s, job)


def resume_job(store: StoreTarget, job: str) -> JsonObject:
    """``jobs resume``: resume a paused, auto-paused or disabled job (as ``enable_job``); the job view."""
    with _opened(store) as s:
        return actions.resume_job(s, job)


def cancel_run(store: StoreTarget, run: str, *, reason: str | None = None) -> JsonObject:
    """``runs cancel``: cancel one run (``RUN_ALREADY_FINISHED`` when it has ended); the outcome."""
    with _opened(store) as s:
        return actions.cancel_run(s, run, reason=reason)


def cancel_job(store: StoreTarget, job: str, *, reason: str | None = None) -> JsonObject:
    """``jobs cancel``: cancel a job's queued dispatches and its waiting and running runs; what was cancelled."""
    with _opened(store) as s:
        return actions.cancel_job(s, job, reason=reason)


def approve(store: StoreTarget, approval: str, *, note: str | None = None) -> JsonObject:
    """``approvals approve``: approve a pending approval (its run starts); the decided approval."""
    with _opened(store) as s:
        return actions.decide_approval(s, approval, "approved", note=note)


def reject(store: StoreTarget, approval: str, *, note: str | None = None) -> JsonObject:
    """``approvals reject``: reject a pending approval (its run ends cancelled, nothing of it runs); the decided approval."""
    with _opened(store) as s:
        return actions.decide_approval(s, approval, "rejected", note=note)


def approve_job(store: StoreTarget, job: str, *, note: str | None = None) -> JsonObject:
    """``jobs approve``: approve the job's one pending approval (``APPROVAL_AMBIGUOUS`` when it has several)."""
    with _opened(store) as s:
        return actions.decide_for_job(s, job, "approved", note=note)


def reject_job(store: StoreTarget, job: str, *, note: str | None = None) -> JsonObject:
    """``jobs reject``: reject the job's one pending approval (``APPROVAL_AMBIGUOUS`` when it has several)."""
    with _opened(store) as s:
        return actions.decide_for_job(s, job, "rejected", note=note)


def retry_delivery(store: StoreTarget, part: str) -> JsonObject:
    """``deliveries retry``: re-arm a failed part and its message's failed parts; the part."""
    with _opened(store) as s:
        return actions.retry_delivery(s, part)
