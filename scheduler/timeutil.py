"""Time representation: integer UTC epoch milliseconds in storage, ISO-8601 ``Z`` in JSON."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from scheduler.errors import SchedulerError


def now_ms() -> int:
    """Current wall-clock time as integer UTC epoch milliseconds."""
    return time.time_ns() // 1_000_000


def to_iso(ms: int | None) -> str | None:
    """Render epoch milliseconds as ISO-8601 UTC with a ``Z`` suffix (``None`` passes through)."""
    if ms is None:
        return None
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def parse_iso(text: str, *, field: str = "time") -> int:
    """Parse an ISO-8601 instant into epoch ms. A time without an explicit zone is rejected.

    Refusing naive times avoids the classic bug where "09:00" silently means the
    dispatcher host's zone.
    """
    if not isinstance(text, str) or not text.strip():
        raise SchedulerError("INVALID_TIME", f"{field}: expected an ISO-8601 instant with a zone")
    raw = text.strip()
    candidate = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    try:
        dt = datetime.fromisoformat(candidate)
    except ValueError:
        raise SchedulerError("INVALID_TIME", f"{field}: not an ISO-8601 instant: {raw!r}") from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise SchedulerError(
            "INVALID_TIME",
            f"{field}: {raw!r} has no zone; add 'Z' or an offset such as '+02:00'",
        )
    return int(dt.timestamp() * 1000)


_DURATION_RE = re.compile(r"(\d+)(ms|d|h|m|s)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str, *, field: str = "duration") -> int:
    """Parse a duration such as ``30s``, ``5m``, ``1h30m`` or ``250ms`` into milliseconds (> 0)."""
    if not isinstance(text, str):
        raise SchedulerError("INVALID_DURATION", f"{field}: expected a string such as '30s' or '1h30m'")
    raw = text.strip().lower()
    pos, total = 0, 0
    for match in _DURATION_RE.finditer(raw):
        if match.start() != pos:
            break
        total += int(match.group(1)) * _UNIT_MS[match.group(2)]
        pos = match.end()
    if not raw or pos != len(raw):
        raise SchedulerError("INVALID_DURATION", f"{field}: cannot parse duration {text!r} (use e.g. 30s, 5m, 1h30m)")
    if total <= 0:
        raise SchedulerError("INVALID_DURATION", f"{field}: duration must be positive")
    return total


def format_duration_ms(ms: int) -> str:
    """Render milliseconds as a compact duration (``1h30m``), the inverse of ``parse_duration_ms``."""
    if ms <= 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts)
