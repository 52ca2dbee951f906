"""``scheduler backup PATH`` and ``scheduler restore PATH``: a consistent copy of a live SQLite database and its artifacts.

Neither command opens the database through the store (no migration, no repair): backup
reads one snapshot with the SQLite online backup API, restore replaces the file. A
PostgreSQL URL is refused with ``BACKUP_UNSUPPORTED_STORE`` (docs/operations.md gives
the ``pg_dump`` recipe).
"""

from __future__ import annotations

from pathlib import Path

import click

from scheduler.cli.output import emit, json_mode, kv


def _target() -> tuple[str, Path | None]:
    """The ``--db`` target of this invocation and its local file (None for a server database)."""
    from scheduler.core.store import default_db_path, local_path_of

    raw = click.get_current_context().find_root().obj.get("db") or str(default_db_path())
    return raw, local_path_of(raw)


@click.command("backup")
@click.argument("path", type=click.Path(path_type=Path))
def backup_cmd(path: Path) -> None:
    """Copy the live SQLite database and its artifacts into the new directory PATH (the dispatcher keeps running)."""
    from scheduler.core.store import default_artifacts_root
    from scheduler.ops.backup import backup_sqlite, unsupported_store

    raw, db = _target()
    if db is None:
        raise unsupported_store(raw, "backup")
    shown = [-1]

    def progress(done: int, total: int) -> None:
        # Only worth a line for large files (over 32 MiB at 4 KiB pages), every tenth of the way.
        if json_mode() or total < 8192:
            return
        tenth = done * 10 // max(total, 1)
        if tenth != shown[0]:
            shown[0] = tenth
            click.echo(f"copied {done}/{total} pages ({tenth * 10}%)", err=True)

    result = backup_sqlite(db, path, artifacts_root=default_artifacts_root(db), progress=progress)

    def human() -> None:
        kv([
            ("backup", result["path"]),
            ("database", f"{result['source']} (schema {result['schema_version']}, {result['database']['bytes']} bytes)"),
            ("runs", result["rows"].get("runs", 0)),
            ("jobs", result["rows"].get("jobs", 0)),
            ("artifacts", f"{result['artifacts']['files']} file(s), {result['artifacts']['bytes']} bytes"),
            ("took", f"{result['seconds']} s"),
        ])
        if result["missing_artifacts"]:
            click.echo(f"warning: {len(result['missing_artifacts'])} artifact(s) referenced by the copy were removed before"
                       " they could be copied (pruned meanwhile)", err=True)

    emit({"backup": result}, human)


@click.command("restore")
@click.argument("path", type=click.Path(path_type=Path))
def restore_cmd(path: Path) -> None:
    """Replace the database (and its artifacts) with the backup directory PATH; refused while a dispatcher holds it."""
    from scheduler.core.store import default_artifacts_root
    from scheduler.ops.backup import restore_sqlite, unsupported_store

    raw, db = _target()
    if db is None:
        raise unsupported_store(raw, "restore")
    result = restore_sqlite(path, db, artifacts_root=default_artifacts_root(db))

    def human() -> None:
        kv([
            ("restored", result["database"]),
            ("from", f"{result['backup']} (taken {result['backup_created_at']})"),
            ("artifacts", result["artifacts"]),
            ("runs", result["rows"].get("runs", 0)),
            ("jobs", result["rows"].get("jobs", 0)),
            *[(f"previous {k}", v) for k, v in result["kept"].items()],
        ])

    emit({"restore": result}, human)
