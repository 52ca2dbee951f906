"""Issue 32, section 2: stumbles a new user met in the CLI, each through the real CLI (SQLite and PostgreSQL).

1. ``apply`` refuses a new one-shot in the past without ``allow_past_at`` (``AT_IN_PAST``, as ``jobs add``),
   and a finished one-shot exported and applied on a new host is marked ``done`` and never runs again.
3. ``--json`` job objects carry their JSON columns (``executor_options``, ``constraints``, ...) as objects.
11. ``schedule_kind`` is inferred from the one schedule field given; two of them are ``SCHEDULE_KIND_AMBIGUOUS``.
12. Human-mode ``apply`` errors name the job and the file.
14. ``jobs delete`` asks for confirmation on a terminal (``--yes`` skips it; no terminal, no question).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from kernel_testing import TERMINAL, run_rows, wait_for

from scheduler.core.spec import SPEC_FIELD_NAMES

PAST = "2020-01-01T00:00:00Z"
FUTURE = "2031-05-01T10:00:00.000Z"  # as the CLI prints instants
ONCE = {"name": "once", "schedule_kind": "at", "schedule_at": PAST, "payload_message": "true"}


def write_toml(path: Path, jobs: list[dict[str, Any]]) -> Path:
    path.write_text(tomli_w.dumps({"jobs": jobs}))
    return path


def job_names(store: Any) -> list[str]:
    with store.read() as tx:
        return [r["name"] for r in tx.all("SELECT name FROM jobs ORDER BY name")]


# --------------------------------------------------------------------------- 3. JSON columns as objects


def test_json_job_objects_carry_objects_not_json_text(cli: Any, store: Any) -> None:
    spec = {"name": "obj", "schedule_kind": "manual", "payload_message": "true",
            "executor_options": {"env_policy": "inherit"}, "retention": {"keep_runs": 3},
            "delivery_mode": "on_failure", "delivery_channel": "webhook", "delivery_to": "http://127.0.0.1:9/x"}
    added = cli("--json", "jobs", "add", json.dumps(spec))
    assert added.code == 0, added
    views = [added.json["job"], cli("--json", "jobs", "get", "obj").json["job"],
             cli("--json", "jobs", "list").json["jobs"][0]]
    for view in views:
        assert view["executor_options"] == {"env_policy": "inherit"}
        assert view["constraints"] == {} and view["delivery_options"] == {} and view["credentials"] == []
        assert view["retention"] == {"keep_runs": 3} and view["evidence"] is None
    # A job object read back is a spec jobs add takes (the spec fields of it), and stores the same job.
    copy = {k: v for k, v in views[1].items() if k in SPEC_FIELD_NAMES and v is not None}
    again = cli("--json", "jobs", "add", json.dumps({**copy, "name": "obj2"}))
    assert again.code == 0, again
    second = cli("--json", "jobs", "get", "obj2").json["job"]
    assert {k: v for k, v in second.items() if k in SPEC_FIELD_NAMES and k != "name"} == \
        {k: v for k, v in views[1].items() if k in SPEC_FIELD_NAMES and k != "name"}
    human = cli("jobs", "get", "obj")
    assert '{"env_policy": "inherit"}' in human.out, human  # the human view prints JSON, not a Python repr


# --------------------------------------------------------------------------- 11. schedule_kind inferred


@pytest.mark.parametrize(("field", "value", "kind"), [("schedule_every", "5m", "every"), ("schedule_cron", "0 3 * * *", "cron"),
                                                      ("schedule_at", FUTURE, "at")])
def test_schedule_kind_is_inferred_from_the_one_schedule_field(cli: Any, field: str, value: str, kind: str) -> None:
    out = cli("--json", "jobs", "add", json.dumps({"name": "j", field: value, "payload_message": "true"}))
    assert out.code == 0, out
    assert out.json["job"]["schedule_kind"] == kind and out.json["job"][field] == value


def test_two_schedule_fields_without_a_kind_are_ambiguous(cli: Any, store: Any, tmp_path: Path) -> None:
    out = cli("--json", "jobs", "add", json.dumps({"name": "j", "schedule_every": "5m", "schedule_cron": "0 3 * * *",
                                                   "payload_message": "true"}))
    assert out.code != 0 and out.json["code"] == "VALIDATION_FAILED", out
    assert [(d["field"], d["code"]) for d in out.json["details"]] == [("schedule_kind", "SCHEDULE_KIND_AMBIGUOUS")]
    assert "schedule_cron" in out.json["details"][0]["error"] and "schedule_every" in out.json["details"][0]["error"]
    none = cli("--json", "jobs", "add", json.dumps({"name": "j", "payload_message": "true"}))
    assert [(d["field"], d["code"]) for d in none.json["details"]] == [("schedule_kind", "REQUIRED")]
    f = write_toml(tmp_path / "jobs.toml", [{"name": "t", "schedule_every": "90s", "payload_message": "date"}])
    assert cli("--json", "apply", str(f)).code == 0  # a job file may leave it out too
    assert cli("--json", "apply", str(f)).json["summary"]["unchanged"] == 1
    assert job_names(store) == ["t"]
