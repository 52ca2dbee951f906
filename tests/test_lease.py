"""Named leases with fencing tokens: acquire, renew, assert, release, takeover (both stores)."""

from __future__ import annotations

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.core import lease as leases


def test_acquire_renew_release_keep_token(store):
    a = leases.acquire(store, "dispatcher", "host:1:a", 1000, now=1_000)
    assert a is not None and a.token >= 1
    leases.renew(store, a, now=1_500)
    assert a.expires_at == 2_500
    with store.read() as tx:
        row = tx.one("SELECT * FROM dispatcher_leases WHERE name = 'dispatcher'")
    assert row["token"] == a.token and row["owner"] == "host:1:a"
    assert leases.release(store, a, now=1_600)
    with store.read() as tx:
        row = tx.one("SELECT * FROM dispatcher_leases WHERE name = 'dispatcher'")
    assert row["owner"] is None and row["token"] == a.token  # the row and its token stay


def test_live_lease_cannot_be_taken_and_expired_one_is_taken_with_higher_token(store):
    a = leases.acquire(store, "dispatcher", "A", 1000, now=10_000)
    assert leases.acquire(store, "dispatcher", "B", 1000, now=10_500) is None
    b = leases.acquire(store, "dispatcher", "B", 1000, now=11_001)
    assert b is not None and b.token > a.token
    with pytest.raises(leases.LeaseLost):
        leases.renew(store, a, now=11_002)
    with store.transaction() as tx, pytest.raises(leases.LeaseLost):
        leases.assert_live(tx, a, now=11_003)
    with store.transaction() as tx:
        leases.assert_live(tx, b, now=11_003)
    assert not leases.release(store, a)  # a stale holder cannot release the new owner's lease


def test_tokens_increase_across_all_leases_and_reacquisition(store):
    tokens = []
    for i in range(3):
        lease = leases.acquire(store, f"dispatcher:{i}", f"owner{i}", 1000)
        tokens.append(lease.token)
        leases.release(store, lease)
        again = leases.acquire(store, f"dispatcher:{i}", f"owner{i}", 1000)
        tokens.append(again.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_expired_lease_fails_assert_even_without_takeover(store):
    a = leases.acquire(store, "dispatcher", "A", 1000, now=1_000)
    with store.transaction() as tx, pytest.raises(leases.LeaseLost) as info:
        leases.assert_live(tx, a, now=2_000)
    assert info.value.code == "LEASE_LOST"


def test_token_regression_and_delete_refused_by_schema(store):
    a = leases.acquire(store, "dispatcher", "A", 1000)
    with pytest.raises(SchedulerError) as info, store.transaction() as tx:
        tx.execute("UPDATE dispatcher_leases SET token = 0 WHERE name = 'dispatcher'")
    assert info.value.code == "CONSTRAINT_VIOLATION"
    with pytest.raises(SchedulerError), store.transaction() as tx:
        tx.execute("DELETE FROM dispatcher_leases WHERE name = 'dispatcher'")
    with store.read() as tx:
        assert tx.scalar("SELECT token FROM dispatcher_leases WHERE name = 'dispatcher'") == a.token
