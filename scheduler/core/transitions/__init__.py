"""Every run, dispatch and approval status transition, in one package (a module for each kind of row).

Each transition is one compare-and-swap on the row's current status (and, for a
running run, on the owning dispatcher's fence), its runtime event in the same
transaction, and, for runs, an observer notification queued to fire once that
transaction has committed. The other kernel modules (queue, completion, cancel,
recovery, jobs, the dispatcher) decide *which* transition happens; only this
module writes ``runs.status``, ``job_dispatch_queue.status`` and ``approvals.status``. Each write is
one named statement of ``scheduler.core.state`` (in brackets below), never SQL of its own.

Runs::

    (new)     -> running                          start_run        (claim, under the claimer's fence)      [insert_runs]
    (new)     -> running, many at once            claim_and_start_many                    [claim_dispatches, insert_runs]
    (new)     -> skipped                          record_skipped   (misfire, overlap, veto)                [insert_runs]
    running   -> ok|error|timeout|cancelled       finish_run       (completion, owner + token)              [finish_run]
    running   -> error (COMPLETION_FAILED)        fail_completion  (owner + token)                    [fail_completion]
    pending|awaiting_approval|approved -> cancelled   cancel_waiting_run                           [cancel_waiting_run]
    (new)     -> awaiting_approval                open_approval_gate  (claim of a gated job's dispatch)    [insert_runs]
    awaiting_approval -> approved | cancelled     decide_approval  (approve; reject or time out)  [approve_run, cancel_...]
    approved  -> running                          dispatch_approved_run (claim again, under the fence) [start_approved_run]
    running   -> awaiting_approval                escalate_run     (an authorization provider escalated)  [escalate_run]
    running   -> recovery_blocked                 block_recovery   (the dead owner's token)              [block_recovery]
    running|recovery_blocked -> crashed           crash_run        (the dead owner's token)                   [crash_run]
    (no status change: cancel request, bookkeeping)   request_cancel, fenced_update     [request_cancel, update_run_bookkeeping]

Dispatch rows::

    (new) -> pending              insert_dispatch (idempotent: deterministic ids)                      [insert_dispatches]
    pending -> claimed            claim_dispatch, claim_and_start_many                                  [claim_dispatches]
    claimed -> pending            release_expired_claims                                          [release_expired_claims]
    claimed -> awaiting_approval  open_approval_gate, escalate_run                                         [gate_dispatch]
    awaiting_approval -> pending  decide_approval (approved: claimed again by one dispatcher)  [requeue_approved_dispatch]
    pending|claimed -> done|failed   finish_dispatch, batched_finishes     [finish_dispatch, finish_dispatches(_clean)]
    pending -> cancelled          cancel_dispatch, cancel_pending_work            [cancel_dispatch, cancel_job_dispatches]
    pending|claimed|awaiting_approval -> cancelled   cancel_waiting_run (with its run)               [cancel_run_dispatch]

Approvals (``approvals.status``, compare-and-swap on ``version``)::

    (new) -> pending -> approved -> dispatched      open_approval_gate, decide_approval, dispatch_approved_run
                                                             [insert_approval, decide_approval, dispatch_approval]
             pending -> rejected | timed_out        decide_approval                               [decide_approval]
    pending|approved -> cancelled                   cancel_waiting_run, cancel_pending_work
                                                                        [cancel_run_approvals, cancel_job_approvals]

Observer hooks (``scheduler_run_state_changed``, and ``scheduler_run_completed`` for
every terminal status) fire after commit, in the process that committed: open the
outermost write transaction with ``committing(store, hooks)``; transitions made in it
(also from nested ``committing`` blocks) are queued on it and fired once it committed,
never when it rolled back. ``hooks=None`` means the process's default observers
(``scheduler.core.observers``: the composition root installs the entry-point hook modules,
built only when there is something to tell), so a CLI ``runs cancel`` of a pending run
notifies that process's observers just like the dispatcher does for its runs.

Modules: ``commit`` (``committing`` and the after-commit notices), ``dispatches``, ``runs``
(the recovery transitions too), ``approvals``, ``pending_work`` (``cancel_pending_work``).
Callers use the names this package exports.
"""

from __future__ import annotations

from scheduler.core.transitions.approvals import (
    decide_approval,
    dispatch_approved_run,
    escalate_run,
    open_approval_gate,
)
from scheduler.core.transitions.commit import AfterCommit, RunNotice, committing
from scheduler.core.transitions.dispatches import (
    batched_finishes,
    cancel_dispatch,
    claim_dispatch,
    dispatch_row,
    finish_dispatch,
    insert_dispatch,
    release_expired_claims,
)
from scheduler.core.transitions.pending_work import CancelledWork, cancel_pending_work
from scheduler.core.transitions.runs import (
    NewRun,
    block_recovery,
    cancel_waiting_run,
    claim_and_start_many,
    crash_run,
    fail_completion,
    fenced_update,
    finish_run,
    record_skipped,
    request_cancel,
    run_row,
    start_run,
)

__all__ = [
    "AfterCommit",
    "CancelledWork",
    "NewRun",
    "RunNotice",
    "batched_finishes",
    "block_recovery",
    "cancel_dispatch",
    "cancel_pending_work",
    "cancel_waiting_run",
    "claim_and_start_many",
    "claim_dispatch",
    "committing",
    "crash_run",
    "decide_approval",
    "dispatch_approved_run",
    "dispatch_row",
    "escalate_run",
    "fail_completion",
    "fenced_update",
    "finish_dispatch",
    "finish_run",
    "insert_dispatch",
    "open_approval_gate",
    "record_skipped",
    "release_expired_claims",
    "request_cancel",
    "run_row",
    "start_run",
]
