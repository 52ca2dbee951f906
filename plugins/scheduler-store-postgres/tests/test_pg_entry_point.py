"""The distribution plugs into the kernel: entry point, plugin API check, ``open_store`` by URL."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from scheduler_store_postgres import PostgresStore

import scheduler
from scheduler.plugins.loader import check_api
from scheduler.store import Store, open_store


def test_declares_plugin_api_and_capabilities() -> None:
    assert PostgresStore.plugin_api == scheduler.PLUGIN_API_VERSION
    assert PostgresStore.capabilities == frozenset({"skip-locked", "listen-notify", "multi-host"})
    assert PostgresStore.dialect == "postgresql"
    check_api(PostgresStore, group="scheduler.stores", name="postgres", dist="scheduler-store-postgres")


def _installed() -> bool:
    return any(ep.name == "postgres" for ep in entry_points(group="scheduler.stores"))


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_open_store_through_entry_point(scheme: str, pg_url: str) -> None:
    if not _installed():
        pytest.skip("scheduler-store-postgres is not installed (pip install -e plugins/scheduler-store-postgres)")
    url = scheme + pg_url[pg_url.index("://") :]
    store = open_store(url)
    try:
        assert isinstance(store, PostgresStore)
        assert isinstance(store, Store)
        with store.transaction() as tx:
            assert tx.scalar("SELECT COUNT(*) FROM jobs") == 0
        assert store.schema_version() >= 2
    finally:
        store.close()
