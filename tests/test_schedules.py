"""Tests for scheduler.core.schedules: cron (with DST), every, at, manual/chain, previews.

Expected instants are hard-coded UTC strings derived by hand from the DST rules
(comments show the derivation); they are not computed with the code under test.
Real tzdata, no mocks.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import parse_iso
from scheduler.core.schedules import (
    Schedule,
    describe_fire,
    missed_slots,
    next_every_slot,
    next_fire,
    next_fires,
    validate_cron,
    validate_timezone,
)

H = 3_600_000


def ms(text: str) -> int:
    return parse_iso(text)


def iso(values: list[int]) -> list[str]:
    return [datetime.fromtimestamp(v / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for v in values]


def cron(expr: str, tz: str = "UTC", **kw: str) -> Schedule:
    return Schedule("cron", cron=expr, tz=tz, **kw)


# --- validation --------------------------------------------------------------------------


def test_validate_cron_normalises() -> None:
    assert validate_cron("  0   9 *  * 1-5 ") == "0 9 * * 1-5"
    assert validate_cron("0 0 9 * * *") == "0 0 9 * * *"
    assert validate_cron("@daily") == "0 0 * * *"
    assert validate_cron("*/5 * * * thu,fri") == "*/5 * * * thu,fri"


@pytest.mark.parametrize(
    "expr",
    [
        "* * * *",  # 4 fields
        "* * * * * * *",  # 7 fields (year form)
        "61 * * * *",
        "0 24 * * *",
        "0 0 0 * *",
        "0 0 * 13 *",
        "0 0 * * 8",
        "60 0 9 * * *",  # seconds-first: 60 s is out of range
        "*/0 * * * *",
        "garbage",
        "a b c d e",
        "",
        "   ",
        "R * * * *",  # random: not deterministic
        "H * * * *",  # hash: needs an id
        "0 0 31 2 *",  # can never fire
        "@reboot",
    ],
)
def test_validate_cron_rejects(expr: str) -> None:
    with pytest.raises(SchedulerError) as err:
        validate_cron(expr)
    assert err.value.code == "INVALID_CRON"


@pytest.mark.parametrize("value", [None, 5, ["*"] * 5, b"* * * * *"])
def test_validate_cron_rejects_non_string(value: object) -> None:
    with pytest.raises(SchedulerError) as err:
        validate_cron(value)  # type: ignore[arg-type]
    assert err.value.code == "INVALID_CRON"


def test_validate_timezone() -> None:
    assert validate_timezone("Europe/Berlin") == "Europe/Berlin"
    assert validate_timezone("UTC") == "UTC"
    for bad in ["", "  ", "Mars/Olympus", "/etc/passwd", "../etc/passwd", "Europe/../UTC", "Europe", "localtime", None, 3]:
        with pytest.raises(SchedulerError) as err:
            validate_timezone(bad)  # type: ignore[arg-type]
        assert err.value.code == "INVALID_TIMEZONE", bad


def test_schedule_validation() -> None:
    assert Schedule("every", every_ms="5m").every_ms == 300_000
    assert Schedule("at", at_ms="2026-01-01T00:00:00Z").at_ms == ms("2026-01-01T00:00:00Z")
    assert cron(" 0  9 * * * ").cron == "0 9 * * *"
    with pytest.raises(SchedulerError) as err:
        cron("0 9 * * *", tz="Nowhere/City")
    assert err.value.code == "INVALID_TIMEZONE"
    with pytest.raises(SchedulerError) as err:
        cron("61 * * * *")
    assert err.value.code == "INVALID_CRON"
    bad = [
        lambda: Schedule("hourly"),
        lambda: Schedule("cron"),
        lambda: Schedule("every"),
        lambda: Schedule("every", every_ms=0),
        lambda: Schedule("every", every_ms=True),
        lambda: Schedule("at"),
        lambda: Schedule("manual", every_ms=1000),
        lambda: cron("0 9 * * *", dst_gap="later"),
        lambda: cron("0 9 * * *", dst_fold="both"),
    ]
    for make in bad:
        with pytest.raises(SchedulerError) as err:
            make()
        assert err.value.code == "INVALID_SCHEDULE"


def test_croniter_is_imported_lazily() -> None:
    code = "import sys, scheduler.core.schedules; assert 'croniter' not in sys.modules, 'croniter imported at module level'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- cron basics -------------------------------------------------------------------------


def test_five_field_utc() -> None:
    s = cron("0 9 * * *")
    assert iso([next_fire(s, ms("2026-01-01T08:59:59Z"))]) == ["2026-01-01T09:00:00Z"]
    # strictly after: exactly at 09:00 gives the next day
    assert iso([next_fire(s, ms("2026-01-01T09:00:00Z"))]) == ["2026-01-02T09:00:00Z"]
    assert iso([next_fire(s, ms("2026-01-01T09:00:00.001Z"))]) == ["2026-01-02T09:00:00Z"]
    # 2026-01-02 is a Friday -> next weekday fire after it is Monday 2026-01-05
    assert iso([next_fire(cron("0 9 * * 1-5"), ms("2026-01-02T10:00:00Z"))]) == ["2026-01-05T09:00:00Z"]


def test_six_field_is_seconds_first() -> None:
    # "0 0 9 * * *" = second 0, minute 0, hour 9 (seconds-last would mean dom 9)
    s = cron("0 0 9 * * *")
    assert iso(next_fires(s, ms("2026-01-01T00:00:00Z"), 2)) == ["2026-01-01T09:00:00Z", "2026-01-02T09:00:00Z"]
    assert iso([next_fire(cron("30 0 9 * * *"), ms("2026-01-01T09:00:00Z"))]) == ["2026-01-01T09:00:30Z"]
    s15 = cron("*/15 * * * * *")
    assert iso(next_fires(s15, ms("2026-01-01T00:00:07.500Z"), 4)) == [
        "2026-01-01T00:00:15Z",
        "2026-01-01T00:00:30Z",
        "2026-01-01T00:00:45Z",
        "2026-01-01T00:01:00Z",
    ]


def test_cron_in_zones() -> None:
    # Berlin is +01:00 in January and +02:00 in July; Kolkata is +05:30 all year.
    assert iso([next_fire(cron("0 9 * * *", "Europe/Berlin"), ms("2026-01-15T00:00:00Z"))]) == ["2026-01-15T08:00:00Z"]
    assert iso([next_fire(cron("0 9 * * *", "Europe/Berlin"), ms("2026-07-15T00:00:00Z"))]) == ["2026-07-15T07:00:00Z"]
    assert iso([next_fire(cron("0 9 * * *", "Asia/Kolkata"), ms("2026-01-15T00:00:00Z"))]) == ["2026-01-15T03:30:00Z"]
    # 09:00 New York (EST, -05:00) on 2026-01-15 was 14:00Z; after that the next is the 16th
    assert iso([next_fire(cron("0 9 * * *", "America/New_York"), ms("2026-01-15T14:00:00Z"))]) == ["2026-01-16T14:00:00Z"]


# --- DST: Europe/Berlin ------------------------------------------------------------------
# 2026-03-29: 02:00 CET (+01:00) jumps to 03:00 CEST (+02:00) at 01:00Z; 02:00-02:59 does not exist.
# 2026-10-25: 03:00 CEST (+02:00) falls back to 02:00 CET (+01:00) at 01:00Z; 02:00-02:59 happens twice.


def test_berlin_spring_forward_shift() -> None:
    # 02:30 read with the pre-gap offset +01:00 -> 01:30Z (= 03:30 CEST). The day after: 02:30 CEST = 00:30Z.
    s = cron("30 2 * * *", "Europe/Berlin")
    assert iso(next_fires(s, ms("2026-03-28T12:00:00Z"), 2)) == ["2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"]
    # after the gap already started (01:10Z = 03:10 CEST) the shifted 01:30Z is still ahead and not lost
    assert iso([next_fire(s, ms("2026-03-29T01:10:00Z"))]) == ["2026-03-29T01:30:00Z"]


def test_berlin_spring_forward_skip() -> None:
    s = cron("30 2 * * *", "Europe/Berlin", dst_gap="skip")
    assert iso([next_fire(s, ms("2026-03-29T00:00:00Z"))]) == ["2026-03-30T00:30:00Z"]


def test_berlin_gap_shift_never_duplicates_real_slot() -> None:
    # 02:30 shifts to 01:30Z, which is also the real 03:30 CEST: it must fire once.
    s = cron("30 2,3 * * *", "Europe/Berlin")
    assert iso(next_fires(s, ms("2026-03-29T00:00:00Z"), 2)) == ["2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"]
    # 02:00/02:20/02:40 shift onto 03:00/03:20/03:40 CEST = 01:00Z/01:20Z/01:40Z, the same as the real slots.
    s = cron("*/20 2-3 * * *", "Europe/Berlin")
    assert iso(next_fires(s, ms("2026-03-28T23:00:00Z"), 4)) == [
        "2026-03-29T01:00:00Z",
        "2026-03-29T01:20:00Z",
        "2026-03-29T01:40:00Z",
        "2026-03-30T00:00:00Z",
    ]


def test_berlin_fall_back_once_and_twice() -> None:
    # 02:30 CEST = 00:30Z (first), 02:30 CET = 01:30Z (second); next day 02:30 CET = 01:30Z.
    once = cron("30 2 * * *", "Europe/Berlin")
    twice = cron("30 2 * * *", "Europe/Berlin", dst_fold="twice")
    after = ms("2026-10-25T00:00:00Z")
    assert iso(next_fires(once, after, 2)) == ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
    assert iso(next_fires(twice, after, 3)) == ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"]
    day = (ms("2026-10-24T22:00:00Z"), ms("2026-10-25T23:00:00Z"))  # the local day 25th
    assert iso(missed_slots(once, *day)) == ["2026-10-25T00:30:00Z"]
    assert iso(missed_slots(twice, *day)) == ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"]


def test_berlin_after_inside_repeated_hour() -> None:
    # "0,30 * * * *" in the fold: 02:00 CEST=00:00Z, 02:30 CEST=00:30Z, 02:00 CET=01:00Z, 02:30 CET=01:30Z,
    # then 03:00 CET=02:00Z.
    twice = cron("0,30 * * * *", "Europe/Berlin", dst_fold="twice")
    once = cron("0,30 * * * *", "Europe/Berlin")
    first_pass = ms("2026-10-25T00:10:00Z")  # 02:10 CEST
    second_pass = ms("2026-10-25T01:10:00Z")  # 02:10 CET
    assert iso(next_fires(twice, first_pass, 4)) == [
        "2026-10-25T00:30:00Z",
        "2026-10-25T01:00:00Z",
        "2026-10-25T01:30:00Z",
        "2026-10-25T02:00:00Z",
    ]
    assert iso(next_fires(twice, second_pass, 2)) == ["2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"]
    assert iso(next_fires(once, first_pass, 2)) == ["2026-10-25T00:30:00Z", "2026-10-25T02:00:00Z"]
    assert iso(next_fires(once, second_pass, 1)) == ["2026-10-25T02:00:00Z"]


# --- DST: America/New_York ---------------------------------------------------------------
# 2026-03-08: 02:00 EST (-05:00) jumps to 03:00 EDT (-04:00) at 07:00Z; 02:00-02:59 does not exist.
# 2026-11-01: 02:00 EDT (-04:00) falls back to 01:00 EST (-05:00) at 06:00Z; 01:00-01:59 happens twice.


def test_new_york_spring_forward() -> None:
    # shift: 02:30 read at -05:00 -> 07:30Z (= 03:30 EDT); skip: next day 02:30 EDT = 06:30Z.
    after = ms("2026-03-08T00:00:00Z")
    assert iso([next_fire(cron("30 2 * * *", "America/New_York"), after)]) == ["2026-03-08T07:30:00Z"]
    skip = cron("30 2 * * *", "America/New_York", dst_gap="skip")
    assert iso([next_fire(skip, after)]) == ["2026-03-09T06:30:00Z"]


def test_new_york_fall_back() -> None:
    # 01:30 EDT = 05:30Z, 01:30 EST = 06:30Z; next day 01:30 EST = 06:30Z.
    after = ms("2026-11-01T00:00:00Z")
    once = cron("30 1 * * *", "America/New_York")
    twice = cron("30 1 * * *", "America/New_York", dst_fold="twice")
    assert iso(next_fires(once, after, 2)) == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    assert iso(next_fires(twice, after, 3)) == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]
    # 02:30 is not ambiguous in New York (the repeated hour is 01:xx): 02:30 EST = 07:30Z, once either way.
    assert iso(next_fires(cron("30 2 * * *", "America/New_York", dst_fold="twice"), after, 1)) == ["2026-11-01T07:30:00Z"]


def test_new_york_hourly_across_fall_back() -> None:
    # Local 2026-11-01 has 25 hours: 00:00 EDT = 04:00Z ... 23:00 EST = 2026-11-02T04:00Z. Every UTC hour
    # from 04:00Z to 28:00Z (25 instants) is an "hh:00" local time; 06:00Z is the second 01:00 (EST).
    window = (ms("2026-11-01T03:30:00Z"), ms("2026-11-02T04:30:00Z"))
    every_hour = [ms("2026-11-01T04:00:00Z") + k * H for k in range(25)]
    twice = missed_slots(cron("0 * * * *", "America/New_York", dst_fold="twice"), *window)
    once = missed_slots(cron("0 * * * *", "America/New_York"), *window)
    assert twice == every_hour
    assert once == [t for t in every_hour if t != ms("2026-11-01T06:00:00Z")]
    assert len(twice) == 25 and len(once) == 24
    for values in (once, twice):
        assert all(a < b for a, b in itertools.pairwise(values))


def test_new_york_hourly_across_spring_forward() -> None:
    # Local 2026-03-08 has 23 hours: 00:00 EST = 05:00Z ... 23:00 EDT = 2026-03-09T03:00Z. 02:00 does not
    # exist; shifted it becomes 07:00Z, which is the real 03:00 EDT, so each UTC hour fires exactly once.
    window = (ms("2026-03-08T04:30:00Z"), ms("2026-03-09T03:30:00Z"))
    expected = [ms("2026-03-08T05:00:00Z") + k * H for k in range(23)]
    assert missed_slots(cron("0 * * * *", "America/New_York"), *window) == expected
    assert missed_slots(cron("0 * * * *", "America/New_York", dst_gap="skip"), *window) == expected


# --- cross-check against a brute-force oracle ---------------------------------------------


def _matcher(expr: str):
    """Independent minute matcher for plain numeric/`*` crons (fields from croniter.expand)."""
    from croniter import croniter

    fields = croniter.expand(expr)[0]

    def ok(field: list, value: int) -> bool:
        return field == ["*"] or value in field

    return lambda w: (
        ok(fields[0], w.minute)
        and ok(fields[1], w.hour)
        and ok(fields[2], w.day)
        and ok(fields[3], w.month)
        and ok(fields[4], w.isoweekday() % 7)
    )


def _oracle(expr: str, tz: str, lo: int, hi: int, gap: str, fold: str) -> list[int]:
    """Scan every UTC minute (real local times) plus every non-existent local minute (gap times)."""
    zone, match, out = ZoneInfo(tz), _matcher(expr), set()
    for t in range(lo - lo % 60_000, hi + 1, 60_000):
        local = datetime.fromtimestamp(t / 1000, zone)
        if match(local) and (local.fold == 0 or fold == "twice"):
            out.add(t)
    # naive UTC +- 15 h brackets every local wall time of the window, whatever the zone's offset
    wall = datetime.fromtimestamp(lo / 1000, UTC).replace(tzinfo=None, second=0) - timedelta(hours=15)
    end = datetime.fromtimestamp(hi / 1000, UTC).replace(tzinfo=None) + timedelta(hours=15)
    while gap == "shift" and wall < end:
        aware = wall.replace(tzinfo=zone)
        if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall and match(wall):
            out.add(int(aware.timestamp() * 1000))  # PEP 495: fold=0 in a gap uses the pre-gap offset
        wall += timedelta(minutes=1)
    return sorted(t for t in out if lo < t <= hi)


@pytest.mark.parametrize(
    ("tz", "center"),
    [
        ("Europe/Berlin", "2026-03-29T01:00:00Z"),
        ("Europe/Berlin", "2026-10-25T01:00:00Z"),
        ("America/New_York", "2026-03-08T07:00:00Z"),
        ("America/New_York", "2026-11-01T06:00:00Z"),
        ("Australia/Lord_Howe", "2026-04-04T15:00:00Z"),  # 30-minute fall back
        ("Australia/Lord_Howe", "2026-10-03T15:30:00Z"),  # 30-minute spring forward
    ],
)
@pytest.mark.parametrize("expr", ["*/20 * * * *", "0,15,45 1-3 * * *", "* 2 * * *", "10 0-4/2 * * *"])
def test_matches_brute_force_oracle(tz: str, center: str, expr: str) -> None:
    first, hi = ms(center) - 5 * H, ms(center) + 5 * H
    for gap in ("shift", "skip"):
        for fold in ("once", "twice"):
            s = cron(expr, tz, dst_gap=gap, dst_fold=fold)
            expected = _oracle(expr, tz, first, hi, gap, fold)
            # many start points, including ones inside the gap and inside the repeated hour
            for lo in range(first, ms(center) + 2 * H, 17 * 60_000 + 3_000):
                assert missed_slots(s, lo, hi) == [t for t in expected if t > lo], (gap, fold, iso([lo]))


# --- every / at / manual / chain ----------------------------------------------------------


def test_next_every_slot_anchored() -> None:
    assert next_every_slot(1000, 500, 2600) == 3000
    assert next_every_slot(1000, 500, 3000) == 3500  # strictly after now
    assert next_every_slot(1000, 500, 0) == 1500  # clock behind the slot: still moves forward
    # no drift: runs that start late still land on the grid
    slot = 0
    for late in (7, 13, 59_999, 1):
        slot = next_every_slot(slot, 60_000, slot + late)
        assert slot % 60_000 == 0
    # no burst after a 10-day downtime: one slot, the first one after now, on the grid
    now = 10 * 86_400_000 + 12_345
    assert next_every_slot(0, 60_000, now) == 10 * 86_400_000 + 60_000


def test_every_next_fire_and_fires() -> None:
    s = Schedule("every", every_ms=500)
    assert next_fire(s, 2600) == 3100  # anchor defaults to after_ms
    assert next_fire(s, 2600, anchor_ms=1000) == 3000
    assert next_fire(s, 2600, anchor_ms=5000) == 5000  # anchor in the future: first slot is the anchor
    assert next_fires(s, 2600, 3, anchor_ms=1000) == [3000, 3500, 4000]
    assert next_fires(s, 2600, 0) == []
    long_down = next_fires(s, 10**9 + 7, 2, anchor_ms=1000)
    assert long_down == [10**9 + 500, 10**9 + 1000]


def test_every_missed_slots() -> None:
    s = Schedule("every", every_ms=60_000)
    assert missed_slots(s, 0, 300_000) == [60_000, 120_000, 180_000, 240_000, 300_000]
    assert missed_slots(s, 0, 300_000, limit=3) == [60_000, 120_000, 180_000]
    assert missed_slots(s, 30_000, 200_000, anchor_ms=0) == [60_000, 120_000, 180_000]
    assert missed_slots(s, 0, 0) == []


def test_at() -> None:
    s = Schedule("at", at_ms=5000)
    assert next_fire(s, 1000) == 5000
    assert next_fire(s, 5000) is None
    assert next_fire(s, 9000) is None
    assert next_fires(s, 1000, 3) == [5000]
    assert missed_slots(s, 1000, 6000) == [5000]
    assert missed_slots(s, 5000, 6000) == []


@pytest.mark.parametrize("kind", ["manual", "chain"])
def test_manual_and_chain_never_fire(kind: str) -> None:
    s = Schedule(kind)
    assert next_fire(s, 0) is None
    assert next_fires(s, 0, 5) == []
    assert missed_slots(s, 0, 10**12) == []


# --- previews / misfire accounting --------------------------------------------------------


@pytest.mark.parametrize("expr", ["0 9 * * 1-5", "*/7 * * * *", "0 0 1 * *", "15 */3 * * * *"])
def test_next_fires_strictly_increasing(expr: str) -> None:
    values = next_fires(cron(expr, "Europe/Berlin"), ms("2026-03-01T00:00:00Z"), 50)
    assert len(values) == 50
    assert all(a < b for a, b in itertools.pairwise(values))


def test_missed_slots_counts() -> None:
    s = cron("0 * * * *")
    assert len(missed_slots(s, ms("2026-01-01T00:00:00Z"), ms("2026-01-01T05:00:00Z"))) == 5  # 01..05
    assert len(missed_slots(s, ms("2026-01-01T00:00:00Z"), ms("2026-01-02T00:00:00Z"), limit=7)) == 7
    assert missed_slots(s, ms("2026-01-01T00:10:00Z"), ms("2026-01-01T00:50:00Z")) == []


def test_describe_fire_offsets() -> None:
    assert describe_fire(ms("2026-01-15T08:00:00Z"), "Europe/Berlin") == {
        "utc": "2026-01-15T08:00:00.000Z",
        "local": "2026-01-15T09:00:00+01:00",
        "offset": "+01:00",
        "tz": "Europe/Berlin",
    }
    summer = describe_fire(ms("2026-03-29T01:00:00Z"), "Europe/Berlin")
    assert summer["local"] == "2026-03-29T03:00:00+02:00" and summer["offset"] == "+02:00"
    assert describe_fire(ms("2026-01-15T08:00:00.250Z"), "America/New_York")["local"] == "2026-01-15T03:00:00.250-05:00"
    with pytest.raises(SchedulerError):
        describe_fire(0, "Nowhere/City")


def test_next_fire_is_fast() -> None:
    # a regression guard against minute-by-minute scanning (typical cost is ~0.1 ms per call)
    s = cron("0 9 * * 1-5", "Europe/Berlin")
    start = time.perf_counter()
    for k in range(1000):
        next_fire(s, ms("2026-01-01T00:00:00Z") + k * 7 * H)
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize("text", ["١s", "５m", "1h٣0m"])  # noqa: RUF001 - non-ASCII digits on purpose
def test_durations_take_ascii_digits_only(text: str) -> None:
    from scheduler.base.errors import SchedulerError
    from scheduler.base.timeutil import parse_duration_ms

    with pytest.raises(SchedulerError) as info:
        parse_duration_ms(text)
    assert info.value.code == "INVALID_DURATION"
