"""``scheduler.base.run_ids``: every run the claim starts (and every skipped run) gets a time-ordered (version 7)
UUID in canonical text form, shown by its random last 8 characters, which every ``runs`` command takes back."""

from __future__ import annotations

import time
import uuid

from scheduler.base.run_ids import new_run_id, short_run_id


def test_a_new_run_id_is_a_canonical_version_7_uuid_with_every_random_bit_used() -> None:
    ids = [new_run_id() for _ in range(4000)]
    assert len(set(ids)) == len(ids)
    for run_id in ids:
        parsed = uuid.UUID(run_id)
        assert str(parsed) == run_id and len(run_id) == 36
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    # after the 48-bit time and the version digit every digit is random: all 16 digits show up at each position over
    # 4000 ids (the variant digit its four)
    for position in range(15, 36):
        seen = {run_id[position] for run_id in ids}
        expected = {"-"} if position in (18, 23) else set("89ab") if position == 19 else set("0123456789abcdef")
        assert seen == expected, position


def test_the_id_starts_with_its_unix_milliseconds_so_later_ids_sort_after_earlier_ones() -> None:
    before = time.time_ns() // 1_000_000
    first = new_run_id()
    after = time.time_ns() // 1_000_000
    stamp = int(first[:8] + first[9:13], 16)
    assert before <= stamp <= after
    time.sleep(0.003)
    later = [new_run_id() for _ in range(100)]
    assert all(run_id > first for run_id in later)  # a new run's key lands at the end of each run-id index


def test_the_short_form_is_the_random_end_and_runs_of_one_minute_differ_there() -> None:
    ids = [new_run_id() for _ in range(2000)]  # made within the same instant: their first 8 characters are shared
    assert len({run_id[:8] for run_id in ids}) <= 2
    shorts = {short_run_id(run_id) for run_id in ids}
    assert len(shorts) >= 1995  # 32 random bits: a collision among 2,000 is rare (expected 0.0005)
    assert all(short_run_id(run_id) == run_id[-8:] for run_id in ids)
    # a run recorded before time-ordered ids (a version 4 id) is shown the same way
    assert short_run_id("0b6c2a8e-1f4d-4c3b-9a7e-5d2f1e0c9b8a") == "1e0c9b8a"
