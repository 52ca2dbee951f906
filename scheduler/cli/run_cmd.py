"""``scheduler run``: the dispatcher in the foreground.

Signals: the first SIGTERM/SIGINT stops claiming and gives running work the grace
period (finished runs are committed as they finish); a second one cancels running
work at once. Executors that ignore cancellation are abandoned by the dispatcher,
which commits their runs itself; the process then exits without waiting for those
worker threads (``os._exit`` after everything is committed and the lease released).
"""

from __future__ import annotations

import os
from typing import Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import parse_duration_ms
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, error_out, json_mode


@click.command("run")
@click.option("--concurrency", type=click.IntRange(1, 256), default=None,
              help="Runs executed at once.  [default: [dispatcher] concurrency, else 4]")
@click.option("--lease-ttl", default=None,
              help="Dispatcher lease lifetime (renewed every third of it).  [default: [dispatcher] lease_ttl_ms, else 15s]")
@click.option("--grace", default=None,
              help="On SIGTERM/SIGINT: how long running work may finish before it is cancelled.  [default: [dispatcher] grace_s, else 10s]")
@click.option("--duration", default=None, help="Stop by itself after this long (e.g. 30s); default: run until stopped.")
@click.option("--shared/--exclusive", "shared", default=None,
              help="Share the database with other dispatchers (PostgreSQL default) or be the only one (SQLite default).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port (0: any free port, printed at start); default: off.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics endpoint listens on.")
def run_cmd(concurrency: int | None, lease_ttl: str | None, grace: str | None, duration: str | None, shared: bool | None,
            metrics_port: int | None, metrics_host: str) -> None:
    """Run the dispatcher until SIGTERM/SIGINT (or --duration)."""
    from scheduler.core.dispatcher import DispatcherConfig, install_signal_handlers
    from scheduler.plugins.options import check_routes
    from scheduler.runtime import dispatcher as composed_dispatcher
    from scheduler.settings import current_settings

    check_routes(current_settings())  # every notification would be stored for a destination its channel cannot send to
    settings = current_settings().dispatcher  # the settings file's [dispatcher]; flags win
    config = DispatcherConfig(
        concurrency=concurrency or settings.concurrency,
        lease_ttl_ms=parse_duration_ms(lease_ttl, field="--lease-ttl") if lease_ttl else settings.lease_ttl_ms,
        grace_s=parse_duration_ms(grace, field="--grace") / 1000 if grace else settings.grace_s,
        kill_grace_s=settings.kill_grace_s,
        exclusive=None if shared is None else not shared,
    )
    quiet = json_mode()
    store = open_ctx_store()
    dispatcher = composed_dispatcher(store, config, hooks=_json_event_hooks(store) if quiet else None,
                                     say=None if quiet else click.echo)
    install_signal_handlers(dispatcher)
    if metrics_port is not None:  # prometheus_client is imported only here
        from scheduler.ops.metrics import DispatcherMetrics

        dispatcher.metrics = DispatcherMetrics(dispatcher)
        bound = dispatcher.metrics.start(metrics_host, metrics_port)
        dispatcher.say(f"metrics on http://{metrics_host}:{bound}/metrics")
    try:
        dispatcher.run(duration_s=parse_duration_ms(duration, field="--duration") / 1000 if duration else None)
    except SchedulerError as exc:
        if dispatcher.stuck_workers():
            error_out(exc.code, exc.message, exc.details)
            _exit_leaving_stuck_workers(dispatcher, exc.exit_code or 1)
        raise
    emit({"owner": dispatcher.owner, "stats": dispatcher.stats},
         lambda: click.echo(f"dispatcher stopped: {dispatcher.stats['started']} started, {dispatcher.stats['finished']} finished"))
    if dispatcher.stuck_workers():
        _exit_leaving_stuck_workers(dispatcher, 0)


def _json_event_hooks(store: Any) -> Any:
    """Under ``--json``: the entry-point hook modules plus ``RunEventLines``, which prints one JSON line per run event
    (NDJSON) from the observer calls the dispatcher makes anyway; the summary stays the last line."""
    from scheduler.cli.output import echo_json
    from scheduler.ops.run_events import RunEventLines
    from scheduler.plugins.hooks import Hooks, make_plugin_manager

    return Hooks(make_plugin_manager([RunEventLines(store, echo_json)]))


def _exit_leaving_stuck_workers(dispatcher: Any, code: int) -> None:
    """Exit now although worker threads are still inside executors that ignored cancellation.

    Their runs are already committed (or left to recovery when the lease was lost) and
    the lease released; waiting for them is what made ``--grace`` meaningless. The store
    is not closed under them (a thread inside a statement must not see its connection
    closed); the operating system releases files and locks, and SQLite's WAL is
    recovered by the next open.
    """
    import sys

    click.echo(f"leaving {dispatcher.stuck_workers()} stuck worker(s) behind", err=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
