"""A dispatcher's tunables and timing constants, and what counts as a database error worth waiting out."""

from __future__ import annotations

import time
from pathlib import Path

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core import lease as leases

#: Longest the loop sleeps without looking at the database.
MAX_SLEEP_S = 1.0
#: How often the loop looks for cancel requests of its running runs (well inside the 250 ms promise).
CANCEL_CHECK_MS = 100
#: How often a sleeping loop looks for other processes' changes (well inside the 250 ms promise).
WAIT_SLICE_S = 0.02
#: A pass that found less work than it had free workers for (work arrives one run at a time) is followed by the next
#: pass no sooner than this (seconds) after it: that pass then takes the finished runs and due work of the whole window
#: in one commit (a time-capped commit group), at most this much later. A pass that fills its workers is followed at once.
GROUP_WINDOW_S = 0.002
#: How long a failed executor load is remembered before the dispatcher tries again.
EXECUTOR_RETRY_S = 30.0
#: After a run's deadline, how long its executor gets to end the run itself (``timeout``) before
#: the dispatcher cancels it: room for clock granularity, so a self-enforcing executor is never raced.
DEADLINE_SLACK_S = 0.5
#: After the dispatcher cancelled a run, how long on top of ``kill_grace_s`` the executor gets to
#: return (stopping a process group takes up to the kill grace) before its worker is abandoned.
ABANDON_SLACK_S = 1.0
#: Longest pause between attempts while the database stays busy (``DB_BUSY``).
BUSY_BACKOFF_MAX_S = 1.0
#: Longest pause between attempts while the database stays full (``DB_DISK_FULL``): room is made by hand, so
#: a few seconds' delay costs nothing, and each attempt may write a little more into what space is left.
DISK_FULL_BACKOFF_MAX_S = 5.0
#: At shutdown, how long to wait for the lease-renewal thread to finish a statement (it may be
#: waiting out a busy database) before the store can be closed under it.
RENEW_JOIN_S = 15.0
#: Codes of database errors worth waiting out, as opposed to a bug or a lost lease.
TRANSIENT_DB_CODES = frozenset({"DB_BUSY", "DB_UNAVAILABLE", "DB_DISK_FULL"})


def is_transient(exc: BaseException) -> bool:
    """True for a database error that may go away by itself (busy, briefly unavailable, full until space is freed).

    The dispatcher waits such errors out and retries instead of crashing; a lost lease
    is never transient.
    """
    if not isinstance(exc, SchedulerError) or isinstance(exc, leases.LeaseLost):
        return False
    return bool(getattr(exc, "retryable", False)) or exc.code in TRANSIENT_DB_CODES


@attrs.define
class DispatcherConfig:
    """Tunables of one dispatcher process."""

    concurrency: int = 4
    lease_ttl_ms: int = 15_000
    #: One dispatcher per database (SQLite default) or several sharing the work (PostgreSQL).
    exclusive: bool | None = None
    grace_s: float = 10.0
    kill_grace_s: float = 2.0
    recovery_interval_ms: int | None = None
    artifacts_root: Path | None = None
    owner: str | None = None


def clock() -> str:
    """The wall-clock time of day, as the dispatcher's lines start."""
    return time.strftime("%H:%M:%S")


def reached(at_ms: int | None, now: int) -> bool:
    """Whether an optional due time has come."""
    return at_ms is not None and at_ms <= now
