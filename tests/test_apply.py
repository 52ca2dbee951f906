"""``scheduler apply`` and ``scheduler export`` through the real CLI, on SQLite and PostgreSQL.

Jobs as code: files are matched to stored jobs by name; an apply is one transaction (a
failure anywhere changes nothing); export then apply changes nothing, chains, plugin
options and handoff v4 jobs included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

PARENT = {"name": "parent", "schedule_kind": "cron", "schedule_cron": "0 3 * * *", "schedule_tz": "Europe/Berlin",
          "payload_message": "echo parent", "executor_options": {"env_policy": "inherit", "working_dir": "/tmp"}}
CHILD = {"name": "child", "schedule_kind": "chain", "parent_id": "parent", "trigger_on": "failure",
         "payload_message": "echo child", "max_retries": 2}
TICK = {"name": "tick", "schedule_kind": "every", "schedule_every": "90s", "payload_message": "date",
        "description": "every ninety seconds"}


def write_toml(path: Path, jobs: list[dict[str, Any]]) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps({"jobs": jobs}))
    return path


def snapshot(store: Any) -> list[dict[str, Any]]:
    """Every stored job row and the artifact count: what "nothing changed" is checked against."""
    with store.read() as tx:
        rows = tx.all("SELECT * FROM jobs ORDER BY name")
        artifacts = tx.scalar("SELECT COUNT(*) FROM execution_artifacts")
        events = tx.scalar("SELECT COUNT(*) FROM runtime_events")
    return [*rows, {"artifacts": artifacts, "events": events}]


def test_apply_creates_then_is_a_no_op_and_shows_a_diff(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [CHILD, PARENT, TICK])  # the child is listed before its parent
    dry = cli("--json", "apply", str(f), "--dry-run")
    assert dry.code == 0, dry
    assert dry.json["summary"] == {"create": 3, "update": 0, "unchanged": 0, "prune": 0}
    assert snapshot(store)[:-1] == []  # a dry run stores nothing
    out = cli("--json", "apply", str(f))
    assert out.code == 0, out
    jobs = {j["name"]: j for j in cli("--json", "jobs", "list").json["jobs"]}
    assert set(jobs) == {"parent", "child", "tick"}
    assert jobs["child"]["parent_id"] == jobs["parent"]["id"] and jobs["child"]["trigger_on"] == "failure"
    assert jobs["parent"]["executor_options"] == {"env_policy": "inherit", "working_dir": "/tmp"}  # an object, not JSON text
    before = snapshot(store)
    again = cli("--json", "apply", str(f))
    assert again.json["summary"] == {"create": 0, "update": 0, "unchanged": 3, "prune": 0}
    assert snapshot(store) == before  # not even an event
    # A changed file: the dry run names each changed field with its old and new value.
    write_toml(f, [CHILD, {**PARENT, "payload_message": "echo v2", "executor_options": {"env_policy": "inherit"}},
                   {k: v for k, v in TICK.items() if k != "description"}])
    diff = cli("--json", "apply", str(f), "--dry-run").json
    changes = {a["name"]: a["changes"] for a in diff["actions"] if a["action"] == "update"}
    assert changes["parent"] == [
        {"field": "payload_message", "old": "echo parent", "new": "echo v2"},
        {"field": "executor_options", "old": {"env_policy": "inherit", "working_dir": "/tmp"}, "new": {"env_policy": "inherit"}},
    ]
    assert changes["tick"] == [{"field": "description", "old": "every ninety seconds", "new": None}]
    assert snapshot(store) == before
    human = cli("apply", str(f), "--dry-run")
    assert "payload_message" in human.out and "would create 0, update 2" in human.out


def test_update_binds_a_new_artifact_and_cancels_work_bound_to_the_old(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [PARENT, TICK])
    assert cli("--json", "apply", str(f)).code == 0
    old = {j["name"]: j for j in cli("--json", "jobs", "list").json["jobs"]}
    assert cli("--json", "jobs", "run", "parent").code == 0  # a manual dispatch bound to the current artifact
    write_toml(f, [{**PARENT, "payload_message": "echo v2"}, {**TICK, "description": "renamed text only"}])
    out = cli("--json", "apply", str(f))
    assert out.code == 0, out
    assert out.json["summary"] == {"create": 0, "update": 2, "unchanged": 0, "prune": 0}
    new = {j["name"]: j for j in cli("--json", "jobs", "list").json["jobs"]}
    assert new["parent"]["artifact_digest"] != old["parent"]["artifact_digest"]
    assert new["parent"]["id"] == old["parent"]["id"]  # updated in place, history kept
    assert new["tick"]["artifact_digest"] == old["tick"]["artifact_digest"]  # a description is not the contract
    with store.read() as tx:
        statuses = [r["status"] for r in tx.all("SELECT status FROM job_dispatch_queue WHERE job_id = ?", (old["parent"]["id"],))]
    assert statuses == ["cancelled"]


def test_prune_disable_and_delete(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [PARENT, CHILD, TICK])
    assert cli("--json", "apply", str(f)).code == 0
    write_toml(f, [TICK])
    without = cli("--json", "apply", str(f))
    assert without.json["summary"]["prune"] == 0 and len(cli("--json", "jobs", "list").json["jobs"]) == 3
    disabled = cli("--json", "apply", str(f), "--prune", "disable")
    assert disabled.code == 0, disabled
    assert disabled.json["summary"] == {"create": 0, "update": 0, "unchanged": 1, "prune": 2}
    states = {j["name"]: j["state"] for j in cli("--json", "jobs", "list").json["jobs"]}
    assert states == {"parent": "disabled", "child": "disabled", "tick": "enabled"}
    # Already disabled: nothing to prune the second time.
    assert cli("--json", "apply", str(f), "--prune", "disable").json["summary"]["prune"] == 0
    deleted = cli("--json", "apply", str(f), "--prune", "delete")  # the child goes before its parent
    assert deleted.code == 0, deleted
    assert [j["name"] for j in cli("--json", "jobs", "list").json["jobs"]] == ["tick"]
    # A file that re-lists a disabled job enables it (the file wins).
    assert cli("--json", "jobs", "disable", "tick").code == 0
    assert cli("--json", "apply", str(f)).json["actions"][0]["changes"] == [{"field": "enabled", "old": False, "new": True}]
    assert cli("--json", "jobs", "get", "tick").json["job"]["state"] == "enabled"


def test_a_failure_inside_the_transaction_changes_nothing(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [PARENT, TICK])
    assert cli("--json", "apply", str(f)).code == 0
    before = snapshot(store)
    # Creates "aaa", updates "tick", disables "parent" ... then the chain job names a parent that does not exist.
    broken = [{**TICK, "payload_message": "date -u"}, {"name": "aaa", "schedule_kind": "manual", "payload_message": "true"},
              {**CHILD, "name": "zzz", "parent_id": "no-such-parent"}]
    write_toml(f, broken)
    out = cli("--json", "apply", str(f), "--prune", "delete")
    assert out.code != 0 and out.json["code"] == "NOT_FOUND", out
    assert snapshot(store) == before


def test_bad_input_names_file_and_job_and_stores_nothing(cli: Any, store: Any, tmp_path: Path) -> None:
    d = tmp_path / "jobs.d"
    d.mkdir()
    write_toml(d / "a.toml", [PARENT])
    (d / "b.json").write_text(json.dumps({"jobs": [TICK, {"name": "bad", "schedule_kind": "cron", "schedule_cron": "61 * * * *",
                                                          "payload_message": "x", "colour": "red"}]}))
    (d / "notes.txt").write_text("not a job file")  # ignored: only *.toml and *.json
    out = cli("--json", "apply", str(d))
    assert out.code != 0 and out.json["code"] == "VALIDATION_FAILED", out
    details = out.json["details"]
    assert {(Path(x["file"]).name, x["index"], x["job"], x["field"], x["code"]) for x in details} == {
        ("b.json", 1, "bad", "schedule_cron", "INVALID_CRON"), ("b.json", 1, "bad", "colour", "UNKNOWN_FIELD")}
    assert snapshot(store)[:-1] == []
    (d / "b.json").write_text(json.dumps([TICK, {**PARENT, "payload_message": "again"}]))
    dup = cli("--json", "apply", str(d))
    assert dup.code != 0 and dup.json["code"] == "NAME_CONFLICT" and dup.json["details"][0]["job"] == "parent"
    (d / "b.json").unlink()
    (d / "a.toml").write_text("[[jobs]]\nname = \n")
    bad_toml = cli("--json", "apply", str(d))
    assert bad_toml.code != 0 and bad_toml.json["code"] == "INVALID_TOML" and "a.toml" in bad_toml.json["error"]
    (d / "a.toml").write_text('jobs = []\nowner = "me"\n')
    assert cli("--json", "apply", str(d)).json["code"] == "APPLY_SOURCE_INVALID"
    assert cli("--json", "apply", str(tmp_path / "missing.toml")).json["code"] == "APPLY_SOURCE_INVALID"
    assert snapshot(store)[:-1] == []


def test_apply_accepts_static_provenance_and_checks_plugins(cli: Any, store: Any, tmp_path: Path) -> None:
    f = write_toml(tmp_path / "jobs.toml", [{**TICK, "provenance": "static"}])
    assert cli("--json", "apply", str(f)).code == 0  # job files are the operator's (jobs add refuses static)
    assert cli("--json", "jobs", "get", "tick").json["job"]["provenance"] == "static"
    write_toml(f, [{**TICK, "executor": "no-such-executor"}])
    out = cli("--json", "apply", str(f))
    assert out.code != 0 and out.json["code"] == "EXECUTOR_NOT_AVAILABLE", out
    assert cli("--json", "apply", str(f), "--allow-missing-plugins").code == 0


@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_export_then_apply_is_a_no_op(cli: Any, store: Any, tmp_path: Path, fmt: str) -> None:
    at_job = {"name": "once", "schedule_kind": "at", "schedule_at": "2031-05-01T10:00:00Z", "payload_message": "echo once",
              "enabled": False}
    agent = {"name": "brief", "schedule_kind": "cron", "schedule_cron": "0 7 * * 1-5", "session_target": "isolated",
             "payload_message": "Summarise the night.", "executor_options": {"model": "m1", "context_mode": "session"},
             "delivery_mode": "on_failure", "delivery_channel": "webhook", "delivery_to": "http://127.0.0.1:9/x"}
    grandchild = {**CHILD, "name": "grandchild", "parent_id": "child", "trigger_condition": "regex:^ok"}
    f = write_toml(tmp_path / "in.toml", [PARENT, CHILD, grandchild, TICK, at_job, agent])
    assert cli("--json", "apply", str(f)).code == 0, cli("--json", "apply", str(f))
    before = snapshot(store)
    out_file = tmp_path / f"export.{fmt}"
    exported = cli("--json", "export", "--format", fmt, "--output", str(out_file))
    assert exported.code == 0 and exported.json["count"] == 6, exported
    text = out_file.read_text()
    doc = tomllib.loads(text) if fmt == "toml" else json.loads(text)
    by_name = {j["name"]: j for j in doc["jobs"]}
    assert by_name["grandchild"]["parent_id"] == "child"  # parents by name, not id
    assert "run_timeout_ms" not in by_name["tick"] and "id" not in by_name["tick"]  # only non-default spec fields
    again = cli("--json", "apply", str(out_file))
    assert again.json["summary"] == {"create": 0, "update": 0, "unchanged": 6, "prune": 0}, again
    assert snapshot(store) == before
    # Into an empty database the export recreates the same jobs, chain links included.
    other = tmp_path / "other.db"
    assert cli("--json", "apply", str(out_file), db=str(other)).code == 0
    redo = cli("--json", "export", "--format", fmt, db=str(other))
    assert redo.json["document"] == doc


def test_handoff_v4_jobs_export_as_json_and_toml_refuses_them(cli: Any, store: Any, tmp_path: Path) -> None:
    spec = {"name": "nightly", "schedule_kind": "manual", "executor": "testkit", "payload_message": "echo:v4",
            "run_timeout_ms": 30000}
    compiled = cli("--json", "handoff", "compile", json.dumps(spec), "--job-id", "job-v4-1", "--workflow", "wf", "--task", "t1")
    assert compiled.code == 0, compiled
    f = tmp_path / "v4.json"
    f.write_text(json.dumps({"jobs": [compiled.json["job"], TICK]}))
    created = cli("--json", "apply", str(f))
    assert created.code == 0, created
    job = cli("--json", "jobs", "get", "nightly").json["job"]
    assert job["id"] == "job-v4-1" and job["handoff_version"] == 4
    before = snapshot(store)
    exported = cli("--json", "export", "--format", "json", "--output", str(tmp_path / "out.json"))
    assert exported.code == 0, exported
    assert cli("--json", "apply", str(tmp_path / "out.json")).json["summary"]["unchanged"] == 2
    assert snapshot(store) == before
    toml = cli("--json", "export", "--format", "toml")
    assert toml.code != 0 and toml.json["code"] == "EXPORT_UNREPRESENTABLE", toml
    assert {d["job"] for d in toml.json["details"]} == {"nightly"}
    # A bound field changed in the file without a new artifact: refused by the ordinary update rule, nothing stored.
    doc = json.loads((tmp_path / "out.json").read_text())
    for j in doc["jobs"]:
        if j["name"] == "nightly":
            j["payload_message"] = "echo:changed"
    (tmp_path / "out.json").write_text(json.dumps(doc))
    refused = cli("--json", "apply", str(tmp_path / "out.json"))
    assert refused.code != 0 and refused.json["code"] == "VALIDATION_FAILED", refused
    assert refused.json["details"][0]["job"] == "nightly" and refused.json["details"][0]["code"].startswith("HANDOFF_ARTIFACT_")
    assert snapshot(store) == before


def test_apply_and_export_as_subprocesses(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    f = write_toml(tmp_path / "jobs.toml", [PARENT, CHILD])
    run = [sys.executable, "-m", "scheduler", "--db", str(db)]
    out = subprocess.run([*run, "apply", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "created 2" in out.stdout
    exported = subprocess.run([*run, "export"], capture_output=True, text=True, timeout=60)
    assert exported.returncode == 0 and tomllib.loads(exported.stdout)["jobs"][0]["name"] == "child"
