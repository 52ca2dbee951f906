"""The third-party example (``examples/authorization-provider``): installed from its folder, then deciding real runs.

The distribution is installed with ``pip install --no-deps --no-build-isolation -e`` into the
test venv (a fresh venv per test was too slow for the suite; ``test_evidence_install`` covers
that path for providers). Then real ``scheduler`` processes add two jobs on a SQLite file, run
them manually, and a real ``scheduler run`` decides them: the member's job runs, the other's
is denied before its command starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "authorization-provider"
BIN = Path(sys.executable).parent


def _scheduler(db: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "scheduler"), "--db", str(db), *args], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_install_the_example_and_run_one_permitted_and_one_denied_job(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(EXAMPLE)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    (tmp_path / "config.toml").write_text("")
    env["SCHEDULER_CONFIG"] = str(tmp_path / "config.toml")
    db = tmp_path / "scheduler.db"
    listed = _scheduler(db, "plugins", "list", "--json", env=env)
    assert "teams" in listed.stdout, listed.stdout + listed.stderr
    config = {"members": ["service:backup"]}
    for name, principal in (("member-job", "backup"), ("stranger-job", "mallory")):
        marker = tmp_path / f"{name}.ran"
        spec = {"name": name, "schedule_kind": "manual", "payload_message": f"touch {marker}",
                "identity": {"subject": {"kind": "service", "principal": principal}},
                "authorization_ref": "teams:ops", "authorization": {"provider_config": config}}
        added = _scheduler(db, "jobs", "add", "--json", json.dumps(spec), env=env)
        assert added.returncode == 0, added.stdout + added.stderr
        ran = _scheduler(db, "jobs", "run", name, "--json", env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    dispatcher = _scheduler(db, "run", "--duration", "4s", env=env)
    assert dispatcher.returncode == 0, dispatcher.stdout + dispatcher.stderr
    runs = {}
    for name in ("member-job", "stranger-job"):
        out = _scheduler(db, "runs", "list", name, "--json", env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        (run,) = json.loads(out.stdout)["runs"]
        runs[name] = run
    assert runs["member-job"]["status"] == "ok" and (tmp_path / "member-job.ran").exists()
    assert runs["stranger-job"]["status"] == "error" and runs["stranger-job"]["error_code"] == "AUTHORIZATION_DENIED"
    assert not (tmp_path / "stranger-job.ran").exists()


def test_jobs_validate_reports_the_providers_policy_problem(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    (tmp_path / "config.toml").write_text("")
    env["SCHEDULER_CONFIG"] = str(tmp_path / "config.toml")
    spec = {"name": "nobody", "schedule_kind": "manual", "payload_message": "true", "authorization_ref": "teams:empty"}
    out = _scheduler(tmp_path / "s.db", "jobs", "validate", "--json", json.dumps(spec), env=env)
    body = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode != 0 and body["code"] == "VALIDATION_FAILED", body
    assert [d["code"] for d in body["details"]] == ["AUTHORIZATION_POLICY_INVALID"]
