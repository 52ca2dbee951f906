"""``scheduler handoff compile``: turn a job spec into one carrying a handoff v4 artifact, ready for ``jobs add``."""

from __future__ import annotations

import json
import uuid

import click

from scheduler.base.errors import SchedulerError
from scheduler.cli.input import read_json_input
from scheduler.cli.jobs_cmd import spec_source
from scheduler.cli.output import emit


@click.group("handoff")
def handoff_group() -> None:
    """Compile handoff v4 artifacts (the portable, digest-bound form of a job)."""


@handoff_group.command("compile")
@spec_source
@click.option("--job-id", "job_id", default=None, help="The id the job will get (default: a new UUID).")
@click.option("--workflow", "workflow_id", default="default", show_default=True, help="Workflow id recorded in the artifact's manifest.")
@click.option("--task", "task_id", default=None, help="Task id recorded in the manifest (default: the job's name).")
def handoff_compile(spec: str | None, file: str | None, stdin: bool, job_id: str | None, workflow_id: str,
                    task_id: str | None) -> None:
    """Validate one job spec and print it with its handoff v4 artifact and the three binding fields.

    The output is a job spec ``jobs add`` accepts as it is: the artifact is re-checked there
    against the spec (any edit to either is refused). Never opens the database.
    """
    from scheduler.artifacts.handoff import compile_submission

    doc = read_json_input(spec, file, stdin)
    if not isinstance(doc, dict):
        raise SchedulerError("INVALID_ARGUMENT", "handoff compile takes one job spec object")
    name = doc.get("name") if isinstance(doc.get("name"), str) else "task"
    out = compile_submission(doc, job_id=job_id or str(uuid.uuid4()), workflow_id=workflow_id, task_id=task_id or name)
    emit({"job": out}, lambda: click.echo(json.dumps(out, indent=2, ensure_ascii=False)))
