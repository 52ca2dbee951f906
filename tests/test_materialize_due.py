"""``materialize_due`` reads the few columns that tell a one-shot reached in time from the others, and whole job rows
only for the jobs that take the per-job path: every kind of due job in one pass is accounted for as before, on both
stores (a lone one-shot reached in time, one-shots past the grace under ``skip`` and ``coalesce``, a cron job)."""

from __future__ import annotations

import json
import time

import pytest

from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.queue import materialize_due, slot_dispatch_id
from scheduler.testing import add_job

#: Where in its minute the test's ``base`` falls. The cron slot's lateness depends on it; the last ones put the old
#: choice of slot (the minute boundary before ``base + 61 s``) more than the 60 s grace behind ``now``, which made the
#: cron a misfire (a second ``slot.misfire_coalesced``) about one run in sixty before the slot was taken from ``now``.
OFFSETS_IN_MINUTE_MS = (0, 1, 1_000, 30_000, 58_001, 58_999, 59_001, 59_999)


@pytest.mark.parametrize("offset", OFFSETS_IN_MINUTE_MS)
def test_one_pass_accounts_for_a_lone_one_shot_late_ones_and_a_cron_job(store, offset):
    # specs refuse a past schedule_at: materialise "later" instead, at a chosen point of a minute
    base = (now_ms() + 10_000) // 60_000 * 60_000 + 60_000 + offset
    on_time = add_job(store, schedule_kind="at", schedule_at=to_iso(base + 61_000), payload_message="ok")
    skipped = add_job(store, schedule_kind="at", schedule_at=to_iso(base), payload_message="ok", misfire_policy="skip")
    coalesced = add_job(store, schedule_kind="at", schedule_at=to_iso(base + 1), payload_message="ok")
    now = base + 62_000  # the lone one-shot within the 60 s grace, two past it, the cron's slot 0 to 60 s late
    # A daily cron at the last minute boundary at or before `now`: exactly one of its slots is due and it is within the
    # grace, wherever in its minute `base` falls (an every-minute cron had two due when it started in a minute's last
    # 12 s).
    minute = now // 60_000 * 60_000
    at = time.gmtime(minute / 1000)
    cron = add_job(store, schedule_kind="cron", schedule_cron=f"{at.tm_min} {at.tm_hour} * * *", payload_message="ok")
    assert int(cron["next_run_at"]) == minute
    not_yet = add_job(store, schedule_kind="at", schedule_at=to_iso(base + 3_600_000), payload_message="ok")
    assert materialize_due(store, now=now) == 3
    assert materialize_due(store, now=now) == 0  # nothing twice
    with store.read() as tx:
        def dispatches(job):
            return tx.all("SELECT * FROM job_dispatch_queue WHERE job_id = ?", (job["id"],))

        for job, kind in ((on_time, "at"), (coalesced, "at"), (cron, "schedule")):
            slot = job["next_run_at"]
            [d] = dispatches(job)
            assert (d["id"], d["kind"], d["status"], d["due_at"]) == (slot_dispatch_id(job["id"], kind, slot), kind, "pending", slot)
            assert (d["created_at"], d["updated_at"], d["artifact_digest"]) == (now, now, job["artifact_digest"])
            assert (d["claim_owner"], d["run_id"], d["source_run_id"], d["source_artifact_digest"]) == (None, None, None, None)
        for job in (on_time, coalesced, skipped):
            row = tx.one("SELECT next_run_at, schedule_anchor_at, updated_at FROM jobs WHERE id = ?", (job["id"],))
            assert row == {"next_run_at": None, "schedule_anchor_at": job["schedule_anchor_at"], "updated_at": now}
        assert int(tx.scalar("SELECT next_run_at FROM jobs WHERE id = ?", (cron["id"],))) > now
        assert dispatches(skipped) == [] and dispatches(not_yet) == []
        assert tx.scalar("SELECT next_run_at FROM jobs WHERE id = ?", (not_yet["id"],)) == not_yet["next_run_at"]
        [run] = tx.all("SELECT status, scheduled_for, skip_reason FROM runs WHERE job_id = ?", (skipped["id"],))
        assert (run["status"], run["scheduled_for"]) == ("skipped", skipped["next_run_at"]) and "misfire" in run["skip_reason"]
        assert tx.scalar("SELECT COUNT(*) FROM runs WHERE job_id <> ?", (skipped["id"],)) == 0
        events = tx.all("SELECT job_id, data FROM runtime_events WHERE kind = 'slot.misfire_coalesced'")
        assert [e["job_id"] for e in events] == [coalesced["id"]]
        assert json.loads(events[0]["data"])["run_slot"] == coalesced["next_run_at"]
