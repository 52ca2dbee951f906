"""``scheduler run``: the dispatcher in the foreground."""

from __future__ import annotations

import click

from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, json_mode
from scheduler.timeutil import parse_duration_ms


@click.command("run")
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True, help="Runs executed at once.")
@click.option("--lease-ttl", default="15s", show_default=True, help="Dispatcher lease lifetime (renewed every third of it).")
@click.option("--grace", default="10s", show_default=True, help="On SIGTERM/SIGINT: how long running work may finish before it is cancelled.")
@click.option("--duration", default=None, help="Stop by itself after this long (e.g. 30s); default: run until stopped.")
@click.option("--shared/--exclusive", "shared", default=None,
              help="Share the database with other dispatchers (PostgreSQL default) or be the only one (SQLite default).")
def run_cmd(concurrency: int, lease_ttl: str, grace: str, duration: str | None, shared: bool | None) -> None:
    """Run the dispatcher until SIGTERM/SIGINT (or --duration)."""
    from scheduler.dispatcher import Dispatcher, DispatcherConfig, install_signal_handlers

    config = DispatcherConfig(
        concurrency=concurrency,
        lease_ttl_ms=parse_duration_ms(lease_ttl, field="--lease-ttl"),
        grace_s=parse_duration_ms(grace, field="--grace") / 1000,
        exclusive=None if shared is None else not shared,
    )
    quiet = json_mode()
    dispatcher = Dispatcher(open_ctx_store(), config, say=None if quiet else lambda m: click.echo(m))
    install_signal_handlers(dispatcher)
    dispatcher.run(duration_s=parse_duration_ms(duration, field="--duration") / 1000 if duration else None)
    emit({"owner": dispatcher.owner, "stats": dispatcher.stats},
         lambda: click.echo(f"dispatcher stopped: {dispatcher.stats['started']} started, {dispatcher.stats['finished']} finished"))
