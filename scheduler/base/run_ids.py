"""Run ids: how a new one is made, how it is shown short, and how a short one is matched.

A run id is a time-ordered UUID (version 7, RFC 9562) in its canonical text form: the first
48 bits are the Unix time in milliseconds, the last 74 bits are random. Ids made later sort
after ids made earlier, so a new run's key lands at the end of every index keyed by run id
(the runs primary key, the events' run index) instead of on a random page of it: a commit
dirties a page or two per index whatever the history's size, where random (version 4) ids
dirtied a page per run, and more of them the longer the history grows (issue 34: with
100,000 runs of history, 1.26x the no-op throughput of random ids: bench/history.py).

Because the id starts with its time, runs made within about a minute share their first
eight characters. A run is therefore shown by its last eight (``short_run_id``), which
are random, and a reference a user types is matched against either end of the ids
(``scheduler.ops.queries.resolve_run``): a full id, a prefix or a suffix of at least
``RUN_REF_MIN`` characters. Runs recorded before this layout (version 4 ids) keep their ids
and are shown and matched the same way.
"""

from __future__ import annotations

import os
import time

#: The shortest prefix or suffix of a run id that ``resolve_run`` matches.
RUN_REF_MIN = 6
#: How many characters of a run id ``short_run_id`` shows (its random end).
SHORT_RUN_ID_LENGTH = 8
#: The first hex digit of a UUID's variant field with its two top bits set to the RFC 9562 variant (``10``).
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def new_run_id(at_ms: int | None = None) -> str:
    """A new run's id: a version 7 UUID (48 bits of Unix milliseconds, 74 random bits) in canonical text form.

    Built from ``time.time_ns`` and ``os.urandom`` without a ``UUID`` object (the claim makes one per run).
    ``at_ms``: the id of a run made at that instant instead of now (a history built for a benchmark or a test).
    """
    stamp = f"{time.time_ns() // 1_000_000 if at_ms is None else at_ms:012x}"
    h = os.urandom(10).hex()
    return f"{stamp[:8]}-{stamp[8:]}-7{h[:3]}-{_VARIANT[h[3]]}{h[4:7]}-{h[8:20]}"


def short_run_id(run_id: str) -> str:
    """How a run is shown where space is short (CLI tables and lines, messages, the web view): its last 8 characters.

    They are random in every layout of run id the store holds, and ``resolve_run`` takes them back.
    """
    return run_id[-SHORT_RUN_ID_LENGTH:]


__all__ = ["RUN_REF_MIN", "SHORT_RUN_ID_LENGTH", "new_run_id", "short_run_id"]
