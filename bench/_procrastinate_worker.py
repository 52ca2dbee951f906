"""A Procrastinate worker process for figure 6b (``bench.peer_procrastinate``).

    python -m bench._procrastinate_worker CONNINFO CONCURRENCY

Runs one ``Worker`` (LISTEN/NOTIFY on, jobs kept after they finish) until SIGTERM. Its two tasks are the
figure's jobs: ``noop`` returns at once, ``sleep`` waits 50 ms. Both are ``async``: Procrastinate runs a
worker's jobs concurrently only as coroutines (its documentation: no ``concurrency`` with blocking
synchronous tasks), so this is its intended form of a job that waits 50 ms.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

SLEEP_S = 0.05


def make_app(conninfo: str) -> Any:
    """A Procrastinate ``App`` on ``conninfo`` with the figure's two tasks registered."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop")
    async def noop() -> None:
        """The no-op job."""

    @app.task(name="sleep")
    async def sleep() -> None:
        """The 50 ms job."""
        await asyncio.sleep(SLEEP_S)

    return app


async def _main(conninfo: str, concurrency: int) -> None:
    app = make_app(conninfo)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, wait=True, listen_notify=True, delete_jobs="never",
                                   install_signal_handlers=True)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2])))
