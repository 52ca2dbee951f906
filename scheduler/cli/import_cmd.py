"""``scheduler import openclaw`` and ``scheduler import crontab``: bring existing jobs in (see ``scheduler.importers``)."""

from __future__ import annotations

import click


@click.group("import")
def import_group() -> None:
    """Import jobs from OpenClaw cron or a crontab."""
