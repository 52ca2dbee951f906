"""One job-state vocabulary (issue 29 piece 2, issue 32 stumbles 9 and 10).

``enabled``, ``paused``, ``auto-paused``, ``disabled``, ``done``: derived from the job row by
``scheduler.core.jobs.job_state`` (and, for SQL, ``JOB_STATE_SQL`` beside it), shown the same way by
``jobs list``/``get`` (human and ``--json``), ``status``, ``jobs tree`` and ``scheduler.api.ops``.
A job that will not fire shows no next run. ``jobs pause``/``resume`` are the operator's words;
a mistyped ``jobs stop`` points at them; ``jobs list --state`` filters. Through the real CLI.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.api import ops
from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.jobs import JOB_STATE_SQL, JOB_STATES, job_state, list_jobs
from scheduler.core.rows import JobRow


def ok(res: Any, key: str | None = None) -> Any:
    assert res.code == 0, res
    doc = res.json
    assert doc["ok"] is True, doc
    return doc[key] if key else doc


def error(res: Any, code: str) -> dict[str, Any]:
    assert res.code != 0, res
    doc = res.json
    assert doc["ok"] is False and doc["code"] == code, doc
    return doc


def hourly(name: str) -> str:
    return json.dumps({"name": name, "schedule_kind": "every", "schedule_every": "1h", "payload_message": "echo hi"})


def human_row(cli: Any, name: str) -> dict[str, str]:
    """The ``jobs list`` table row of job ``name``, by column heading."""
    res = cli("jobs", "list")
    assert res.code == 0, res
    head, *rows = res.out.splitlines()
    starts = [head.index(h) for h in ("NAME", "ID", "STATE", "SCHEDULE", "NEXT RUN", "LAST")]
    for line in rows:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=False)]
        if cells[0] == name:
            return dict(zip(("name", "id", "state", "schedule", "next run", "last"), cells, strict=True))
    raise AssertionError(f"{name} not in {res.out!r}")


# --- the one function and its SQL twin -------------------------------------------------------------------


def test_the_sql_expression_agrees_with_job_state_on_every_combination(store: Any) -> None:
    """Every combination of the columns the state reads, on a real store (both stores): SQL == Python."""
    kinds = {"at": {"schedule_kind": "at", "schedule_at": "2099-01-01T00:00:00Z"},
             "every": {"schedule_kind": "every", "schedule_every": "1h"}, "cron": {"schedule_kind": "cron", "schedule_cron": "0 9 * * *"},
             "manual": {"schedule_kind": "manual"}}
    combos = list(itertools.product(kinds, (0, 1), (None, 1_700_000_000_000), (None, "", "auto-paused after 3 failures"),
                                    (None, 1_800_000_000_000)))
    ids = {}
    for i, (kind, enabled, paused_at, reason, next_run) in enumerate(combos):
        job = add_job(store, name=f"j{i}", payload_message="ok", **kinds[kind])
        with store.transaction() as tx:  # a test may set any combination by hand
            tx.execute("UPDATE jobs SET enabled = ?, paused_at = ?, paused_reason = ?, next_run_at = ? WHERE id = ?",
                       (enabled, paused_at, reason, next_run, job["id"]))
        ids[job["id"]] = (kind, enabled, paused_at, reason, next_run)
    with store.read() as tx:
        rows = tx.all(f"SELECT *, {JOB_STATE_SQL} AS derived_state FROM jobs")
        by_filter = {s: {r.id for r in list_jobs(tx, state=s)} for s in JOB_STATES}
    assert len(rows) == len(combos)
    seen = set()
    for r in rows:
        python = job_state(JobRow.from_row(r))
        assert r["derived_state"] == python, (ids[r["id"]], r["derived_state"], python)
        assert r["id"] in by_filter[python]
        seen.add(python)
    assert seen == set(JOB_STATES)  # every state is reachable, so the comparison covered each
    assert sum(len(v) for v in by_filter.values()) == len(rows)  # each job in exactly one state's listing


def test_the_states_mean_what_the_docs_say() -> None:
    def row(**cols: Any) -> JobRow:
        base = {"enabled": 1, "paused_at": None, "paused_reason": None, "schedule_kind": "every", "next_run_at": 1}
        return JobRow.from_row({**base, **cols})

    assert job_state(row()) == "enabled"
    assert job_state(row(enabled=0)) == "disabled"
    assert job_state(row(enabled=0, paused_at=5)) == "paused"  # the operator's pause carries no reason
    assert job_state(row(enabled=0, paused_at=5, paused_reason="auto-paused after 3 consecutive failures")) == "auto-paused"
    assert job_state(row(enabled=0, paused_at=5, paused_reason="")) == "auto-paused"  # a reason, even empty, is the scheduler's
    assert job_state(row(schedule_kind="at", next_run_at=None)) == "done"
    assert job_state(row(schedule_kind="at", next_run_at=None, enabled=0)) == "done"  # it will not fire again either way
    assert job_state(row(schedule_kind="at", next_run_at=7)) == "enabled"  # a one-shot still to fire
    assert job_state(row(schedule_kind="manual", next_run_at=None)) == "enabled"  # manual and chain jobs never have a next run


# --- what the CLI shows ----------------------------------------------------------------------------------


def test_a_one_shot_that_fired_is_done_and_filterable(store: Any, cli: Any, dispatcher: Any) -> None:
    ok(cli("--json", "jobs", "add", hourly("tick")))
    spec = {"name": "once", "executor": "testkit", "payload_message": "ok"}
    soon = to_iso(now_ms() - 1000)
    job = ok(cli("--json", "jobs", "add", json.dumps(spec), "--at", soon, "--allow-past"), "job")
    assert job["state"] == "enabled" and job["next_run_at"] is not None
    dispatcher()
    wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], what="the one-shot's run")
    got = ok(cli("--json", "jobs", "get", "once"), "job")
    assert got["state"] == "done" and got["next_run_at"] is None and got["enabled"] is True
    assert human_row(cli, "once")["state"] == "done" and human_row(cli, "once")["next run"] == "-"
    assert [j["name"] for j in ok(cli("--json", "jobs", "list", "--state", "done"), "jobs")] == ["once"]
    assert [j["name"] for j in ok(cli("--json", "jobs", "list", "--state", "enabled"), "jobs")] == ["tick"]
    assert ok(cli("--json", "status"), "status")["jobs"] == {"done": 1, "enabled": 1}
    resumed = ok(cli("--json", "jobs", "resume", "once"), "job")  # re-enabling a done one-shot does not re-arm it
    assert resumed["state"] == "done" and resumed["next_run_at"] is None


def test_a_disabled_job_shows_no_next_run(cli: Any) -> None:
    ok(cli("--json", "jobs", "add", hourly("a")))
    assert human_row(cli, "a")["next run"] != "-"
    off = ok(cli("--json", "jobs", "disable", "a"), "job")
    assert off["state"] == "disabled" and off["next_run_at"] is None
    assert human_row(cli, "a")["state"] == "disabled" and human_row(cli, "a")["next run"] == "-"
    assert ok(cli("--json", "jobs", "get", "a"), "job")["next_run_at"] is None
    on = ok(cli("--json", "jobs", "enable", "a"), "job")
    assert on["state"] == "enabled" and on["next_run_at"] is not None and human_row(cli, "a")["next run"] != "-"


def test_pause_and_resume(store: Any, cli: Any) -> None:
    job = ok(cli("--json", "jobs", "add", hourly("a")), "job")
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE job_id = ?", (job["id"],)) == 0
    res = cli("jobs", "pause", "a")
    assert res.code == 0 and res.out.strip() == "a is paused", res
    paused = ok(cli("--json", "jobs", "get", "a"), "job")
    assert paused["state"] == "paused" and paused["enabled"] is False and paused["next_run_at"] is None
    assert paused["paused_at"] is not None and paused["paused_reason"] is None
    assert human_row(cli, "a")["state"] == "paused" and human_row(cli, "a")["next run"] == "-"
    refused = error(cli("--json", "jobs", "run", "a"), "JOB_DISABLED")
    assert "paused" in refused["error"] and "jobs resume a" in refused["error"]
    assert [j["name"] for j in ok(cli("--json", "jobs", "list", "--state", "paused"), "jobs")] == ["a"]
    assert ok(cli("--json", "status"), "status")["jobs"] == {"paused": 1}
    with store.read() as tx:
        kinds = [r["kind"] for r in tx.all("SELECT kind FROM runtime_events WHERE job_id = ? ORDER BY id", (job["id"],))]
    assert kinds[-1] == "job.paused"
    resumed = ok(cli("--json", "jobs", "resume", "a"), "job")
    assert resumed["state"] == "enabled" and resumed["enabled"] is True and resumed["next_run_at"] is not None
    assert resumed["paused_at"] is None
    res = cli("jobs", "resume", "a")
    assert res.code == 0 and res.out.startswith("a is enabled; next run "), res


def test_auto_paused_is_its_own_state_and_the_operators_word_wins(store: Any, cli: Any) -> None:
    job = ok(cli("--json", "jobs", "add", hourly("a")), "job")
    with store.transaction() as tx:  # what completion's auto_pause_job leaves (tests/test_runtime.py drives it for real)
        tx.execute("UPDATE jobs SET enabled = 0, paused_at = ?, paused_reason = ? WHERE id = ?",
                   (now_ms(), "auto-paused after 3 consecutive failures", job["id"]))
    view = ok(cli("--json", "jobs", "get", "a"), "job")
    assert view["state"] == "auto-paused" and view["next_run_at"] is None
    assert human_row(cli, "a")["state"] == "auto-paused"
    assert "jobs resume a" in error(cli("--json", "jobs", "run", "a"), "JOB_DISABLED")["error"]
    assert ok(cli("--json", "jobs", "pause", "a"), "job")["state"] == "paused"
    assert ok(cli("--json", "jobs", "disable", "a"), "job")["state"] == "disabled"  # disable clears a pause
    disabled = ok(cli("--json", "jobs", "get", "a"), "job")
    assert disabled["paused_at"] is None and disabled["paused_reason"] is None
    assert "jobs enable a" in error(cli("--json", "jobs", "run", "a"), "JOB_DISABLED")["error"]
    assert ok(cli("--json", "jobs", "pause", "a"), "job")["state"] == "paused"
    assert ok(cli("--json", "jobs", "enable", "a"), "job")["state"] == "enabled"  # enable and resume are one


def test_pause_does_to_pending_work_what_disable_does(store: Any, cli: Any, dispatcher: Any) -> None:
    from scheduler.core.queue import enqueue_manual

    a = ok(cli("--json", "jobs", "add", hourly("a")), "job")
    b = ok(cli("--json", "jobs", "add", hourly("b")), "job")
    for name in ("a", "b"):
        enqueue_manual(store, name)  # a manual request queued before: kept by disable (docs/cli.md), so by pause too
    ok(cli("--json", "jobs", "pause", "a"))
    ok(cli("--json", "jobs", "disable", "b"))

    def queue(job_id: str) -> list[Any]:
        with store.read() as tx:
            return [r["status"] for r in tx.all("SELECT status FROM job_dispatch_queue WHERE job_id = ?", (job_id,))]

    dispatcher()
    wait_for(lambda: "pending" not in queue(a["id"]) + queue(b["id"]), what="the dispatcher to drop both")
    assert queue(a["id"]) == queue(b["id"]) and "pending" not in queue(a["id"])
    assert [r["dispatch_kind"] for r in run_rows(store, a["id"])] == [r["dispatch_kind"] for r in run_rows(store, b["id"])]
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE kind <> 'manual'") == 0  # no slot materialised


def test_unknown_state_is_refused(store: Any, cli: Any) -> None:
    ok(cli("--json", "jobs", "add", hourly("a")))
    doc = error(cli("--json", "jobs", "list", "--state", "stopped"), "INVALID_ARGUMENT")
    assert "stopped" in doc["error"] and all(s in doc["error"] for s in JOB_STATES)
    res = cli("jobs", "list", "--state", "Paused")
    assert res.code != 0 and "INVALID_ARGUMENT" in res.err
    with pytest.raises(SchedulerError) as caught:
        ops.list_jobs(store, state="nope")
    assert caught.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize("typo", ["stop", "suspend", "halt", "hold", "freeze"])
def test_a_mistyped_stop_hints_at_pause(cli: Any, typo: str) -> None:
    doc = error(cli("--json", "jobs", typo, "a"), "INVALID_ARGUMENT")
    assert f"No such command '{typo}'" in doc["error"] and "scheduler jobs pause" in doc["error"], doc
    res = cli("jobs", typo, "a")
    assert res.code == 2 and "jobs pause" in res.err


@pytest.mark.parametrize("typo", ["start", "unpause", "continue"])
def test_a_mistyped_start_hints_at_resume(cli: Any, typo: str) -> None:
    doc = error(cli("--json", "jobs", typo, "a"), "INVALID_ARGUMENT")
    assert "scheduler jobs resume" in doc["error"], doc


def test_the_ops_api_pauses_resumes_and_filters_as_the_cli_does(store: Any, cli: Any) -> None:
    ok(cli("--json", "jobs", "add", hourly("a")))
    ok(cli("--json", "jobs", "add", hourly("b")))
    target = store  # the store the cli fixture writes to
    mine = ops.pause_job(target, "a")
    theirs = ok(cli("--json", "jobs", "pause", "b"), "job")
    assert mine["state"] == theirs["state"] == "paused" and mine["next_run_at"] is None
    assert [j["name"] for j in ops.list_jobs(target, state="paused")] == ["a", "b"]
    assert ops.resume_job(target, "a")["state"] == "enabled"
    assert [j["name"] for j in ops.list_jobs(target, state="enabled")] == ["a"]


def test_the_tree_shows_the_state(cli: Any) -> None:
    ok(cli("--json", "jobs", "add", hourly("root")))
    ok(cli("--json", "jobs", "pause", "root"))
    tree = ok(cli("--json", "jobs", "tree"), "tree")
    assert tree[0]["state"] == "paused" and tree[0]["enabled"] is False
    assert cli("jobs", "tree").out.strip() == "root (paused)"
