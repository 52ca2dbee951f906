"""Hook implementations shipped with the hello executor (entry point group ``scheduler.hooks``).

Three of the kernel's hookspecs, each showing one kind of extension point:

* ``scheduler_run_state_changed``: an observer (append one line per transition to a log file);
* ``scheduler_dispatch_veto``: a firstresult decision (hold back hello jobs while a pause file exists);
* ``scheduler_register_commands``: a CLI extension (``scheduler hello``).

Hooks must be quick and must not raise: they run in the dispatcher, and the veto runs
inside the claim transaction.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from scheduler.api import hookimpl

#: When set, every run state change is appended to this file as one JSON line.
LOG_ENV = "HELLO_STATE_LOG"
#: While the file named here exists, jobs on the hello executor are skipped (``veto: ...``).
PAUSE_ENV = "HELLO_PAUSE_FILE"


@hookimpl
def scheduler_run_state_changed(run_id: str, job_id: str, old_status: str | None, new_status: str, at_ms: int) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = {"run_id": run_id, "job_id": job_id, "old": old_status, "new": new_status, "at_ms": at_ms}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


@hookimpl
def scheduler_dispatch_veto(job: dict[str, Any], dispatch_kind: str) -> str | None:
    pause = os.environ.get(PAUSE_ENV)
    if job.get("executor") == "hello" and dispatch_kind != "manual" and pause and Path(pause).exists():
        return f"hello executor paused ({pause} exists)"
    return None  # no opinion: other plugins (or nobody) decide


@hookimpl
def scheduler_register_commands(cli: Any) -> None:
    import click

    if "hello" in cli.commands:  # the kernel may call this hook more than once per process
        return

    from scheduler_toolkit.cli import emit  # plugin commands follow the CLI's --json contract too

    @cli.command("hello")
    @click.option("--name", default="world", help="Who to greet.")
    def hello(name: str) -> None:
        """Say hello from the scheduler-executor-hello plugin."""
        text = f"hello, {name} (from scheduler-executor-hello)"
        emit({"greeting": text}, lambda: click.echo(text))
