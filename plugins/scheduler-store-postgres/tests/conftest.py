"""Fixtures: the real PostgreSQL server at 127.0.0.1:5432, one fresh schema per test.

No server, no failure: every test that needs one is skipped with the reason. Set
``SCHEDULER_TEST_POSTGRES_URL`` (without query parameters) to point at another server.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
if str(PLUGIN_ROOT) not in sys.path:  # running from a source tree without `pip install -e`
    sys.path.insert(0, str(PLUGIN_ROOT))

from scheduler_store_postgres import PostgresStore  # noqa: E402 - after the sys.path fallback above

HOST, PORT, DATABASE = "127.0.0.1", 5432, "test"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "postgres: needs the PostgreSQL server at 127.0.0.1:5432")


def _candidates() -> list[str]:
    override = os.environ.get("SCHEDULER_TEST_POSTGRES_URL")
    if override:
        return [override]
    return [f"postgresql://postgres@{HOST}:{PORT}/{DATABASE}", f"postgresql://{HOST}:{PORT}/{DATABASE}"]


@pytest.fixture(scope="session")
def pg_base_url() -> str:
    """A URL that reaches the server (user ``postgres``, else the OS user), or skip the test."""
    error: Exception | None = None
    for url in _candidates():
        try:
            with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return url
        except psycopg.Error as exc:
            error = exc
            text = str(exc)
            if "role" not in text and "authentication" not in text and "database" not in text:
                break  # no server answered: trying another user will not help
    pytest.skip(f"PostgreSQL not reachable at {HOST}:{PORT}: {' '.join(str(error).split())}")


@pytest.fixture(scope="session")
def admin(pg_base_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection for creating and dropping schemas and poking at catalogs."""
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        yield conn


def drop_schema(admin: psycopg.Connection[Any], name: str) -> None:
    """Drop a test schema and everything in it."""
    admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def pg_schema(admin: psycopg.Connection[Any]) -> Iterator[str]:
    """A unique, empty schema for this test, dropped (CASCADE) afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        drop_schema(admin, name)


@pytest.fixture
def pg_url(pg_base_url: str, pg_schema: str) -> str:
    """The store URL for this test's schema."""
    return f"{pg_base_url}?schema={pg_schema}"


@pytest.fixture
def make_store(pg_url: str) -> Iterator[Callable[..., PostgresStore]]:
    """Factory for stores on this test's schema (or another URL); all are closed at teardown."""
    made: list[PostgresStore] = []

    def factory(url: str | None = None, *, initialize: bool = True) -> PostgresStore:
        store = PostgresStore(url or pg_url)
        made.append(store)
        if initialize:
            store.initialize()
        return store

    yield factory
    for store in made:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., PostgresStore]) -> PostgresStore:
    """An initialised store on this test's schema."""
    return make_store()


@pytest.fixture
def job(store: PostgresStore) -> str:
    """The id of one manual job inserted into the store."""
    with store.transaction() as tx:
        tx.execute(
            "INSERT INTO jobs(id, name, schedule_kind, payload_message, created_at, updated_at) VALUES (?, ?, 'manual', 'echo hi', ?, ?)",
            ("job-1", "job one", 1, 1),
        )
    return "job-1"
