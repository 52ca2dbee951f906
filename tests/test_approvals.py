"""The approval gate: nothing of a gated job runs before a decision, on SQLite and PostgreSQL.

The payloads are testkit ``touch:FILE`` steps, so "nothing ran" is a file that does not
exist and "ran once" is a file with one line.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, scheduler_cmd, wait_for

from scheduler.approvals.decisions import decide, expire_due, list_approvals, scope_matches
from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.jobs import delete_job, set_enabled, update_job
from scheduler.core.queue import enqueue_manual
from scheduler.core.transitions import insert_dispatch


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def statuses(store: Any, job_id: str) -> list[str]:
    return [r["status"] for r in run_rows(store, job_id)]


def approvals(store: Any, job_id: str | None = None) -> list[dict[str, Any]]:
    with store.read() as tx:
        return list_approvals(tx, job_id=job_id)


def pending(store: Any, job_id: str, count: int = 1) -> list[dict[str, Any]]:
    """Wait until the job has ``count`` pending approvals; return them."""
    return wait_for(lambda: (rows := [a for a in approvals(store, job_id) if a["status"] == "pending"]) and len(rows) == count
                    and rows, what=f"{count} pending approval(s)")


def gated(store: Any, marker: Path, **spec: Any) -> dict[str, Any]:
    return add_job(store, payload_message=f"touch:{marker}", approval_required=True, **spec)


def test_regression_a_gated_manual_run_waits_for_approval_then_runs_once(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    """Before the gate: ``approval_required: true`` and ``jobs run`` ran at once with status ok and no approval."""
    marker = tmp_path / "ran"
    job = gated(store, marker, approval_risk_level="high")
    enqueue_manual(store, job["id"])
    dispatcher()
    (approval,) = pending(store, job["id"])
    time.sleep(0.5)
    assert lines(marker) == [] and statuses(store, job["id"]) == ["awaiting_approval"]
    assert approval["risk_level"] == "high" and approval["artifact_digest"] == job["artifact_digest"] and approval["version"] == 1
    decided = decide(store, approval["id"], "approved", note="looks fine")
    assert decided["status"] == "approved" and decided["note"] == "looks fine" and decided["decided_uid"] is not None
    wait_for(lambda: statuses(store, job["id"]) == ["ok"], what="approved run finished")
    assert len(lines(marker)) == 1
    (final,) = approvals(store, job["id"])
    assert final["status"] == "dispatched" and final["version"] == 3
    with pytest.raises(SchedulerError) as err:
        decide(store, approval["id"], "rejected")
    assert err.value.code == "APPROVAL_CONFLICT"


def test_every_dispatch_kind_waits_and_runs_once_after_approval(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marks = {k: tmp_path / k for k in ("at", "schedule", "chain", "retry", "replay")}
    at_job = gated(store, marks["at"], schedule_kind="at", schedule_at=to_iso(now_ms() + 300))
    every = gated(store, marks["schedule"], schedule_kind="every", schedule_every="1s")
    parent = add_job(store, name="parent", payload_message="ok")
    child = gated(store, marks["chain"], schedule_kind="chain", parent_id="parent")
    retried = add_job(store, payload_message=f"touch:{marks['retry']};flaky:2", approval_required=True, max_retries=1,
                      retry_backoff_ms=0)
    replayed = gated(store, marks["replay"])
    enqueue_manual(store, parent["id"])
    enqueue_manual(store, retried["id"])
    with store.transaction() as tx:  # what recovery queues for an interrupted at-least-once run
        insert_dispatch(tx, id="replay-1", job_id=replayed["id"], kind="manual", due_at=now_ms(), now=now_ms(), replay_count=1)
    dispatcher()
    gates = [pending(store, job["id"])[0] for job in (at_job, every, child, retried, replayed)]
    time.sleep(0.3)
    assert all(lines(m) == [] for m in marks.values())  # every kind waits
    for approval in gates:
        decide(store, approval["id"], "approved")
    (retry_approval,) = pending(store, retried["id"])  # the failed first attempt's retry is gated again
    assert statuses(store, retried["id"]) == ["error", "awaiting_approval"]
    decide(store, retry_approval["id"], "approved")
    for job in (at_job, child, retried, replayed):
        wait_for(lambda j=job: statuses(store, j["id"])[-1] == "ok", what=f"{job['name']} ran")
    wait_for(lambda: "ok" in statuses(store, every["id"]), what="scheduled run")
    set_enabled(store, every["id"], False)
    assert [len(lines(marks[k])) for k in ("at", "chain", "replay")] == [1, 1, 1]
    assert len(lines(marks["retry"])) == 2 and len(lines(marks["schedule"])) == 1
    kinds = {r["dispatch_kind"] for j in (at_job, every, child, retried, replayed) for r in run_rows(store, j["id"])}
    assert {"at", "schedule", "chain", "retry", "manual"} <= kinds
    (replay_run,) = run_rows(store, replayed["id"])
    assert replay_run["status"] == "ok"


def test_reject_and_timeouts_decide_without_running(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    rejected, timed_out, auto, scoped = (tmp_path / n for n in ("rejected", "timed-out", "auto", "scoped"))
    a = gated(store, rejected)
    b = gated(store, timed_out, approval_timeout_s=1)
    c = gated(store, auto, approval_timeout_s=1, approval_timeout_action="approve")
    d = gated(store, scoped, approval_timeout_s=1, approval_approver_scope="uid:0")  # scoped + "approve" is refused at add
    for job in (a, b, c, d):
        enqueue_manual(store, job["id"])
    dispatcher()
    (first,) = pending(store, a["id"])
    decide(store, first["id"], "rejected", note="not today")
    (run,) = run_rows(store, a["id"])
    assert (run["status"], run["error_code"]) == ("cancelled", "APPROVAL_REJECTED") and "not today" in run["cancel_reason"]
    started = time.monotonic()
    wait_for(lambda: statuses(store, b["id"]) == ["cancelled"], what="timed out")  # no tick: the wake-up covers it
    assert time.monotonic() - started < 3.0
    wait_for(lambda: statuses(store, c["id"]) == ["ok"], what="auto-approved")
    wait_for(lambda: statuses(store, d["id"]) == ["cancelled"], what="scoped gate rejected on timeout")
    assert run_rows(store, b["id"])[0]["error_code"] == "APPROVAL_TIMED_OUT"
    assert run_rows(store, d["id"])[0]["error_code"] == "APPROVAL_TIMED_OUT"
    assert [approvals(store, j["id"])[0]["status"] for j in (a, b, c, d)] == ["rejected", "timed_out", "dispatched", "timed_out"]
    assert (lines(rejected), lines(timed_out), len(lines(auto)), lines(scoped)) == ([], [], 1, [])


@pytest.mark.parametrize("how", ["cancel", "disable", "delete", "update"])
def test_cancel_disable_delete_and_update_end_a_waiting_gate(store: Any, dispatcher: Any, tmp_path: Path, how: str) -> None:
    from scheduler.core.cancel import cancel_run

    marker = tmp_path / "ran"
    job = gated(store, marker)
    enqueue_manual(store, job["id"])
    d = dispatcher()
    (approval,) = pending(store, job["id"])
    (run,) = run_rows(store, job["id"])
    if how == "cancel":
        cancel_run(store, run["id"], reason="no")
    elif how == "disable":
        set_enabled(store, job["id"], False)
    elif how == "update":
        update_job(store, job["id"], {"run_timeout_ms": 1234})
    else:
        delete_job(store, job["id"])
    with pytest.raises(SchedulerError) as err:
        decide(store, approval["id"], "approved")
    assert err.value.code in ("APPROVAL_CONFLICT", "NOT_FOUND")
    if how != "delete":
        assert statuses(store, job["id"]) == ["cancelled"] and approvals(store, job["id"])[0]["status"] == "cancelled"
    time.sleep(0.3)
    d.stop()
    assert lines(marker) == []


def test_a_waiting_gate_counts_as_active_for_overlap(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    job = gated(store, tmp_path / "ran")
    enqueue_manual(store, job["id"])
    dispatcher()
    pending(store, job["id"])
    with pytest.raises(SchedulerError) as err:  # overlap_policy skip: a manual run is refused while one awaits approval
        enqueue_manual(store, job["id"])
    assert err.value.code == "JOB_ALREADY_RUNNING"


def test_two_pending_approvals_make_jobs_approve_ambiguous(cli: Any, store: Any, dispatcher: Any, tmp_path: Path) -> None:
    job = gated(store, tmp_path / "ran", name="twice", overlap_policy="allow")
    enqueue_manual(store, job["id"])
    enqueue_manual(store, job["id"])
    dispatcher()
    first, second = pending(store, job["id"], count=2)
    out = cli("--json", "jobs", "approve", "twice")
    assert out.code != 0 and out.json["code"] == "APPROVAL_AMBIGUOUS" and set(out.json["details"]["approvals"]) == {
        first["id"], second["id"]}
    assert cli("--json", "approvals", "reject", first["id"], "--note", "dup").json["approval"]["status"] == "rejected"
    assert cli("--json", "jobs", "approve", "twice").json["approval"]["id"] == second["id"]
    listed = cli("--json", "approvals", "list").json["approvals"]
    assert {a["id"] for a in listed} == {first["id"], second["id"]}
    assert cli("--json", "approvals", "list", "--pending").json["approvals"] == []
    shown = cli("--json", "approvals", "show", first["id"][:8]).json["approval"]
    assert shown["status"] == "rejected" and shown["note"] == "dup"
    assert cli("--json", "approvals", "show", second["id"][-12:]).json["approval"]["id"] == second["id"]  # its end too
    assert cli("--json", "approvals", "show", "no-such-approval").json["code"] == "NOT_FOUND"


def test_concurrent_approvers_one_wins(store: Any, store_url: str, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    job = gated(store, marker)
    enqueue_manual(store, job["id"])
    d = dispatcher()
    (approval,) = pending(store, job["id"])
    d.stop()  # nothing else touches the database while the two decide
    cmd = [*scheduler_cmd(), "--db", store_url, "--json", "approvals", "approve", approval["id"]]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(60), json.loads(p.stdout.read().strip().splitlines()[-1])) for p in procs]
    assert sorted(code for code, _ in results) == [0, 1], results
    assert [doc.get("code") for code, doc in results if code] == ["APPROVAL_CONFLICT"]
    (row,) = approvals(store, job["id"])
    assert row["status"] == "approved" and row["version"] == 2


def test_scope_matching_uses_the_account_not_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert scope_matches(None, "anyone", 1234)
    assert scope_matches("uid:1234", "anyone", 1234) and not scope_matches("uid:1234", "anyone", 1235)
    assert scope_matches("alice", "alice", 1) and not scope_matches("alice", "mallory", 2)
    assert scope_matches("ａｌｉｃｅ", "alice", 1)  # noqa: RUF001 - NFKC: full-width letters are the same principal
    from scheduler.approvals.decisions import approver_identity

    monkeypatch.setenv("USER", "someone-else")
    monkeypatch.setenv("LOGNAME", "someone-else")
    name, uid = approver_identity()
    assert name != "someone-else" and uid >= 0


def test_a_scoped_decision_by_another_account_changes_nothing(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    job = gated(store, tmp_path / "ran", approval_approver_scope="uid:4242")
    enqueue_manual(store, job["id"])
    dispatcher()
    (approval,) = pending(store, job["id"])
    with pytest.raises(SchedulerError) as err:
        decide(store, approval["id"], "approved")
    assert err.value.code == "APPROVAL_SCOPE_MISMATCH"
    (row,) = approvals(store, job["id"])
    assert (row["status"], row["version"]) == ("pending", 1) and statuses(store, job["id"]) == ["awaiting_approval"]


def test_decided_approvals_are_final_in_the_database(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    job = gated(store, tmp_path / "ran")
    enqueue_manual(store, job["id"])
    dispatcher()
    (approval,) = pending(store, job["id"])
    decide(store, approval["id"], "rejected")
    for sql in ("UPDATE approvals SET status = 'approved', version = version + 1 WHERE id = ?",
                "UPDATE approvals SET status = 'pending', version = version + 1 WHERE id = ?"):
        with pytest.raises(SchedulerError) as err, store.transaction() as tx:
            tx.execute(sql, (approval["id"],))
        assert "APPROVAL_FINAL" in err.value.message


def test_an_approval_notice_goes_through_the_outbox(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    job = add_job(store, payload_message="ok", approval_required=True, delivery_mode="always", delivery_channel="log",
                  delivery_to="ops")
    enqueue_manual(store, job["id"])
    dispatcher()
    (approval,) = pending(store, job["id"])
    with store.read() as tx:
        (row,) = tx.all("SELECT channel, target, body, idempotency_key FROM delivery_outbox WHERE job_id = ?", (job["id"],))
    assert (row["channel"], row["target"]) == ("log", "ops") and approval["id"] in row["body"]
    assert row["idempotency_key"] == f"{approval['id']}:approval-notice:part:1/1"


def test_expire_due_is_idempotent(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    job = gated(store, tmp_path / "ran", approval_timeout_s=1)
    enqueue_manual(store, job["id"])
    d = dispatcher()
    pending(store, job["id"])
    d.stop()
    later = now_ms() + 5000
    with store.transaction() as tx:
        assert expire_due(tx, now=later) == 1
    with store.transaction() as tx:
        assert expire_due(tx, now=later) == 0
    assert statuses(store, job["id"]) == ["cancelled"]
