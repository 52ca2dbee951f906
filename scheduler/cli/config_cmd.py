"""``scheduler config``: the effective settings, the kernel's and those plugins contribute."""

from __future__ import annotations

import os
from typing import Any

import click

from scheduler.cli.output import emit, table


def kernel_settings(db: str | None) -> dict[str, Any]:
    """The kernel's settings as this invocation would use them (no database is opened)."""
    from scheduler.artifacts import default_artifacts_root
    from scheduler.dispatcher import DispatcherConfig
    from scheduler.queue import MISFIRE_GRACE_MS
    from scheduler.store import default_db_path, redact_url

    defaults = DispatcherConfig()
    target = db or str(default_db_path())
    return {
        "db": redact_url(target),
        "artifacts_dir": str(default_artifacts_root(target)),
        "dispatcher.concurrency": defaults.concurrency,
        "dispatcher.lease_ttl_ms": defaults.lease_ttl_ms,
        "dispatcher.grace_s": defaults.grace_s,
        "dispatcher.misfire_grace_ms": MISFIRE_GRACE_MS,
        "sqlite.synchronous": os.environ.get("SCHEDULER_SQLITE_SYNCHRONOUS", "NORMAL").upper(),
        "plugins.disabled": os.environ.get("SCHEDULER_DISABLE_PLUGINS", ""),
        "plugins.strict": os.environ.get("SCHEDULER_STRICT_PLUGINS", ""),
    }


@click.command("config")
@click.pass_context
def config_cmd(ctx: click.Context) -> None:
    """Show effective settings: the kernel's, plus defaults contributed by hook plugins (kernel keys win)."""
    from scheduler.plugins.hooks import Hooks

    kernel = kernel_settings(ctx.find_root().obj.get("db"))
    rows = [{"key": k, "value": v, "source": "kernel"} for k, v in kernel.items()]
    for key, value in sorted(Hooks().config_defaults().items()):
        if key not in kernel:
            rows.append({"key": key, "value": value, "source": "plugin"})
    emit({"config": {r["key"]: r["value"] for r in rows}, "sources": {r["key"]: r["source"] for r in rows}},
         lambda: table([(r["key"], r["value"], r["source"]) for r in rows], ["key", "value", "source"]))
