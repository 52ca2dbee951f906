"""Reading the scheduler as the CLI shows it: jobs, runs, approvals and delivery parts, as JSON-ready dicts.

One function per read command (``jobs list``, ``jobs get``, ``jobs next``, ``runs list``, ``runs get``,
``runs events``, ``runs output``, ``runs evidence``, ``approvals list``, ``approvals show``, ``deliveries list``, ``deliveries show``, ``queue list``,
``queue show``): the CLI prints
what it returns under ``--json`` (or renders it as a table) and ``scheduler.api.ops`` hands the
same value to plugins, so there is one way to read each thing. Every function takes an open
store, checks its arguments as the CLI's options do (``INVALID_ARGUMENT``), and reads in one
read transaction. A job is named by id or name, a run, an approval or a part by id or a unique
prefix, a dispatch by id or a unique prefix or suffix; an unknown one is ``NOT_FOUND``.
"""

from __future__ import annotations

import base64
from typing import Any, cast

from scheduler.approvals.decisions import approval_to_json
from scheduler.approvals.decisions import get_approval as approval_row
from scheduler.approvals.decisions import list_approvals as approval_rows
from scheduler.artifacts.handoff import hydrate
from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import RUN_REF_MIN, SHORT_RUN_ID_LENGTH
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.events import event_to_json
from scheduler.core.id_refs import ids_with_end
from scheduler.core.jobs import JOB_STATES, check_job_state, job_to_json, resolve_job
from scheduler.core.jobs import list_jobs as job_rows
from scheduler.core.outputs import read_stream
from scheduler.core.rows import DispatchRow, JSONObject, JSONValue, RunRow
from scheduler.core.runs import RUN_STATUSES, TERMINAL, run_to_json
from scheduler.core.runs import get_run as run_row
from scheduler.core.runs import list_runs as run_rows
from scheduler.core.schedules import describe_fire, next_fires
from scheduler.core.spec import spec_from_row
from scheduler.core.store import default_artifacts_root
from scheduler.core.store.base import Store, Tx
from scheduler.delivery.outbox import STATUSES as DELIVERY_STATUSES
from scheduler.delivery.outbox import get_part, list_parts, part_to_json
from scheduler.evidence.verify import check_parsed_output, verify_run

__all__ = [
    "DELIVERY_STATUSES",
    "DISPATCH_STATUSES",
    "JOB_STATES",
    "MAX_LIMIT",
    "RUN_STATUSES",
    "check_job_state",
    "check_limit",
    "check_run_status",
    "evidence_run_id",
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
    "output_view",
    "resolve_run",
    "run_events",
    "run_output",
    "verify_evidence",
]

#: The largest ``--limit`` a listing takes (the CLI's ``AsciiIntRange(1, MAX_LIMIT)``).
MAX_LIMIT = 100_000
#: The most fire times ``next_runs`` gives (``jobs next -n``).
MAX_NEXT_RUNS = 1000


def check_limit(limit: int | None, *, optional: bool = False) -> None:
    """``INVALID_ARGUMENT`` unless ``limit`` is an integer in 1..MAX_LIMIT (None too when ``optional``): the CLI's ``--limit``."""
    if limit is None and optional:
        return
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise SchedulerError("INVALID_ARGUMENT", f"limit must be an integer from 1 to {MAX_LIMIT} (got {limit!r})")


def _job_id(tx: Tx, job: str | None) -> str | None:
    """The id of the job named ``job`` (id or name), None for no job filter; ``NOT_FOUND`` for an unknown job."""
    return resolve_job(tx, job).id if job is not None else None


def list_jobs(store: Store, *, enabled: bool | None = None, state: str | None = None, limit: int | None = None,
              include_handoff_artifacts: bool = False) -> list[dict[str, Any]]:
    """``jobs list``: every job by name, each with its ``state`` and ``next_run_at`` (``job_to_json``).

    ``enabled`` True or False keeps only jobs whose enabled flag is set or not (a ``done``
    one-shot keeps its flag); ``state`` keeps only jobs in that state (one of ``JOB_STATES``,
    else ``INVALID_ARGUMENT``); ``include_handoff_artifacts`` adds each handoff v4 job's
    artifact payload, re-validated, and any bad artifact fails the whole listing (so none is
    shown unproved).
    """
    check_limit(limit, optional=True)
    check_job_state(state)
    with store.read() as tx:
        rows = job_rows(tx, enabled=enabled, state=state, limit=limit)
        views = [job_to_json(r) for r in rows]
        if include_handoff_artifacts:
            for row, view in zip(rows, views, strict=True):
                if row.handoff_version == 4:
                    view["handoff_artifact_payload"] = hydrate(tx, row)
    return views


def get_job(store: Store, job: str) -> dict[str, Any]:
    """``jobs get``: one job (by id or name) as ``job_to_json`` shows it."""
    with store.read() as tx:
        return job_to_json(resolve_job(tx, job))


def next_runs(store: Store, job: str, count: int = 5) -> dict[str, Any]:
    """``jobs next``: the job's next ``count`` fire times in its zone, each with its UTC offset (``describe_fire``).

    They start at the job's stored ``next_run_at`` when it has one, else (a paused cron or interval
    job) at now; a job that never fires again has none. Past year 9999 is ``OUT_OF_RANGE``.
    """
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_NEXT_RUNS:
        raise SchedulerError("INVALID_ARGUMENT", f"count must be an integer from 1 to {MAX_NEXT_RUNS} (got {count!r})")
    with store.read() as tx:
        row = resolve_job(tx, job)
    spec = spec_from_row(row)
    start = row.next_run_at
    fires: list[int] = []
    try:
        if start is not None:
            fires = [start] + next_fires(spec.schedule(), start, count - 1, anchor_ms=row.schedule_anchor_at) if count > 1 else [start]
        elif spec.schedule_kind in ("cron", "every"):
            fires = next_fires(spec.schedule(), now_ms(), count, anchor_ms=row.schedule_anchor_at)
        views = [describe_fire(ms, spec.schedule_tz) for ms in fires[:count]]
    except (OverflowError, ValueError) as exc:  # fire times past year 9999
        raise SchedulerError("OUT_OF_RANGE", f"the next {count} fire times run past 9999-12-31T23:59:59Z ({exc})") from None
    return {"job_id": row.id, "fires": views}


def resolve_run(tx: Tx, ref: str) -> RunRow:
    """A run row by full id or a unique prefix or suffix of at least ``RUN_REF_MIN`` (6) characters: what every
    ``runs`` command takes, and the listings' short form (a run id's last 8 characters, ``short_run_id``) among them.

    ``INVALID_ARGUMENT`` for a piece two runs share (the first characters of runs made within the same minute, say),
    ``NOT_FOUND`` for no run.
    """
    row = tx.one("SELECT * FROM runs WHERE id = ?", (ref,))
    if row is None and len(ref) >= RUN_REF_MIN and all(c in "0123456789abcdef-" for c in ref):
        matches = ids_with_end(tx, "runs", ref, limit=2)
        if len(matches) > 1:
            raise SchedulerError("INVALID_ARGUMENT", f"run id prefix or suffix {ref!r} is ambiguous: give more of the id "
                                 f"(its last {SHORT_RUN_ID_LENGTH} characters, as listings show it, or the whole id)")
        if matches:
            row = tx.one("SELECT * FROM runs WHERE id = ?", (matches[0],))
    return RunRow.from_row(row) if row is not None else run_row(tx, ref)


def check_run_status(status: str | None) -> None:
    """``INVALID_ARGUMENT`` for a status no run has (an empty one too: it is a mistake, not "no filter")."""
    if status is not None and status not in RUN_STATUSES:
        raise SchedulerError("INVALID_ARGUMENT", f"unknown run status {status!r}; one of {', '.join(RUN_STATUSES)}")


def list_runs(store: Store, *, job: str | None = None, status: str | None = None, limit: int = 20,
              before: str | None = None, since_ms: int | None = None, until_ms: int | None = None) -> list[dict[str, Any]]:
    """``runs list``: recent runs, newest first, of one job (id or name) when given, of one status when given.

    An unknown status is ``INVALID_ARGUMENT`` (``check_run_status``). Beyond the CLI's options,
    for a paging reader such as the web view: ``before`` (a run id or a unique prefix or suffix) gives the
    page after that run (a keyset cursor: the runs created before it), ``since_ms`` / ``until_ms``
    (epoch milliseconds) the runs created in ``[since_ms, until_ms)``.
    """
    check_limit(limit)
    check_run_status(status)
    with store.read() as tx:
        cursor = None
        if before is not None:
            last = resolve_run(tx, before)
            cursor = (last.created_at, last.id)
        rows = run_rows(tx, job_id=_job_id(tx, job), status=status, limit=limit, before=cursor, since_ms=since_ms,
                        until_ms=until_ms)
    return [run_to_json(r) for r in rows]


def job_names(store: Store) -> dict[str, str]:
    """Every job's name by id (``runs list`` names the job of each run in its table)."""
    with store.read() as tx:
        return {r["id"]: r["name"] for r in tx.all("SELECT id, name FROM jobs")}


def get_run(store: Store, run: str) -> dict[str, Any]:
    """``runs get``: everything recorded about one run (id or a unique prefix or suffix), ``run_to_json(full=True)``.

    The parsed structured output is checked against the digest the run's evidence payload binds
    before it is shown (``scheduler.evidence.verify.check_parsed_output``): ``output_parsed_verified``
    says whether evidence binds it, and a value that contradicts it is ``OUTPUT_TAMPERED`` (nothing shown).
    """
    with store.read() as tx:
        row = resolve_run(tx, run)
        bound = check_parsed_output(tx, row.id, row.output_parsed)
        view = run_to_json(row, full=True)
    view["output_parsed_verified"] = bound
    return view


def run_events(store: Store, run: str) -> list[dict[str, Any]]:
    """``runs events``: the audit trail of one run (id or a unique prefix or suffix), oldest first (``event_to_json``)."""
    with store.read() as tx:
        row = resolve_run(tx, run)
        return [event_to_json(e) for e in tx.all("SELECT * FROM runtime_events WHERE run_id = ? ORDER BY id", (row.id,))]


def output_view(run: RunRow, streams: tuple[str, ...], datas: dict[str, bytes], *, both: bool) -> dict[str, Any]:
    """The ``--json`` answer of ``runs output``: one stream (with the other's size) or, with ``both``, each.

    Text is given as ``utf-8`` or, when a stream is not UTF-8, as ``base64``; with the run's
    status and whether it has ended (``complete``).
    """
    def one(s: str) -> JSONObject:
        data = datas[s]
        try:
            content, encoding = data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            content, encoding = base64.b64encode(data).decode("ascii"), "base64"
        return {"bytes": len(data), "sha256": cast("JSONValue", run.get(f"{s}_sha256")),
                "offloaded": bool(run.get(f"{s}_artifact")), "encoding": encoding, "content": content}

    state: JSONObject = {"run_status": run.status, "complete": run.status in TERMINAL}
    if both:
        return {"run_id": run.id, **state, "streams": {s: one(s) for s in streams}}
    (s,) = streams
    other = "stderr" if s == "stdout" else "stdout"
    return {"run_id": run.id, "stream": s, **one(s), **state,
            "other": {"stream": other, "bytes": cast("JSONValue", run.get(f"{other}_bytes"))}}


def run_output(store: Store, run: str) -> dict[str, Any]:
    """``runs output RUN --both``: both streams of one run, each verified against its recorded size and SHA-256
    (``read_stream``: a changed row or file is ``ARTIFACT_TAMPERED``, never shown); empty until the run has ended."""
    with store.read() as tx:
        row = resolve_run(tx, run)
    root = default_artifacts_root(store.local_path)
    streams = ("stdout", "stderr")
    datas = {s: read_stream(root, row, s) if row.status in TERMINAL else b"" for s in streams}
    return output_view(row, streams, datas, both=True)


def evidence_run_id(store: Store, ref: str) -> str:
    """The full run id ``runs evidence`` works on: a run (id or a unique prefix or suffix), else a pruned run's evidence row."""
    with store.read() as tx:
        try:
            return resolve_run(tx, ref).id
        except SchedulerError as exc:
            if exc.code != "NOT_FOUND":
                raise
            if tx.one("SELECT run_id FROM evidence_records WHERE run_id = ?", (ref,)) is not None:
                return ref
            if tx.one("SELECT run_id FROM run_tombstones WHERE run_id = ?", (ref,)) is not None:
                return ref
            raise


def verify_evidence(store: Store, run: str) -> dict[str, Any]:
    """``runs evidence RUN``: re-verify one run's evidence from history alone (``verify_run``); the verdict.

    A failed check raises its ``EVIDENCE_*`` code (``EvidenceCheck.error``: the details name the
    check that failed), as the command exits non-zero with it.
    """
    check = verify_run(store, evidence_run_id(store, run))
    if not check.verified:
        raise check.error()
    return {k: v for k, v in check.to_json().items() if k != "ok"}


def list_approvals(store: Store, *, pending: bool = False, job: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """``approvals list``: approvals newest first; only those waiting for a decision with ``pending``, of one job when given."""
    check_limit(limit)
    with store.read() as tx:
        return [approval_to_json(r) for r in approval_rows(tx, pending=pending, job_id=_job_id(tx, job), limit=limit)]


def get_approval(store: Store, approval: str) -> dict[str, Any]:
    """``approvals show``: one approval (id or a unique prefix or suffix of at least 8 characters)."""
    with store.read() as tx:
        return approval_to_json(approval_row(tx, approval))


def list_deliveries(store: Store, *, status: str | None = None, job: str | None = None, run: str | None = None,
                    limit: int = 100) -> list[dict[str, Any]]:
    """``deliveries list``: outbox parts newest first, with state, attempts and last error (``part_to_json``).

    Filters: ``status`` (one of ``DELIVERY_STATUSES``), ``job`` (id or name) and, beyond the
    CLI's options, ``run`` (id or a unique prefix or suffix): the parts of that run's messages.
    """
    check_limit(limit)
    if status is not None and status not in DELIVERY_STATUSES:
        raise SchedulerError("INVALID_ARGUMENT", f"unknown delivery status {status!r}; one of {', '.join(DELIVERY_STATUSES)}")
    with store.read() as tx:
        job_id = _job_id(tx, job)
        run_id = resolve_run(tx, run).id if run is not None else None
        rows = list_parts(tx, status=status, job_id=job_id, run_id=run_id, limit=limit)
        return [part_to_json(r) for r in rows]


def get_delivery(store: Store, part: str) -> dict[str, Any]:
    """``deliveries show``: one outbox part (id or a unique prefix or suffix) with its body and receipt."""
    with store.read() as tx:
        return part_to_json(get_part(tx, part), full=True)


#: Every status of a dispatch row (``job_dispatch_queue.status``), as ``queue list --status`` takes them.
DISPATCH_STATUSES = ("pending", "claimed", "awaiting_approval", "done", "cancelled", "failed")
#: The shortest dispatch id prefix or suffix ``resolve_dispatch`` accepts.
DISPATCH_REF_MIN = 8
_DISPATCH_SELECT = "SELECT d.*, j.name AS job_name FROM job_dispatch_queue d LEFT JOIN jobs j ON j.id = d.job_id"
#: Where an event carrying an error keeps it: ``dispatch.claim_released`` (the attempt's last error),
#: ``run.completion_failed`` (the completion's failure); ``run.finished`` keeps its ``error_code``.
_ERROR_KEYS = ("last_error", "error")


def dispatch_to_json(row: DispatchRow, job_name: str | None, *, now: int) -> JSONObject:
    """The JSON view of a dispatch row: instants as ISO-8601, the claim's owner and whether it has expired.

    The claim token and fencing token stay out: they are the claiming dispatcher's, not
    something a reader acts on. ``claim_expired`` is true for a ``claimed`` row whose claim
    ran out (recovery returns it to ``pending`` when no run of it is active).
    """
    return {
        "id": row.id, "job_id": row.job_id, "job_name": job_name, "kind": row.kind, "status": row.status,
        "due_at": to_iso(row.due_at), "created_at": to_iso(row.created_at), "updated_at": to_iso(row.updated_at),
        "attempts": row.attempts, "replay_count": row.replay_count, "claim_owner": row.claim_owner,
        "claim_expires_at": to_iso(row.claim_expires_at),
        "claim_expired": row.status == "claimed" and row.claim_expires_at is not None and row.claim_expires_at <= now,
        "last_error": row.last_error, "run_id": row.run_id, "source_run_id": row.source_run_id,
        "requested_by": row.requested_by, "cancel_reason": row.cancel_reason, "artifact_digest": row.artifact_digest,
    }


def resolve_dispatch(tx: Tx, ref: str) -> tuple[DispatchRow, str | None]:
    """A dispatch row and its job's name, by full id or a unique prefix or suffix of at least 8 characters.

    ``queue list`` shows each id's last 28 characters, which ``queue show`` takes back as a
    suffix. ``INVALID_ARGUMENT`` when two dispatches share the prefix or suffix, ``NOT_FOUND`` for none.
    """
    row = tx.one(f"{_DISPATCH_SELECT} WHERE d.id = ?", (ref,))
    if row is None and len(ref) >= DISPATCH_REF_MIN:
        matches = ids_with_end(tx, "job_dispatch_queue", ref)
        if len(matches) > 1:
            raise SchedulerError("INVALID_ARGUMENT", f"dispatch id prefix or suffix {ref!r} is ambiguous")
        row = tx.one(f"{_DISPATCH_SELECT} WHERE d.id = ?", (matches[0],)) if matches else None
    if row is None:
        raise SchedulerError("NOT_FOUND", f"Dispatch not found: {ref}")
    return DispatchRow.from_row(row), row["job_name"]


def list_queue(store: Store, *, status: str | None = None, job: str | None = None, limit: int = 100) -> list[JSONObject]:
    """``queue list``: dispatch rows, latest due first, with attempts, claim and last error (``dispatch_to_json``).

    Filters: ``status`` (one of ``DISPATCH_STATUSES``; unknown is ``INVALID_ARGUMENT``) and
    ``job`` (id or name; unknown is ``NOT_FOUND``).
    """
    check_limit(limit)
    if status is not None and status not in DISPATCH_STATUSES:
        raise SchedulerError("INVALID_ARGUMENT", f"unknown dispatch status {status!r}; one of {', '.join(DISPATCH_STATUSES)}")
    now = now_ms()
    with store.read() as tx:
        job_id = _job_id(tx, job)
        sql, params = f"{_DISPATCH_SELECT} WHERE 1 = 1", []
        if status is not None:
            sql += " AND d.status = ?"
            params.append(status)
        if job_id is not None:
            sql += " AND d.job_id = ?"
            params.append(job_id)
        rows = tx.all(sql + " ORDER BY d.due_at DESC, d.id DESC LIMIT ?", [*params, limit])
    return [dispatch_to_json(DispatchRow.from_row(r), r["job_name"], now=now) for r in rows]


def _error_of(event: JSONObject) -> JSONObject | None:
    """The error an event of a dispatch records (``kind``, ``at``, ``run_id``, ``attempts``, ``error``), or None."""
    data = event["data"] if isinstance(event["data"], dict) else {}
    error = next((data[k] for k in _ERROR_KEYS if data.get(k)), None)
    if error is None and event["kind"] == "run.finished" and data.get("status") != "ok":
        error = data.get("error_code")
    if not error:
        return None
    return {"at": event["at"], "kind": event["kind"], "run_id": event["run_id"], "attempts": data.get("attempts"),
            "error": error}


#: Every event of a dispatch: those of its runs (``runs_dispatch_idx``, then ``runtime_events_run_idx``) and those
#: naming it and no run (``runtime_events_dispatch_idx``), of its job, oldest first. An event names the run it is about
#: and that run's own dispatch, so the two halves are every event naming the dispatch (schema 13 dropped the
#: job-and-time index this read once went through, which every run event wrote).
_DISPATCH_EVENTS_SQL = (
    "SELECT * FROM runtime_events WHERE run_id IN (SELECT id FROM runs WHERE dispatch_id = ?) AND dispatch_id = ?"
    " AND job_id = ?"
    " UNION ALL SELECT * FROM runtime_events WHERE run_id IS NULL AND dispatch_id = ? AND job_id = ? ORDER BY id"
)


def get_dispatch(store: Store, dispatch: str) -> JSONObject:
    """``queue show``: one dispatch (id or unique prefix or suffix) with its events and its error history.

    ``events`` are every runtime event naming the dispatch, oldest first (``dispatch.*`` and
    the ``run.*`` / ``approval.*`` events of its runs); ``errors`` are those that record an
    error, so an attempt's error survives a later attempt overwriting ``last_error``.
    """
    now = now_ms()
    with store.read() as tx:
        row, job_name = resolve_dispatch(tx, dispatch)
        events = [event_to_json(e) for e in tx.all(_DISPATCH_EVENTS_SQL, (row.id, row.id, row.job_id, row.id, row.job_id))]
    view = dispatch_to_json(row, job_name, now=now)
    errors: list[JSONValue] = [e for e in map(_error_of, events) if e is not None]
    view["events"], view["errors"] = [*events], errors
    return view
