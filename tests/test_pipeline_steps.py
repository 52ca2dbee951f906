"""The run pipeline as registered steps: the one list, the plan derived from the artifact, fail-closed registration,
and a third-party step (tests/support/scheduler-step-testkit) that takes part in real runs without a kernel change."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kernel_testing import scheduler_cmd

from scheduler.base.errors import SchedulerError
from scheduler.core import steps
from scheduler.core.artifact import bind_plan, execution_sections
from scheduler.core.jobs import create_jobs
from scheduler.core.queue import enqueue_manual
from scheduler.core.spec import validate_spec
from scheduler.core.steps import StepBase
from scheduler.pipeline import DEFAULT_STEPS, installed_steps
from scheduler.testing import RunningDispatcher, add_job, run_rows, sqlite_store, wait_for

MARKER = "echo:step-testkit"
MARKER_EVENTS = [("steptestkit.before", None), ("steptestkit.around", "enter"), ("steptestkit.around", "exit"),
                 ("steptestkit.after", None)]


def spec(**fields: Any) -> Any:
    return validate_spec({"name": "p", "schedule_kind": "manual", "payload_message": "ok", "executor": "testkit", **fields},
                         plugin_options=False)


def job_row(store: Any, job_id: str) -> dict[str, Any]:
    with store.read() as tx:
        return tx.one("SELECT * FROM jobs WHERE id = ?", (job_id,))


def marker_events(store: Any, run_id: str) -> list[tuple[str, Any]]:
    with store.read() as tx:
        rows = tx.all("SELECT kind, data FROM runtime_events WHERE run_id = ? AND kind LIKE 'steptestkit.%' ORDER BY id", (run_id,))
    return [(r["kind"], json.loads(r["data"] or "{}").get("phase")) for r in rows]


def test_the_built_in_steps_are_one_list_in_run_order() -> None:
    assert [s.name for s in DEFAULT_STEPS] == ["artifact", "plugin_options", "governance", "identity", "proofs", "authorization",
                                               "approval", "credentials", "verification", "evidence"]


def test_a_third_party_step_is_placed_where_it_says() -> None:
    names = [s.name for s in installed_steps()]
    assert names.index("testkit-marker") == names.index("authorization") + 1
    assert [n for n in names if n != "testkit-marker"] == [s.name for s in DEFAULT_STEPS]


def test_the_plan_is_derived_from_the_artifact_and_cached_per_digest(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "s.db")
    try:
        plain = create_jobs(store, [spec(name="plain")])[0]
        gated = create_jobs(store, [spec(name="gated", authorization_ref="policy:x", evidence={"provider": "checksum"})])[0]
        plain_plan = bind_plan(store, job_row(store, plain.id), spec(name="plain"))
        assert plain_plan.steps == ("artifact", "plugin_options", "identity", "credentials", "verification")
        assert len(plain_plan.before) == 1 and len(plain_plan.around) == 1 and plain_plan.after == (plain_plan.after[0],)
        gated_spec = spec(name="gated", authorization_ref="policy:x", evidence={"provider": "checksum"})
        gated_plan = bind_plan(store, job_row(store, gated.id), gated_spec)
        assert "authorization" in gated_plan.steps and "evidence" in gated_plan.steps and "proofs" not in gated_plan.steps
        assert bind_plan(store, job_row(store, plain.id), spec(name="plain")) is plain_plan  # cached per digest
    finally:
        store.close()


def test_nothing_is_validated_or_projected_without_installed_steps() -> None:
    done = spec()
    with steps.installed_as(None):
        with pytest.raises(SchedulerError) as err:
            validate_spec({"name": "p", "schedule_kind": "manual", "payload_message": "ok"}, plugin_options=False)
        assert err.value.code == "PIPELINE_NOT_INSTALLED"
        with pytest.raises(SchedulerError) as err:
            execution_sections(done)
        assert err.value.code == "PIPELINE_NOT_INSTALLED"


def test_a_field_or_section_without_its_step_fails_closed(tmp_path: Path) -> None:
    without_evidence = [s for s in DEFAULT_STEPS if s.name != "evidence"]
    with steps.installed_as(without_evidence):
        with pytest.raises(SchedulerError) as err:
            validate_spec({"name": "p", "schedule_kind": "manual", "payload_message": "ok", "evidence": {}}, plugin_options=False)
        assert err.value.code == "PIPELINE_STEP_NOT_REGISTERED"
    store = sqlite_store(tmp_path / "s.db")
    try:
        declared = spec(name="e", evidence={"provider": "checksum"})
        job = create_jobs(store, [declared])[0]
        # the step's distribution went away: its jobs do not run
        with steps.installed_as(without_evidence), pytest.raises(SchedulerError) as err:
            bind_plan(store, job_row(store, job.id), declared)
        assert err.value.code == "PIPELINE_STEP_NOT_REGISTERED" and err.value.details == {"sections": ["evidence"]}
    finally:
        store.close()


def test_two_steps_cannot_own_one_field() -> None:
    class Twin(StepBase):
        name = "twin"
        fields: ClassVar[dict[str, Any]] = {"identity": None}

    with pytest.raises(ValueError, match="owned by steps 'identity' and 'twin'"):
        steps.install([*DEFAULT_STEPS, Twin()])
    with pytest.raises(ValueError, match="two pipeline steps"):
        steps.install([*DEFAULT_STEPS, DEFAULT_STEPS[0]])
    assert [s.name for s in steps.registered().steps] == [s.name for s in installed_steps()]  # a refused install changes nothing


def test_a_third_party_step_runs_in_an_in_process_dispatcher(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "s.db")
    try:
        marked, other = add_job(store, payload_message=MARKER), add_job(store, payload_message="echo:other")
        enqueue_manual(store, marked["id"])
        enqueue_manual(store, other["id"])
        d = RunningDispatcher(store)
        try:
            runs = wait_for(lambda: [r for j in (marked, other) for r in run_rows(store, j["id"]) if r["status"] == "ok"]
                            if all(any(r["status"] == "ok" for r in run_rows(store, j["id"])) for j in (marked, other)) else None,
                            what="both runs")
        finally:
            d.stop()
        by_job = {r["job_id"]: r for r in runs}
        assert marker_events(store, by_job[marked["id"]]["id"]) == MARKER_EVENTS
        assert marker_events(store, by_job[other["id"]]["id"]) == []  # a step that does not apply is not in the plan
    finally:
        store.close()


def test_a_third_party_step_runs_in_scheduler_run(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    job = json.dumps({"name": "marked", "schedule_kind": "manual", "executor": "testkit", "payload_message": MARKER})
    for argv in (["jobs", "add", job], ["jobs", "run", "marked"], ["run", "--duration", "3s"]):
        out = subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", *argv], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    store = sqlite_store(db)
    try:
        with store.read() as tx:
            run = tx.one("SELECT id, status FROM runs")
        assert run["status"] == "ok" and marker_events(store, run["id"]) == MARKER_EVENTS
    finally:
        store.close()
