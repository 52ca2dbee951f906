"""scheduler status --check on SQLite and PostgreSQL: ok with a live dispatcher, a one-line reason and a non-zero exit for
each unhealthy state, structured reasons with --json."""

from __future__ import annotations

import time
import uuid
from typing import Any

from kernel_testing import add_job


def _check(cli: Any, *, as_json: bool = False) -> Any:
    return cli("--json", "status", "--check") if as_json else cli("status", "--check")


def test_no_dispatcher_fails_with_one_line(cli: Any, store: Any) -> None:
    out = _check(cli)
    assert out.code == 1
    lines = out.err.strip().splitlines()
    assert lines == ["error [HEALTH_CHECK_FAILED]: no live dispatcher holds the lease"], out
    err = _check(cli, as_json=True).json
    assert err["code"] == "HEALTH_CHECK_FAILED" and [r["check"] for r in err["details"]] == ["dispatcher"]


def test_live_dispatcher_is_ok_then_each_problem_is_named(cli: Any, store: Any, dispatcher: Any) -> None:
    d = dispatcher()
    out = _check(cli)
    assert out.code == 0 and out.out.strip() == "ok", out
    assert _check(cli, as_json=True).json == {"ok": True, "healthy": True, "reasons": []}

    job = add_job(store, name="h", payload_message="ok")
    now = int(time.time() * 1000)
    run_id = str(uuid.uuid4())
    with store.transaction() as tx:  # states a test cannot easily provoke for real: written as recovery and the outbox leave them
        tx.execute("INSERT INTO runs (id, job_id, status, attempt, created_at, started_at) VALUES (?, ?, 'recovery_blocked', 1, ?, ?)",
                   (run_id, job["id"], now, now))
    reasons = _check(cli, as_json=True).json["details"]
    assert [r["check"] for r in reasons] == ["recovery_blocked"] and reasons[0]["runs"] == [run_id]
    out = _check(cli)
    assert out.code == 1 and "1 run(s) recovery_blocked" in out.err and len(out.err.strip().splitlines()) == 1
    d.stop()
    reasons = [r["check"] for r in _check(cli, as_json=True).json["details"]]
    assert reasons == ["dispatcher", "recovery_blocked"]


def test_failed_outbox_and_overdue_approvals_fail_the_check(cli: Any, store: Any, dispatcher: Any) -> None:
    dispatcher()
    from scheduler.cli.status_cmd import check_reasons, collect_status

    status = collect_status(store)
    assert check_reasons(status) == []
    status["outbox"]["failed"] = 2
    status["approvals"]["expired_pending"] = 1
    reasons = check_reasons(status)
    assert [(r["check"], r["count"]) for r in reasons] == [("outbox", 2), ("approvals", 1)]
    assert reasons[0]["reason"] == "2 delivery part(s) failed"
