"""LISTEN/NOTIFY wake-ups: one channel per schema, one dedicated listening connection per store.

A sleeping dispatcher must wake within milliseconds when another process (a CLI
``jobs add``, a dispatcher on another host) commits work. PostgreSQL delivers
``NOTIFY`` to every session that ``LISTEN``s on the channel, at the notifier's commit.

The listener is a plain autocommit connection outside the pool (a pooled connection
would be handed to other threads and lose its ``LISTEN``). It is opened lazily on the
first wait and kept: notifications that arrive between two waits stay queued on the
socket and make the next wait return at once, so a wake-up is never lost while the
dispatcher is busy. Waiting is a ``select`` on the connection's socket plus a local
socket pair that ``close()`` uses to interrupt a wait in another thread.
"""

from __future__ import annotations

import hashlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

CHANNEL_PREFIX = "scheduler_wakeup_"
_MAX_IDENTIFIER = 63


def channel_name(schema: str) -> str:
    """The NOTIFY channel of a schema: ``scheduler_wakeup_<schema>``, hashed if it would exceed 63 bytes.

    Channels are per database, so naming the schema keeps stores in different
    schemas of one database from waking each other.
    """
    name = CHANNEL_PREFIX + schema
    if len(name.encode("utf-8")) <= _MAX_IDENTIFIER:
        return name
    return CHANNEL_PREFIX + hashlib.sha256(schema.encode("utf-8")).hexdigest()[:32]


class Listener:
    """A dedicated ``LISTEN`` connection and a wait that returns on the first notification."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], channel: str) -> None:
        self._connect = connect
        self.channel = channel
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def _ensure(self) -> tuple[psycopg.Connection[Any], bool]:
        """The listening connection, (re)opened when needed; the flag says it was just opened."""
        if self._conn is not None and not self._conn.closed:
            return self._conn, False
        conn = self._connect()
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn, True

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error as exc:  # pragma: no cover - closing a broken connection
                log.debug("closing LISTEN connection: %s", exc)

    def _drain(self, conn: psycopg.Connection[Any]) -> int:
        """Read whatever arrived on the socket; count the queued notifications (consuming them all)."""
        pgconn = conn.pgconn
        pgconn.consume_input()
        count = 0
        while pgconn.notifies() is not None:
            count += 1
        return count

    def _sleep(self, seconds: float) -> None:
        """Sleep, interruptibly by ``close()``."""
        if seconds > 0:
            select.select([self._wake_r], [], [], seconds)

    def wait(self, timeout_s: float) -> bool:
        """Block until a notification arrives (True) or ``timeout_s`` passes (False).

        One waiter at a time; a second thread waits for the first to finish, within its
        own deadline. If the listening connection breaks it is reopened; a reopen that
        succeeds returns True (a change may have been missed meanwhile), one that fails
        sleeps out the timeout and returns False so an outage never becomes a busy loop.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        if not self._lock.acquire(timeout=max(0.0, timeout_s)):
            return False
        try:
            if self._closed:
                return False
            reopened = self._conn is not None and self._conn.closed
            try:
                conn, fresh = self._ensure()
            except psycopg.Error as exc:
                log.warning("cannot open LISTEN connection for %s: %s", self.channel, exc)
                self._sleep(deadline - time.monotonic())
                return False
            if fresh and reopened:
                return True
            try:
                if self._drain(conn):
                    return True
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    wake = self._wake_r.fileno()
                    ready, _, _ = select.select([conn.fileno(), wake], [], [], remaining)
                    if wake in ready or self._closed:
                        return False
                    if ready and self._drain(conn):
                        return True
            except (psycopg.Error, OSError, ValueError) as exc:
                if self._closed:
                    return False
                log.warning("LISTEN connection for %s lost: %s", self.channel, exc)
                self._drop()
                try:
                    self._ensure()
                except psycopg.Error:
                    self._sleep(deadline - time.monotonic())
                    return False
                return True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Interrupt any wait and close the listening connection."""
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:  # pragma: no cover - buffer full or already closed
            pass
        with self._lock:
            self._drop()
            for s in (self._wake_r, self._wake_w):
                try:
                    s.close()
                except OSError:  # pragma: no cover
                    pass
