"""The pass completes a run no earlier than its worker finished it (a defect a CI run found, issue 34's stop 42).

The pass read its clock, then took the finished results. A result posted in between (its
evidence attested, with the payload's ``duration_ms`` measured then) was completed at the
earlier instant, so the run's recorded ``duration_ms`` was shorter than its payload's and
``runs evidence`` refused a run it had just attested: ``EVIDENCE_PAYLOAD_MISMATCH`` on
``result.duration_ms``. In CI the window was a scheduling hiccup; here the loop is held in it
on purpose: the next pass that finds no result waits for one (SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from evidence_support import (
    artifacts_dir,  # noqa: F401  (the autouse artifacts-root fixture)
    evidence_row,
    run_row,
)
from kernel_testing import add_job, run_rows, wait_for

from scheduler.core.dispatcher.workers import Workers
from scheduler.core.queue import enqueue_manual
from scheduler.evidence.verify import verify_run


def test_a_result_posted_while_a_pass_starts_is_completed_after_it_was_attested(
    store: Any, dispatcher: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hold = threading.Event()
    take = Workers.take_finished

    def take_finished(self: Workers) -> list:
        if hold.is_set() and self.finished.empty():  # the loop loses the CPU here until the worker posts its result
            hold.clear()
            deadline = time.monotonic() + 10
            while self.finished.empty() and time.monotonic() < deadline:
                time.sleep(0.002)
        return take(self)

    monkeypatch.setattr(Workers, "take_finished", take_finished)
    dispatcher()
    job = add_job(store, name="attested", executor="shell", payload_message="sleep 1.5; echo done", evidence={})
    enqueue_manual(store, job["id"])
    wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running"], what="running")
    hold.set()  # the next pass (at most a second away: the loop's longest sleep) starts before the run ends
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], timeout=20, what="run ok")[0]
    assert not hold.is_set()  # a pass did wait in the window
    payload = json.loads(evidence_row(store, run["id"])["canonical_payload"])
    assert payload["result"]["duration_ms"] <= run_row(store, run["id"])["duration_ms"]
    check = verify_run(store, run["id"])
    assert check.verified, check
