"""Entry point of the ``scheduler`` command.

Start-up is kept fast: this module imports only click; each command group lives
in its own module, imported when invoked. ``version``, ``help``, ``schema``,
``capabilities``, ``jobs validate`` and ``jobs add --dry-run`` never open the
database; stateful commands open it through ``open_ctx_store`` on first use.
Every failure becomes a coded error (JSON on stdout with ``--json``), never a
traceback.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any

import click

LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "version": ("scheduler.cli.info_cmd", "version_cmd", "Print the scheduler version."),
    "schema": ("scheduler.cli.info_cmd", "schema_cmd", "Print the job-spec field catalogue or the SQL schema."),
    "capabilities": ("scheduler.cli.info_cmd", "capabilities_cmd", "Print what this scheduler supports."),
    "config": ("scheduler.cli.config_cmd", "config_cmd", "Show effective settings (kernel and plugin defaults)."),
    "plugins": ("scheduler.cli.info_cmd", "plugins_group", "Inspect installed plugins."),
    "status": ("scheduler.cli.status_cmd", "status_cmd", "Lease, queue, runs and recovery state at a glance."),
    "doctor": ("scheduler.cli.status_cmd", "doctor_cmd", "Check database health and plugins; exit 1 when unhealthy."),
    "jobs": ("scheduler.cli.jobs_cmd", "jobs_group", "Create, inspect and change jobs."),
    "deliveries": ("scheduler.cli.deliveries_cmd", "deliveries_group", "Inspect the delivery outbox; re-arm failed parts."),
    "queue": ("scheduler.cli.queue_cmd", "queue_group", "Inspect the dispatch queue: attempts, claims and errors."),
    "approvals": ("scheduler.cli.approvals_cmd", "approvals_group", "List and decide approval gates."),
    "proofs": ("scheduler.cli.proofs_cmd", "proofs_group", "Revoke authorization proofs or keys; list revocations and claims."),
    "handoff": ("scheduler.cli.handoff_cmd", "handoff_group", "Compile handoff v4 artifacts for jobs."),
    "runs": ("scheduler.cli.runs_cmd", "runs_group", "Inspect runs and their output."),
    "schedule": ("scheduler.cli.schedule_cmd", "schedule_group", "Preview schedules; quick cron jobs (add/list/show/remove)."),
    "run": ("scheduler.cli.run_cmd", "run_cmd", "Run the dispatcher in the foreground."),
    "conformance": ("scheduler.conformance.cli", "conformance_group", "Run provider conformance cases."),
    "backup": ("scheduler.cli.backup_cmd", "backup_cmd", "Copy the live SQLite database and its artifacts to a directory."),
    "restore": ("scheduler.cli.backup_cmd", "restore_cmd", "Replace the database with a backup (refused while a dispatcher holds it)."),
    "service": ("scheduler.cli.service_cmd", "service_group", "Install, inspect or remove the systemd unit for `scheduler run`."),
    "apply": ("scheduler.cli.apply_cmd", "apply_cmd", "Make the stored jobs match a job file (TOML or JSON), in one transaction."),
    "export": ("scheduler.cli.apply_cmd", "export_cmd", "Write the stored jobs as a job file that apply takes back unchanged."),
    "import": ("scheduler.cli.import_cmd", "import_group", "Import jobs from OpenClaw cron or a crontab."),
}


#: Commands that never validate, store or run a job: they start without the run pipeline's registry.
NO_JOB_COMMANDS = frozenset({"version", "capabilities", "schema"})


def _install_steps() -> None:
    """Install the run pipeline's steps and the handoff v4 kind, deferred: imported when a job is first validated or run."""
    from scheduler.core import steps, submissions

    steps.install(_pipeline_steps)
    submissions.install_deferred(_handoff_kind)


def _handoff_kind() -> Any:
    """The handoff v4 kind of submitted artifacts (``scheduler.artifacts.handoff_kind``), imported when a job binds one."""
    from scheduler.artifacts.handoff_kind import HANDOFF_KIND

    return HANDOFF_KIND


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(LAZY_COMMANDS) | set(super().list_commands(ctx)) | {"help"})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "help":
            return help_cmd
        if name not in NO_JOB_COMMANDS:
            _install_steps()
        if name in LAZY_COMMANDS:
            module, attr, _ = LAZY_COMMANDS[name]
            return getattr(importlib.import_module(module), attr)
        found = super().get_command(ctx, name)
        if found is None and not ctx.resilient_parsing:
            # Unknown to the kernel: give hook plugins a chance to add commands.
            from scheduler.plugins.hooks import Hooks

            Hooks().register_commands(self)
            found = super().get_command(ctx, name)
        return found

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, LAZY_COMMANDS[name][2]) for name in sorted(LAZY_COMMANDS)]
        rows.append(("help", "Show help for a command."))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db", envvar="SCHEDULER_DB", default=None, metavar="PATH|URL",
              help="Database: a SQLite file path or postgresql://... URL (env SCHEDULER_DB; default in the XDG data dir).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: one JSON object.")
@click.pass_context
def cli(ctx: click.Context, db: str | None, as_json: bool) -> None:
    """Schedule shell commands and AI-agent turns, durably."""
    ctx.ensure_object(dict)
    ctx.obj.setdefault("json", as_json)
    ctx.obj["json"] = ctx.obj["json"] or as_json
    ctx.obj["db"] = db


@click.command("help")
@click.argument("command", nargs=-1)
@click.pass_context
def help_cmd(ctx: click.Context, command: tuple[str, ...]) -> None:
    """Show help for the scheduler or one of its commands."""
    root = ctx.find_root()
    target: click.Command = root.command
    sub_ctx = root
    for name in command:
        if not isinstance(target, click.Group):
            break
        nxt = target.get_command(sub_ctx, name)
        if nxt is None:
            from scheduler.base.errors import SchedulerError

            raise SchedulerError("INVALID_ARGUMENT", f"no such command: {' '.join(command)}")
        sub_ctx = click.Context(nxt, info_name=name, parent=sub_ctx)
        target = nxt
    from scheduler.cli.output import emit

    text = target.get_help(sub_ctx)
    emit({"command": " ".join(command), "help": text}, lambda: click.echo(text))


#: Commands that only read the database: opening it for them never writes (no migration, no repair),
#: so they work while another process holds the write lock. ``doctor`` is not one: it repairs.
READ_ONLY_COMMANDS = frozenset({
    "jobs list", "jobs get", "jobs tree", "jobs next", "runs list", "runs get", "runs output", "runs events",
    "schedule list", "schedule show", "status", "export",
    "approvals list", "approvals show", "deliveries list", "deliveries show", "queue list", "queue show",
})


#: Commands that may create the SQLite database when its path names no file: those that add jobs. Every other
#: command (``scheduler run``, reads, ``doctor``) refuses a missing path with ``DB_NOT_FOUND`` instead of starting
#: over on an empty database (a dispatcher's deleted file must not come back empty, issue 30).
CREATING_COMMANDS = frozenset({"jobs add", "apply", "import openclaw", "import crontab", "schedule add"})


def _command_path(ctx: click.Context) -> str:
    """``"jobs list"`` for the context of ``scheduler ... jobs list``."""
    names: list[str] = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(names))


def _process_hooks() -> Any:
    """The entry-point hook modules (``scheduler.runtime.install`` for the CLI: imported only when there is something to tell)."""
    from scheduler.plugins.hooks import Hooks

    return Hooks()


def _pipeline_steps() -> Any:
    """The run pipeline's steps (``scheduler.pipeline.installed_steps``), imported when a command first needs them."""
    from scheduler.pipeline import installed_steps

    return installed_steps()


def open_ctx_store(ctx: click.Context | None = None) -> Any:
    """The store for this invocation, opened (and initialised, failing closed) on first use.

    Commands in ``READ_ONLY_COMMANDS`` open it read-only (see ``Store.initialize``); only those in
    ``CREATING_COMMANDS`` may create a SQLite database on a path that names none.
    """
    ctx = ctx or click.get_current_context()
    root = ctx.find_root()
    if root.obj.get("store") is None:
        from scheduler.core import observers
        from scheduler.plugins.stores import open_store

        observers.install_default(_process_hooks)  # what this command commits tells the installed hook modules
        command = _command_path(ctx)
        store = open_store(root.obj.get("db"), readonly=command in READ_ONLY_COMMANDS, create=command in CREATING_COMMANDS)
        root.obj["store"] = store
        root.call_on_close(store.close)
    return root.obj["store"]


def _split_json_flag(argv: list[str]) -> tuple[list[str], bool]:
    """Accept ``--json`` anywhere before ``--`` (it is a global option, but users put it last)."""
    out, as_json, passthrough = [], False, False
    for arg in argv:
        if passthrough:
            out.append(arg)
        elif arg == "--":
            passthrough = True
            out.append(arg)
        elif arg == "--json":
            as_json = True
        else:
            out.append(arg)
    return out, as_json


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; every error is coded, none is a traceback."""
    from scheduler.base.errors import SchedulerError
    from scheduler.cli.output import error_out

    args, as_json = _split_json_flag(list(sys.argv[1:] if argv is None else argv))
    obj: dict[str, Any] = {"json": as_json}
    try:
        rv = cli.main(args=args, prog_name="scheduler", standalone_mode=False, obj=obj)
        # standalone_mode=False returns ctx.exit(code) instead of raising it
        return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
    except SchedulerError as exc:
        _with_json(as_json, functools.partial(error_out, exc.code, exc.message, exc.details))
        return exc.exit_code or 1
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        _with_json(as_json, lambda: error_out("INTERRUPTED", "aborted"))
        return 130
    except click.ClickException as exc:
        _with_json(as_json, functools.partial(error_out, "INVALID_ARGUMENT", exc.format_message()))
        return 2
    except KeyboardInterrupt:
        _with_json(as_json, lambda: error_out("INTERRUPTED", "interrupted"))
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: still no traceback for the user unless asked
        if os.environ.get("SCHEDULER_DEBUG"):
            raise
        _with_json(as_json, functools.partial(error_out, "INTERNAL_ERROR", f"{type(exc).__name__}: {exc}"))
        return 70


def _with_json(as_json: bool, fn: Any) -> None:
    """Run an output function with JSON mode set even when click never built a context."""
    ctx = click.Context(cli, obj={"json": as_json})
    with ctx:
        fn()


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
