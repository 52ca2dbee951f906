"""Typed rows: the jobs, runs, dispatches, approvals and outbox parts core and the pipeline pass around.

A row is read as the mapping the store returns (``Tx.one`` / ``Tx.all``) and turned into its
class once, at the read (``from_row``): from there on it travels as typed attributes, not as an
untyped mapping. Each class has one field per column of its table, in schema order
(``scheduler.core.store.schema_runs`` / ``schema_records`` define them; a test holds the two
together): TEXT is ``str``, INT, BIGINT and the 0/1 flags are ``int``, a nullable column is
``... | None``, and a JSON column stays the text it is stored as (the spec parses it:
``scheduler.core.spec.spec_from_row``). A column the read did not select is None.

The classes are frozen, and ``from_row`` fills a new instance's ``__dict__`` in one C-level call
instead of running the generated ``__init__`` (a frozen ``__init__`` sets each of a job row's 72
fields through ``object.__setattr__``: about 500 bytecodes and 5 µs per row, and the dispatcher
builds two job rows, a run row, a dispatch row and a counted job per run on its hot path,
``bench/throughput``). That is why they keep a ``__dict__`` rather than slots; the values are the
store's, already checked by its schema, and the classes have no validators or converters to skip.
``to_dict`` gives the mapping back where a row leaves typed code (a JSON view, a caller that takes
a mapping); ``get`` answers as that mapping would, for the callers still reading rows by key.

The JSON aliases name what is a document rather than a row: an options object, a stored JSON
column once parsed, an event's data, a JSON view (``JSONObject``), and what a column holds (``SQLValue``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Self, TypeAlias

import attrs

#: A JSON scalar.
JSONScalar: TypeAlias = bool | int | float | str | None
#: Any JSON value (what ``json.loads`` returns).
JSONValue: TypeAlias = "JSONScalar | list[JSONValue] | dict[str, JSONValue]"
#: A JSON object: a document (options, a parsed JSON column, event data, a JSON view), not a row.
JSONObject: TypeAlias = "dict[str, JSONValue]"
#: What one column of a row holds.
SQLValue: TypeAlias = str | int | float | bytes | None

#: Field names per row class, in schema (and ``__init__``) order.
_NAMES: dict[type, tuple[str, ...]] = {}
_NAME_SETS: dict[type, frozenset[str]] = {}
#: Per row class, every field None (what ``from_row`` starts a row of some of the columns from).
_NONES: dict[type, dict[str, None]] = {}
#: Per row class, one C-level read of every field in schema order (``to_dict``).
_READ_ALL: dict[type, Callable[[object], tuple[SQLValue, ...]]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(a.name for a in attrs.fields(cls))
        _NAME_SETS[cls] = frozenset(names)
        _NONES[cls] = dict.fromkeys(names)
        _READ_ALL[cls] = attrgetter(*names)
    return names


class Row:
    """What every row class does: built from a mapping, given back as one."""

    __slots__ = ()

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> Self:
        """The row a read returned, as this class (a column the read did not select is None; other keys are ignored)."""
        names = _NAMES.get(cls) or _names(cls)
        made = object.__new__(cls)
        values = made.__dict__
        # One or two C-level fills (see the module docstring): a whole row (``SELECT *``, ``RETURNING *``) as it is,
        # a row of some of the columns over every field None, anything else (other keys too) column by column.
        if len(row) == len(names) and row.keys() == _NAME_SETS[cls]:
            values.update(row)
        elif row.keys() <= _NAME_SETS[cls]:
            values.update(_NONES[cls])
            values.update(row)
        else:
            values.update(zip(names, map(row.get, names), strict=True))
        return made

    def to_dict(self) -> dict[str, SQLValue]:
        """The row as the store returns it: column name to value, in schema order."""
        names = _names(type(self))
        return dict(zip(names, _READ_ALL[type(self)](self), strict=True))

    def get(self, column: str, default: object = None) -> object:
        """``row.get(column, default)`` of the mapping this row was built from (for callers not yet on attributes)."""
        _names(type(self))
        return getattr(self, column) if column in _NAME_SETS[type(self)] else default


@attrs.frozen(slots=False)
class JobRow(Row):
    """A ``jobs`` row: the job's spec columns (JSON ones as their stored text) and its runtime bookkeeping."""

    id: str
    name: str
    description: str | None
    enabled: int
    job_type: str
    provenance: str
    schedule_kind: str
    schedule_cron: str | None
    schedule_every: str | None
    schedule_at: int | None
    schedule_tz: str
    dst_gap_policy: str
    dst_fold_policy: str
    misfire_policy: str
    allow_past_at: int
    session_target: str
    executor: str | None
    executor_options: str
    delivery_options: str
    notify: int
    constraints: str
    payload_message: str
    run_timeout_ms: int
    max_retries: int
    retry_backoff_ms: int
    overlap_policy: str
    queue_limit: int
    max_consecutive_failures: int
    delivery_guarantee: str
    parent_id: str | None
    trigger_on: str | None
    trigger_delay_s: int
    trigger_condition: str | None
    delivery_mode: str
    delivery_channel: str | None
    delivery_to: str | None
    output_format: str
    verify_shell: str | None
    verify_timeout_s: int
    verify_on_failure: str
    approval_required: int
    approval_timeout_s: int
    approval_timeout_action: str
    approval_risk_level: str
    approval_approver_scope: str | None
    watchdog_alert_channel: str | None
    watchdog_alert_to: str | None
    watchdog_self_destruct: int
    identity: str | None
    credentials: str
    child_credential_policy: str
    evidence: str | None
    evidence_ref: str | None
    authorization_ref: str | None
    authorization: str | None
    authorization_proof: str | None
    retention: str | None
    artifact_digest: str | None
    handoff_version: int | None
    effective_task_hash: str | None
    created_at: int
    updated_at: int
    next_run_at: int | None
    schedule_anchor_at: int | None
    last_run_at: int | None
    last_status: str | None
    last_error: str | None
    last_duration_ms: int | None
    run_count: int
    consecutive_failures: int
    paused_at: int | None
    paused_reason: str | None



@attrs.frozen(slots=False)
class RunRow(Row):
    """A ``runs`` row: one attempt to execute a job."""

    id: str
    job_id: str
    dispatch_id: str | None
    dispatch_kind: str | None
    status: str
    attempt: int
    scheduled_for: int | None
    created_at: int
    started_at: int | None
    finished_at: int | None
    terminal_at: int | None
    duration_ms: int | None
    dispatcher_owner: str | None
    dispatcher_token: int | None
    parent_run_id: str | None
    retry_of_run_id: str | None
    replay_of_run_id: str | None
    delivery_guarantee: str
    executor: str | None
    exit_code: int | None
    error_code: str | None
    error_message: str | None
    skip_reason: str | None
    summary: str | None
    executor_handle: str | None
    process_state: str | None
    process_terminated_at: int | None
    process_signal: str | None
    cancel_requested_at: int | None
    cancel_requested_by: str | None
    cancel_reason: str | None
    agent_abort_requested_at: int | None
    agent_abort_outcome: str | None
    stdout_excerpt: str | None
    stderr_excerpt: str | None
    stdout_bytes: int | None
    stderr_bytes: int | None
    stdout_sha256: str | None
    stderr_sha256: str | None
    stdout_artifact: str | None
    stderr_artifact: str | None
    stdout_truncated: int
    stderr_truncated: int
    output_format: str | None
    output_valid: int | None
    output_warning: str | None
    output_bytes: int | None
    output_sha256: str | None
    output_parsed: str | None
    output_artifact: str | None
    verify_status: str | None
    verify_json: str | None
    env_policy_warning: str | None
    usage_json: str | None
    identity_json: str | None
    trust_level: str | None
    principal: str | None
    delegation_json: str | None
    governance_json: str | None
    credentials_json: str | None
    authorization_json: str | None
    proof_json: str | None
    evidence_status: str | None
    artifact_digest: str | None
    source_run_id: str | None
    source_artifact_digest: str | None



@attrs.frozen(slots=False)
class DispatchRow(Row):
    """A ``job_dispatch_queue`` row: one unit of due work (a slot, a manual run, a retry, a chain trigger)."""

    id: str
    job_id: str
    kind: str
    status: str
    due_at: int
    created_at: int
    updated_at: int
    claim_owner: str | None
    claim_token: str | None
    claim_fence: int | None
    claim_expires_at: int | None
    attempts: int
    replay_count: int
    last_error: str | None
    run_id: str | None
    source_run_id: str | None
    requested_by: str | None
    cancel_reason: str | None
    artifact_digest: str | None
    source_artifact_digest: str | None



@attrs.frozen(slots=False)
class ApprovalRow(Row):
    """An ``approvals`` row: one gate a run waits at, versioned, bound to the run's artifact."""

    id: str
    job_id: str
    run_id: str | None
    dispatch_id: str | None
    gate_kind: str
    status: str
    version: int
    risk_level: str
    approver_scope: str | None
    timeout_action: str
    requested_at: int
    expires_at: int | None
    decided_by: str | None
    decided_uid: int | None
    note: str | None
    decision_reason: str | None
    approved_at: int | None
    rejected_at: int | None
    cancelled_at: int | None
    timed_out_at: int | None
    dispatched_at: int | None
    proof_not_before: int | None
    proof_expires_at: int | None
    proof_clock_skew_ms: int | None
    artifact_digest: str
    source_run_id: str | None
    source_artifact_digest: str | None



@attrs.frozen(slots=False)
class OutboxPartRow(Row):
    """A ``delivery_outbox`` row: one part of one message to a channel."""

    id: str
    run_id: str | None
    job_id: str | None
    channel: str
    target: str | None
    idempotency_key: str
    group_key: str
    part_index: int
    part_count: int
    body: str
    status: str
    attempts: int
    max_attempts: int
    due_at: int
    claim_owner: str | None
    claim_token: str | None
    claim_expires_at: int | None
    last_error: str | None
    error_code: str | None
    last_attempt_at: int | None
    receipt_id: str | None
    receipt_json: str | None
    delivered_at: int | None
    created_at: int
    updated_at: int


@attrs.frozen(slots=False)
class CompletionDebtRow(Row):
    """A ``completion_debts`` row: who owns a run's completion delivery until every part of it is settled."""

    id: str
    #: The job's id (stable across renames; views add its name).
    task_label: str
    #: The job's session target (``shell``, ``isolated``, ``main``): the session the completion belongs to.
    session_key: str
    run_id: str
    status: str
    outbox_group: str | None
    claim_owner: str | None
    created_at: int
    updated_at: int


def json_object(value: object) -> JSONObject:
    """``value`` when it is a JSON object, else an empty one (reading an optional part of a document)."""
    return value if isinstance(value, dict) else {}
