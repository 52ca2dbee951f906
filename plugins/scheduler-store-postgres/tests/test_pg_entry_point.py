"""The distribution plugs into the kernel: entry point, plugin API, ``open_store`` by URL, the Store Protocol."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from scheduler_store_postgres import PostgresStore
from scheduler_toolkit.store import open_store

from scheduler.api import PLUGIN_API_VERSION
from scheduler.api.store import Store


def test_declares_plugin_api_capabilities_and_what_the_kernel_asks_instead_of_the_dialect() -> None:
    assert PostgresStore.plugin_api == PLUGIN_API_VERSION
    assert PostgresStore.capabilities == frozenset({"skip-locked", "listen-notify", "multi-host"})
    assert PostgresStore.dialect == "postgresql"
    store = PostgresStore("postgresql://127.0.0.1:1/none")
    assert store.exclusive_dispatch is False and store.local_path is None  # many dispatchers; no file to sit beside


def _installed() -> bool:
    return any(ep.name == "postgres" for ep in entry_points(group="scheduler.stores"))


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_open_store_through_entry_point(scheme: str, pg_url: str) -> None:
    """The kernel finds the driver by URL scheme and checks its plugin API before use."""
    if not _installed():
        pytest.skip("scheduler-store-postgres is not installed (pip install -e plugins/scheduler-store-postgres)")
    url = scheme + pg_url[pg_url.index("://") :]
    store = open_store(url)
    try:
        assert isinstance(store, PostgresStore)
        assert isinstance(store, Store)
        with store.transaction() as tx:
            assert tx.scalar("SELECT COUNT(*) FROM jobs") == 0
        assert store.schema_version() >= 3
    finally:
        store.close()
