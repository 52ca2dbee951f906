"""``python -m bench._counted_run ARGS``: the ``scheduler`` CLI, with its SQLite commits counted (bench only).

The throughput figures run a real ``scheduler run`` process; to state commits per run they
start it through this module, which wraps ``SQLiteStore.transaction`` to count outermost
write transactions (one Python call per commit) and writes the count to
``$BENCH_COMMITS_FILE`` when the process exits. Everything else is the CLI's ``main``.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path


def main() -> None:
    from scheduler.cli.main import main as cli_main
    from scheduler.core.store.sqlite import SQLiteStore

    counted = {"commits": 0}
    original = SQLiteStore.transaction

    def transaction(self: SQLiteStore):  # type: ignore[no-untyped-def]
        slot = getattr(self._local, "slot", None)
        if slot is None or not slot.depth:
            counted["commits"] += 1
        return original(self)

    SQLiteStore.transaction = transaction  # type: ignore[method-assign]
    path = os.environ.get("BENCH_COMMITS_FILE")
    if path:
        atexit.register(lambda: Path(path).write_text(str(counted["commits"])))
    sys.argv[0] = "scheduler"
    sys.exit(cli_main())


if __name__ == "__main__":
    main()
