"""Named leases with fencing tokens: acquire, renew, assert, release.

Tokens come from one global counter row, so every acquisition anywhere gets a
token larger than any token handed out before; a takeover therefore always
fences out the previous holder. Release keeps the row (and its token): tokens
never go back, and the schema refuses a decrease or a delete.
"""

from __future__ import annotations

import os
import secrets
import socket

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core.store.base import Store, Tx

#: The row whose token is the global fencing counter.
FENCE_COUNTER = "__fence_counter__"


def new_owner_id() -> str:
    """``host:pid:random``: unique per dispatcher process, readable in ``status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def owner_host(owner: str | None) -> str | None:
    """The host part of an owner id."""
    return owner.split(":", 1)[0] if owner else None


def owner_pid(owner: str | None) -> int | None:
    """The PID part of an owner id (``host:pid:random``), or None when it has none."""
    try:
        return int(owner.split(":")[1]) if owner else None
    except (IndexError, ValueError):
        return None


def owner_is_dead_local_process(owner: str | None) -> bool:
    """True when ``owner`` names a process on this host that no longer exists."""
    if not owner or owner_host(owner) != socket.gethostname():
        return False
    pid = owner_pid(owner)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def describe_lost_dispatcher(owner: str | None, token: int | None) -> str:
    """Why a dispatcher no longer holds the fence of its runs, as far as this host can tell.

    Recovery records this on the runs it ends (``DISPATCHER_LOST``): a process that is
    gone from this host (killed, crashed, or stopped without ending its runs) is not the
    same story as one still alive that let its lease expire (stopped, stalled, hung), nor
    as one on another host, which may be down or unreachable.
    """
    who = f"dispatcher {owner} (token {token})"
    pid = owner_pid(owner)
    if not owner or pid is None:
        return f"{who} let its lease expire"
    if owner_host(owner) != socket.gethostname():
        return f"{who} on host {owner_host(owner)} let its lease expire (host down or unreachable, or the process stalled)"
    if owner_is_dead_local_process(owner):
        return f"{who} is gone: its process {pid} no longer runs on this host (killed, crashed or exited without ending its runs)"
    return f"{who} let its lease expire while its process {pid} was still alive on this host (stopped, stalled or hung)"


@attrs.define
class Lease:
    """A lease this process holds."""

    name: str
    owner: str
    token: int
    expires_at: int
    ttl_ms: int


class LeaseLost(SchedulerError):
    """The lease expired or was taken over: the holder must stop committing."""

    def __init__(self, message: str) -> None:
        super().__init__("LEASE_LOST", message)


def next_token(tx: Tx) -> int:
    """Draw the next fencing token from the global counter (inside the caller's transaction)."""
    tx.execute("INSERT INTO dispatcher_leases(name, token) VALUES (?, 0) ON CONFLICT (name) DO NOTHING", (FENCE_COUNTER,))
    return int(tx.scalar("UPDATE dispatcher_leases SET token = token + 1 WHERE name = ? RETURNING token", (FENCE_COUNTER,)))


def acquire(store: Store, name: str, owner: str, ttl_ms: int, *, now: int | None = None, steal_from: str | None = None) -> Lease | None:
    """Take the lease if it is free or expired (new, higher token); None while another live owner holds it.

    ``steal_from`` names a holder the caller has proven dead (same host, process gone):
    its unexpired lease is taken over too, still with a higher token.
    """
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        tx.execute("INSERT INTO dispatcher_leases(name, token) VALUES (?, 0) ON CONFLICT (name) DO NOTHING", (name,))
        row = tx.one("SELECT owner, expires_at FROM dispatcher_leases WHERE name = ?", (name,))
        assert row is not None
        stealing = steal_from is not None and row["owner"] == steal_from
        if row["owner"] is not None and row["owner"] != owner and (row["expires_at"] or 0) > now and not stealing:
            return None
        token = next_token(tx)
        changed = tx.execute(
            "UPDATE dispatcher_leases SET owner = ?, token = ?, acquired_at = ?, renewed_at = ?, expires_at = ?"
            " WHERE name = ? AND (owner IS NULL OR owner = ? OR owner = ? OR expires_at <= ?)",
            (owner, token, now, now, now + ttl_ms, name, owner, steal_from if stealing else owner, now),
        )
        if changed != 1:
            return None
    return Lease(name=name, owner=owner, token=token, expires_at=now + ttl_ms, ttl_ms=ttl_ms)


def renew(store: Store, lease: Lease, *, now: int | None = None) -> None:
    """Extend the lease, keeping its token; ``LeaseLost`` if it was taken over or has already expired.

    An expired lease is never renewed, even when nobody has taken it yet: others may
    already be acting on its expiry (recovering its runs), so a holder that could not
    renew in time (stopped, or blocked by a busy database) must step down.
    """
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        changed = tx.execute(
            "UPDATE dispatcher_leases SET renewed_at = ?, expires_at = ?"
            " WHERE name = ? AND owner = ? AND token = ? AND expires_at > ?",
            (now, now + lease.ttl_ms, lease.name, lease.owner, lease.token, now),
        )
        row = None if changed == 1 else tx.one("SELECT owner, token, expires_at FROM dispatcher_leases WHERE name = ?",
                                              (lease.name,))
    if changed != 1:
        if row is not None and row["owner"] == lease.owner and row["token"] == lease.token:
            raise LeaseLost(f"lease {lease.name!r} (token {lease.token}) expired {now - (row['expires_at'] or 0)} ms"
                            " before it could be renewed")
        raise LeaseLost(f"lease {lease.name!r} (token {lease.token}) was taken over")
    lease.expires_at = now + lease.ttl_ms


def assert_live(tx: Tx, lease: Lease, *, now: int | None = None) -> None:
    """Inside a transaction: fail with ``LeaseLost`` unless this lease is still ours and unexpired."""
    now = now_ms() if now is None else now
    row = tx.one("SELECT owner, token, expires_at FROM dispatcher_leases WHERE name = ?", (lease.name,))
    if row is None or row["owner"] != lease.owner or row["token"] != lease.token:
        raise LeaseLost(f"lease {lease.name!r} (token {lease.token}) is no longer held")
    if (row["expires_at"] or 0) <= now:
        raise LeaseLost(f"lease {lease.name!r} (token {lease.token}) expired")


def release(store: Store, lease: Lease, *, now: int | None = None) -> bool:
    """Give the lease up (the row and its token stay); False if it was no longer ours."""
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        changed = tx.execute(
            "UPDATE dispatcher_leases SET owner = NULL, expires_at = ? WHERE name = ? AND owner = ? AND token = ?",
            (now, lease.name, lease.owner, lease.token),
        )
    return changed == 1


def list_leases(tx: Tx) -> list[dict]:
    """Every lease row except the fence counter."""
    return tx.all("SELECT * FROM dispatcher_leases WHERE name <> ? ORDER BY name", (FENCE_COUNTER,))
