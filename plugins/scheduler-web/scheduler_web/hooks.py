"""``scheduler web``: the web view as a CLI command, added through the kernel's ``scheduler_register_commands`` hook.

The kernel calls the hook only for a command it does not know, so the web stack (Starlette,
Jinja2, uvicorn) is imported only when ``scheduler web`` runs.
"""

from __future__ import annotations

from typing import Any

import click

from scheduler.api import hookimpl


@hookimpl
def scheduler_register_commands(cli: Any) -> None:
    """Add ``scheduler web`` to the root group (once: the kernel may call the hook more than once per process)."""
    if "web" in cli.commands:
        return

    @cli.command("web")
    @click.option("--host", envvar="SCHEDULER_WEB_HOST", default="127.0.0.1", show_default=True,
                  help="Address to bind (env SCHEDULER_WEB_HOST). Anything but loopback needs an access token.")
    @click.option("--port", envvar="SCHEDULER_WEB_PORT", type=click.IntRange(0, 65535), default=8787, show_default=True,
                  help="TCP port (env SCHEDULER_WEB_PORT; 0: any free port, printed at start).")
    @click.option("--read-only", "read_only", envvar="SCHEDULER_WEB_READ_ONLY", is_flag=True,
                  help="Serve the pages without any action (env SCHEDULER_WEB_READ_ONLY=1).")
    @click.option("--token-file", "token_file", envvar="SCHEDULER_WEB_TOKEN_FILE", default=None, metavar="PATH",
                  type=click.Path(dir_okay=False),
                  help="File holding the access token every request must carry (env SCHEDULER_WEB_TOKEN_FILE; "
                       "or the token itself in SCHEDULER_WEB_TOKEN).")
    def web(host: str, port: int, read_only: bool, token_file: str | None) -> None:
        """Serve the web view of this database: jobs, runs, approvals, deliveries, status (docs/web.md)."""
        from scheduler_web.server import serve

        serve(click.get_current_context().find_root().obj.get("db"), host=host, port=port, read_only=read_only,
              token_file=token_file)
