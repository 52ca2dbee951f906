"""Kernel SQL on PostgreSQL: placeholders, nesting, rollback, ON CONFLICT/RETURNING, SKIP LOCKED claims."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from scheduler_store_postgres import PostgresStore
from scheduler_store_postgres.sqlcompat import numbered_placeholders, prepare, server_signature, translate_placeholders
from scheduler_store_postgres.store import PREPARE_AFTER
from scheduler_store_postgres.url import parse_url

from scheduler.api import SchedulerError

MakeStore = Callable[..., PostgresStore]


# -- pure functions (no server needed) ------------------------------------------------------


def test_placeholders_outside_quotes_and_comments_only() -> None:
    query, count = translate_placeholders(
        "SELECT '?', \"odd?name\", ? -- what?\n, $$ ? $$, $tag$ ? $tag$ /* ? */ FROM t WHERE a LIKE '50%' AND b = ?"
    )
    assert count == 2
    assert query == (
        "SELECT '?', \"odd?name\", %s -- what?\n, $$ ? $$, $tag$ ? $tag$ /* ? */ FROM t WHERE a LIKE '50%%' AND b = %s"
    )
    assert translate_placeholders("SELECT 'it''s ?', ?") == ("SELECT 'it''s ?', %s", 1)
    assert translate_placeholders("SELECT $1, ? % 2") == ("SELECT $1, %s %% 2", 1)


def test_prepare_leaves_parameterless_sql_alone_and_adapts_bools() -> None:
    assert prepare("SELECT '100%'", ()) == ("SELECT '100%'", None)
    assert prepare("UPDATE jobs SET enabled = ? WHERE id = ?", (True, "x")) == (
        "UPDATE jobs SET enabled = %s WHERE id = %s",
        [1, "x"],
    )


def test_parse_url_strips_store_parameters_and_redacts() -> None:
    spec = parse_url("postgresql://u:pw@db1:5432,db2:5432/sched?schema=team_a&pool_max=4&sslmode=prefer&password=x")
    assert spec.schema == "team_a" and spec.pool_max == 4 and spec.pool_min == 1
    assert "schema=" not in spec.conninfo and "pool_max" not in spec.conninfo and "sslmode=prefer" in spec.conninfo
    assert "pw" not in spec.location and "password=x" not in spec.location and "schema=team_a" in spec.location
    assert parse_url("postgres://localhost/db").schema is None
    for bad in ("postgresql://h/db?schema=", "postgresql://h/db?pool_max=zero", "postgresql://h/db?pool_min=5&pool_max=2"):
        with pytest.raises(SchedulerError) as err:
            parse_url(bad)
        assert err.value.code == "DB_INIT_FAILED" and err.value.details["phase"] == "open"


# -- against the server ---------------------------------------------------------------------


@pytest.mark.postgres
def test_placeholders_with_params(store: PostgresStore, job: str) -> None:
    with store.transaction() as tx:
        assert (
            tx.execute(
                "UPDATE jobs SET description = ?, enabled = ? WHERE id = ? AND name LIKE '%one'", ("50% done?", False, job)
            )
            == 1
        )
        row = tx.one(
            "SELECT description, enabled, next_run_at FROM jobs WHERE id = ? AND (? IS NULL OR name = ?)", (job, None, None)
        )
    assert row == {"description": "50% done?", "enabled": 0, "next_run_at": None}
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM jobs WHERE name IN (?, ?)", ("job one", "nope")) == 1
        assert tx.scalar("SELECT SUM(run_count + ?) FROM jobs", (2,)) == 2
        assert tx.scalar("SELECT AVG(x) FROM (VALUES (1), (2)) v(x)") == 1.5
        assert tx.all("SELECT id FROM jobs WHERE id = ?", ("missing",)) == []
        assert tx.one("SELECT id FROM jobs WHERE id = ?", ("missing",)) is None
        assert tx.scalar("SELECT id FROM jobs WHERE id = ?", ("missing",)) is None


@pytest.mark.postgres
def test_bytea_round_trip(store: PostgresStore) -> None:
    blob = bytes(range(256))
    with store.transaction() as tx:
        tx.execute(
            "INSERT INTO delivery_outbox(id, channel, idempotency_key, group_key, body, due_at, created_at, updated_at)"
            " VALUES ('o', 'file', 'k', 'g', 'b', 1, 1, 1)"
        )
        tx.execute(
            "INSERT INTO delivery_attachments(id, outbox_id, ordinal, name, mime_type, size_bytes, sha256, content, created_at)"
            " VALUES ('a', 'o', 0, 'x.bin', 'application/octet-stream', ?, ?, ?, 1)",
            (len(blob), "f" * 64, blob),
        )
    with store.read() as tx:
        assert tx.scalar("SELECT content FROM delivery_attachments WHERE id = 'a'") == blob


@pytest.mark.postgres
def test_on_conflict_do_nothing_and_returning(store: PostgresStore, job: str) -> None:
    insert = (
        "INSERT INTO job_dispatch_queue(id, job_id, kind, due_at, created_at, updated_at) VALUES (?, ?, 'schedule', ?, ?, ?)"
        " ON CONFLICT(id) DO NOTHING RETURNING id, status, attempts"
    )
    with store.transaction() as tx:
        assert tx.one(insert, ("slot-1", job, 10, 1, 1)) == {"id": "slot-1", "status": "pending", "attempts": 0}
        assert tx.one(insert, ("slot-1", job, 10, 1, 1)) is None  # same slot materialised twice: a no-op
        assert tx.execute(insert, ("slot-1", job, 10, 1, 1)) == 0
        updated = tx.all("UPDATE job_dispatch_queue SET attempts = attempts + 1 WHERE job_id = ? RETURNING id, attempts", (job,))
    assert updated == [{"id": "slot-1", "attempts": 1}]


@pytest.mark.postgres
def test_nested_transactions_join_the_outer_one(store: PostgresStore, job: str) -> None:
    with pytest.raises(RuntimeError), store.transaction() as outer:
        outer.execute("UPDATE jobs SET run_count = 1 WHERE id = ?", (job,))
        with store.transaction() as inner:
            assert inner is outer
            inner.execute("UPDATE jobs SET run_count = run_count + 1 WHERE id = ?", (job,))
            with store.read() as nested_read:
                assert nested_read.scalar("SELECT run_count FROM jobs WHERE id = ?", (job,)) == 2
        raise RuntimeError("abort after the inner block committed nothing on its own")
    with store.read() as tx:
        assert tx.scalar("SELECT run_count FROM jobs WHERE id = ?", (job,)) == 0
    with store.transaction() as outer, store.transaction() as inner:
        inner.execute("UPDATE jobs SET run_count = 7 WHERE id = ?", (job,))
    with store.read() as tx:
        assert tx.scalar("SELECT run_count FROM jobs WHERE id = ?", (job,)) == 7


@pytest.mark.postgres
def test_rollback_on_exception(store: PostgresStore, job: str) -> None:
    with pytest.raises(ZeroDivisionError), store.transaction() as tx:
        tx.execute("UPDATE jobs SET description = 'changed' WHERE id = ?", (job,))
        1 / 0  # noqa: B018
    with store.read() as tx:
        assert tx.scalar("SELECT description FROM jobs WHERE id = ?", (job,)) is None
    # the connection went back to the pool clean and is reusable
    with store.transaction() as tx:
        assert tx.execute("UPDATE jobs SET description = 'ok' WHERE id = ?", (job,)) == 1


@pytest.mark.postgres
def test_swallowed_statement_error_cannot_commit_silently(store: PostgresStore, job: str) -> None:
    """PostgreSQL aborts the whole transaction on an error; committing it would silently roll back."""
    with pytest.raises(SchedulerError) as err, store.transaction() as tx:
        tx.execute("UPDATE jobs SET description = 'lost' WHERE id = ?", (job,))
        try:
            tx.execute("UPDATE jobs SET enabled = 5 WHERE id = ?", (job,))
        except SchedulerError:
            pass
    assert err.value.code == "CONSTRAINT_VIOLATION" and "rolled back" in err.value.message
    with store.read() as tx:
        assert tx.scalar("SELECT description FROM jobs WHERE id = ?", (job,)) is None


@pytest.mark.postgres
def test_read_is_a_read_only_snapshot(store: PostgresStore, make_store: MakeStore, job: str) -> None:
    other = make_store()
    with store.read() as tx:
        assert tx.scalar("SELECT run_count FROM jobs") == 0
        with other.transaction() as w:
            w.execute("UPDATE jobs SET run_count = 3")
        assert tx.scalar("SELECT run_count FROM jobs") == 0  # same snapshot for the whole read
    with store.read() as tx:
        assert tx.scalar("SELECT run_count FROM jobs") == 3
    with pytest.raises(Exception, match="read-only"), store.read() as tx:
        tx.execute("UPDATE jobs SET run_count = 4")
    with store.transaction() as tx:  # the pooled connection is back to read-write
        assert tx.execute("UPDATE jobs SET run_count = 4") == 1


@pytest.mark.postgres
def test_threads_get_separate_transactions(store: PostgresStore, job: str) -> None:
    seen: list[Any] = []
    entered = threading.Event()
    release = threading.Event()

    def writer() -> None:
        with store.transaction() as tx:
            tx.execute("UPDATE jobs SET description = 'uncommitted' WHERE id = ?", (job,))
            entered.set()
            release.wait(5)

    t = threading.Thread(target=writer)
    t.start()
    entered.wait(5)
    with store.read() as tx:  # not joined to the writer's transaction: its change is invisible
        seen.append(tx.scalar("SELECT description FROM jobs WHERE id = ?", (job,)))
    release.set()
    t.join(5)
    assert seen == [None]


def _fill_queue(store: PostgresStore, job: str, n: int) -> None:
    with store.transaction() as tx:
        for i in range(n):
            tx.execute(
                "INSERT INTO job_dispatch_queue(id, job_id, kind, due_at, created_at, updated_at) VALUES (?, ?, 'manual', ?, 1, 1)",
                (f"d{i:03d}", job, i),
            )


def _claim_one(tx: Any, owner: str) -> str | None:
    row = tx.one(
        "SELECT id FROM job_dispatch_queue WHERE status = 'pending' AND due_at <= ? ORDER BY due_at LIMIT 1" + tx.skip_locked,
        (10**12,),
    )
    if row is None:
        return None
    changed = tx.execute(
        "UPDATE job_dispatch_queue SET status = 'claimed', claim_owner = ?, claim_token = ?, claim_expires_at = ?"
        " WHERE id = ? AND status = 'pending'",
        (owner, uuid.uuid4().hex, 10**12, row["id"]),
    )
    assert changed == 1
    return str(row["id"])


@pytest.mark.postgres
def test_skip_locked_claims_never_overlap(make_store: MakeStore, job: str, store: PostgresStore) -> None:
    _fill_queue(store, job, 100)
    claims: dict[str, list[str]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def worker(owner: str) -> None:
        mine = make_store()  # its own pool, as a second dispatcher process would have
        start.wait()
        while True:
            with mine.transaction() as tx:
                got = _claim_one(tx, owner)
                if got is not None:
                    time.sleep(0.001)  # hold the row lock a moment so the claimers really interleave
            if got is None:
                return
            claims[owner].append(got)

    threads = [threading.Thread(target=worker, args=(o,)) for o in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    a, b = set(claims["a"]), set(claims["b"])
    assert len(claims["a"]) == len(a) and len(claims["b"]) == len(b)
    assert not a & b
    assert a | b == {f"d{i:03d}" for i in range(100)}
    assert a and b, "both claimers should have won rows"
    with store.read() as tx:
        owners = {r["id"]: r["claim_owner"] for r in tx.all("SELECT id, claim_owner FROM job_dispatch_queue")}
    assert all(owners[i] == "a" for i in a) and all(owners[i] == "b" for i in b)


def _protocol_members(proto: type) -> set[str]:
    return {n for n in vars(proto) if not n.startswith("_")} | set(getattr(proto, "__annotations__", {}))


def test_implements_every_member_of_the_kernel_protocols() -> None:
    """Fails when the kernel adds a Tx/Store member this store does not provide yet."""
    from scheduler_store_postgres import PgTx

    from scheduler.api.store import Store, Tx

    assert PgTx.skip_locked == " FOR UPDATE SKIP LOCKED" and PgTx.for_update == " FOR UPDATE"
    assert _protocol_members(Tx) - set(dir(PgTx)) == set()
    store = PostgresStore("postgresql://127.0.0.1:1/none")
    assert _protocol_members(Store) - set(dir(store)) == set()


@pytest.mark.postgres
def test_skip_locked_skips_instead_of_waiting(store: PostgresStore, make_store: MakeStore, job: str) -> None:
    _fill_queue(store, job, 2)
    other = make_store()
    holding = threading.Event()
    release = threading.Event()
    first: list[str | None] = []

    def hold() -> None:
        with other.transaction() as tx:
            first.append(_claim_one(tx, "slow"))
            holding.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    assert holding.wait(5)
    started = time.monotonic()
    with store.transaction() as tx:
        second = _claim_one(tx, "fast")
    elapsed = time.monotonic() - started
    release.set()
    t.join(5)
    assert first == ["d000"] and second == "d001"
    assert elapsed < 1.0


@pytest.mark.postgres
def test_lost_pooled_connection_is_db_unavailable_then_recovers(make_store: MakeStore, pg_url: str, admin: Any) -> None:
    store = make_store(pg_url + "&pool_max=1")  # one connection: the killed one is handed out again
    with store.read() as tx:
        pid = tx.scalar("SELECT pg_backend_pid()")
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    time.sleep(0.1)
    with pytest.raises(SchedulerError) as err, store.transaction() as tx:
        tx.scalar("SELECT 1")
    assert err.value.code == "DB_UNAVAILABLE"
    with store.transaction() as tx:  # the pool discarded the broken connection and opened a new one
        assert tx.scalar("SELECT pg_backend_pid()") != pid


@pytest.mark.postgres
def test_begin_rides_with_the_first_statement_and_a_failing_first_statement_rolls_back(store: PostgresStore, job: str) -> None:
    """BEGIN is sent with the block's first statement: that statement failing still leaves nothing and a clean connection."""
    with pytest.raises(SchedulerError) as err, store.transaction() as tx:
        tx.execute("UPDATE jobs SET enabled = 5 WHERE id = ?", (job,))  # the very first statement violates a check
    assert err.value.code == "CONSTRAINT_VIOLATION"
    with store.transaction() as tx:  # first statement returning rows: the BEGIN result is skipped, the row is there
        assert tx.one("SELECT id, run_count FROM jobs WHERE id = ?", (job,)) == {"id": job, "run_count": 0}
        assert tx.scalar("SELECT current_setting('transaction_isolation')") == "read committed"
        tx.execute("UPDATE jobs SET run_count = 2 WHERE id = ?", (job,))
    with store.read() as tx:
        assert tx.scalar("SELECT current_setting('transaction_isolation')") == "repeatable read"
        assert tx.scalar("SELECT current_setting('transaction_read_only')") == "on"
        assert tx.all("SELECT run_count FROM jobs WHERE id = ?", (job,)) == [{"run_count": 2}]
    with store.transaction():
        pass  # no statement: no transaction is opened at all
    assert all(check["ok"] for check in store.health()), store.health()  # pooled connections back in their usual mode


def test_numbered_placeholders_and_server_signature() -> None:
    query, _count = translate_placeholders("SELECT ? FROM t WHERE a LIKE '50%' AND b = ?")
    assert numbered_placeholders(query, True) == "SELECT $1 FROM t WHERE a LIKE '50%' AND b = $2"
    assert numbered_placeholders("SELECT '100%'", False) == "SELECT '100%'"
    assert server_signature(None) == ()
    assert server_signature(["x", None, 5, b"z"]) == (0, 0, 20, 17)
    assert server_signature([1.5]) is None  # a float literal is numeric, a float parameter float8: stays on the client
    assert server_signature([2**63]) is None  # beyond int8: the literal is numeric


def _prepared_statements(tx: Any, marker: str) -> list[str]:
    return [r["statement"] for r in tx.all("SELECT statement FROM pg_prepared_statements") if marker in r["statement"]]


@pytest.mark.postgres
def test_repeated_statements_are_prepared_on_the_server(store: PostgresStore, job: str) -> None:
    """After PREPARE_AFTER client-bound runs a statement is parsed and planned once per connection, with the same results."""
    marker = f"m{uuid.uuid4().hex}"  # a statement text no earlier test ran in this process
    query = f"SELECT id, run_count + ? AS n FROM jobs WHERE id = ? /* {marker} */"
    with store.transaction() as tx:
        tx.execute("SELECT 1")  # BEGIN rode with this one; the statements below run inside the transaction
        results = [tx.one(query, (30000, job)) for _ in range(PREPARE_AFTER + 3)]
        assert results == [{"id": job, "n": 30000}] * (PREPARE_AFTER + 3)
        # Integers go as int8 on the server: ? + ? cannot overflow a smallint as psycopg's default int2 would.
        sums = [tx.scalar(f"SELECT ? + ? /* {marker} sum */", (30000, 30000)) for _ in range(PREPARE_AFTER + 2)]
        assert sums == [60000] * (PREPARE_AFTER + 2)
        assert len(_prepared_statements(tx, marker)) == 2
        assert tx.execute(f"UPDATE jobs SET run_count = run_count WHERE id = ? /* {marker} */", (job,)) == 1


@pytest.mark.postgres
def test_statements_the_server_cannot_type_stay_bound_on_the_client(store: PostgresStore, job: str) -> None:
    """``? IS NULL`` fails to parse with an untyped parameter: the probe finds out in a savepoint, the transaction goes on."""
    marker = f"m{uuid.uuid4().hex}"
    query = f"SELECT id FROM jobs WHERE id = ? AND (? IS NULL OR name = ?) /* {marker} */"
    with store.transaction() as tx:
        tx.execute("SELECT 1")
        for _ in range(PREPARE_AFTER + 3):
            assert tx.all(query, (job, None, None)) == [{"id": job}]
            assert tx.all(query, (job, "job one", "job one")) == [{"id": job}]
        assert _prepared_statements(tx, marker) == []
        tx.execute("UPDATE jobs SET description = ? WHERE id = ?", ("still usable", job))
    with store.read() as tx:
        assert tx.scalar("SELECT description FROM jobs WHERE id = ?", (job,)) == "still usable"


def test_prepare_parameter_is_on_or_off() -> None:
    assert parse_url("postgresql://h/db").prepare is True
    spec = parse_url("postgresql://h/db?prepare=off&sslmode=prefer")
    assert spec.prepare is False and "prepare" not in spec.conninfo and "sslmode=prefer" in spec.conninfo
    with pytest.raises(SchedulerError) as err:
        parse_url("postgresql://h/db?prepare=sometimes")
    assert err.value.code == "DB_INIT_FAILED" and "prepare must be on or off" in err.value.message


@pytest.mark.postgres
def test_prepare_off_keeps_every_statement_on_the_client(make_store: MakeStore, pg_url: str, job: str) -> None:
    """Behind a pooler that cannot keep prepared statements: ``?prepare=off`` never creates one."""
    store = make_store(f"{pg_url}&prepare=off")
    marker = f"m{uuid.uuid4().hex}"
    with store.transaction() as tx:
        tx.execute("SELECT 1")
        for _ in range(PREPARE_AFTER + 3):
            assert tx.scalar(f"SELECT run_count FROM jobs WHERE id = ? /* {marker} */", (job,)) == 0
        assert _prepared_statements(tx, marker) == []
