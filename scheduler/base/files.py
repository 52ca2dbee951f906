"""Reading a file a user or an operator names, never more than a limit: the one bounded read.

A proof file, a job file, a trust file (key, JWKS, CA), a policy file: each is read whole, but a
file that is too large (or a FIFO or device that never ends) must not be read into memory. The
read stops one byte past the limit, so "exactly at the limit" and "over it" are told apart
without a ``stat`` that a changing file could contradict.
"""

from __future__ import annotations

import os

from scheduler.base.errors import SchedulerError


def read_capped(path: str | os.PathLike[str], limit: int, *, what: str, unreadable: str, too_large: str) -> bytes:
    """The bytes of the file at ``path``, at most ``limit`` of them.

    ``SchedulerError(unreadable)`` naming ``what`` and the path when it cannot be opened or read
    (the OS's reason in the message), ``SchedulerError(too_large)`` when it holds more than
    ``limit`` bytes; ``details`` carry the path (and the limit).
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise SchedulerError(unreadable, f"cannot read the {what} {os.fspath(path)}: {exc.strerror or exc}",
                             details={"path": os.fspath(path)}) from None
    if len(data) > limit:
        raise SchedulerError(too_large, f"the {what} {os.fspath(path)} is larger than {limit} bytes",
                             details={"path": os.fspath(path), "limit_bytes": limit})
    return data
