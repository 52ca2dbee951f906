"""Schedules: when a job fires next (cron in an IANA zone, fixed interval, one-shot, manual, chain).

All instants are integer UTC epoch milliseconds. Cron expressions are evaluated on
*naive local wall-clock* times with croniter, then every wall time is mapped to an
instant with zoneinfo, so DST is handled explicitly here rather than by croniter:

* DST gap (the wall time does not exist, spring forward), ``dst_gap``:
  ``"shift"`` (default) interprets the wall time with the offset in force *before*
  the transition (PEP 495 ``fold=0``), i.e. it moves forward by the gap length:
  Berlin 2026-03-29 02:30 -> 01:30Z (shown as 03:30+02:00). ``"skip"`` drops it.
  A shifted instant that coincides with a real slot (``30 2,3 * * *``) fires once.
* DST fold (the wall time happens twice, fall back), ``dst_fold``: ``"once"``
  (default) fires only at the first occurrence (``fold=0``, the earlier instant);
  ``"twice"`` fires at both instants.

Results are always strictly increasing and de-duplicated. croniter is imported
lazily so that ``scheduler version`` never pays for it.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import parse_duration_ms, parse_iso, to_iso

KINDS = ("cron", "every", "at", "manual", "chain")
DST_GAP_POLICIES = ("shift", "skip")
DST_FOLD_POLICIES = ("once", "twice")

_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)  # noqa: DTZ001 - naive on purpose: the wall-clock epoch
_MS = timedelta(milliseconds=1)
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# croniter's R (random) and H (hash) tokens; "thu", "fri", "mar" etc. stay allowed.
_RANDOM_OR_HASH = re.compile(r"(?<![a-z])[rh](?![a-z])")
# Offset samples used to find where to start croniter (see _cron_instants).
_SAMPLE_SPAN_MS = 13 * 3_600_000


def validate_cron(expr: str) -> str:
    """Check a 5-field or 6-field (seconds first) cron expression and return it normalised.

    Whitespace is collapsed and ``@daily``-style aliases become their 5-field form so
    the stored text is canonical. croniter's syntax is accepted, except the 7-field
    (year) form and the non-deterministic ``R``/``H`` tokens; impossible day/month
    pairs such as ``0 0 31 2 *`` are rejected up front instead of never firing.
    """
    if not isinstance(expr, str):
        raise SchedulerError("INVALID_CRON", f"cron: expected a string, got {type(expr).__name__}")
    text = " ".join(expr.split())
    text = _ALIASES.get(text.lower(), text)
    fields = text.split(" ") if text else []
    if len(fields) not in (5, 6):
        hint = " (the year field is not supported)" if len(fields) == 7 else ""
        raise SchedulerError(
            "INVALID_CRON",
            f"cron: expected 5 fields (min hour dom month dow) or 6 with seconds first, got {len(fields)}{hint}: {expr!r}",
        )
    if any(_RANDOM_OR_HASH.search(f.lower()) for f in fields):
        raise SchedulerError("INVALID_CRON", f"cron: random/hash tokens (R, H) are not supported: {expr!r}")
    from croniter import croniter  # third-party, imported on first use (about 30 ms of CLI start-up otherwise)

    try:
        croniter.expand(text, second_at_beginning=len(fields) == 6, strict=True)
    except (ValueError, TypeError, LookupError) as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise SchedulerError("INVALID_CRON", f"cron: invalid expression {expr!r}: {reason}") from None
    return text


def validate_timezone(name: str) -> str:
    """Check an IANA zone name (``Europe/Berlin``) and return it stripped.

    Empty, path-like (``/etc/x``, ``..``) and host-dependent (``localtime``) names are
    refused so a schedule never silently means "whatever zone the dispatcher runs in".
    """
    if not isinstance(name, str) or not name.strip():
        raise SchedulerError("INVALID_TIMEZONE", "tz: expected an IANA zone name such as 'Europe/Berlin'")
    key = name.strip()
    parts = key.split("/")
    if key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts) or key == "localtime":
        raise SchedulerError("INVALID_TIMEZONE", f"tz: not an IANA zone name: {name!r}")
    try:
        ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise SchedulerError("INVALID_TIMEZONE", f"tz: unknown time zone {name!r}") from None
    return key


def _opt_cron(value: str | None) -> str | None:
    return None if value is None else validate_cron(value)


def _opt_every(value: str | int | None) -> int | None:
    return parse_duration_ms(value, field="every") if isinstance(value, str) else value


def _opt_at(value: str | int | None) -> int | None:
    return parse_iso(value, field="at") if isinstance(value, str) else value


@attrs.frozen
class Schedule:
    """When a job fires. Validated on construction (raises ``SchedulerError``).

    ``every_ms`` also accepts a duration string (``"5m"``), ``at_ms`` an ISO instant.
    """

    kind: str
    cron: str | None = attrs.field(default=None, converter=_opt_cron)
    every_ms: int | None = attrs.field(default=None, converter=_opt_every)
    at_ms: int | None = attrs.field(default=None, converter=_opt_at)
    tz: str = attrs.field(default="UTC", converter=validate_timezone)
    dst_gap: str = "shift"
    dst_fold: str = "once"

    def __attrs_post_init__(self) -> None:
        def bad(msg: str) -> SchedulerError:
            return SchedulerError("INVALID_SCHEDULE", msg)

        if self.kind not in KINDS:
            raise bad(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.dst_gap not in DST_GAP_POLICIES:
            raise bad(f"dst_gap: expected 'shift' or 'skip', got {self.dst_gap!r}")
        if self.dst_fold not in DST_FOLD_POLICIES:
            raise bad(f"dst_fold: expected 'once' or 'twice', got {self.dst_fold!r}")
        own = {"cron": "cron", "every": "every_ms", "at": "at_ms"}.get(self.kind)
        for name in ("cron", "every_ms", "at_ms"):
            value = getattr(self, name)
            if name == own and value is None:
                raise bad(f"{self.kind} schedule needs {name}")
            if name != own and value is not None:
                raise bad(f"{name} is not allowed for a {self.kind} schedule")
        for name in ("every_ms", "at_ms"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise bad(f"{name}: expected integer milliseconds, got {value!r}")
        if self.every_ms is not None and self.every_ms <= 0:
            raise bad("every_ms: must be positive")


def next_every_slot(previous_slot_ms: int, every_ms: int, now_ms: int) -> int:
    """Smallest ``previous_slot + k*every`` (k >= 1) strictly after ``now``.

    Anchoring to the previous *scheduled* slot (not to when the run actually
    happened) keeps an interval schedule drift-free, and jumping straight past
    ``now`` means missed slots after downtime are skipped, never fired in a burst.
    """
    if every_ms <= 0:
        raise SchedulerError("INVALID_SCHEDULE", "every_ms: must be positive")
    k = 1 if now_ms < previous_slot_ms else (now_ms - previous_slot_ms) // every_ms + 1
    return previous_slot_ms + k * every_ms


def _every_first(every_ms: int, after_ms: int, anchor_ms: int | None) -> int:
    """First slot ``anchor + k*every`` (k >= 0) strictly after ``after_ms``."""
    anchor = after_ms if anchor_ms is None else anchor_ms
    return anchor if anchor > after_ms else next_every_slot(anchor, every_ms, after_ms)


@functools.lru_cache(maxsize=256)
def _template(expr: str) -> Any:
    """A parsed croniter for ``expr`` (parsing dominates the cost); callers copy it."""
    from croniter import croniter

    return croniter(expr, _EPOCH_NAIVE, ret_type=datetime, day_or=True, second_at_beginning=len(expr.split(" ")) == 6)


def _offset_ms(zone: ZoneInfo, ms: int) -> int:
    off = (_EPOCH_UTC + ms * _MS).astimezone(zone).utcoffset()
    return off // _MS if off is not None else 0


def _wall_instants(wall: datetime, zone: ZoneInfo, gap: str, fold: str) -> tuple[list[int], int]:
    """Instants for one local wall time, plus the DST jump size in ms (0 if unambiguous)."""
    first, second = wall.replace(tzinfo=zone, fold=0), wall.replace(tzinfo=zone, fold=1)
    off0, off1 = first.utcoffset(), second.utcoffset()
    base = (wall - _EPOCH_NAIVE) // _MS
    if off0 is None or off1 is None or off0 == off1:
        return [base - (off0 // _MS if off0 is not None else 0)], 0
    jump = abs(off1 - off0) // _MS
    t0, t1 = base - off0 // _MS, base - off1 // _MS
    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall:
        return ([t0] if gap == "shift" else []), jump  # gap: fold=0 = shift forward
    return ([t0, t1] if fold == "twice" else [t0]), jump  # fold: t0 is the earlier instant


def _cron_instants(schedule: Schedule, after_ms: int) -> Iterator[int]:
    """Yield the cron schedule's fire instants strictly after ``after_ms``, increasing.

    croniter starts at ``after + min(offset nearby)``: every fire t > after comes
    from a wall time t + offset(t) (for a shifted gap time, the pre-gap offset), so
    this catches second fold occurrences and gap shifts that lie after ``after`` but
    whose wall time is earlier than after's own. Near a transition, wall order and
    instant order differ for up to twice the jump, so instants are buffered, sorted
    and de-duplicated until croniter is past that horizon.
    """
    from croniter import CroniterBadDateError

    zone = ZoneInfo(schedule.tz)
    assert schedule.cron is not None
    min_off = min(_offset_ms(zone, after_ms + k * _SAMPLE_SPAN_MS) for k in range(-2, 3))
    it = copy.copy(_template(schedule.cron))
    it.set_current(_EPOCH_NAIVE + (after_ms + min_off) * _MS, force=True)
    pending: list[int] = []
    horizon: datetime | None = None
    last = after_ms
    while True:
        try:
            wall = it.get_next(datetime)
        except (CroniterBadDateError, OverflowError, ValueError):
            wall = None
        if horizon is not None and (wall is None or wall > horizon):
            for t in sorted(set(pending)):
                if t > last:
                    yield t
                    last = t
            pending.clear()
            horizon = None
        if wall is None:
            return
        instants, jump = _wall_instants(wall, zone, schedule.dst_gap, schedule.dst_fold)
        if jump:
            end = wall + 2 * jump * _MS
            horizon = end if horizon is None else max(horizon, end)
        if horizon is not None:
            pending.extend(instants)
            continue
        for t in instants:
            if t > last:
                yield t
                last = t


def _fires(schedule: Schedule, after_ms: int, anchor_ms: int | None) -> Iterator[int]:
    """All fire instants strictly after ``after_ms`` in increasing order (may be endless)."""
    if schedule.kind == "cron":
        yield from _cron_instants(schedule, after_ms)
    elif schedule.kind == "every":
        assert schedule.every_ms is not None
        t = _every_first(schedule.every_ms, after_ms, anchor_ms)
        while True:
            yield t
            t += schedule.every_ms
    elif schedule.kind == "at" and schedule.at_ms is not None and schedule.at_ms > after_ms:
        yield schedule.at_ms


def next_fire(schedule: Schedule, after_ms: int, *, anchor_ms: int | None = None) -> int | None:
    """The first fire instant strictly after ``after_ms``, or ``None`` if there is none.

    ``every`` slots are ``anchor + k*every`` (k >= 0, anchor defaults to ``after_ms``);
    missed slots are skipped. ``at`` fires once; ``manual``/``chain`` never fire by time.
    """
    return next(_fires(schedule, after_ms, anchor_ms), None)


def next_fires(schedule: Schedule, after_ms: int, n: int, *, anchor_ms: int | None = None) -> list[int]:
    """Up to ``n`` strictly increasing fire instants after ``after_ms`` (for previews)."""
    out: list[int] = []
    if n <= 0:
        return out
    for t in _fires(schedule, after_ms, anchor_ms):
        out.append(t)
        if len(out) >= n:
            break
    return out


def missed_slots(schedule: Schedule, from_ms: int, to_ms: int, *, limit: int = 1000, anchor_ms: int | None = None) -> list[int]:
    """Fire instants t with ``from_ms < t <= to_ms``, at most ``limit`` of them.

    Used for misfire accounting after downtime. ``every`` slots are anchored at
    ``anchor_ms`` (default ``from_ms``, normally the last scheduled slot).
    """
    out: list[int] = []
    if limit <= 0 or to_ms <= from_ms:
        return out
    for t in _fires(schedule, from_ms, anchor_ms):
        if t > to_ms:
            break
        out.append(t)
        if len(out) >= limit:
            break
    return out


def _format_offset(seconds: int) -> str:
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" + (f":{secs:02d}" if secs else "")


def describe_fire(ms: int, tz: str) -> dict[str, str]:
    """Render a fire instant for humans and JSON: UTC, local wall time with offset, zone.

    Showing the offset next to the local time makes DST shifts visible in previews.
    """
    zone = ZoneInfo(validate_timezone(tz))
    local = (_EPOCH_UTC + ms * _MS).astimezone(zone)
    off = local.utcoffset()
    offset = _format_offset(int(off.total_seconds()) if off is not None else 0)
    stamp = local.replace(tzinfo=None).isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
    return {"utc": to_iso(ms) or "", "local": stamp + offset, "offset": offset, "tz": zone.key}
