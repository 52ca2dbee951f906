"""Backup and restore of a SQLite database and its artifact store, while a dispatcher keeps running.

A backup is a directory::

    PATH/scheduler.db     a consistent copy of the database (SQLite online backup API)
    PATH/artifacts/       the offloaded output files (``scheduler.core.outputs``), copied after the database
    PATH/backup.json      the manifest: format, time, source, schema version, SHA-256 and row counts

Consistency: the database is copied page by page (``sqlite3.Connection.backup`` in steps)
inside one read transaction on the source, so the copy is the database as of one
instant although the dispatcher keeps committing (WAL readers never block writers, and a
held snapshot never makes the backup restart). Artifacts are copied *after* that
snapshot: a run's files are written before its row commits, so every run in the copy
finds its files; files of later runs are harmless extras (orphans). A file that is in
the snapshot but gone when copied (pruned meanwhile) is listed as ``missing_artifacts``.

Restore refuses a database a dispatcher holds (the pid-file flock beside it, a live
lease in it, or any other open connection), then writes the copy beside the target,
fsyncs it, checks it and renames it into place; the database it replaces is kept
beside it (``*.pre-restore-STAMP``) and the backup's artifact files are merged into the
artifact store (paths are unique per run; a root shared by several databases is never swapped). PostgreSQL has no online copy here: see
docs/operations.md (``pg_dump``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.core import filemodes
from scheduler.core.lease import owner_is_dead_local_process
from scheduler.core.store import redact_url
from scheduler.core.store.migrations import SCHEMA_VERSION

#: The manifest's ``format``: bumped when the layout changes.
BACKUP_FORMAT = "scheduler-backup-v1"
MANIFEST = "backup.json"
DB_NAME = "scheduler.db"
ARTIFACTS_DIR = "artifacts"
#: Pages copied per backup step (4 MiB at the default 4 KiB page size): progress for large files,
#: and the source's WAL is never pinned by one long step.
STEP_PAGES = 1024
#: Columns of ``runs`` that name an offloaded artifact (relative to the artifact root).
ARTIFACT_COLUMNS = ("stdout_artifact", "stderr_artifact", "output_artifact")
#: Where the PostgreSQL recipe lives (named in ``BACKUP_UNSUPPORTED_STORE``).
POSTGRES_DOC = "docs/operations.md#postgresql"

Progress = Callable[[int, int], None]


def unsupported_store(target: str, what: str) -> SchedulerError:
    """``BACKUP_UNSUPPORTED_STORE`` for a server database: the operator uses the server's own tools."""
    return SchedulerError(
        "BACKUP_UNSUPPORTED_STORE",
        f"`scheduler {what}` copies a SQLite file; {redact_url(target)} is a server database:"
        f" use pg_dump / pg_restore as described in {POSTGRES_DOC}",
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{uuid.uuid4().hex[:6]}"


def _check_sqlite_file(path: Path, what: str) -> None:
    """NOT_FOUND for a missing file, ``BACKUP_INVALID`` for something that is not a SQLite database."""
    if not path.is_file():
        raise SchedulerError("NOT_FOUND", f"{what} not found: {path}")
    with open(path, "rb") as fh:
        if fh.read(16) != b"SQLite format 3\x00":
            raise SchedulerError("BACKUP_INVALID", f"{what} is not a SQLite database: {path}")


def _inspect_copy(path: Path) -> dict[str, Any]:
    """Integrity, schema version and row counts of a database copy (closed again; WAL files cleaned up)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        if "schema_migrations" not in tables:
            raise SchedulerError("BACKUP_INVALID", f"{path} is not a scheduler database (no schema_migrations table)")
        version = int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0])
        counts = {t: int(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0]) for t in tables}
        artifacts: set[str] = set()
        if "runs" in tables:
            cols = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
            for col in (c for c in ARTIFACT_COLUMNS if c in cols):
                artifacts.update(r[0] for r in conn.execute(f"SELECT {col} FROM runs WHERE {col} IS NOT NULL"))
    finally:
        conn.close()
    return {"integrity": integrity, "schema_version": version, "rows": counts, "artifacts": sorted(artifacts)}


def _copy_db(source: Path, dest: Path, progress: Progress | None, step_pages: int) -> None:
    """Copy a live database into ``dest`` with the online backup API, inside one read snapshot of the source."""
    fd, _ = filemodes.create_file(dest, os.O_WRONLY)
    os.close(fd)
    src = sqlite3.connect(source, isolation_level=None, timeout=30)
    try:
        src.execute("PRAGMA busy_timeout = 30000")
        dst = sqlite3.connect(dest, isolation_level=None)
        try:
            # One snapshot for the whole copy: the dispatcher's commits land after it, never inside it.
            src.execute("BEGIN")
            src.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()

            def step(_status: int, remaining: int, total: int) -> None:
                if progress is not None:
                    progress(total - remaining, total)

            src.backup(dst, pages=step_pages, progress=step)
            src.execute("COMMIT")
            # A copy that is a single self-contained file: no -wal/-shm left beside it.
            dst.execute("PRAGMA journal_mode = DELETE")
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise SchedulerError("BACKUP_FAILED", f"copying {source} failed: {exc}") from None
    finally:
        src.close()
    _fsync_file(dest)


def _copy_tree(src_root: Path, dest_root: Path) -> tuple[int, int, int]:
    """Copy every file under ``src_root`` (permissions kept); ``(files, bytes, vanished)``.

    A file removed while the copy runs (pruned) is skipped and counted, not an error.
    """
    files = size = vanished = 0
    if not src_root.is_dir():
        return 0, 0, 0
    filemodes.ensure_dir(dest_root)
    for dirpath, dirnames, filenames in os.walk(src_root):
        rel = Path(dirpath).relative_to(src_root)
        target_dir = dest_root / rel
        filemodes.ensure_dir(target_dir)
        dirnames.sort()
        for name in sorted(filenames):
            try:
                shutil.copy2(Path(dirpath) / name, target_dir / name)
            except FileNotFoundError:
                vanished += 1
                continue
            files += 1
            size += (target_dir / name).stat().st_size
            _fsync_file(target_dir / name)
        _fsync_dir(target_dir)
    return files, size, vanished


def backup_sqlite(db_path: Path, dest: Path, *, artifacts_root: Path, progress: Progress | None = None,
                  step_pages: int = STEP_PAGES) -> dict[str, Any]:
    """Make a consistent backup directory ``dest`` of a live SQLite database and its artifact store.

    Nothing is stopped or locked for writing: the copy is taken from one read snapshot.
    The directory is assembled beside ``dest`` and renamed into place when complete, so a
    failed or interrupted backup never leaves something that looks like a backup.
    ``dest`` must not exist, or be an empty directory (``BACKUP_TARGET_EXISTS``), and its
    directory must be one a directory can be made in (``BACKUP_TARGET_INVALID``: ``/proc/x``,
    below a file, no permission).
    """
    db_path = db_path.expanduser().resolve()
    dest = dest.expanduser().absolute()
    _check_sqlite_file(db_path, "database")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise SchedulerError("BACKUP_TARGET_EXISTS", f"{dest} exists and is not an empty directory")
    root = artifacts_root.expanduser().absolute()
    if dest == db_path.parent or dest == root or root in dest.parents:
        raise SchedulerError("INVALID_ARGUMENT", f"{dest} is where the live database keeps its files")
    work = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        filemodes.ensure_dir(dest.parent)
        filemodes.ensure_dir(work)
    except OSError as exc:  # /proc/x, below a file, no permission, a read-only file system: a coded refusal
        raise SchedulerError("BACKUP_TARGET_INVALID", f"cannot make the backup directory {dest}: {exc.strerror or exc}",
                             details={"path": str(dest)}) from None
    started = time.time()
    try:
        _copy_db(db_path, work / DB_NAME, progress, step_pages)
        info = _inspect_copy(work / DB_NAME)
        if info["integrity"] != ["ok"]:
            raise SchedulerError("BACKUP_FAILED", "the copy fails its integrity check: " + "; ".join(info["integrity"][:5]))
        files, size, vanished = _copy_tree(artifacts_root, work / ARTIFACTS_DIR)
        missing = [a for a in info["artifacts"] if not (work / ARTIFACTS_DIR / a).is_file()]
        manifest = {
            "format": BACKUP_FORMAT,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "source": str(db_path),
            "artifacts_source": str(artifacts_root),
            "schema_version": info["schema_version"],
            "database": {"file": DB_NAME, "bytes": (work / DB_NAME).stat().st_size, "sha256": _sha256(work / DB_NAME)},
            "rows": info["rows"],
            "artifacts": {"dir": ARTIFACTS_DIR, "files": files, "bytes": size, "referenced": len(info["artifacts"]),
                          "vanished_during_copy": vanished},
            "missing_artifacts": missing,
        }
        mpath = work / MANIFEST
        fd, _ = filemodes.create_file(mpath, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "w") as fh:
            json.dump(manifest, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(work)
        os.replace(work, dest)  # an empty ``dest`` directory is replaced; anything else was refused above
        _fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {"path": str(dest), "seconds": round(time.time() - started, 3), **manifest}


def read_manifest(backup: Path) -> dict[str, Any]:
    """The manifest of a backup directory, checked for format and the database's digest (``BACKUP_INVALID``)."""
    backup = backup.expanduser()
    if not backup.is_dir():
        raise SchedulerError("NOT_FOUND", f"backup directory not found: {backup}")
    try:
        manifest = json.loads((backup / MANIFEST).read_text())
    except FileNotFoundError:
        raise SchedulerError("BACKUP_INVALID", f"{backup} has no {MANIFEST}: not a `scheduler backup` directory") from None
    except (OSError, ValueError) as exc:
        raise SchedulerError("BACKUP_INVALID", f"{backup / MANIFEST} is unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BACKUP_FORMAT:
        raise SchedulerError("BACKUP_INVALID", f"{backup / MANIFEST}: unknown format {manifest.get('format') if isinstance(manifest, dict) else None!r}"
                             f" (expected {BACKUP_FORMAT})")
    db = backup / DB_NAME
    _check_sqlite_file(db, "backup database")
    expected = (manifest.get("database") or {}).get("sha256")
    if expected != _sha256(db):
        raise SchedulerError("BACKUP_INVALID", f"{db} does not match the SHA-256 its manifest records (damaged or edited)")
    return manifest


def pidfile_of(db_path: Path) -> Path:
    """The dispatcher's flock'd pid file beside a SQLite database (see ``scheduler.core.dispatcher.pidfile.PidFile.lock``)."""
    return Path(f"{db_path}.dispatcher.pid")


def _hold_pidfile(db_path: Path) -> Any:
    """Take the dispatcher pid file's flock for the restore, or ``RESTORE_DATABASE_IN_USE`` naming the holder."""
    path = pidfile_of(db_path)
    fh = os.fdopen(filemodes.create_file(path, os.O_RDWR | os.O_APPEND)[0], "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "?"
        fh.close()
        raise SchedulerError("RESTORE_DATABASE_IN_USE",
                             f"a dispatcher (pid {holder}) holds {db_path}: stop it (`scheduler service` / SIGTERM) before restoring") from None
    return fh


def _check_idle(db_path: Path) -> None:
    """Refuse a database with a live dispatcher lease or another open connection; leaves its WAL empty."""
    now = int(time.time() * 1000)
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=5)
    try:
        try:
            rows = conn.execute("SELECT name, owner, expires_at FROM dispatcher_leases").fetchall()
        except sqlite3.OperationalError:
            rows = []  # not (yet) a scheduler database: nothing holds it
        live = [r for r in rows if r[1] and (r[2] or 0) > now and not owner_is_dead_local_process(r[1])]
        if live:
            raise SchedulerError("RESTORE_DATABASE_IN_USE",
                                 f"{db_path}: lease {live[0][0]!r} is held by {live[0][1]} until it expires or is released;"
                                 " stop that dispatcher before restoring")
        busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise SchedulerError("RESTORE_DATABASE_IN_USE", f"{db_path} is open in another process: close it before restoring")
    except sqlite3.Error as exc:
        raise SchedulerError("RESTORE_DATABASE_IN_USE", f"{db_path} cannot be locked for the restore: {exc}") from None
    finally:
        conn.close()


def _merge_artifacts(src_root: Path, root: Path) -> int:
    """Put every artifact file of a backup into ``root``, each written beside and renamed into place.

    Merged, not swapped: artifact paths are unique per run (``runs/RUN_ID/...``), and an
    artifact root may be shared by several databases in one directory, so nothing already
    there is moved or removed (files no restored run names are orphans for pruning).
    Returns how many files were written.
    """
    written = 0
    if not src_root.is_dir():
        return 0
    for dirpath, _dirnames, filenames in os.walk(src_root):
        target_dir = root / Path(dirpath).relative_to(src_root)
        filemodes.ensure_dir(target_dir)
        for name in filenames:
            source, target = Path(dirpath) / name, target_dir / name
            if target.is_file() and target.stat().st_size == source.stat().st_size and _sha256(target) == _sha256(source):
                continue
            partial = target_dir / f".{name}.restore-{uuid.uuid4().hex[:8]}"
            try:
                shutil.copy2(source, partial)
                _fsync_file(partial)
                os.replace(partial, target)
            finally:
                partial.unlink(missing_ok=True)
            written += 1
        _fsync_dir(target_dir)
    return written


def restore_sqlite(backup: Path, db_path: Path, *, artifacts_root: Path) -> dict[str, Any]:
    """Replace ``db_path`` and its artifact store with a backup, atomically, unless something holds the database.

    Order: check the backup (manifest, digest); copy its database beside the target and
    check the copy (integrity, a schema this version can open); take the dispatcher's pid
    file lock and make sure no lease or connection is live; keep the current database
    beside it (``*.pre-restore-STAMP``); rename the copy into place and fsync the directory;
    then merge the backup's artifact files into the artifact store.
    """
    backup = backup.expanduser().absolute()
    db_path = db_path.expanduser().absolute()
    manifest = read_manifest(backup)
    filemodes.ensure_dir(db_path.parent)
    tmp = db_path.parent / f".{db_path.name}.restore-{uuid.uuid4().hex[:8]}"
    stamp = _stamp()
    kept: dict[str, str] = {}
    lock = None
    try:
        fd, _ = filemodes.create_file(tmp, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "wb") as out, open(backup / DB_NAME, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        if _sha256(tmp) != manifest["database"]["sha256"]:
            raise SchedulerError("BACKUP_INVALID", f"{backup / DB_NAME} changed while it was copied")
        info = _inspect_copy(tmp)
        if info["integrity"] != ["ok"]:
            raise SchedulerError("BACKUP_INVALID", "the backup fails its integrity check: " + "; ".join(info["integrity"][:5]))
        if info["schema_version"] > SCHEMA_VERSION:
            raise SchedulerError("BACKUP_INVALID", f"the backup has schema version {info['schema_version']};"
                                                   f" this scheduler knows up to {SCHEMA_VERSION}")
        lock = _hold_pidfile(db_path)
        if db_path.exists():
            _check_idle(db_path)
            aside = db_path.with_name(f"{db_path.name}.pre-restore-{stamp}")
            shutil.copy2(db_path, aside)
            kept["database"] = str(aside)
            for suffix in ("-wal", "-shm"):  # empty after the TRUNCATE checkpoint; must not meet the new file
                Path(f"{db_path}{suffix}").unlink(missing_ok=True)
        os.replace(tmp, db_path)
        _fsync_dir(db_path.parent)
        restored = _merge_artifacts(backup / ARTIFACTS_DIR, artifacts_root)
    finally:
        tmp.unlink(missing_ok=True)
        if lock is not None:
            lock.close()
    return {"database": str(db_path), "artifacts": str(artifacts_root), "backup": str(backup),
            "backup_created_at": manifest.get("created_at"), "schema_version": info["schema_version"],
            "rows": info["rows"], "kept": kept, "artifacts_restored": restored}
