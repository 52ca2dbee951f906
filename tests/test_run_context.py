"""What the kernel hands an executor beyond the job: the trigger context and the state kept from the last ok run.

Also the two trust refusals at ``jobs add``: a ``verify_shell`` check the executor would never
run, and ``provenance: static`` claimed from the CLI. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

from kernel_testing import add_job, run_rows, wait_for

from scheduler.core.queue import enqueue_manual


def outputs(store: Any, job_id: str) -> list[tuple[str, str | None]]:
    return [(r["status"], r["stdout_excerpt"]) for r in run_rows(store, job_id)]


def test_a_chained_child_and_a_retry_see_the_run_they_follow(store: Any, dispatcher: Any) -> None:
    parent = add_job(store, name="parent", payload_message="echo:parent said hello")
    child = add_job(store, name="child", schedule_kind="chain", parent_id="parent", payload_message="show-trigger")
    retried = add_job(store, payload_message="show-trigger;flaky:2", max_retries=1, retry_backoff_ms=0)
    enqueue_manual(store, parent["id"])
    enqueue_manual(store, retried["id"])
    dispatcher()
    (ran,) = wait_for(lambda: [r for r in run_rows(store, child["id"]) if r["status"] == "ok"], what="child")
    (parent_run,) = run_rows(store, parent["id"])
    seen = json.loads(ran["stdout_excerpt"])
    assert seen == {"kind": "chain", "attempt": 1, "source": parent_run["id"], "status": "ok", "output": "parent said hello"}
    wait_for(lambda: [s for s, _ in outputs(store, retried["id"])] == ["error", "ok"], what="retry")
    first, second = run_rows(store, retried["id"])
    assert json.loads(first["stdout_excerpt"]) == {"kind": "manual", "attempt": 1, "source": None, "status": None, "output": None}
    seen = json.loads(second["stdout_excerpt"])
    assert (seen["kind"], seen["attempt"], seen["source"], seen["status"]) == ("retry", 2, first["id"], "error")


def test_state_is_kept_only_from_ok_runs_and_handed_to_the_next(store: Any, dispatcher: Any) -> None:
    job = add_job(store, name="stateful", executor="testkit-stateful", payload_message="show-state;keep:turns=1")
    enqueue_manual(store, job["id"])
    dispatcher()
    wait_for(lambda: outputs(store, job["id"]) == [("ok", "null")], what="first run: nothing kept yet")
    from scheduler.core.jobs import update_job

    update_job(store, job["id"], {"payload_message": "show-state;keep:turns=2;fail"})  # kept nothing: the run fails
    enqueue_manual(store, job["id"])
    wait_for(lambda: len(outputs(store, job["id"])) == 2 and outputs(store, job["id"])[1][0] == "error", what="failing run")
    update_job(store, job["id"], {"payload_message": "show-state"})
    enqueue_manual(store, job["id"])
    wait_for(lambda: len(outputs(store, job["id"])) == 3 and outputs(store, job["id"])[2][0] == "ok", what="third run")
    states = [json.loads(text.splitlines()[0]) for _status, text in outputs(store, job["id"])]
    assert states == [None, {"turns": "1"}, {"turns": "1"}]  # the failed run's "2" was never kept
    with store.read() as tx:
        row = tx.one("SELECT executor, state, run_id FROM executor_state WHERE job_id = ?", (job["id"],))
    assert row["executor"] == "testkit-stateful" and json.loads(row["state"]) == {"turns": "1"}
    assert row["run_id"] == run_rows(store, job["id"])[0]["id"]


def test_unusable_state_is_refused_and_the_previous_kept(store: Any) -> None:
    from scheduler.core.completion import keep_executor_state
    from scheduler.core.execution import MAX_EXECUTOR_STATE_BYTES
    from scheduler.core.rows import RunRow

    job = add_job(store, payload_message="ok")
    with store.transaction() as tx:
        tx.execute("INSERT INTO runs(id, job_id, status, created_at, executor) VALUES ('r1', ?, 'ok', 1, 'testkit')", (job["id"],))
        run = RunRow.from_row({"id": "r1", "job_id": job["id"]})
        assert keep_executor_state(tx, run, {"a": 1}, now=1, actor=None)
        assert not keep_executor_state(tx, run, ["not", "an", "object"], now=2, actor=None)
        assert not keep_executor_state(tx, run, {"big": "x" * MAX_EXECUTOR_STATE_BYTES}, now=3, actor=None)
        assert not keep_executor_state(tx, run, {"nan": float("nan")}, now=4, actor=None)
        assert json.loads(tx.scalar("SELECT state FROM executor_state WHERE job_id = ?", (job["id"],))) == {"a": 1}
        assert tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind = 'executor_state.refused'") == 3


def test_a_verify_check_the_executor_never_runs_is_refused(cli: Any) -> None:
    spec = {"name": "unchecked", "schedule_kind": "manual", "payload_message": "ok", "executor": "testkit", "verify_shell": "true"}
    out = cli("--json", "jobs", "add", json.dumps(spec))
    assert out.code != 0 and out.json["code"] == "VALIDATION_FAILED"
    assert [(d["field"], d["code"]) for d in out.json["details"]] == [("verify_shell", "SCHEDULER_GOVERNANCE_DENIED")]
    shell = cli("--json", "jobs", "add", json.dumps({**spec, "executor": "shell"}))  # the shell executor runs the check
    assert shell.code == 0, shell


def test_the_cli_cannot_claim_static_provenance(cli: Any) -> None:
    spec = {"name": "trusted?", "schedule_kind": "manual", "payload_message": "ok", "executor": "testkit", "provenance": "static"}
    for args in (("jobs", "add", json.dumps(spec)), ("jobs", "validate", json.dumps(spec))):
        out = cli("--json", *args)
        assert out.code != 0 and out.json["details"][0]["code"] == "PROVENANCE_NOT_ALLOWED"
    assert cli("--json", "jobs", "add", json.dumps({**spec, "provenance": "external"})).code == 0
    out = cli("--json", "jobs", "update", "trusted?", json.dumps({"provenance": "static"}))
    assert out.code != 0 and out.json["details"][0]["code"] == "PROVENANCE_NOT_ALLOWED"
    assert cli("--json", "jobs", "get", "trusted?").json["job"]["provenance"] == "external"
