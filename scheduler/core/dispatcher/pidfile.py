"""The pid file of the one dispatcher of a SQLite file: an flock'd file beside the database, naming its PID."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from scheduler.core.dispatcher.config import clock
from scheduler.core.filemodes import create_file

log = logging.getLogger("scheduler.core.dispatcher")


class PidFile:
    """``<database>.dispatcher.pid`` of an exclusive dispatcher on a local SQLite file (``path`` None: no pid file).

    Only the lease decides who owns the database; the pid file tells operators (and
    ``scheduler restore``) which process that is, and its flock keeps a second local
    dispatcher from starting while the first is alive.
    """

    def __init__(self, path: Path | None, say: Callable[[str], None]) -> None:
        self.path = path
        self._say = say
        self._fh: IO[str] | None = None

    def lock(self) -> str | None:
        """Single instance per SQLite file: take the flock on the pid file.

        Only takes the lock, never writes: returns None when we hold it, or the PID the
        file names when another process holds it. A holder that lets its lease expire
        (stopped, hung) does not block a takeover: the lease, not the pid file, decides
        who owns the database. The PID is written once the lease is ours (``write``), so
        a refused dispatcher never overwrites it.
        """
        if self.path is None:
            return None
        # created 0600 (0660 in group mode), like the database
        fh = os.fdopen(create_file(self.path, os.O_RDWR | os.O_APPEND)[0], "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            other = fh.read().strip() or "?"
            fh.close()
            return other
        self._fh = fh
        return None

    def unlock_unwritten(self) -> None:
        """Let go of a lock taken for a start that did not get the lease (the file keeps naming the live holder)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def write(self) -> None:
        """Name our PID in the pid file: we hold the lease, so we are the dispatcher of this database.

        After a takeover from a stalled holder that still has the flock, the file is
        written without it (the stalled process never writes it again); the renewal
        thread takes the flock as soon as the stalled process is gone (``retry_lock``).
        """
        path = self.path
        if path is None:
            return
        line = f"{os.getpid()}\n"
        try:
            if self._fh is not None:
                self._fh.seek(0)
                self._fh.truncate()
                self._fh.write(line)
                self._fh.flush()
            else:
                with open(path, "r+" if path.exists() else "w") as fh:
                    fh.truncate()
                    fh.write(line)
        except OSError as exc:
            log.warning("could not write pid file %s: %s", path, exc)

    def retry_lock(self) -> None:
        """Take the pid-file lock once the stalled process we took over from has let go of it."""
        if self._fh is not None or self.path is None:
            return
        if self.lock() is None and self._fh is not None:
            self.write()
            self._say(f"{clock()} pid file lock taken over from the stalled dispatcher")

    def release(self, *, clean: bool) -> None:
        """Close the pid file; after a clean stop, empty it first so no stale PID is left behind."""
        fh, self._fh = self._fh, None
        path = self.path
        try:
            if clean and path is not None:
                if fh is not None:
                    fh.seek(0)
                    if fh.read().strip() == str(os.getpid()):
                        fh.seek(0)
                        fh.truncate()
                        fh.flush()
                elif path.exists() and path.read_text().strip() == str(os.getpid()):
                    with open(path, "r+") as other:
                        other.truncate()
        except OSError as exc:
            log.warning("could not clear pid file %s: %s", path, exc)
        finally:
            if fh is not None:
                fh.close()
