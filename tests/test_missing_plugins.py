"""Issue 8, "one rule for missing plugins": a job naming a plugin that is not installed is refused.

``jobs add``, ``jobs update``, ``jobs validate`` and ``jobs add --dry-run`` refuse a spec whose
executor (written, or implied by ``session_target``), delivery channel or watchdog alert channel
is not installed, with ``<KIND>_NOT_AVAILABLE``, unless ``--allow-missing-plugins``. Presence is
read from package metadata: no plugin is imported to check it. Real ``scheduler`` processes
with side-loaded distributions (a ``*.dist-info`` on ``PYTHONPATH``), as a user would install them.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest
from kernel_testing import scheduler_cmd

MANUAL = {"schedule_kind": "manual", "payload_message": "echo hi"}


def spec(name: str = "job", **fields: Any) -> str:
    return json.dumps({"name": name, **MANUAL, **fields})


def sub(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real ``scheduler --json ARGS`` in a subprocess, with plugin switches cleared unless given."""
    full = {**os.environ, "SCHEDULER_DISABLE_PLUGINS": "", "SCHEDULER_STRICT_PLUGINS": "", **(env or {})}
    full.pop("SCHEDULER_DEBUG", None)
    return subprocess.run([*scheduler_cmd(), "--json", *args], capture_output=True, text=True, env=full, timeout=60)


def ok(res: subprocess.CompletedProcess) -> dict[str, Any]:
    assert res.returncode == 0 and "Traceback" not in res.stderr, (res.stdout, res.stderr[-2000:])
    return json.loads(res.stdout)


def refused(res: subprocess.CompletedProcess, code: str) -> dict[str, Any]:
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert (res.returncode, doc["ok"], doc["code"]) == (1, False, code), doc
    return doc


def jobs_in(db: Path) -> list[str]:
    return [j["name"] for j in ok(sub("--db", str(db), "jobs", "list"))["jobs"]]


# --- add ------------------------------------------------------------------------------------------------------------


#: Every target's default executor is installed here; a host without one is a host where it is switched off.
WITHOUT_MAIN_SESSION = {"SCHEDULER_DISABLE_PLUGINS": "main-session"}


@pytest.mark.parametrize("fields, code, field, reason, env", [
    ({"executor": "nosuch"}, "EXECUTOR_NOT_AVAILABLE", "executor", "not installed", None),
    ({"session_target": "main"}, "EXECUTOR_NOT_AVAILABLE", "executor", "disabled", WITHOUT_MAIN_SESSION),  # implied executor
    ({"delivery_mode": "always", "delivery_channel": "nosuch-chat", "delivery_to": "#ops"}, "CHANNEL_NOT_AVAILABLE",
     "delivery_channel", "not installed", None),
    ({"job_type": "watchdog", "watchdog_alert_channel": "nosuch-pager"}, "CHANNEL_NOT_AVAILABLE", "watchdog_alert_channel",
     "not installed", None),
], ids=["executor", "implied-executor", "delivery-channel", "watchdog-channel"])
def test_add_refuses_a_plugin_that_is_not_installed_and_stores_nothing(fields: dict[str, Any], code: str, field: str, reason: str,
                                                                       env: dict[str, str] | None, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    doc = refused(sub("--db", str(db), "jobs", "add", spec("needs-plugin", **fields), env=env), code)
    assert [(d["field"], d["code"], d["reason"]) for d in doc["details"]] == [(field, code, reason)]
    assert "--allow-missing-plugins" in doc["error"]
    assert not db.exists()  # refused before the database is opened
    stored = ok(sub("--db", str(db), "jobs", "add", "--allow-missing-plugins", spec("needs-plugin", **fields), env=env))["job"]
    assert stored["name"] == "needs-plugin" and jobs_in(db) == ["needs-plugin"]


def test_an_implied_executor_says_where_its_name_comes_from() -> None:
    doc = refused(sub("jobs", "validate", spec(session_target="main"), env=WITHOUT_MAIN_SESSION), "EXECUTOR_NOT_AVAILABLE")
    assert "'main-session'" in doc["error"] and "session_target=main" in doc["error"]


def test_every_missing_plugin_is_listed_and_arrays_say_which_item(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    array = json.dumps([
        {"name": "fine", **MANUAL},
        {"name": "two-missing", **MANUAL, "executor": "nosuch", "delivery_mode": "on_failure", "delivery_channel": "nosuch-chat"},
        {"name": "one-missing", **MANUAL, "delivery_mode": "always", "delivery_channel": "nosuch-chat"},
    ])
    doc = refused(sub("--db", str(db), "jobs", "add", array), "EXECUTOR_NOT_AVAILABLE")  # the first one's code
    assert [(d["index"], d["field"], d["code"]) for d in doc["details"]] == [
        (1, "executor", "EXECUTOR_NOT_AVAILABLE"), (1, "delivery_channel", "CHANNEL_NOT_AVAILABLE"),
        (2, "delivery_channel", "CHANNEL_NOT_AVAILABLE"),
    ]
    assert not db.exists()  # all or nothing


def test_validate_and_dry_run_apply_the_same_rule_without_a_database(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    bad = spec(executor="nosuch")
    for args in (["jobs", "validate", bad], ["jobs", "add", "--dry-run", bad]):
        refused(sub("--db", str(db), *args), "EXECUTOR_NOT_AVAILABLE")
        assert ok(sub("--db", str(db), *args[:-1], "--allow-missing-plugins", bad))["job"]["executor"] == "nosuch"
    assert not db.exists()


def test_a_disabled_plugin_counts_as_missing(tmp_path: Path) -> None:
    off = {"SCHEDULER_DISABLE_PLUGINS": "executors:testkit"}
    doc = refused(sub("jobs", "validate", spec(executor="testkit"), env=off), "EXECUTOR_NOT_AVAILABLE")
    assert doc["details"][0]["reason"] == "disabled" and "SCHEDULER_DISABLE_PLUGINS" in doc["error"]
    assert ok(sub("jobs", "validate", spec(executor="testkit")))["valid"] is True


def test_the_demo_jobs_still_add(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    db = tmp_path / "demo.db"
    added = ok(sub("--db", str(db), "jobs", "add", "--file", str(root / "examples" / "demo-jobs.json")))["jobs"]
    assert len(added) == len(json.loads((root / "examples" / "demo-jobs.json").read_text()))


# --- presence is read from metadata, nothing is imported --------------------------------------------------------------


def _side_loaded_channel(tmp_path: Path, name: str) -> tuple[dict[str, str], Path]:
    """A channel distribution whose module records that it was imported; returns the env and the marker path."""
    from kernel_testing import sideload_distribution

    tag = uuid.uuid4().hex[:8]
    project = tmp_path / f"scheduler-channel-{name}"
    (project / f"chan_{tag}").mkdir(parents=True)
    marker = tmp_path / "imported"
    (project / "pyproject.toml").write_text(textwrap.dedent(f"""
        [project]
        name = "scheduler-channel-{name}"
        version = "0.1.0"

        [project.entry-points."scheduler.channels"]
        {name} = "chan_{tag}:Channel"
    """))
    (project / f"chan_{tag}" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('not needed to check presence')\n")
    paths = sideload_distribution(project, tmp_path / "site")
    return {"PYTHONPATH": os.pathsep.join(paths)}, marker


def test_an_installed_plugin_is_accepted(tmp_path: Path) -> None:
    env, _marker = _side_loaded_channel(tmp_path, "pager")
    job = spec(delivery_mode="always", delivery_channel="pager", delivery_to="ops")
    refused(sub("jobs", "validate", job), "CHANNEL_NOT_AVAILABLE")  # not on the path: missing
    assert ok(sub("jobs", "validate", job, env=env))["valid"] is True  # installed: accepted
    assert ok(sub("--db", str(tmp_path / "s.db"), "jobs", "add", job, env=env))["job"]["delivery_channel"] == "pager"


def test_the_presence_check_imports_no_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Presence comes from the metadata: a plugin that would fail to import still counts as installed
    (whether it loads is ``doctor``'s business and the run's), and checking it imports nothing."""
    from scheduler.core.spec import validate_spec
    from scheduler.plugins.refs import missing_plugins, plugin_refs

    env, marker = _side_loaded_channel(tmp_path, "pager")
    for entry in reversed(env["PYTHONPATH"].split(os.pathsep)):
        monkeypatch.syspath_prepend(entry)
    job = attrs.evolve(validate_spec(json.loads(spec())), delivery_mode="always", delivery_channel="pager")
    assert [r.name for r in plugin_refs(job)] == ["shell", "pager"]
    assert missing_plugins(plugin_refs(job)) == []
    assert not marker.exists()


# --- update ---------------------------------------------------------------------------------------------------------


def test_update_refuses_naming_a_missing_plugin_and_changes_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    ok(sub("--db", db, "jobs", "add", spec("upd", executor="testkit")))
    before = ok(sub("--db", db, "jobs", "get", "upd"))["job"]
    refused(sub("--db", db, "jobs", "update", "upd", '{"executor": "nosuch"}'), "EXECUTOR_NOT_AVAILABLE")
    refused(sub("--db", db, "jobs", "update", "upd", '{"session_target": "main", "executor": null}', env=WITHOUT_MAIN_SESSION),
            "EXECUTOR_NOT_AVAILABLE")
    refused(sub("--db", db, "jobs", "update", "upd", '{"delivery_mode": "always", "delivery_channel": "nosuch-chat"}'),
            "CHANNEL_NOT_AVAILABLE")
    assert ok(sub("--db", db, "jobs", "get", "upd"))["job"] == before
    changed = ok(sub("--db", db, "jobs", "update", "upd", "--allow-missing-plugins", '{"executor": "nosuch"}'))["job"]
    assert changed["executor"] == "nosuch"


def test_update_does_not_recheck_a_plugin_it_leaves_alone(tmp_path: Path) -> None:
    """A job stored with --allow-missing-plugins (prepared for another host) can still be edited."""
    db = str(tmp_path / "s.db")
    ok(sub("--db", db, "jobs", "add", "--allow-missing-plugins",
           spec("elsewhere", executor="nosuch", delivery_mode="always", delivery_channel="nosuch-chat")))
    assert ok(sub("--db", db, "jobs", "update", "elsewhere", '{"description": "runs on the GPU host"}'))["job"]["description"]
    doc = refused(sub("--db", db, "jobs", "update", "elsewhere", '{"delivery_channel": "other-chat"}'), "CHANNEL_NOT_AVAILABLE")
    assert [d["field"] for d in doc["details"]] == ["delivery_channel"]  # the untouched executor is not reported


# --- the rule itself --------------------------------------------------------------------------------------------------


def test_each_plugin_kind_has_a_registered_not_available_code() -> None:
    from scheduler.base.errors import ErrorCode
    from scheduler.plugins.protocols import PROVIDER_KINDS
    from scheduler.plugins.refs import PluginRef

    for kind, (group, _protocol) in PROVIDER_KINDS.items():
        ref = PluginRef(kind, "x", "f")
        assert ErrorCode(ref.code).value == f"{kind.upper()}_NOT_AVAILABLE" and ref.group == group


def test_a_new_kind_of_reference_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Later fields (evidence, credentials, authorization) plug into the same rule."""
    import scheduler.plugins.refs as refs
    from scheduler.base.errors import SchedulerError
    from scheduler.core.spec import validate_spec

    job = validate_spec(json.loads(spec()))
    monkeypatch.setattr(refs, "SPEC_REFERENCES", (*refs.SPEC_REFERENCES, lambda s: [refs.PluginRef("evidence", "nosuch-sig", "evidence.provider")]))
    with pytest.raises(SchedulerError) as info:
        refs.require_plugins([job])
    assert info.value.code == "EVIDENCE_NOT_AVAILABLE" and info.value.details[0]["field"] == "evidence.provider"


def test_schedule_add_follows_the_missing_plugin_rule(tmp_path, monkeypatch) -> None:
    """`schedule add --target main` needs the `main-session` executor like `jobs add` does."""
    import json as _json

    from scheduler.testing import run_cli

    monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", "main-session")
    db = str(tmp_path / "s.db")
    code, out, _ = run_cli("--json", "schedule", "add", "0 3 * * *", "summarise", "--target", "main", db=db)
    assert code == 1 and _json.loads(out)["code"] == "EXECUTOR_NOT_AVAILABLE"
    code, out, _ = run_cli("--json", "jobs", "list", db=db)
    assert _json.loads(out)["code"] == "DB_NOT_FOUND"  # the refused add created nothing, not even the database
    code, out, err = run_cli("--json", "schedule", "add", "0 3 * * *", "summarise", "--target", "main",
                             "--allow-missing-plugins", db=db)
    assert code == 0, err
