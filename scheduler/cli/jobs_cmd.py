"""``scheduler jobs ...``: add, validate, list, get, update, enable, disable, pause, resume, delete, tree, next, run, cancel."""

from __future__ import annotations

import sys
from typing import Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.cli.input import AsciiIntRange, read_json_input
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, kv, local_time, table

_spec_source = [
    click.argument("spec", required=False),
    click.option("--file", "file", type=click.Path(dir_okay=False), help="Read the spec from a file."),
    click.option("--stdin", "stdin", is_flag=True, help="Read the spec from standard input."),
]


def spec_source(fn: Any) -> Any:
    """Decorate a command with the three ways of giving a spec."""
    for deco in reversed(_spec_source):
        fn = deco(fn)
    return fn


allow_missing_plugins_option = click.option(
    "--allow-missing-plugins", "allow_missing_plugins", is_flag=True,
    help="Accept a job naming an executor, channel or provider that is not installed here (for another host).",
)


def _require_plugins(specs: list[Any], *, many: bool, allow_missing: bool) -> None:
    """The missing-plugin rule (``<KIND>_NOT_AVAILABLE``) unless ``--allow-missing-plugins``; reads metadata only."""
    if allow_missing:
        return
    from scheduler.plugins.refs import require_plugins

    require_plugins(specs, indexed=many)


def _refuse_duplicate_names(specs: list[Any], many: bool) -> None:
    """``NAME_CONFLICT`` for an array naming a job twice: ``jobs add`` could never store it, so nothing accepts it."""
    if not many:
        return
    first_index: dict[str, int] = {}
    details = []
    for index, spec in enumerate(specs):
        if spec.name in first_index:
            details.append({"index": index, "field": "name", "code": "NAME_CONFLICT",
                            "error": f"job name {spec.name!r} is already used by item {first_index[spec.name]} of the array"})
        else:
            first_index[spec.name] = index
    if details:
        names = ", ".join(sorted({repr(specs[d["index"]].name) for d in details}))
        raise SchedulerError("NAME_CONFLICT", f"the array names a job more than once: {names}", details=details)


#: Provenance the CLI may give a job: ``static`` (the operator's own job files) is trusted above a user's.
CLI_PROVENANCE = ("user_added", "external")


def _refuse_trusted_provenance(item: Any) -> None:
    """``PROVENANCE_NOT_ALLOWED``: a job added or changed from the CLI cannot claim ``static`` provenance.

    Trust-dependent checks (the agent executor's prompt-injection patterns) apply to
    ``user_added`` and ``external`` jobs; claiming ``static`` would switch them off.
    """
    if isinstance(item, dict) and item.get("provenance") not in (None, *CLI_PROVENANCE):
        raise SchedulerError("VALIDATION_FAILED", "invalid job spec: provenance", details=[{
            "field": "provenance", "code": "PROVENANCE_NOT_ALLOWED",
            "error": f"the CLI sets provenance {' or '.join(CLI_PROVENANCE)}; {item.get('provenance')!r} is reserved for the"
                     " operator's job files"}])


def _check_levels(store: Any, specs: list[Any], many: bool, *, previous: Any = None) -> None:
    """The invoking account may give a job at most its own trust level (``scheduler.pipeline.identity.check_invoker``)."""
    from scheduler.pipeline.identity import check_invoker, invoker

    who = invoker(store)
    for index, spec in enumerate(specs):
        try:
            check_invoker(spec, who, previous=previous)
        except SchedulerError as exc:
            if many and isinstance(exc.details, dict):
                exc.details["index"] = index
            raise


def _one_shot_option(value: str | None, option: str) -> None:
    """Refuse an empty ``--at``/``--in``: it would otherwise be ignored and the job silently become manual."""
    if value is not None and not value.strip():
        raise SchedulerError("INVALID_ARGUMENT", f"{option} needs a value (got an empty string)")


#: Words other schedulers use for a ``jobs`` command, with the command meant: an unknown one names it.
COMMAND_HINTS = {
    "stop": "pause", "suspend": "pause", "halt": "pause", "hold": "pause", "freeze": "pause",
    "start": "resume", "unpause": "resume", "continue": "resume", "unsuspend": "resume", "unfreeze": "resume",
}


class JobsGroup(click.Group):
    """The ``jobs`` group: an unknown command another scheduler would take (``stop``) names the one meant."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Click's resolution, except that a word in ``COMMAND_HINTS`` is refused naming its command."""
        name = args[0] if args else ""
        if name in COMMAND_HINTS and self.get_command(ctx, name) is None and not ctx.resilient_parsing:
            meant = COMMAND_HINTS[name]
            other = "disable" if meant == "pause" else "enable"
            raise click.UsageError(f"No such command '{name}'. Did you mean `scheduler jobs {meant}`"
                                   f" (or `scheduler jobs {other}`)? See docs/cli.md, \"Job states\".", ctx)
        return super().resolve_command(ctx, args)


@click.group("jobs", cls=JobsGroup)
def jobs_group() -> None:
    """Create, inspect and change jobs."""


def _validate_many(doc: Any, *, at: str | None = None, in_: str | None = None,
                   allow_past: bool = False) -> tuple[list[Any], bool, list[Any]]:
    """Validate one spec object or an array of them (all errors reported, indexed for arrays).

    Returns the specs, whether the input was an array, and per spec the handoff v4
    submission it carried (or None), already checked against that spec.
    """
    from scheduler.artifacts.handoff import split_submission
    from scheduler.base.timeutil import now_ms, parse_duration_ms, to_iso
    from scheduler.core.spec import validate_spec

    many = isinstance(doc, list)
    items = doc if many else [doc]
    if many and not items:
        raise SchedulerError("VALIDATION_FAILED", "an empty array holds no job", details=[])
    now = now_ms()
    specs, details, submissions = [], [], []
    for index, item in enumerate(items):
        if isinstance(item, dict) and (at is not None or in_ is not None):
            item = dict(item)
            item["schedule_kind"] = "at"
            item["schedule_at"] = at if at is not None else to_iso(now + parse_duration_ms(in_, field="--in"))
        if isinstance(item, dict) and allow_past:
            item = {**item, "allow_past_at": True}
        try:
            item, submission = split_submission(item) if isinstance(item, dict) else (item, None)
            _refuse_trusted_provenance(item)
            specs.append(validate_spec(item, now=now))
            submissions.append(submission)
            if submission is not None:
                compiled = submission.payload.get("compiled") if isinstance(submission.payload, dict) else None
                submission.verify(specs[-1], job_id=compiled.get("job_id") if isinstance(compiled, dict) else None)
        except SchedulerError as exc:
            if not many:
                raise
            for d in exc.details or [{"field": "", "code": exc.code, "error": exc.message}]:
                details.append({**d, "index": index})
    if details:
        raise SchedulerError("VALIDATION_FAILED", f"{len({d['index'] for d in details})} of {len(items)} job specs are invalid", details=details)
    _refuse_duplicate_names(specs, many)
    return specs, many, submissions


@jobs_group.command("validate")
@spec_source
@allow_missing_plugins_option
def jobs_validate(spec: str | None, file: str | None, stdin: bool, allow_missing_plugins: bool) -> None:
    """Validate a spec (object or array) without touching the database, as ``jobs add`` would."""
    specs, many, _subs = _validate_many(read_json_input(spec, file, stdin))
    _require_plugins(specs, many=many, allow_missing=allow_missing_plugins)
    payload = {"valid": True, "jobs" if many else "job": [s.to_json() for s in specs] if many else specs[0].to_json()}
    proof_warnings = _proof_warnings(specs)
    if proof_warnings:
        payload["warnings"] = proof_warnings
    emit(payload, lambda: [click.echo(f"valid: {len(specs)} job spec(s)"),
                           *(click.echo(f"warning: {w['job']}: {w['warning']}", err=True) for w in proof_warnings)])


def _proof_warnings(specs: list[Any]) -> list[dict[str, str]]:
    """A recurring job whose proof source is not refreshed serves one dispatch (docs/proofs.md): say so."""
    out = []
    for s in specs:
        if getattr(s, "authorization_proof", None):
            from scheduler.pipeline.proofs.declaration import recurring_warning

            text = recurring_warning(s.schedule_kind, s.authorization_proof)
            if text:
                out.append({"job": s.name, "field": "authorization_proof.source", "warning": text})
    return out


@jobs_group.command("add")
@spec_source
@click.option("--dry-run", is_flag=True, help="Validate and show what would be stored; never opens the database.")
@click.option("--at", "at", default=None, help="Shortcut: one-shot at this ISO-8601 instant.")
@click.option("--in", "in_", default=None, help="Shortcut: one-shot after this duration (e.g. 90s, 5m).")
@click.option("--allow-past", is_flag=True, help="Accept a one-shot time in the past.")
@allow_missing_plugins_option
def jobs_add(spec: str | None, file: str | None, stdin: bool, dry_run: bool, at: str | None, in_: str | None, allow_past: bool,
             allow_missing_plugins: bool) -> None:
    """Add one job, or an array of jobs all-or-nothing."""
    if at is not None and in_ is not None:
        raise SchedulerError("INVALID_ARGUMENT", "use --at or --in, not both")
    _one_shot_option(at, "--at")
    _one_shot_option(in_, "--in")
    specs, many, submissions = _validate_many(read_json_input(spec, file, stdin), at=at, in_=in_, allow_past=allow_past)
    _require_plugins(specs, many=many, allow_missing=allow_missing_plugins)
    if dry_run:
        from scheduler.base.timeutil import now_ms, to_iso
        from scheduler.core.jobs import initial_schedule

        views = []
        for s in specs:
            view = s.to_json()
            view["next_run_at"] = to_iso(initial_schedule(s, now_ms())[0]) if s.parent_id is None else None
            views.append(view)
        payload = {"dry_run": True, "jobs" if many else "job": views if many else views[0]}
        emit(payload, lambda: click.echo(f"dry run: {len(specs)} job spec(s) valid; nothing stored"))
        return
    from scheduler.core.jobs import create_jobs, job_to_json

    store = open_ctx_store()
    _check_levels(store, specs, many)
    rows = create_jobs(store, specs, submissions=submissions)
    views = [job_to_json(r) for r in rows]
    emit(
        {"jobs": views} if many else {"job": views[0]},
        lambda: [click.echo(f"added {v['name']} ({v['id']}), next run {local_time(v['next_run_at'])}") for v in views],
    )


@jobs_group.command("list")
@click.option("--enabled/--disabled", "enabled", default=None, help="Only jobs whose enabled flag is set, or only those whose flag is not.")
@click.option("--state", "state", default=None, metavar="STATE",
              help="Only jobs in this state: enabled, paused, auto-paused, disabled or done.")
@click.option("--limit", type=AsciiIntRange(1, 100000), default=None, help="At most N jobs.")
@click.option("--include-handoff-artifacts", "include_handoff", is_flag=True,
              help="Add each handoff v4 job's artifact payload, re-validated; any bad artifact fails the whole listing.")
def jobs_list(enabled: bool | None, state: str | None, limit: int | None, include_handoff: bool) -> None:
    """List jobs with their state and next run (none for a job that will not fire)."""
    from scheduler.core.jobs import check_job_state
    from scheduler.ops.queries import list_jobs

    check_job_state(state)  # refused before the database is opened
    views = list_jobs(open_ctx_store(), enabled=enabled, state=state, limit=limit, include_handoff_artifacts=include_handoff)
    emit(
        {"jobs": views},
        lambda: table(
            [(v["name"], short, v["state"], _schedule_text(v), local_time(v["next_run_at"]), v["last_status"])
             for v, short in zip(views, _short_ids(views), strict=True)],
            ["name", "id", "state", "schedule", "next run", "last"],
        ),
    )


def _short_ids(views: list[Any]) -> list[str]:
    """The ID column of ``jobs list``: each job's shortest unique id start or end (``short_job_ids``), which every
    command taking a job accepts back; the same piece for a job however the listing is filtered."""
    from scheduler.core.jobs import short_job_ids

    if not views:
        return []
    with open_ctx_store().read() as tx:
        pieces = short_job_ids(tx)
    return [pieces.get(v["id"], v["id"]) for v in views]


def _schedule_text(v: dict[str, Any]) -> str:
    kind = v["schedule_kind"]
    if kind == "cron":
        return f"cron {v['schedule_cron']}" + ("" if v["schedule_tz"] == "UTC" else f" ({v['schedule_tz']})")
    if kind == "every":
        return f"every {v['schedule_every']}"
    if kind == "at":
        return f"at {local_time(v['schedule_at'])}"
    if kind == "chain":
        return f"after parent ({v['trigger_on']})"
    return kind


@jobs_group.command("get")
@click.argument("job")
def jobs_get(job: str) -> None:
    """Show one job (by id or name)."""
    from scheduler.ops.queries import get_job

    view = get_job(open_ctx_store(), job)
    emit({"job": view}, lambda: kv(view.items()))


@jobs_group.command("artifact")
@click.argument("job")
@click.option("--run", "run_id", default=None, help="The artifact a run of this job was bound to, instead of the job's current one.")
def jobs_artifact(job: str, run_id: str | None) -> None:
    """Print a job's execution artifact as its canonical JSON (its SHA-256 is the digest), re-validated first."""
    from scheduler.core.artifact import artifact_to_json, load_artifact
    from scheduler.core.jobs import resolve_job
    from scheduler.core.runs import get_run

    with open_ctx_store().read() as tx:
        row = resolve_job(tx, job)
        digest = row.artifact_digest
        if run_id is not None:
            run = get_run(tx, run_id)
            if run.job_id != row.id:
                raise SchedulerError("NOT_FOUND", f"run {run_id} is not a run of job {row.name!r}")
            digest = run.artifact_digest
            if digest is None:
                raise SchedulerError("EXECUTION_ARTIFACT_MISSING", f"run {run_id} predates execution artifacts: it has no binding")
        artifact = load_artifact(tx, digest)
    # Exactly the canonical bytes when piped (so `| sha256sum` gives the digest); a newline on a terminal.
    emit({"artifact": artifact_to_json(artifact)}, lambda: click.echo(artifact.payload_text, nl=sys.stdout.isatty()))


@jobs_group.command("update")
@click.argument("job")
@spec_source
@allow_missing_plugins_option
def jobs_update(job: str, spec: str | None, file: str | None, stdin: bool, allow_missing_plugins: bool) -> None:
    """Change fields of a job with a partial spec; ``null`` resets a field to its default."""
    from scheduler.core.jobs import job_to_json, resolve_job, update_job
    from scheduler.core.spec import spec_from_row
    from scheduler.plugins.refs import require_plugins

    patch = read_json_input(spec, file, stdin, what="update")
    _refuse_trusted_provenance(patch)
    store = open_ctx_store()
    # update_job merges the patch into the stored spec and validates the result; the plugin rule
    # reads that merged spec inside the same (outer) transaction, so a refusal stores nothing and
    # the merge rule stays in one place. Only plugin names the update changes are checked. (Its
    # change notification inside the outer transaction is delivered on commit by both stores.)
    with store.transaction() as tx:
        before = spec_from_row(resolve_job(tx, job))
        row = update_job(store, job, patch)
        _check_levels(store, [spec_from_row(row)], False, previous=before)  # refused: the update rolls back
        if not allow_missing_plugins:
            require_plugins([spec_from_row(row)], previous=[before])
    view = job_to_json(row)
    emit({"job": view}, lambda: click.echo(f"updated {view['name']}, next run {local_time(view['next_run_at'])}"))


def _toggle(job: str, action: str) -> None:
    """``jobs enable``/``resume`` (one action), ``disable``, ``pause``: do it, print the job's state and next run."""
    from scheduler.ops import actions

    do = {"enable": actions.enable_job, "resume": actions.resume_job, "disable": actions.disable_job,
          "pause": actions.pause_job}[action]
    view = do(open_ctx_store(), job)
    nxt = f"; next run {local_time(view['next_run_at'])}" if view["state"] == "enabled" else ""
    emit({"job": view}, lambda: click.echo(f"{view['name']} is {view['state']}{nxt}"))


@jobs_group.command("enable")
@click.argument("job")
def jobs_enable(job: str) -> None:
    """Enable a disabled job, or resume a paused or auto-paused one (as `jobs resume`); its next run is recomputed from now."""
    _toggle(job, "enable")


@jobs_group.command("disable")
@click.argument("job")
def jobs_disable(job: str) -> None:
    """Disable a job (state disabled); its pending scheduled dispatches are cancelled."""
    _toggle(job, "disable")


@jobs_group.command("pause")
@click.argument("job")
def jobs_pause(job: str) -> None:
    """Pause a job (state paused): as `jobs disable`, nothing fires and its pending dispatches are cancelled."""
    _toggle(job, "pause")


@jobs_group.command("resume")
@click.argument("job")
def jobs_resume(job: str) -> None:
    """Resume a paused, auto-paused or disabled job (as `jobs enable`); its next run is recomputed from now."""
    _toggle(job, "resume")


@jobs_group.command("delete")
@click.argument("job")
@click.option("--cascade", is_flag=True, help="Also delete chained child jobs.")
@click.option("--yes", "-y", "yes", is_flag=True, help="Do not ask for confirmation (asked only when stdin is a terminal).")
def jobs_delete(job: str, cascade: bool, yes: bool = False) -> None:
    """Delete a job with its runs; on a terminal it asks first (``--yes`` does not)."""
    from scheduler.core.jobs import delete_job

    store = open_ctx_store()
    if not yes and sys.stdin is not None and sys.stdin.isatty():
        _confirm_delete(store, job, cascade)
    row = delete_job(store, job, cascade=cascade)
    emit({"deleted": {"id": row.id, "name": row.name}}, lambda: click.echo(f"deleted {row.name} ({row.id})"))


def _confirm_delete(store: Any, job: str, cascade: bool) -> None:
    """Ask on the terminal (stderr, default no) before deleting ``job``; a no is ``INTERRUPTED`` (exit 130), nothing deleted.

    The job is resolved first, so an unknown one is ``NOT_FOUND`` without a question; the
    question names the job, its id and how many runs (and, with ``--cascade``, chained
    children) go with it. Scripts and pipes (stdin not a terminal) are never asked.
    """
    from scheduler.core.jobs import resolve_job

    with store.read() as tx:
        row = resolve_job(tx, job)
        runs = tx.scalar("SELECT COUNT(*) FROM runs WHERE job_id = ?", (row.id,)) or 0
        children = tx.scalar("SELECT COUNT(*) FROM jobs WHERE parent_id = ?", (row.id,)) or 0
    also = f" and its {children} chained child job(s)" if cascade and children else ""
    click.confirm(f"Delete job {row.name!r} ({row.id}) with its {runs} run(s){also}?", default=False, abort=True, err=True)


@jobs_group.command("tree")
@click.argument("job", required=False)
def jobs_tree(job: str | None) -> None:
    """Show job chains as a tree."""
    from scheduler.core.jobs import job_tree

    with open_ctx_store().read() as tx:
        roots = job_tree(tx, job)

    def human() -> None:
        def walk(node: dict[str, Any], prefix: str, last: bool, top: bool) -> None:
            branch = "" if top else ("└── " if last else "├── ")
            cond = f" [{node['trigger_on']}{' ' + node['trigger_condition'] if node['trigger_condition'] else ''}]" if node["trigger_on"] else ""
            click.echo(f"{prefix}{branch}{node['name']}{cond}{'' if node['state'] == 'enabled' else ' (' + node['state'] + ')'}")
            kids = node["children"]
            for i, kid in enumerate(kids):
                walk(kid, prefix + ("" if top else ("    " if last else "│   ")), i == len(kids) - 1, False)

        for root in roots:
            walk(root, "", True, True)
        if not roots:
            click.echo("(no jobs)")

    emit({"tree": roots}, human)


@jobs_group.command("next")
@click.argument("job")
@click.option("-n", "count", type=AsciiIntRange(1, 1000), default=5, help="How many fire times.")
def jobs_next(job: str, count: int) -> None:
    """The next N fire times of a job, with UTC offsets."""
    from scheduler.ops.queries import next_runs

    result = next_runs(open_ctx_store(), job, count)
    views = result["fires"]
    emit(result, lambda: table([(v["local"], v["offset"], v["utc"]) for v in views], ["local", "offset", "utc"]))


@jobs_group.command("run")
@click.argument("job")
def jobs_run(job: str) -> None:
    """Run a job now (enqueues a manual dispatch; the dispatcher picks it up within milliseconds)."""
    from scheduler.ops.actions import run_job

    row = run_job(open_ctx_store(), job)
    emit({"dispatch": row}, lambda: click.echo(f"queued manual run of {job} (dispatch {row['id']})"))


@jobs_group.command("approve")
@click.argument("job")
@click.option("--note", default=None, help="Why (recorded with your OS identity).")
def jobs_approve(job: str, note: str | None) -> None:
    """Approve the job's one pending approval (APPROVAL_AMBIGUOUS when it has several: use `approvals approve ID`)."""
    from scheduler.cli.approvals_cmd import decide_for_job

    decide_for_job(job, "approved", note)


@jobs_group.command("reject")
@click.argument("job")
@click.option("--note", default=None, help="Why (recorded with your OS identity).")
def jobs_reject(job: str, note: str | None) -> None:
    """Reject the job's one pending approval (APPROVAL_AMBIGUOUS when it has several: use `approvals reject ID`)."""
    from scheduler.cli.approvals_cmd import decide_for_job

    decide_for_job(job, "rejected", note)


@jobs_group.command("cancel")
@click.argument("job")
@click.option("--reason", default=None, help="Why (recorded with your OS identity).")
def jobs_cancel(job: str, reason: str | None) -> None:
    """Cancel a job's pending, waiting and running work."""
    from scheduler.ops.actions import cancel_job

    result = cancel_job(open_ctx_store(), job, reason=reason)
    emit(result, lambda: click.echo(f"cancel requested: {len(result['runs'])} run(s), {result['dispatches']} queued dispatch(es)"))
