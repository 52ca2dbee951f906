"""scheduler-store-postgres: the PostgreSQL store for the scheduler kernel.

Several dispatchers on several hosts share one PostgreSQL database: claims use
``FOR UPDATE SKIP LOCKED``, wake-ups use ``LISTEN/NOTIFY``, and every scheduler object
lives in one schema named by the URL (``postgresql://host/db?schema=scheduler``).
Registered as the ``postgres`` driver of the ``scheduler.stores`` entry-point group, so
``open_store("postgresql://...")`` finds it once the distribution is installed.
"""

from __future__ import annotations

from scheduler_store_postgres.store import PgTx, PostgresStore

__version__ = "0.1.0"

__all__ = ["PgTx", "PostgresStore", "__version__"]
