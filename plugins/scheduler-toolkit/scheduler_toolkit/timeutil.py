"""Times as the kernel keeps them: ``now_ms()`` (UTC epoch milliseconds) and ``to_iso(ms)`` (ISO-8601 with ``Z``).

The kernel's own code (``scheduler.base.timeutil``), re-exported.
"""

from __future__ import annotations

from scheduler.base.timeutil import now_ms, to_iso

__all__ = ["now_ms", "to_iso"]
