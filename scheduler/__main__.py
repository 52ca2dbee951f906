"""``python -m scheduler`` runs the CLI."""

from scheduler.cli.main import run

run()
