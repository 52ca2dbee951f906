"""Time representation: integer UTC epoch milliseconds in storage, ISO-8601 ``Z`` in JSON."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

from scheduler.base.errors import SchedulerError


def now_ms() -> int:
    """Current wall-clock time as integer UTC epoch milliseconds."""
    return time.time_ns() // 1_000_000


def to_iso(ms: int | None) -> str | None:
    """Render epoch milliseconds as ISO-8601 UTC with a ``Z`` suffix (``None`` passes through)."""
    if ms is None:
        return None
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


#: The instants the kernel accepts: 1970-01-01T00:00:00.000Z .. 9999-12-31T23:59:59.999Z. Anything
#: outside cannot be rendered as ISO-8601 (or overflows date arithmetic), so it is refused on input.
MIN_INSTANT_MS = 0
MAX_INSTANT_MS = 253_402_300_799_999


def check_instant_ms(ms: int, *, field: str = "time") -> int:
    """``ms`` if it lies in the representable range, else ``INVALID_TIME``."""
    if not MIN_INSTANT_MS <= ms <= MAX_INSTANT_MS:
        raise SchedulerError("INVALID_TIME", f"{field}: instant out of range (1970-01-01T00:00:00Z .. 9999-12-31T23:59:59Z)")
    return ms


def parse_iso(text: str, *, field: str = "time") -> int:
    """Parse an ISO-8601 instant into epoch ms. A time without an explicit zone is rejected.

    Refusing naive times avoids the classic bug where "09:00" silently means the
    dispatcher host's zone.
    """
    if not isinstance(text, str) or not text.strip():
        raise SchedulerError("INVALID_TIME", f"{field}: expected an ISO-8601 instant with a zone")
    raw = text.strip()
    candidate = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    if len(raw) > 64:
        raise SchedulerError("INVALID_TIME", f"{field}: not an ISO-8601 instant: {raw[:40]!r}...")
    try:
        dt = datetime.fromisoformat(candidate)
    except ValueError:
        raise SchedulerError("INVALID_TIME", f"{field}: not an ISO-8601 instant: {raw!r}") from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise SchedulerError(
            "INVALID_TIME",
            f"{field}: {raw!r} has no zone; add 'Z' or an offset such as '+02:00'",
        )
    try:
        # Exact integer arithmetic (a float timestamp can be off by one millisecond).
        ms = (dt - _EPOCH) // _ONE_MS
    except (OverflowError, ValueError):
        raise SchedulerError("INVALID_TIME", f"{field}: instant out of range: {raw!r}") from None
    return check_instant_ms(ms, field=field)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


_DURATION_RE = re.compile(r"(\d+)(ms|d|h|m|s)", re.ASCII)  # noqa: RUF003 - ASCII digits only: "١s" is not a duration
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


#: Longest duration accepted anywhere (about ten years): keeps ``now + duration`` a valid instant.
MAX_DURATION_MS = 3660 * 86_400_000
_MAX_DURATION_CHARS = 32


def parse_duration_ms(text: str, *, field: str = "duration") -> int:
    """Parse a duration such as ``30s``, ``5m``, ``1h30m`` or ``250ms`` into milliseconds (> 0, <= ``MAX_DURATION_MS``).

    Units come at most once each, largest first (``d h m s ms``): ``1s1s`` or ``30s1m`` is
    ``INVALID_DURATION``, never a sum nobody meant to write.
    """
    if not isinstance(text, str):
        raise SchedulerError("INVALID_DURATION", f"{field}: expected a string such as '30s' or '1h30m'")
    raw = text.strip().lower()
    if len(raw) > _MAX_DURATION_CHARS:
        raise SchedulerError("INVALID_DURATION", f"{field}: cannot parse duration {text[:40]!r} (use e.g. 30s, 5m, 1h30m)")
    pos, total, last = 0, 0, None
    for match in _DURATION_RE.finditer(raw):
        if match.start() != pos:
            break
        size = _UNIT_MS[match.group(2)]
        if last is not None and size >= last:
            raise SchedulerError("INVALID_DURATION", f"{field}: duration {text!r} repeats a unit or puts a smaller one"
                                 " first (write each of d, h, m, s, ms at most once, largest first: 1h30m)")
        last = size
        total += int(match.group(1)) * size
        pos = match.end()
    if not raw or pos != len(raw):
        raise SchedulerError("INVALID_DURATION", f"{field}: cannot parse duration {text!r} (use e.g. 30s, 5m, 1h30m)")
    if total <= 0:
        raise SchedulerError("INVALID_DURATION", f"{field}: duration must be positive")
    if total > MAX_DURATION_MS:
        raise SchedulerError("INVALID_DURATION", f"{field}: duration must be at most {MAX_DURATION_MS // 86_400_000}d")
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
