"""Issue 30 defect 9: inputs that were accepted and should be refused, each with a stable code and nothing stored.

``delivery_to`` the channel cannot send to (``file:///etc/passwd``, ``javascript:alert(1)`` for the
webhook channel), a URL carrying a password (``http://user:pass@host/x``: a secret at rest in the job
and the outbox), duplicate JSON keys (the last one silently won), ``schedule_every: "1s1s"`` (a 2 s
interval), a ``working_dir`` that does not exist or is relative, an empty ``verify_shell``, an
``env_allow`` naming a dynamic-loader variable, and ``backup`` into ``/proc`` (was INTERNAL_ERROR).
Each is refused through the real CLI by ``jobs add`` and ``jobs validate`` (and ``apply``), and
``jobs list`` shows nothing stored afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, scheduler_cmd, wait_for

from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store

MANUAL = {"schedule_kind": "manual", "payload_message": "echo hi"}


def _spec(**fields: Any) -> dict[str, Any]:
    return {"name": "job", **MANUAL, **fields}


def _codes(doc: dict[str, Any]) -> set[str]:
    return {d["code"] for d in doc.get("details") or []}


def _refused_everywhere(cli: Any, tmp_path: Path, text: str, code: str, field: str | None = None) -> dict[str, Any]:
    """``jobs add``, ``jobs validate`` and ``apply`` each refuse the spec text with ``code``; no job is stored."""
    docs = []
    baseline = cli("--json", "jobs", "add", json.dumps({"name": "baseline", **MANUAL}))
    assert baseline.code == 0, baseline
    added = cli("--json", "jobs", "add", text)
    validated = cli("--json", "jobs", "validate", text)
    path = tmp_path / "jobs.json"
    path.write_text(text if text.lstrip().startswith("[") else f"[{text}]")
    applied = cli("--json", "apply", str(path))
    from_file = cli("--json", "jobs", "add", "--file", str(path))
    for res in (added, validated, applied, from_file):
        assert res.code != 0, res
        doc = res.json
        assert doc["ok"] is False, doc
        assert code == doc["code"] or code in _codes(doc), doc
        if field is not None and code in _codes(doc):
            assert any(d["field"] == field for d in doc["details"] if d["code"] == code), doc
        docs.append(doc)
    listed = cli("--json", "jobs", "list")
    assert listed.code == 0, listed
    assert [j["name"] for j in listed.json["jobs"]] == ["baseline"], listed.json
    return docs[0]


WEBHOOK = {"delivery_mode": "always", "delivery_channel": "webhook"}


@pytest.mark.parametrize("target", ["file:///etc/passwd", "javascript:alert(1)", "ftp://example.com/x", "not a url"])
def test_a_webhook_target_the_channel_cannot_send_to_is_refused_at_add(cli: Any, tmp_path: Path, target: str) -> None:
    _refused_everywhere(cli, tmp_path, json.dumps(_spec(**WEBHOOK, delivery_to=target)), "DELIVERY_TARGET_INVALID",
                        "delivery_to")


def test_a_good_webhook_target_is_still_accepted(cli: Any) -> None:
    added = cli("--json", "jobs", "add", json.dumps(_spec(**WEBHOOK, delivery_to="https://hooks.example.com/x")))
    assert added.code == 0, added


@pytest.mark.parametrize("fields", [
    {**WEBHOOK, "delivery_to": "http://user:pass@host/x"},
    {**WEBHOOK, "delivery_to": "https://token@host/x"},
    {"job_type": "watchdog", "watchdog_alert_channel": "webhook", "watchdog_alert_to": "https://u:p@host/alert"},
])
def test_a_url_with_credentials_is_refused_and_never_stored(cli: Any, tmp_path: Path, fields: dict[str, Any]) -> None:
    doc = _refused_everywhere(cli, tmp_path, json.dumps(_spec(**fields)), "URL_CREDENTIALS_REFUSED")
    text = json.dumps(doc)
    assert "pass@" not in text and "p@host" not in text and "token@" not in text, doc  # the secret is not echoed
    assert "credential" in text.lower()


def test_a_url_option_with_credentials_is_refused(cli: Any, tmp_path: Path) -> None:
    fields = {**WEBHOOK, "delivery_to": "https://host/x",
              "delivery_options": {"headers": {"X-Link": "https://admin:hunter2@intranet/x"}}}
    doc = _refused_everywhere(cli, tmp_path, json.dumps(_spec(**fields)), "URL_CREDENTIALS_REFUSED",
                              "delivery_options.headers.X-Link")
    assert "hunter2" not in json.dumps(doc)


def test_duplicate_json_keys_are_refused(cli: Any, tmp_path: Path) -> None:
    text = '{"name": "job", "schedule_kind": "manual", "payload_message": "echo a", "payload_message": "rm -rf x"}'
    doc = _refused_everywhere(cli, tmp_path, text, "DUPLICATE_KEY")
    assert "payload_message" in doc["error"], doc


def test_duplicate_keys_nested_are_refused(cli: Any, tmp_path: Path) -> None:
    text = json.dumps(_spec())[:-1] + ', "executor_options": {"env_policy": "minimal", "env_policy": "inherit"}}'
    doc = _refused_everywhere(cli, tmp_path, text, "DUPLICATE_KEY")
    assert "env_policy" in doc["error"], doc


@pytest.mark.parametrize("every", ["1s1s", "1m30s1m", "5m5m"])
def test_a_duration_repeating_a_unit_is_refused(cli: Any, tmp_path: Path, every: str) -> None:
    fields = {"name": "job", "payload_message": "echo hi", "schedule_every": every}
    _refused_everywhere(cli, tmp_path, json.dumps(fields), "INVALID_DURATION", "schedule_every")


def test_the_duration_parser_refuses_a_repeated_unit_and_keeps_ordered_ones() -> None:
    from scheduler.base.errors import SchedulerError
    from scheduler.base.timeutil import parse_duration_ms

    assert parse_duration_ms("1h30m") == 5_400_000
    assert parse_duration_ms("1d2h3m4s5ms") == 93_784_005
    for bad in ("1s1s", "30s1m", "1ms1s"):
        with pytest.raises(SchedulerError) as info:
            parse_duration_ms(bad)
        assert info.value.code == "INVALID_DURATION", bad


@pytest.mark.parametrize("working_dir", ["/nonexistent/dir", "../../../../etc", "relative/dir"])
def test_a_working_dir_that_is_not_an_absolute_existing_directory_is_refused(cli: Any, tmp_path: Path, working_dir: str) -> None:
    fields = _spec(executor_options={"working_dir": working_dir})
    _refused_everywhere(cli, tmp_path, json.dumps(fields), "WORKING_DIR_INVALID", "executor_options.working_dir")


def test_a_working_dir_that_is_a_file_is_refused(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    fields = _spec(executor_options={"working_dir": str(tmp_path / "f")})
    _refused_everywhere(cli, tmp_path, json.dumps(fields), "WORKING_DIR_INVALID", "executor_options.working_dir")


def test_an_existing_working_dir_and_home_relative_one_are_accepted(cli: Any, tmp_path: Path) -> None:
    assert cli("--json", "jobs", "add", json.dumps(_spec(executor_options={"working_dir": str(tmp_path)}))).code == 0
    assert cli("--json", "jobs", "add", json.dumps(_spec(name="home", executor_options={"working_dir": "~"}))).code == 0


@pytest.mark.parametrize("verify", ["", "   ", "\n\t"])
def test_an_empty_verify_shell_is_refused(cli: Any, tmp_path: Path, verify: str) -> None:
    _refused_everywhere(cli, tmp_path, json.dumps(_spec(verify_shell=verify)), "REQUIRED", "verify_shell")


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "ld_preload", "DYLD_INSERT_LIBRARIES",
                                  "GCONV_PATH"])
def test_env_allow_refuses_dynamic_loader_variables(cli: Any, tmp_path: Path, name: str) -> None:
    fields = _spec(executor_options={"env_allow": ["HOME", name]})
    _refused_everywhere(cli, tmp_path, json.dumps(fields), "ENV_NAME_RESERVED", "executor_options.env_allow")


def test_the_loader_variable_list_is_the_one_credentials_reserve() -> None:
    from scheduler.core.processes import is_loader_variable
    from scheduler.pipeline.credentials.bindings import reserved_key_reason

    for name in ("LD_PRELOAD", "LD_AUDIT", "DYLD_LIBRARY_PATH", "GCONV_PATH"):
        assert is_loader_variable(name)
        assert reserved_key_reason(name) is not None
    assert not is_loader_variable("HOME")


def test_backup_into_proc_is_a_structured_error(cli: Any, store_url: str) -> None:
    if store_url.startswith("postgres"):
        pytest.skip("backup copies SQLite files; PostgreSQL points to pg_dump")
    cli("--json", "jobs", "add", json.dumps(_spec()))
    res = cli("--json", "backup", "/proc/x")
    assert res.code != 0, res
    assert res.json["code"] == "BACKUP_TARGET_INVALID", res.json


@pytest.mark.parametrize(("channel", "target"), [
    ("email", "not an address"), ("email", "a@example.com, javascript:alert(1)"),
    ("telegram", "file:///etc/passwd"), ("telegram", "12ab"),
    ("slack", "javascript:alert(1)"),
])
def test_every_channel_judges_its_delivery_to_at_add(cli: Any, tmp_path: Path, channel: str, target: str) -> None:
    fields = _spec(delivery_mode="always", delivery_channel=channel, delivery_to=target)
    _refused_everywhere(cli, tmp_path, json.dumps(fields), "DELIVERY_TARGET_INVALID", "delivery_to")


@pytest.mark.parametrize(("channel", "target"), [
    ("email", "ops@example.com, Ana <ana@example.com>"), ("telegram", "-1001234567890"), ("telegram", "@mychannel"),
    ("slack", "C0123456789"),
])
def test_good_channel_targets_are_still_accepted(cli: Any, channel: str, target: str) -> None:
    fields = _spec(delivery_mode="always", delivery_channel=channel, delivery_to=target)
    added = cli("--json", "jobs", "add", json.dumps(fields))
    assert added.code == 0, added


@pytest.mark.parametrize(("patch", "code"), [
    ('{"delivery_to": "javascript:alert(1)"}', "DELIVERY_TARGET_INVALID"),
    ('{"delivery_to": "https://u:hunter2@host/x"}', "URL_CREDENTIALS_REFUSED"),
    ('{"delivery_to": "https://a/x", "delivery_to": "https://b/x"}', "DUPLICATE_KEY"),
    ('{"verify_shell": " "}', "REQUIRED"),
    ('{"executor_options": {"env_allow": ["LD_AUDIT"]}}', "ENV_NAME_RESERVED"),
    ('{"executor_options": {"working_dir": "../../../../etc"}}', "WORKING_DIR_INVALID"),
])
def test_jobs_update_refuses_the_same_and_leaves_the_job_as_it_was(cli: Any, patch: str, code: str) -> None:
    added = cli("--json", "jobs", "add", json.dumps(_spec(**WEBHOOK, delivery_to="https://hooks.example.com/x")))
    assert added.code == 0, added
    before = cli("--json", "jobs", "get", "job").json
    res = cli("--json", "jobs", "update", "job", patch)
    assert res.code != 0, res
    assert code == res.json["code"] or code in _codes(res.json), res.json
    assert "hunter2" not in res.out
    assert cli("--json", "jobs", "get", "job").json == before


def test_a_watchdog_alert_target_its_channel_cannot_send_to_is_refused(cli: Any, tmp_path: Path) -> None:
    fields = _spec(job_type="watchdog", watchdog_alert_channel="webhook", watchdog_alert_to="file:///etc/passwd")
    _refused_everywhere(cli, tmp_path, json.dumps(fields), "DELIVERY_TARGET_INVALID", "watchdog_alert_to")
    good = _spec(name="dog", job_type="watchdog", watchdog_alert_channel="webhook", watchdog_alert_to="https://h/x")
    assert cli("--json", "jobs", "add", json.dumps(good)).code == 0


@pytest.fixture
def routes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``routes(*r)``: a settings file with these ``[notifications] routes``, read again at once (and forgotten after)."""
    from scheduler.settings import reload_settings

    def write(*routes: str) -> None:
        config = tmp_path / "settings.toml"
        config.write_text("[notifications]\nroutes = [" + ", ".join(json.dumps(r) for r in routes) + "]\n")
        monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
        reload_settings()

    yield write
    monkeypatch.delenv("SCHEDULER_CONFIG")
    reload_settings()


@pytest.mark.parametrize(("route", "code"), [
    ("webhook:file:///etc/passwd", "DELIVERY_TARGET_INVALID"), ("webhook:javascript:alert(1)", "DELIVERY_TARGET_INVALID"),
    ("telegram:12ab", "DELIVERY_TARGET_INVALID"), ("email:not an address", "DELIVERY_TARGET_INVALID"),
    ("webhook:https://ops:hunter2@hooks.example.com/x", "URL_CREDENTIALS_REFUSED"),
])
def test_a_notification_route_its_channel_cannot_send_to_is_refused_before_anything_runs(cli: Any, routes: Any, route: str,
                                                                                        code: str) -> None:
    """The settings file's routes are judged like delivery_to: ``scheduler run`` does not start, ``config --check`` and
    ``doctor`` fail, and nothing is stored (no lease taken, no run, no outbox row)."""
    cli("--json", "jobs", "add", json.dumps(_spec(schedule_kind="every", schedule_every="1s", schedule_at=None)))
    routes("webhook:https://hooks.example.com/ok", route)
    ran = cli("--json", "run", "--duration", "2s")
    assert ran.code != 0 and ran.json["code"] == code, ran
    assert ran.json["details"][0]["field"] == "notifications.routes[1]" and "hunter2" not in ran.out + ran.err
    checked = cli("--json", "config", "--check")
    assert checked.code != 0 and checked.json["code"] == "CONFIG_INVALID", checked
    assert [(d["key"], d["code"]) for d in checked.json["details"]] == [("notifications.routes[1]", code)]
    doctor = cli("--json", "doctor")
    assert doctor.code != 0 and "notification_routes" in doctor.json["error"], doctor
    assert "hunter2" not in checked.out + doctor.out
    status = cli("--json", "status").json["status"]
    assert status["runs"] == {} and status["outbox"] == {} and not [lease for lease in status["leases"] if lease["live"]]


def test_good_notification_routes_are_accepted(cli: Any, routes: Any) -> None:
    routes("webhook:https://hooks.example.com/ok", "telegram:@mychannel", "email:ops@example.com", "webhook")
    assert cli("--json", "config", "--check").code == 0
    doctor = cli("--json", "doctor").json
    [check] = [c for c in doctor.get("checks") or doctor["details"] if c["check"] == "notification_routes"]
    assert check["ok"] and check["problems"] == []


def test_a_reload_that_brings_a_bad_route_is_refused_and_the_previous_routes_stay(tmp_path: Path) -> None:
    """SIGHUP to a real ``scheduler run``: new settings whose route the channel refuses are not installed."""
    db, cfg, log = tmp_path / "s.db", tmp_path / "settings.toml", tmp_path / "run.log"
    cfg.write_text('[notifications]\nroutes = ["webhook:http://127.0.0.1:9/old"]\n')
    store = open_store(str(db))
    job = add_job(store, executor="shell", name="fails", payload_message="exit 3", max_retries=0)
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*scheduler_cmd(), "--db", str(db), "run", "--grace", "1s"], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "SCHEDULER_CONFIG": str(cfg)})
    try:
        wait_for(lambda: "holds lease" in log.read_text(), timeout=30, what="dispatcher ready")
        cfg.write_text('[notifications]\nroutes = ["webhook:file:///etc/passwd"]\n')
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "settings reload failed (DELIVERY_TARGET_INVALID), keeping the previous settings" in log.read_text(),
                 timeout=20, what="refused reload")
        enqueue_manual(store, job["id"])

        def targets() -> list[str]:
            with store.read() as tx:
                return [r["target"] for r in tx.all("SELECT target FROM delivery_outbox WHERE job_id = ?", (job["id"],))]

        assert wait_for(targets, timeout=30, what="the failure's notification") == ["http://127.0.0.1:9/old"]
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        store.close()


def test_an_openclaw_jobs_file_naming_a_key_twice_is_refused(cli: Any, tmp_path: Path) -> None:
    """``import openclaw --legacy-json`` parses its file as strictly as ``jobs add`` parses a spec (nothing imported)."""
    legacy = tmp_path / "jobs.json"
    legacy.write_text('{"jobs": [{"id": "a", "name": "x", "schedule": {"kind": "every", "everyMs": 60000},'
                      ' "payload": {"kind": "agentTurn", "message": "hi"}, "payload": {"kind": "agentTurn", "message": "rm"}}]}')
    res = cli("--json", "import", "openclaw", "--legacy-json", str(legacy))
    assert res.code != 0 and res.json["code"] == "DUPLICATE_KEY" and "payload" in res.json["error"], res
    assert [j["name"] for j in cli("--json", "jobs", "list").json["jobs"]] == []
    legacy.write_text("{not json")
    assert cli("--json", "import", "openclaw", "--legacy-json", str(legacy)).json["code"] == "IMPORT_SOURCE_INVALID"
