"""``claim_candidates`` interleaves the oldest due dispatches with the newest ones one each in turn, then gives the
rest of the longer side, in exactly that order (on both stores and either side first)."""

from __future__ import annotations

from typing import Any

from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.jobs import create_jobs
from scheduler.core.queue import claim_candidates, materialize_due
from scheduler.core.spec import validate_spec


def _one_shot(name: str, at_ms: int) -> Any:
    return validate_spec({"name": name, "schedule_kind": "at", "schedule_at": to_iso(at_ms), "allow_past_at": True,
                          "executor": "testkit", "payload_message": "ok"})


def test_the_newest_and_the_oldest_alternate_then_the_longer_side_goes_on(store: Any) -> None:
    base = now_ms() + 10_000
    # 12 of a backlog, each a millisecond apart (a total order), and 3 due later: the newest side of a claim of 3
    create_jobs(store, [_one_shot(f"old-{i:02d}", base + i) for i in range(12)]
                + [_one_shot(f"new-{i}", base + 1000 + i) for i in range(3)])
    now = base + 2000
    assert materialize_due(store, now=now) == 15
    with store.transaction() as tx:
        names = {r["id"]: r["name"] for r in tx.all("SELECT id, name FROM jobs")}
        old_first = [names[c["job_id"]] for c in claim_candidates(tx, now=now, limit=3, newest_first=False)]
        new_first = [names[c["job_id"]] for c in claim_candidates(tx, now=now, limit=3, newest_first=True)]
        one = [names[c["job_id"]] for c in claim_candidates(tx, now=now, limit=1, newest_first=True)]
    oldest = [f"old-{i:02d}" for i in range(12)]  # the 12 the window of a claim of 3 looks at
    newest = ["new-0", "new-1", "new-2"]
    assert old_first == ["old-00", "new-0", "old-01", "new-1", "old-02", "new-2", *oldest[3:]]
    assert new_first == ["new-0", "old-00", "new-1", "old-01", "new-2", "old-02", *oldest[3:]]
    assert one == ["new-2", "old-00", "old-01", "old-02", "old-03"]  # the single newest, then the window's rest
    assert sorted(old_first) == sorted(new_first) == sorted(oldest + newest)
