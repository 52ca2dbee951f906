"""cedar and policyfile deciding real runs: real ``scheduler`` processes, a real ``scheduler run`` dispatcher.

Per provider, three jobs whose payload appends a line to a marker file: one the policy
permits (it runs), one it denies (``AUTHORIZATION_DENIED``, nothing ran, the decision on the
run and as an ``authorization.decided`` event), one it escalates (the run waits in
``awaiting_approval`` until ``scheduler approvals approve``, then runs exactly once without
asking the provider again). policyfile runs on SQLite and PostgreSQL, cedar on SQLite and
PostgreSQL too. ``doctor`` fails on a Cedar policy with a syntax error, naming the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent

CEDAR = """\
@id("permitted")
permit(principal == Job::"permitted-job", action == Action::"manual", resource);

@id("needs-a-human")
@escalate("high")
permit(principal == Job::"escalated-job", action, resource);
"""

POLICYFILE = """\
[[rule]]
effect = "permit"
reason = "the permitted job"
jobs = ["permitted-*"]
dispatch_kinds = ["manual"]

[[rule]]
effect = "escalate"
reason = "a human decides the escalated job"
jobs = ["escalated-*"]

[[rule]]
effect = "deny"
reason = "nothing else runs"
jobs = ["*"]
"""


class Cli:
    """Real ``scheduler --db URL ...`` processes with this test's settings file."""

    def __init__(self, db: str, tmp_path: Path, config: str) -> None:
        self.db = db
        (tmp_path / "config.toml").write_text(config)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
        self.env["SCHEDULER_CONFIG"] = str(tmp_path / "config.toml")

    def argv(self, *args: str) -> list[str]:
        return [str(BIN / "scheduler"), "--db", self.db, *args]

    def __call__(self, *args: str, ok: bool = True) -> dict[str, Any]:
        out = subprocess.run(self.argv(*args, "--json"), env=self.env, capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
        lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
        assert lines, out.stderr
        body = json.loads(lines[-1])
        if ok:
            assert out.returncode == 0 and body.get("ok", True), out.stdout + out.stderr
        return body

    def dispatcher(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv("run"), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)

    def runs(self, job: str) -> list[dict[str, Any]]:
        return self("runs", "list", job)["runs"]

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 40.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = probe()
            if found:
                return found
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")


def _status(cli: Cli, job: str, *statuses: str) -> Callable[[], Any]:
    def probe() -> Any:
        runs = cli.runs(job)
        return runs if runs and all(r["status"] in statuses for r in runs) else None

    return probe


def _decide_three_jobs(cli: Cli, ref: Callable[[str], str], tmp_path: Path) -> None:
    markers = {name: tmp_path / f"{name}.ran" for name in ("permitted-job", "denied-job", "escalated-job")}
    for name, marker in markers.items():
        cli("jobs", "add", json.dumps({"name": name, "schedule_kind": "manual", "payload_message": f"echo ran >> {marker}",
                                       "authorization_ref": ref(name)}))
        cli("jobs", "run", name)
    dispatcher = cli.dispatcher()
    try:
        (permitted,) = cli.wait("the permitted run", _status(cli, "permitted-job", "ok", "error"))
        (denied,) = cli.wait("the denied run", _status(cli, "denied-job", "ok", "error"))
        (waiting,) = cli.wait("the escalated run to wait", _status(cli, "escalated-job", "awaiting_approval"))

        assert permitted["status"] == "ok", permitted
        assert markers["permitted-job"].read_text() == "ran\n"
        got = cli("runs", "get", permitted["id"])
        assert got["run"]["authorization"]["decision"] == "permit", got

        assert denied["status"] == "error" and denied["error_code"] == "AUTHORIZATION_DENIED", denied
        assert not markers["denied-job"].exists()  # the payload never started
        record = cli("runs", "get", denied["id"])["run"]["authorization"]
        assert record["decision"] == "deny" and record["code"] == "AUTHORIZATION_DENIED" and record["reason"], record
        assert record["policy_ref"] == ref("denied-job").split(":", 1)[1]
        events = cli("runs", "events", denied["id"])["events"]
        decided = [e for e in events if e["kind"] == "authorization.decided"]
        assert len(decided) == 1 and decided[0]["data"]["decision"] == "deny", events

        assert not markers["escalated-job"].exists()
        (approval,) = cli("approvals", "list", "--pending", "--job", "escalated-job")["approvals"]
        assert approval["gate_kind"] == "authorization", approval
        cli("approvals", "approve", approval["id"], "--note", "looked at it")
        (approved,) = cli.wait("the approved run", _status(cli, "escalated-job", "ok", "error"))
        assert approved["status"] == "ok" and approved["id"] == waiting["id"], approved
        assert markers["escalated-job"].read_text() == "ran\n"  # ran exactly once
        record = cli("runs", "get", approved["id"])["run"]["authorization"]
        assert record["decision"] == "permit" and record["via"] == "approval" and record["escalated"]["decision"] == "escalate"
        assert len(cli.runs("escalated-job")) == 1
    finally:
        dispatcher.terminate()
        try:
            dispatcher.wait(20)
        except subprocess.TimeoutExpired:
            dispatcher.kill()
            dispatcher.wait(5)


def test_cedar_permits_denies_and_escalates_real_runs(store_url: str, tmp_path: Path) -> None:
    policies = tmp_path / "cedar"
    policies.mkdir()
    (policies / "jobs.cedar").write_text(CEDAR)
    cli = Cli(store_url, tmp_path, f'[providers.cedar]\npolicy_dir = "{policies}"\n')
    _decide_three_jobs(cli, lambda name: "cedar:jobs", tmp_path)


def test_policyfile_permits_denies_and_escalates_real_runs(store_url: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "jobs.toml").write_text(POLICYFILE)
    cli = Cli(store_url, tmp_path, f'[providers.policyfile]\npolicy_dir = "{rules}"\n')
    _decide_three_jobs(cli, lambda name: "policyfile:jobs", tmp_path)


def test_doctor_fails_on_a_cedar_syntax_error_naming_the_job(db_path: Path, tmp_path: Path) -> None:
    policies = tmp_path / "cedar"
    policies.mkdir()
    (policies / "jobs.cedar").write_text(CEDAR)
    cli = Cli(str(db_path), tmp_path, f'[providers.cedar]\npolicy_dir = "{policies}"\n')
    cli("jobs", "add", json.dumps({"name": "nightly", "schedule_kind": "manual", "payload_message": "true",
                                   "authorization_ref": "cedar:jobs"}))
    healthy = cli("doctor")
    (check,) = [c for c in healthy["checks"] if c["check"] == "authorization_policies"]
    assert check["ok"] and check["detail"] == "1 job(s) checked"

    (policies / "jobs.cedar").write_text(CEDAR.replace("action == Action", "action === Action"))  # edited after the job was added
    sick = cli("doctor", ok=False)
    assert sick["code"] == "UNHEALTHY" and "authorization_policies" in sick["error"], sick
    (check,) = [c for c in sick["details"] if c["check"] == "authorization_policies"]
    (problem,) = check["problems"]
    assert problem["job"] == "nightly" and problem["code"] == "AUTHORIZATION_POLICY_INVALID", problem
    assert "CEDAR_POLICY_INVALID" in problem["error"] and "jobs.cedar" in problem["error"]
    assert "job nightly" in check["detail"]
    human = subprocess.run(cli.argv("doctor"), env=cli.env, capture_output=True, text=True, timeout=60)
    assert human.returncode != 0 and "nightly" in human.stdout + human.stderr

    cli("jobs", "disable", "nightly")  # only enabled jobs are checked
    assert not [c for c in cli("doctor")["checks"] if c["check"] == "authorization_policies"]


def test_doctor_fails_when_a_jobs_authorization_provider_is_gone(db_path: Path, tmp_path: Path) -> None:
    """A job added with --allow-missing-plugins whose provider never came: every run would be denied."""
    cli = Cli(str(db_path), tmp_path, "")
    cli("jobs", "add", "--allow-missing-plugins", json.dumps({"name": "orphan", "schedule_kind": "manual",
                                                               "payload_message": "true", "authorization_ref": "nosuch:x"}))
    sick = cli("doctor", ok=False)
    (check,) = [c for c in sick["details"] if c["check"] == "authorization_policies"]
    assert [(p["job"], p["code"]) for p in check["problems"]] == [("orphan", "AUTHORIZATION_NOT_AVAILABLE")], check
