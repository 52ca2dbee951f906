"""Issue 29: the defects and smaller gaps an end-to-end audit of the seed contracts found.

Each test drives the real ``scheduler`` CLI in a subprocess against a real SQLite file and
failed on the code before its fix.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from kernel_testing import scheduler_cmd

MANUAL = {"schedule_kind": "manual", "payload_message": "echo hi"}


def sub(db: Path, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``scheduler --db DB --json ARGS`` in a real process."""
    full = {**os.environ, **(env or {})}
    full.pop("SCHEDULER_DEBUG", None)
    return subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", *args], input=stdin, capture_output=True, env=full,
                          timeout=120)


def ok(res: subprocess.CompletedProcess) -> dict[str, Any]:
    """The JSON answer of a process that succeeded."""
    assert res.returncode == 0 and b"Traceback" not in res.stderr, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    doc: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    return doc


def refused(res: subprocess.CompletedProcess, code: str, exit_status: int = 1) -> dict[str, Any]:
    """Assert a real process failed with one JSON error object of ``code`` and no traceback."""
    assert b"Traceback" not in res.stderr, res.stderr[-2000:]
    doc: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    assert (res.returncode, doc["ok"], doc["code"]) == (exit_status, False, code), (res.returncode, doc)
    return doc


def spec(name: str = "job", **fields: Any) -> str:
    return json.dumps({"name": name, **MANUAL, **fields})


def job_names(db: Path) -> list[str]:
    return sorted(j["name"] for j in ok(sub(db, "jobs", "list"))["jobs"])


# --- defects 1 and 2: approver scopes that nobody could match, look-alikes ------------------------------------------


def test_defect_1_an_unmatchable_uid_scope_is_refused_at_add_and_update(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    for bad in ("uid:abc", "uid:", "uid:-1", "uid:1x", "group:wheel"):
        doc = refused(sub(db, "jobs", "add", spec(approval_required=True, approval_approver_scope=bad)), "VALIDATION_FAILED")
        assert [(d["field"], d["code"]) for d in doc["details"]] == [("approval_approver_scope", "INVALID_SCOPE")], bad
    ok(sub(db, "jobs", "add", spec("fine", approval_required=True, approval_approver_scope="uid:1001")))
    refused(sub(db, "jobs", "update", "fine", json.dumps({"approval_approver_scope": "uid:abc"})), "VALIDATION_FAILED")
    assert job_names(db) == ["fine"]
    assert ok(sub(db, "jobs", "get", "fine"))["job"]["approval_approver_scope"] == "uid:1001"


def test_defect_2_a_full_width_look_alike_scope_is_refused(tmp_path: Path) -> None:
    """The docs said a full-width spelling was the same principal; refusing it is safer, and the docs now say so."""
    db = tmp_path / "s.db"
    doc = refused(sub(db, "jobs", "add", spec(approval_required=True, approval_approver_scope="ｒｏｏｔ")), "VALIDATION_FAILED")  # noqa: RUF001
    assert [(d["field"], d["code"]) for d in doc["details"]] == [("approval_approver_scope", "INVALID_SCOPE")]
    text = (Path(__file__).parent.parent / "docs" / "approvals.md").read_text()
    assert "is the same principal" not in text and "look-alike" in text


# --- defect 5: a read-only command on a database missing a table ----------------------------------------------------


def test_defect_5_read_only_status_on_a_database_missing_a_table_fails_closed(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ok(sub(db, "jobs", "add", spec()))
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE runtime_events")
    for args in (("status",), ("status", "--check"), ("jobs", "list")):
        doc = refused(sub(db, *args), "DB_INIT_FAILED")
        assert doc["details"]["phase"] == "schema" and "table runtime_events" in doc["details"]["missing"], doc
    with sqlite3.connect(db) as conn:  # the read-only commands repaired nothing
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'runtime_events'").fetchone()[0] == 0
    ok(sub(db, "doctor"))  # a writing open recreates the missing objects
    assert ok(sub(db, "status"))["status"]["jobs"] == {"enabled": 1}


# --- defect 7: the legacy evidence alias ----------------------------------------------------------------------------


def test_defect_7_the_legacy_sha256_provider_alias_is_the_checksum_backend(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    for name, declaration in (("plain", {"provider": "sha256"}), ("methods", {"provider": "sha256", "methods": ["sha256"]})):
        assert ok(sub(db, "jobs", "validate", spec(name, evidence=declaration)))["ok"] is True
        stored = ok(sub(db, "jobs", "add", spec(name, evidence=declaration)))["job"]["evidence"]
        stored = json.loads(stored) if isinstance(stored, str) else stored
        assert stored["provider"] == "checksum" and stored["methods"] == declaration.get("methods", []), stored
    # the alias is only the checksum backend's: a signed provider asking for the checksum method is still refused
    refused(sub(db, "jobs", "add", spec("signed", evidence={"provider": "ssh", "methods": ["sha256"]})), "VALIDATION_FAILED")


def run_once(db: Path, job: str, duration: str = "3s") -> dict[str, Any]:
    """``jobs run JOB`` then a real dispatcher for ``duration``; the job's newest run as ``runs list`` shows it."""
    ok(sub(db, "jobs", "run", job))
    res = subprocess.run([*scheduler_cmd(), "--db", str(db), "run", "--duration", duration], capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = ok(sub(db, "runs", "list", job))["runs"]
    assert runs and runs[0]["status"] == "ok", runs
    return runs[0]


# --- defect 9: a run row deleted by hand is not "pruned" ------------------------------------------------------------


def test_defect_9_evidence_of_a_run_deleted_without_a_tombstone_fails(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ok(sub(db, "jobs", "add", spec("e", evidence={"provider": "checksum"})))
    run = run_once(db, "e")
    assert ok(sub(db, "runs", "evidence", run["id"]))["verified"] is True
    with sqlite3.connect(db) as conn:  # by hand, around every safeguard: no tombstone is written
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("DELETE FROM runs WHERE id = ?", (run["id"],))
    doc = refused(sub(db, "runs", "evidence", run["id"]), "EVIDENCE_RUN_MISSING")
    assert "no tombstone" in doc["error"]
    assert sub(db, "runs", "evidence", "--all").returncode != 0


# --- defects 10 and 14: agent jobs that could only fail every run are refused at add --------------------------------


def _agent(name: str, **fields: Any) -> str:
    return json.dumps({"name": name, "schedule_kind": "manual", "payload_message": "hi", "executor": "agent", **fields})


def test_defect_10_a_heartbeat_symlink_out_of_the_workspace_is_refused_at_add(tmp_path: Path) -> None:
    db, workspace, outside = tmp_path / "s.db", tmp_path / "ws", tmp_path / "private"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.md").write_text("not for the model\n")
    (workspace / "escape.md").symlink_to(outside / "secret.md")
    (workspace / "notes.md").write_text("fine\n")
    (workspace / "inside.md").symlink_to(workspace / "notes.md")
    env = {"SCHEDULER_EXECUTORS_AGENT_WORKSPACE": str(workspace)}
    for command in ("validate", "add"):
        doc = refused(sub(db, "jobs", command, _agent("hb", executor_options={"heartbeat_file": "escape.md", "model": "m"}),
                          env=env), "VALIDATION_FAILED")
        assert [(d["field"], d["code"]) for d in doc["details"]] == [("executor_options.heartbeat_file", "HEARTBEAT_PATH_REFUSED")]
    ok(sub(db, "jobs", "add", _agent("kept", executor_options={"heartbeat_file": "inside.md", "model": "m"}), env=env))
    refused(sub(db, "jobs", "update", "kept", json.dumps({"executor_options": {"heartbeat_file": "escape.md", "model": "m"}}),
                env=env), "VALIDATION_FAILED")
    assert job_names(db) == ["kept"]


def test_defect_14_max_cost_without_a_price_is_refused_at_add(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    capped = _agent("capped", executor_options={"model": "m1"}, constraints={"max_cost": 0.5})
    doc = refused(sub(db, "jobs", "add", capped), "VALIDATION_FAILED")
    assert [(d["field"], d["code"]) for d in doc["details"]] == [("constraints.max_cost", "AGENT_PRICE_UNKNOWN")]
    assert not db.exists() or job_names(db) == []
    priced = {"SCHEDULER_EXECUTORS_AGENT_PRICES": '{"m1" = "0.15/0.60"}'}
    assert ok(sub(db, "jobs", "add", capped, env=priced))["job"]["name"] == "capped"
    ok(sub(db, "jobs", "add", _agent("uncapped", executor_options={"model": "m1"})))  # no cap, no price needed


# --- defect 12: the dispatcher log on a delivery's last attempt ------------------------------------------------------


def test_defect_12_the_last_attempt_of_a_delivery_is_logged_failed_not_retry(tmp_path: Path) -> None:
    from scheduler.testing.http import LoopbackHTTPServer, Reply

    server = LoopbackHTTPServer()
    server.default("/hook", Reply(status=500))  # retryable every time
    config = tmp_path / "scheduler.toml"
    config.write_text('[channels.webhook]\nsecret = {credential = "env:TEST_WEBHOOK_SECRET"}\n'
                      "[delivery]\nretry_base_ms = 50\nretry_max_ms = 100\nmax_attempts = 2\n")
    env = {"SCHEDULER_CONFIG": str(config),
           "TEST_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"fedcba9876543210fedcba9876543210").decode()}
    db = tmp_path / "s.db"
    try:
        ok(sub(db, "jobs", "add", spec("d", delivery_mode="always", delivery_channel="webhook", delivery_to=f"{server.url}/hook"),
               env=env))
        ok(sub(db, "jobs", "run", "d", env=env))
        res = subprocess.run([*scheduler_cmd(), "--db", str(db), "run", "--duration", "4s"], capture_output=True, timeout=120,
                             env={**os.environ, **env})
    finally:
        server.close()
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stdout.decode().splitlines() if " deliver webhook " in ln or ln.startswith("deliver webhook ")]
    assert len(lines) == 2, res.stdout.decode()
    assert ": retry (" in lines[0] and "attempt 1/2" in lines[0], lines
    assert ": failed (" in lines[1] and "attempt 2/2" in lines[1] and ": retry" not in lines[1], lines
    parts = ok(sub(db, "deliveries", "list", env=env))
    assert [p["status"] for p in parts.get("deliveries", parts.get("parts", []))] == ["failed"], parts


# --- defect 13: doctor checks the live lease and pending cancellations ----------------------------------------------


def _check(doc: dict[str, Any], name: str) -> dict[str, Any]:
    checks = doc.get("checks") or doc.get("details")
    (found,) = [c for c in checks if c["check"] == name]
    return found


def test_defect_13_doctor_checks_the_dispatcher_lease_and_pending_cancellations(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ok(sub(db, "jobs", "add", spec()))
    healthy = ok(sub(db, "doctor"))
    assert _check(healthy, "dispatcher_lease")["warning"] is True and "no live dispatcher" in _check(healthy, "dispatcher_lease")["detail"]
    assert _check(healthy, "cancellations")["ok"] is True
    job_id = ok(sub(db, "jobs", "get", "job"))["job"]["id"]
    now = int(time.time() * 1000)
    dead_pid = subprocess.Popen(["true"])  # a pid that no longer runs: this finished child's
    dead_pid.wait()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO runs(id, job_id, status, attempt, created_at, started_at, cancel_requested_at)"
                     " VALUES ('stuck-run', ?, 'running', 1, ?, ?, ?)", (job_id, now - 600_000, now - 600_000, now - 300_000))
        conn.execute("INSERT INTO dispatcher_leases(name, owner, token, acquired_at, renewed_at, expires_at)"
                     " VALUES ('dispatcher', ?, 1, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET owner = excluded.owner,"
                     " token = excluded.token + dispatcher_leases.token, expires_at = excluded.expires_at",
                     (f"{socket.gethostname()}:{dead_pid.pid}:abcd", now, now, now + 600_000))
    doc = refused(sub(db, "doctor"), "UNHEALTHY")
    cancels, lease = _check(doc, "cancellations"), _check(doc, "dispatcher_lease")
    assert cancels["ok"] is False and cancels["runs"] == ["stuck-run"] and "not honoured" in cancels["detail"]
    assert lease["ok"] is True and lease["warning"] is True and f"pid {dead_pid.pid}" in lease["detail"]
    assert "no longer runs" in lease["detail"]


# --- defect 15: job names in the decision answers and deliveries show -----------------------------------------------


def test_defect_15_approve_reject_and_deliveries_show_name_the_job(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    config = tmp_path / "scheduler.toml"
    config.write_text('[channels.webhook]\nsecret = {credential = "env:TEST_WEBHOOK_SECRET"}\n[delivery]\nmax_attempts = 1\n')
    env = {"SCHEDULER_CONFIG": str(config),
           "TEST_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"fedcba9876543210fedcba9876543210").decode()}
    for name in ("gated", "gated2"):
        ok(sub(db, "jobs", "add", spec(name, approval_required=True, delivery_mode="always", delivery_channel="webhook",
                                       delivery_to="http://127.0.0.1:9/hook"), env=env))
        ok(sub(db, "jobs", "run", name, env=env))
    res = subprocess.run([*scheduler_cmd(), "--db", str(db), "run", "--duration", "3s"], capture_output=True, timeout=120,
                         env={**os.environ, **env})
    assert res.returncode == 0, res.stderr[-2000:]
    pending = ok(sub(db, "approvals", "list", env=env))["approvals"]
    by_job = {a["job_name"]: a["id"] for a in pending}
    assert set(by_job) == {"gated", "gated2"}, pending
    approved = ok(sub(db, "approvals", "approve", by_job["gated"], env=env))
    rejected = ok(sub(db, "approvals", "reject", by_job["gated2"], env=env))
    assert approved["approval"]["job_name"] == "gated" and rejected["approval"]["job_name"] == "gated2", (approved, rejected)
    parts = ok(sub(db, "deliveries", "list", env=env))["deliveries"]
    assert parts and parts[0]["job_name"] in ("gated", "gated2"), parts
    assert ok(sub(db, "deliveries", "show", parts[0]["id"], env=env))["delivery"]["job_name"] == parts[0]["job_name"]
    human = subprocess.run([*scheduler_cmd(), "--db", str(db), "deliveries", "show", parts[0]["id"]], capture_output=True,
                           timeout=60, env={**os.environ, **env})
    assert human.returncode == 0 and any(ln.replace(":", " ").split() == ["job_name", parts[0]["job_name"]]
                                         for ln in human.stdout.decode().splitlines()), human.stdout.decode()


# --- defect 4: a referenced artifact cannot be deleted, foreign keys on or off --------------------------------------


def test_defect_4_a_referenced_artifact_survives_a_connection_with_foreign_keys_off(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    digest = ok(sub(db, "jobs", "add", spec()))["job"]["artifact_digest"]
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")
        try:
            conn.execute("DELETE FROM execution_artifacts WHERE digest = ?", (digest,))
        except sqlite3.DatabaseError as exc:
            assert "ARTIFACT_REFERENCED" in str(exc)
        else:
            raise AssertionError("a referenced artifact was deleted")
        conn.commit()
    finally:
        conn.close()
    assert ok(sub(db, "doctor"))["healthy"] is True  # nothing was lost: the job still matches its artifact
