"""``scheduler runs ...``: list, get, output, cancel, events."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import short_run_id
from scheduler.cli.input import AsciiIntRange
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, kv, local_time, table

if TYPE_CHECKING:
    from scheduler.core.rows import RunRow


@click.group("runs")
def runs_group() -> None:
    """Inspect runs and their output."""


@runs_group.command("list")
@click.argument("job", required=False)
@click.option("--limit", type=AsciiIntRange(1, 100000), default=20, show_default=True, help="At most N runs.")
@click.option("--status", default=None, help="Only runs with this status.")
def runs_list(job: str | None, limit: int, status: str | None) -> None:
    """Recent runs, newest first (of one job when given)."""
    from scheduler.ops.queries import check_run_status, job_names, list_runs

    check_run_status(status)  # refused before the database is opened
    store = open_ctx_store()
    views = list_runs(store, job=job or None, status=status, limit=limit)

    def human() -> None:
        names = job_names(store) if views else {}
        table(
            [(short_run_id(v["id"]), names.get(v["job_id"], v["job_id"][:8]), v["status"], v["dispatch_kind"], local_time(v["scheduled_for"]),
              local_time(v["started_at"]), f"{v['duration_ms']} ms" if v["duration_ms"] is not None else None,
              v["error_code"] or v["skip_reason"]) for v in views],
            ["run", "job", "status", "kind", "scheduled", "started", "took", "note"],
        )

    emit({"runs": views}, human)


def _resolve_run(tx, ref: str) -> RunRow:
    """A run row by full id or a unique prefix or suffix of at least 6 characters (``scheduler.ops.queries.resolve_run``)."""
    from scheduler.ops.queries import resolve_run

    return resolve_run(tx, ref)


@runs_group.command("get")
@click.argument("run_id")
def runs_get(run_id: str) -> None:
    """Everything recorded about one run."""
    from scheduler.ops.queries import get_run

    view = get_run(open_ctx_store(), run_id)
    emit({"run": view}, lambda: kv((k, v) for k, v in view.items() if k not in ("stdout_excerpt", "stderr_excerpt")))


#: How often ``runs output --follow`` looks at a running run's row and its growing artifact files.
FOLLOW_POLL_S = 0.2


@runs_group.command("output")
@click.argument("run_id")
@click.argument("stream", type=click.Choice(["stdout", "stderr"]), default="stdout")
@click.option("--both", is_flag=True, help="Both streams: the run's stdout to standard output, its stderr to standard error.")
@click.option("--follow", "-f", is_flag=True,
              help="While the run has not ended, show what it has stored so far and wait until it ends.")
def runs_output(run_id: str, stream: str, both: bool, follow: bool) -> None:
    """The whole output stream of a run, exact bytes, verified against its recorded SHA-256 and size.

    Inline or offloaded, the bytes are checked before anything is printed, so a changed
    row or file is ``ARTIFACT_TAMPERED`` (exit 1) and never shown as if it were the output.
    Human mode writes the raw bytes and says on stderr what it did not print: the other
    stream's size, a run that has not ended. ``--json`` gives text as ``utf-8`` or, when the
    stream is not UTF-8, ``base64``, with the run's status and whether it has ended.
    ``--follow`` shows a running run's offloaded output as it is stored, then the rest, checked,
    when the run ends (``--json``: waits, then answers).
    """
    from scheduler.core.store import default_artifacts_root

    ctx = click.get_current_context()
    if both and ctx.get_parameter_source("stream") is click.core.ParameterSource.COMMANDLINE:
        raise SchedulerError("INVALID_ARGUMENT", "--both shows stdout and stderr: give no STREAM with it")
    streams = ("stdout", "stderr") if both else (stream,)
    store = open_ctx_store()
    root = default_artifacts_root(store.local_path)
    with store.read() as tx:
        run = _resolve_run(tx, run_id)
    quiet = bool(ctx.find_root().obj.get("json"))
    shown: dict[str, bytes] = {}
    if follow:
        run, shown = _follow(store, root, run, streams, show=not quiet)
    datas = {s: _rest_of(root, run, s, shown.get(s, b"")) for s in streams}
    if quiet:
        from scheduler.ops.queries import output_view

        emit(output_view(run, streams, datas, both=both))
        return
    for s in streams:
        _write_raw(datas[s][len(shown.get(s, b"")):], err=s == "stderr" and both)
    for note in _output_notes(run, streams, datas, both=both, shown=shown):
        click.echo(note, err=True)


def _ended(run: RunRow) -> bool:
    """Whether waiting for ``run`` is over: a terminal status, or ``recovery_blocked`` (it waits for an operator)."""
    from scheduler.core.runs import TERMINAL

    return run.status in TERMINAL or run.status == "recovery_blocked"


def _follow(store: Any, root: Path, run: RunRow, streams: tuple[str, ...], *, show: bool) -> tuple[RunRow, dict[str, bytes]]:
    """Poll ``run`` until it has ended; when ``show``, write what its executor has offloaded so far as it grows.

    Returns the ended run and, per stream, the bytes shown (checked against the recorded
    stream by ``_rest_of``). Output short enough to stay in the executor's memory appears
    only when the run ends: it is not stored anywhere before.
    """
    import time

    from scheduler.core.outputs import read_growing

    shown = {s: bytearray() for s in streams}
    while not _ended(run):
        if show:
            for s in streams:
                while chunk := read_growing(root, run.id, s, len(shown[s])):
                    shown[s] += chunk
                    _write_raw(chunk, err=s == "stderr" and len(streams) == 2)
        time.sleep(FOLLOW_POLL_S)
        with store.read() as tx:
            run = _resolve_run(tx, run.id)
    return run, {s: bytes(b) for s, b in shown.items()}


def _rest_of(root: Path, run: RunRow, stream: str, shown: bytes) -> bytes:
    """The verified stream of an ended run (``b""`` while it runs), refusing one that does not start with what
    ``--follow`` showed of it (``ARTIFACT_TAMPERED``); a stream recorded without a digest leaves what was shown."""
    from scheduler.core.outputs import read_stream
    from scheduler.core.runs import TERMINAL

    if run.status not in TERMINAL:
        return shown
    data = read_stream(root, run, stream)
    if shown and run.get(f"{stream}_sha256") and not data.startswith(shown):
        raise SchedulerError("ARTIFACT_TAMPERED", f"run {run.id} {stream}: the {len(shown)} bytes shown while it ran are"
                                                  " not the start of its recorded stream")
    return data if data or not shown else shown


def _output_notes(run: RunRow, streams: tuple[str, ...], datas: dict[str, bytes], *, both: bool,
                  shown: dict[str, bytes]) -> list[str]:
    """What human ``runs output`` says on stderr about what it did not print: a run not ended, the other stream."""
    from scheduler.core.runs import TERMINAL

    ref = short_run_id(run.id)
    if run.status == "recovery_blocked":
        return [(f"run {ref} is recovery_blocked: it ends when recovery can tell what its process did"
                 f" (scheduler runs get {ref}, scheduler doctor); its output is stored then")]
    if run.status not in TERMINAL:
        return [(f"run {ref} is {run.status}: its output is stored when it ends"
                 f" (follow it with: scheduler runs output {ref} --follow)")]
    notes = [f"run {ref} {s}: what was shown while it ran is unverified, the run ended {run.status} without recording it"
             for s in streams if shown.get(s) and not run.get(f"{s}_sha256")]
    if both:
        return notes
    (s,) = streams
    other = "stderr" if s == "stdout" else "stdout"
    size = (run.stderr_bytes if other == "stderr" else run.stdout_bytes) or 0
    has = f"{other} has {size} byte{'' if size == 1 else 's'}"
    hint = f"scheduler runs output {ref} {other}, or --both"
    outcome = run.status + (f" [{run.error_code}]" if run.error_code else "")
    if not datas[s] and size:
        notes.append(f"run {ref} ended {outcome}: {s} is empty; {has} ({hint})")
    elif not datas[s] and run.status != "ok":
        notes.append(f"run {ref} ended {outcome}: no output on stdout or stderr (scheduler runs get {ref})")
    elif size:
        notes.append(f"({has} too: {hint})")
    return notes


def _write_raw(data: bytes, *, err: bool = False) -> None:
    """Write ``data`` as it is to standard output (or error); a text-only stream (in-process callers) gets it as
    str, losslessly (surrogateescape)."""
    if not data:
        return
    stream = sys.stderr if err else sys.stdout
    out = getattr(stream, "buffer", None)
    if out is None:
        stream.write(data.decode("utf-8", errors="surrogateescape"))
        stream.flush()
    else:
        stream.flush()
        out.write(data)
        out.flush()


@runs_group.command("cancel")
@click.argument("run_id")
@click.option("--reason", default=None, help="Why (recorded with your OS identity).")
def runs_cancel(run_id: str, reason: str | None) -> None:
    """Cancel one run: waiting runs end at once, a running one gets its cancellation token."""
    from scheduler.ops.actions import cancel_run

    result = cancel_run(open_ctx_store(), run_id, reason=reason)
    emit(result, lambda: click.echo(f"run {short_run_id(result['run_id'])}: {result['outcome']}"))


@runs_group.command("evidence")
@click.argument("run_id", required=False)
@click.option("--all", "all_runs", is_flag=True, help="Re-verify every run with evidence (a summary; exit 1 if any is invalid).")
@click.option("--since", default=None, help="With --all: only evidence since this instant (ISO-8601) or duration ago (7d).")
@click.option("--export", "export_format", type=click.Choice(["in-toto"]), default=None,
              help="Write the run's verified evidence as a signed in-toto attestation (DSSE, [evidence] export_key).")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="With --export: write the envelope to FILE.")
def runs_evidence(run_id: str | None, all_runs: bool, since: str | None, export_format: str | None, output: str | None) -> None:
    """Re-verify one run's evidence from history alone: its own artifact, its output files, its envelope.

    Exit 0 with ``{"ok": true, "verified": true, "provider": ..., "method": ...}``, or non-zero
    with the first failure's ``EVIDENCE_*`` code (docs/evidence.md). A pruned run's retained
    evidence still verifies (the run-row and output checks are then skipped, and said so).
    ``--all`` re-verifies many (``--since``); ``--export in-toto`` exports one (docs/evidence.md).
    """
    from scheduler.ops.queries import evidence_run_id, verify_evidence

    store = open_ctx_store()
    if all_runs or since is not None or export_format is not None or output is not None:
        from scheduler.cli.evidence_extras import evidence_extras

        evidence_extras(store, run_id, all_runs=all_runs, since=since, export_format=export_format, output=output,
                        resolve=lambda ref: evidence_run_id(store, ref))
        return
    if run_id is None:
        raise SchedulerError("INVALID_ARGUMENT", "runs evidence needs a RUN_ID (or --all)")
    view = verify_evidence(store, run_id)
    emit(view, lambda: kv([("run", view["run_id"]), ("verified", "yes"), ("provider", view["provider"]),
                           ("method", view["method"]), *((name, outcome) for name, outcome in view["checks"].items())]))


@runs_group.command("events")
@click.argument("run_id")
def runs_events(run_id: str) -> None:
    """The audit trail of one run."""
    from scheduler.ops.queries import run_events

    events = run_events(open_ctx_store(), run_id)
    emit({"events": events}, lambda: table([(local_time(e["at"]), e["kind"], e["actor"], e["data"]) for e in events],
                                           ["at", "event", "actor", "data"]))


@runs_group.command("prune")
@click.option("--older-than", "older_than", default=None,
              help="Prune terminal runs that ended longer ago than this (e.g. 30d); default: [retention] max_run_age or the job's.")
@click.option("--keep", type=AsciiIntRange(1, 10_000_000), default=None,
              help="Keep each job's newest N terminal runs; default: [retention] keep_runs or the job's.")
@click.option("--job", default=None, help="Only runs of this job (id or name); outbox, events, artifacts and orphans are left alone.")
@click.option("--dry-run", is_flag=True, help="Say what would be pruned; change nothing.")
def runs_prune(older_than: str | None, keep: int | None, job: str | None, dry_run: bool) -> None:
    """Apply retention now: old runs nothing still needs and their files, settled outbox messages, old events,
    unreferenced artifacts and orphaned output directories, by the same rules as the dispatcher's duty.

    A run is kept while any rule keeps it (among its job's newest --keep, or younger than
    --older-than); a flag wins over the job's ``retention`` field, which wins over the
    settings file's ``[retention]``. Retained evidence is kept (a run tombstone records the
    pruned run); evidence past its retention is deleted with its run. One runtime event
    (``runs.pruned``) records the counts per table.
    """
    from scheduler.base.timeutil import parse_duration_ms
    from scheduler.core.jobs import resolve_job
    from scheduler.core.store import default_artifacts_root
    from scheduler.ops.pruning import prune_runs

    older_than_ms = parse_duration_ms(older_than, field="--older-than") if older_than is not None else None
    store = open_ctx_store()
    job_id = None
    if job is not None:
        with store.read() as tx:
            job_id = resolve_job(tx, job).id
    report = prune_runs(store, older_than_ms=older_than_ms, keep=keep, job_id=job_id, dry_run=dry_run,
                        artifacts_root=default_artifacts_root(store.local_path))
    view = report.to_json()
    counts = view["counts"]
    emit(view, lambda: click.echo(
        f"{'would prune' if dry_run else 'pruned'} {view['pruned']} run(s): {view['tombstoned']} tombstoned ({view['evidence_retained']} with"
        f" retained evidence, {view['evidence_deleted']} with expired evidence deleted), {len(view['skipped'])} skipped;"
        f" {counts['delivery_outbox']} outbox part(s), {counts['runtime_events']} event(s),"
        f" {counts['execution_artifacts']} artifact(s), {counts['orphaned_dirs']} orphaned output dir(s)"
        + ("" if dry_run else f", {view['files_removed']} output file(s) removed")))
