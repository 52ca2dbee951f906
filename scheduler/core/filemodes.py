"""Permissions of the files the scheduler creates: the database, its WAL/SHM, artifacts, the pid file.

Job output and audit data belong to the operator, so by default (``private``) every
file the scheduler creates is ``0600`` and every directory it creates ``0700``,
whatever the process umask. Installations where approvers are other users of a shared
group choose ``group``: files ``0660``, directories ``2770`` (setgid, so files created
inside inherit the directory's group).

How it is enforced, without touching the process-wide umask (which child processes of
concurrently running jobs would inherit):

* files are created with ``os.open(..., O_CREAT | O_EXCL, mode)`` and then ``fchmod``'d
  to exactly ``mode`` (the umask can only remove bits, and group mode needs them);
* directories are created one level at a time and ``chmod``'d the same way;
* SQLite creates ``-wal`` and ``-shm`` itself with the *database file's* permissions
  (and, when run as root, its owner), so creating the database file first with the
  right mode is enough for them too.

Existing files and directories are never changed: ``doctor`` reports world access
instead (``world_access``), because tightening a file behind an operator's back can
lock out the users of a deliberate set-up.
A file the scheduler writes whole on request (``export --output``, ``replace_file``) is not
reused but replaced by a new private file, so it never keeps a wider mode from before.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import Literal

from scheduler.settings import current_settings

#: The override variable of the ``[storage] file_mode`` setting.
FILE_MODE_ENV = "SCHEDULER_STORAGE_FILE_MODE"

FileModeName = Literal["private", "group"]

#: Permissions per mode: (file, directory).
MODES: dict[str, tuple[int, int]] = {
    "private": (0o600, 0o700),
    "group": (0o660, 0o2770),
}


def file_mode_setting() -> FileModeName:
    """The configured mode: the ``[storage] file_mode`` setting (override ``SCHEDULER_STORAGE_FILE_MODE``).

    ``private`` by default; an unknown value is ``CONFIG_INVALID`` from the settings loader.
    The one place the setting is read.
    """
    return current_settings().storage.file_mode


def file_mode() -> int:
    """Permission bits for a file the scheduler creates (``0600``, or ``0660`` in group mode)."""
    return MODES[file_mode_setting()][0]


def dir_mode() -> int:
    """Permission bits for a directory the scheduler creates (``0700``, or ``02770`` in group mode)."""
    return MODES[file_mode_setting()][1]


def ensure_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` and any missing parents with ``dir_mode()``; existing directories are left as they are.

    ``Path.mkdir(mode=...)`` is filtered by the umask and applies to the last level
    only, so each level created here is ``chmod``'d to the exact mode.
    """
    target = Path(path)
    missing: list[Path] = []
    probe = target
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    mode = dir_mode() if missing else 0
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode & 0o777)
        except FileExistsError:
            continue  # created meanwhile by another thread or process: theirs to keep
        os.chmod(directory, mode)
    return target


def create_file(path: str | os.PathLike[str], flags: int = os.O_WRONLY) -> tuple[int, bool]:
    """Open ``path``, creating it with ``file_mode()`` if missing; returns (fd, created).

    ``flags`` are the access flags (``O_WRONLY``, ``O_RDWR``, ``O_APPEND``, ``O_TRUNC``...).
    An existing file keeps its permissions.
    """
    while True:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            try:
                return os.open(path, flags | os.O_CLOEXEC), False
            except FileNotFoundError:
                continue  # removed between the two opens: try to create it again
        try:
            os.fchmod(fd, file_mode())
        except BaseException:
            os.close(fd)
            raise
        return fd, True


def replace_file(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` as the file at ``path`` with exactly ``file_mode()``, atomically; returns the path written.

    For a file the scheduler writes on request that holds its data (``export --output``: every
    job spec): ``create_file`` makes a temp file beside the target (``O_EXCL``, then ``fchmod``
    to ``file_mode()``, whatever the umask), the bytes are written and synced, and the temp file
    is renamed over the target. So the result is private even when a file was already there
    with a wider mode (unlike ``create_file``, which keeps an existing file's mode: this file
    is replaced, not reused), and no reader ever sees half of it. A symlink is followed (its
    target is replaced); a path that exists but is not a regular file (a directory, a device,
    a FIFO) is refused with ``OSError`` (``EINVAL``) before anything is written.
    """
    target = Path(os.path.realpath(os.fspath(path)))
    if target.exists() and not target.is_file():
        raise OSError(errno.EINVAL, "not a regular file", str(target))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd, _created = create_file(tmp, os.O_WRONLY)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def world_access(path: str | os.PathLike[str]) -> str | None:
    """``"0644"``-style permissions when ``path`` exists and others may read, write or enter it, else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & stat.S_IRWXO:
        return format(stat.S_IMODE(mode), "04o")
    return None
