"""The lease keeper: takes the dispatcher's fenced lease, renews it on its own thread, and gives it up.

It also holds the singleton ``maintenance`` lease of a dispatcher that shares its database
(PostgreSQL): the one dispatcher holding it runs recovery and the singleton duties.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core import lease as leases
from scheduler.core.dispatcher.config import RENEW_JOIN_S
from scheduler.core.dispatcher.pidfile import PidFile
from scheduler.core.store.base import Store

log = logging.getLogger("scheduler.core.dispatcher")


class LeaseKeeper:
    """The dispatcher's lease (``lease``) and, in shared mode, the ``maintenance`` lease while it holds it."""

    def __init__(self, store: Store, *, name: str, owner: str, ttl_ms: int, exclusive: bool, pidfile: PidFile,
                 say: Callable[[str], None], on_lost: Callable[..., None]) -> None:
        self.store = store
        self.name = name
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.exclusive = exclusive
        self.pidfile = pidfile
        self._say = say
        #: Told (from the renewal thread) when the lease was taken over or ran out (``why``), or the database file
        #: vanished (``why, code="DB_VANISHED"``).
        self._on_lost = on_lost
        self.lease: leases.Lease | None = None
        #: The singleton ``maintenance`` lease (shared mode only), while we hold it.
        self.maint: leases.Lease | None = None
        #: Why the lease was lost (None while it is ours, or after we released it).
        self.lost: str | None = None
        #: The code the dispatcher exits with once ``lost`` is set: ``LEASE_LOST``, or ``DB_VANISHED``.
        self.lost_code = "LEASE_LOST"
        #: Set once we gave the lease up ourselves: a failure to renew after that is no loss.
        self.released = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def acquire(self) -> leases.Lease:
        """Take the lease (or fail with ``DISPATCHER_ALREADY_RUNNING``) and name our PID in the pid file."""
        holder = self.pidfile.lock()
        lease = leases.acquire(self.store, self.name, self.owner, self.ttl_ms)
        if lease is None:
            with self.store.read() as tx:
                row = tx.one("SELECT owner, expires_at FROM dispatcher_leases WHERE name = ?", (self.name,))
            if row and leases.owner_is_dead_local_process(row["owner"]):
                # The holder crashed on this host (kill -9): no need to wait for its lease to run out.
                lease = leases.acquire(self.store, self.name, self.owner, self.ttl_ms, steal_from=row["owner"])
                if lease is not None:
                    self._say(f"previous dispatcher {row['owner']} is gone: took over its lease")
        if lease is None:
            self.pidfile.unlock_unwritten()
            raise SchedulerError(
                "DISPATCHER_ALREADY_RUNNING",
                f"dispatcher lease on {self.store.location} is held by {row['owner'] if row else '?'}"
                f" until {to_iso(row['expires_at']) if row else '?'}",
            )
        if holder is not None:
            self._say(f"pid file held by stalled process {holder} whose lease expired: taking over")
        self.lease = lease
        self.pidfile.write()
        return lease

    def start_renewal(self) -> None:
        """Renew the lease on a daemon thread from now on."""
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        """Renew the lease every third of its TTL until shutdown stops this thread.

        A failed renewal (busy or unavailable database) is retried soon; a lease that
        was taken over or ran out meanwhile is lost (``renew`` never resurrects an
        expired lease), and the dispatcher steps down. Each renewal first checks that the
        database path still names the file the store opened (``verify_identity``, where the
        store has a file: SQLite): a deleted or replaced file stops the dispatcher at once
        with ``DB_VANISHED``.
        """
        assert self.lease is not None
        interval = self.lease.ttl_ms / 3000
        delay = interval
        verify = getattr(self.store, "verify_identity", None)
        while not self._stop.wait(delay):
            if self.lost is not None or self.released:
                return
            try:
                if verify is not None:
                    verify()
                leases.renew(self.store, self.lease)
                delay = interval
            except leases.LeaseLost as exc:
                self._on_lost(exc.message)
                return
            except SchedulerError as exc:
                if exc.code != "DB_VANISHED":
                    if self._renewal_failed(exc):
                        return
                    delay = min(interval, 0.2)
                    continue
                self._on_lost(exc.message, code=exc.code)
                return
            except Exception as exc:  # noqa: BLE001 - database busy or unavailable: keep trying until the lease runs out
                if self._renewal_failed(exc):
                    return
                delay = min(interval, 0.2)
                continue
            self.pidfile.retry_lock()

    def _renewal_failed(self, exc: Exception) -> bool:
        """Log a failed renewal; True (and the lease lost) when the lease ran out meanwhile."""
        assert self.lease is not None
        log.warning("lease renewal failed: %s", getattr(exc, "message", exc))
        if now_ms() >= self.lease.expires_at:
            code = "DB_DISK_FULL" if getattr(exc, "code", None) == "DB_DISK_FULL" else "LEASE_LOST"
            self._on_lost(f"lease expired while renewal failed: {getattr(exc, 'message', exc)}", code=code)
            return True
        return False

    def lose(self, why: str, code: str = "LEASE_LOST") -> bool:
        """Record that the lease is lost (``code``: why the dispatcher exits); False when we had given it up
        ourselves (during shutdown)."""
        if self.released or self.lost is not None:
            return False
        self.lost, self.lost_code = why, code
        return True

    def maintenance(self) -> leases.Lease | None:
        """Singleton duties (recovery) run under one named lease, taken over when it expires."""
        current = self.maint
        if current is not None:
            try:
                leases.renew(self.store, current)
                return current
            except leases.LeaseLost:
                self.maint = None
        self.maint = leases.acquire(self.store, "maintenance", self.owner, self.ttl_ms)
        return self.maint

    def singleton_fence(self) -> leases.Lease | None:
        """The lease fencing singleton work: ours on a database of our own, else the maintenance lease while held."""
        return self.lease if self.exclusive else self.maint

    def stop_renewal(self) -> None:
        """Stop the renewal thread and wait for it (closing the store under a thread blocked in a statement crashed
        the process); from now on the lease is ours to give up."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(RENEW_JOIN_S)
            if self._thread.is_alive():
                log.warning("lease renewal thread still busy after %.0fs", RENEW_JOIN_S)
        self.released = True

    def release(self, *, clean: bool) -> None:
        """Empty the pid file before releasing the leases (never after another dispatcher took over).

        After an unclean stop (the lease lost) the pid file is only closed and the leases left to expire.
        """
        if not clean:
            self.pidfile.release(clean=False)
            return
        self.pidfile.release(clean=True)
        assert self.lease is not None
        for lease in (self.lease, self.maint):
            if lease is None:
                continue
            try:
                leases.release(self.store, lease)
            except SchedulerError as exc:  # busy: the lease simply expires after its TTL
                log.warning("could not release lease %r: %s", lease.name, exc.message)
