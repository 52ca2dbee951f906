"""Jobs as code: ``scheduler apply`` (make the stored jobs match a file) and ``scheduler export``.

A job file is TOML (an array of tables ``[[jobs]]``) or JSON (``{"jobs": [...]}`` or a plain
array); a directory holds several (``*.toml`` and ``*.json``, read in name order). Each job is
a job spec exactly as ``jobs add`` takes it, validated the same way; jobs are matched to the
stored ones by ``name``. The field catalogue is read from ``scheduler.core.spec`` (``SPEC_FIELDS``,
``spec_to_input``), so every spec field flows through apply and export without a list here.

``apply`` works out a plan (create, update, unchanged, prune) and carries it out in ONE
transaction through the ordinary job paths (``create_jobs``, ``update_job``, ``set_enabled``,
``delete_job``): an update that changes a job's execution contract binds a new artifact and
cancels the work bound to the old one, exactly as ``jobs update`` does. Any refusal rolls
the whole apply back. ``export`` writes the stored jobs with only their non-default fields,
chain parents by name, so export followed by apply changes nothing. An apply that would leave
more jobs than ``[jobs] max_jobs`` (counted once, after pruning) is refused whole (``JOB_LIMIT_REACHED``).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import tomli_w

from scheduler.artifacts.handoff import SUBMISSION_FIELDS, hydrate, split_submission, submission_fields
from scheduler.base.errors import SchedulerError
from scheduler.base.json_document import MAX_INPUT_BYTES, parse_json_document
from scheduler.base.timeutil import now_ms
from scheduler.core import state
from scheduler.core.jobs import check_job_cap, create_jobs, delete_job, set_enabled, update_job
from scheduler.core.spec import SPEC_FIELD_NAMES, SPEC_FIELDS, _default, spec_from_row, spec_to_input, validate_spec
from scheduler.core.store.base import Store, Tx
from scheduler.core.transitions import committing

#: Top-level keys a job file may hold besides its jobs.
_FILE_KEYS = frozenset({"jobs", "version"})
#: The document version ``export`` writes (and ``apply`` accepts).
FILE_VERSION = 1
#: The spec fields that do not change through ``update_job`` (``set_enabled`` handles them).
_STATE_FIELDS = ("enabled",)
#: The job-file key (not a spec field) that marks a one-shot whose one slot was taken where it was exported.
DONE_KEY = "done"


@attrs.frozen
class DesiredJob:
    """One job of a job file: the raw object (for messages), its validated spec and handoff submission.

    ``done`` is the file's ``done = true``: a one-shot that already took its slot (``export``
    writes it), created without a next run so it never fires again on this host.
    """

    file: str
    index: int
    spec: Any
    submission: Any
    raw: dict[str, Any]
    done: bool = False

    def where(self) -> dict[str, Any]:
        """``{file, index, job}``: what every message about this job names."""
        return {"file": self.file, "index": self.index, "job": self.spec.name}


@attrs.define
class Action:
    """One line of an apply plan: ``create``, ``update``, ``unchanged`` or ``prune`` (disable/delete)."""

    action: str
    name: str
    file: str | None = None
    job_id: str | None = None
    changes: list[dict[str, Any]] = attrs.Factory(list)
    prune: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON view of the action (``changes`` as ``{field, old, new}``)."""
        out: dict[str, Any] = {"action": self.action, "name": self.name, "file": self.file, "job_id": self.job_id,
                               "changes": self.changes}
        if self.prune is not None:
            out["prune"] = self.prune
        return out


# --------------------------------------------------------------------------- reading job files


def read_sources(path: str) -> list[tuple[str, list[Any]]]:
    """``[(file name, job objects)]`` of a job file or of every ``*.toml``/``*.json`` in a directory.

    ``APPLY_SOURCE_INVALID`` when the path is missing, a directory holds no job file, or a file
    is not a list of job objects; ``INVALID_JSON`` / ``INVALID_TOML`` when a file does not parse.
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in (".toml", ".json"))
        if not files:
            raise SchedulerError("APPLY_SOURCE_INVALID", f"{path}: the directory holds no *.toml or *.json job file")
    elif p.is_file():
        files = [p]
    else:
        raise SchedulerError("APPLY_SOURCE_INVALID", f"{path}: no such file or directory")
    return [(str(f), _read_file(f)) for f in files]


def _read_file(f: Path) -> list[Any]:
    """The job objects of one file (TOML by a ``.toml`` suffix, JSON otherwise)."""
    try:
        raw = f.read_bytes()
    except OSError as exc:
        raise SchedulerError("PAYLOAD_READ_FAILED", f"cannot read {f}: {exc.strerror or exc}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise SchedulerError("PAYLOAD_TOO_LARGE", f"{f} is larger than {MAX_INPUT_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SchedulerError("PAYLOAD_READ_FAILED", f"{f} is not UTF-8 text") from None
    if f.suffix == ".toml":
        try:
            doc: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SchedulerError("INVALID_TOML", f"{f} is not valid TOML: {exc}") from None
    else:
        try:
            doc = parse_json_document(text, what=str(f))
        except SchedulerError as exc:
            if exc.details:
                exc.details = [{**d, "file": str(f)} for d in exc.details]
            raise
    if isinstance(doc, list):
        return doc
    if not isinstance(doc, dict):
        raise SchedulerError("APPLY_SOURCE_INVALID", f"{f}: expected {{\"jobs\": [...]}} or an array of job specs")
    unknown = sorted(set(doc) - _FILE_KEYS)
    if unknown:
        raise SchedulerError("APPLY_SOURCE_INVALID", f"{f}: unknown top-level key(s) {', '.join(map(repr, unknown))}"
                             " (a job file holds `jobs` and optionally `version`)")
    if "version" in doc and doc["version"] != FILE_VERSION:
        raise SchedulerError("APPLY_SOURCE_INVALID", f"{f}: version {doc['version']!r} is not supported (this scheduler reads 1)")
    jobs = doc.get("jobs", [])
    if not isinstance(jobs, list):
        raise SchedulerError("APPLY_SOURCE_INVALID", f"{f}: `jobs` must be an array of job specs")
    return jobs


def validate_sources(sources: list[tuple[str, list[Any]]]) -> list[DesiredJob]:
    """Validate every job of every file as ``jobs add`` does; one ``VALIDATION_FAILED`` lists all problems.

    Each detail names its ``file``, ``index`` and ``job`` (the name, when the object has one).
    A name used twice (in one file or across files) is ``NAME_CONFLICT``. Job files are the
    operator's: ``provenance: static`` is accepted here (``jobs add`` refuses it).
    """
    now = now_ms()
    out: list[DesiredJob] = []
    details: list[dict[str, Any]] = []
    for file, items in sources:
        for index, item in enumerate(items):
            where = {"file": file, "index": index, "job": item.get("name") if isinstance(item, dict) else None}
            done = isinstance(item, dict) and DONE_KEY in item
            try:
                obj, submission = split_submission(item) if isinstance(item, dict) else (item, None)
                if done:
                    obj = {k: v for k, v in obj.items() if k != DONE_KEY}
                # An at-job already stored keeps its (possibly past) instant: the file is compared, not re-added;
                # a new one in the past is refused when the plan sees it is new (``plan``: AT_IN_PAST).
                spec = validate_spec(obj, now=now, check_past=False)
                if done:
                    done = _check_done(item[DONE_KEY], spec)
                if submission is not None:
                    compiled = submission.payload.get("compiled") if isinstance(submission.payload, dict) else None
                    submission.verify(spec, job_id=compiled.get("job_id") if isinstance(compiled, dict) else None)
                out.append(DesiredJob(file, index, spec, submission, item, done))
            except SchedulerError as exc:
                for d in exc.details or [{"field": "", "code": exc.code, "error": exc.message}]:
                    details.append({**d, **where})
    if details:
        jobs = len({(d["file"], d["index"]) for d in details})
        total = sum(len(items) for _, items in sources)
        raise SchedulerError("VALIDATION_FAILED", f"{jobs} of {total} job specs are invalid", details=details)
    seen: dict[str, DesiredJob] = {}
    conflicts = []
    for job in out:
        first = seen.setdefault(job.spec.name, job)
        if first is not job:
            conflicts.append({"file": job.file, "index": job.index, "job": job.spec.name, "field": "name", "code": "NAME_CONFLICT",
                              "error": f"job name {job.spec.name!r} is already used by item {first.index} of {first.file}"})
    if conflicts:
        names = ", ".join(sorted({repr(c["job"]) for c in conflicts}))
        raise SchedulerError("NAME_CONFLICT", f"the job files name a job more than once: {names}", details=conflicts)
    return out


def _check_done(value: object, spec: Any) -> bool:
    """The file's ``done`` marker: a boolean, and only on a one-shot (``VALIDATION_FAILED`` otherwise)."""
    if not isinstance(value, bool):
        raise SchedulerError("VALIDATION_FAILED", "invalid job spec: done", details=[
            {"field": DONE_KEY, "code": "INVALID_TYPE", "error": "must be true or false"}])
    if value and spec.schedule_kind != "at":
        raise SchedulerError("VALIDATION_FAILED", "invalid job spec: done", details=[
            {"field": DONE_KEY, "code": "CONFLICT", "error": "is only valid with schedule_kind=at (a one-shot that already ran)"}])
    return value


# --------------------------------------------------------------------------- planning


def _stored_input(tx: Tx, row: dict[str, Any], names_by_id: dict[str, str]) -> dict[str, Any]:
    """A stored job as the user-editable object a file would hold (non-defaults; parent by name)."""
    obj = spec_to_input(spec_from_row(row))
    if row.get("parent_id") is not None:
        obj["parent_id"] = names_by_id.get(row["parent_id"], row["parent_id"])
    else:
        obj.pop("parent_id", None)
    return obj


def _desired_input(job: DesiredJob, names_by_id: dict[str, str]) -> dict[str, Any]:
    """A file's job as the same normalised object (validated values, non-defaults; parent by name)."""
    obj = spec_to_input(job.spec)
    if obj.get("parent_id") is not None:
        obj["parent_id"] = names_by_id.get(obj["parent_id"], obj["parent_id"])
    return obj


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """``{field, old, new}`` for every field whose value differs (a missing field is its default)."""
    defaults = {f.name: (None if f.metadata["required"] else _default(f)) for f in SPEC_FIELDS}
    out = []
    for name in (f.name for f in SPEC_FIELDS):
        a, b = old.get(name, defaults[name]), new.get(name, defaults[name])
        if a != b:
            out.append({"field": name, "old": a, "new": b})
    return out


def plan(tx: Tx, desired: list[DesiredJob], *, prune: str | None = None, now: int | None = None) -> list[Action]:
    """The actions that make the stored jobs match ``desired`` (nothing is written).

    A job to create is held to ``jobs add``'s creation rule: a one-shot whose ``schedule_at``
    has passed needs ``allow_past_at`` (or the file's ``done = true``: it will not run), else
    ``VALIDATION_FAILED`` with an ``AT_IN_PAST`` detail naming its file, index and job. A
    stored one-shot keeps its instant, passed or not: it is compared, not created.
    """
    now = now_ms() if now is None else now
    rows = tx.all("SELECT * FROM jobs ORDER BY name")
    names_by_id = {r["id"]: r["name"] for r in rows}
    by_name = {r["name"]: r for r in rows}
    actions: list[Action] = []
    past: list[dict[str, Any]] = []
    for job in desired:
        row = by_name.get(job.spec.name)
        new = _desired_input(job, names_by_id)
        if row is None:
            spec = job.spec
            if spec.schedule_kind == "at" and spec.schedule_at <= now and not spec.allow_past_at and not job.done:
                past.append({"field": "schedule_at", "code": "AT_IN_PAST",
                             "error": "is in the past (set allow_past_at to accept it)", **job.where()})
            actions.append(Action("create", job.spec.name, job.file))
            continue
        changes = _changes(_stored_input(tx, row, names_by_id), new)
        if job.submission is not None and job.submission.digest != row.get("artifact_digest"):
            changes.append({"field": "handoff_artifact_digest", "old": row.get("artifact_digest"), "new": job.submission.digest})
        actions.append(Action("update" if changes else "unchanged", job.spec.name, job.file, row["id"], changes))
    if past:
        raise SchedulerError("VALIDATION_FAILED", f"{len(past)} of {len(desired)} job specs are invalid: a new one-shot"
                             " in the past needs allow_past_at", details=past)
    if prune is not None:
        wanted = {j.spec.name for j in desired}
        for row in rows:
            if row["name"] in wanted:
                continue
            if prune == "disable" and not row["enabled"]:
                actions.append(Action("unchanged", row["name"], None, row["id"], prune="already disabled"))
            else:
                actions.append(Action("prune", row["name"], None, row["id"], prune=prune))
    return actions


def _creation_order(jobs: list[DesiredJob]) -> list[DesiredJob]:
    """Jobs to create, parents named in the same batch before their children (stable otherwise)."""
    by_name = {j.spec.name: j for j in jobs}
    done: set[str] = set()
    out: list[DesiredJob] = []

    def visit(job: DesiredJob, depth: int) -> None:
        if job.spec.name in done or depth > 64:
            return
        parent = by_name.get(job.spec.parent_id) if job.spec.parent_id else None
        if parent is not None and parent is not job:
            visit(parent, depth + 1)
        if job.spec.name not in done:
            done.add(job.spec.name)
            out.append(job)

    for job in jobs:
        visit(job, 0)
    return out


def apply(store: Store, desired: list[DesiredJob], *, prune: str | None = None, dry_run: bool = False) -> list[Action]:
    """Make the stored jobs match ``desired`` in one transaction; return the plan carried out.

    With ``dry_run`` only the plan is computed (read-only). Any refusal (a chain cycle, a job
    that is running when it must be deleted, a handoff v4 job changed without a new artifact)
    raises and rolls everything back.
    """
    if dry_run:
        with store.read() as tx:
            return plan(tx, desired, prune=prune)
    with committing(store) as tx:
        actions = plan(tx, desired, prune=prune)
        by_name = {j.spec.name: j for j in desired}
        to_create = _creation_order([by_name[a.name] for a in actions if a.action == "create"])
        created_ids: dict[str, str] = {}
        for job in to_create:
            with _naming(job):
                row = create_jobs(store, [job.spec], submissions=[job.submission], check_cap=False)[0]
                created_ids[job.spec.name] = row.id
                if job.done:  # it took its slot where it was exported: no next run here, as there
                    state.rows(tx, "clear_next_runs", now=now_ms(), rows=[{"job_id": row.id}])
        for action in actions:
            if action.action == "create":
                action.job_id = created_ids[action.name]
            elif action.action == "update":
                job = by_name[action.name]
                fields = {c["field"] for c in action.changes} & SPEC_FIELD_NAMES
                patch: dict[str, Any] = {}
                new = job.raw if isinstance(job.raw, dict) else {}
                normalised = _desired_input(job, {})
                for name in sorted(fields - set(_STATE_FIELDS)):
                    patch[name] = normalised.get(name)  # absent: None resets the field to its default
                if job.submission is not None:
                    patch.update({k: new[k] for k in SUBMISSION_FIELDS})
                with _naming(job):
                    if patch:
                        update_job(store, action.job_id, patch)  # type: ignore[arg-type]
                    if "enabled" in fields:
                        set_enabled(store, action.job_id, job.spec.enabled)  # type: ignore[arg-type]
        pruned = [a for a in actions if a.action == "prune"]
        if prune == "disable":
            for action in pruned:
                set_enabled(store, action.job_id, False)  # type: ignore[arg-type]
        elif prune == "delete":
            for action in _children_first(tx, pruned):
                delete_job(store, action.job_id)  # type: ignore[arg-type]
        if to_create:
            check_job_cap(tx)  # [jobs] max_jobs counts the jobs the whole apply leaves, after pruning
    return actions


@contextmanager
def _naming(job: DesiredJob) -> Iterator[None]:
    """Name the job and its file in any refusal met while carrying out its action (message and ``details``).

    A refusal inside the transaction (a chain parent that does not exist, a handoff v4 job
    changed without a new artifact) otherwise says what went wrong but not which job of which
    file: the message gains ``FILE [INDEX] job 'NAME': `` and ``details`` the ``file``,
    ``index`` and ``job`` keys (each entry's, for a list), in both output modes.
    """
    try:
        yield
    except SchedulerError as exc:
        where = job.where()
        exc.message = f"{job.file} [{job.index}] job {job.spec.name!r}: {exc.message}"
        exc.args = (exc.message,)
        if exc.details is None:
            exc.details = where
        elif isinstance(exc.details, dict):
            exc.details = {**where, **exc.details}
        elif isinstance(exc.details, list):
            exc.details = [{**where, **d} if isinstance(d, dict) else d for d in exc.details]
        raise


def _children_first(tx: Tx, pruned: list[Action]) -> list[Action]:
    """Pruned jobs ordered so a chained child is deleted before its parent."""
    ids = {a.job_id for a in pruned}
    parent = {r["id"]: r["parent_id"] for r in tx.all("SELECT id, parent_id FROM jobs")}

    def depth(job_id: str | None) -> int:
        d, cursor = 0, parent.get(job_id)  # type: ignore[arg-type]
        while cursor is not None and d < 64:
            d, cursor = d + 1, parent.get(cursor)
        return d

    return sorted(pruned, key=lambda a: (-depth(a.job_id) if a.job_id in ids else 0, a.name))


# --------------------------------------------------------------------------- export


def export_document(tx: Tx) -> dict[str, Any]:
    """``{"version": 1, "jobs": [...]}``: every stored job with only its non-default fields.

    Chain parents are named, not referred to by id. A handoff v4 job carries its four
    submission fields (its artifact re-validated first, as ``jobs list --include-handoff-artifacts``
    does), so applying the export accepts the same artifact again.
    """
    rows = tx.all("SELECT * FROM jobs ORDER BY name")
    names_by_id = {r["id"]: r["name"] for r in rows}
    jobs = []
    for row in rows:
        obj = _stored_input(tx, row, names_by_id)
        if row["schedule_kind"] == "at" and row["next_run_at"] is None:
            obj[DONE_KEY] = True  # its one slot was taken here: applied elsewhere it must not run again
        if row.get("handoff_version") == 4:
            obj.update(submission_fields(hydrate(tx, row)))
        jobs.append(obj)
    return {"version": FILE_VERSION, "jobs": jobs}


def render(doc: dict[str, Any], fmt: str) -> str:
    """The document as TOML (``tomli_w``) or JSON text.

    TOML has no null: a value that is null somewhere inside a job (a handoff v4 artifact
    holds some) cannot be written, and ``EXPORT_UNREPRESENTABLE`` names each place; JSON can
    hold every job.
    """
    if fmt == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    problems = []
    for index, job in enumerate(doc["jobs"]):
        for path in _null_paths(job, ""):
            problems.append({"index": index, "job": job.get("name"), "field": path, "code": "EXPORT_UNREPRESENTABLE",
                             "error": "null has no TOML form"})
    if problems:
        names = ", ".join(sorted({repr(p["job"]) for p in problems}))
        raise SchedulerError("EXPORT_UNREPRESENTABLE", f"job(s) {names} hold null values, which TOML cannot write;"
                             " use --format json", details=problems)
    return tomli_w.dumps(doc)


def _null_paths(value: Any, path: str) -> list[str]:
    """Dotted paths of every ``None`` inside a JSON value."""
    if value is None:
        return [path or "(value)"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _null_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _null_paths(v, f"{path}[{i}]")]
    return []
