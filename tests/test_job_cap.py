"""``[jobs] max_jobs`` (issue 29 piece 3, seed 004 ``max_tasks``): a host cap on stored jobs, off by default.

``jobs add``, ``apply`` and ``import`` past the cap are refused with ``JOB_LIMIT_REACHED`` and store
nothing, checked in the transaction that inserts the jobs; the cap comes from a real settings file
or its ``SCHEDULER_JOBS_MAX_JOBS`` override. SQLite and PostgreSQL; concurrent adds in real processes.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from kernel_testing import scheduler_cmd

from scheduler.settings import reload_settings
from scheduler.testing import write_settings


def spec(name: str) -> str:
    return json.dumps({"name": name, "schedule_kind": "manual", "payload_message": "true"})


def snapshot(store: Any) -> tuple[list[str], int, int]:
    """The stored job names, artifact and event counts: what "nothing stored" is checked against."""
    with store.read() as tx:
        names = [r["name"] for r in tx.all("SELECT name FROM jobs ORDER BY name")]
        artifacts = int(tx.scalar("SELECT COUNT(*) FROM execution_artifacts"))
        events = int(tx.scalar("SELECT COUNT(*) FROM runtime_events"))
    return names, artifacts, events


def refused(res: Any, code: str = "JOB_LIMIT_REACHED") -> dict[str, Any]:
    assert res.code != 0, res
    doc: dict[str, Any] = res.json
    assert doc["ok"] is False and doc["code"] == code, doc
    return doc


def cap_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, max_jobs: int) -> None:
    """A real settings file with ``[jobs] max_jobs`` named by ``$SCHEDULER_CONFIG``."""
    path = write_settings(tmp_path / "config.toml", {"jobs": {"max_jobs": max_jobs}})
    monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
    reload_settings()


def test_off_by_default(cli: Any) -> None:
    for i in range(5):
        assert cli("--json", "jobs", "add", spec(f"j{i}")).code == 0
    doc = cli("--json", "config").json
    assert "max_jobs" in json.dumps(doc)


def test_jobs_add_past_the_cap_is_refused_and_stores_nothing(cli: Any, store: Any, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    cap_file(monkeypatch, tmp_path, 2)
    assert cli("--json", "jobs", "add", spec("a")).code == 0
    before = snapshot(store)
    # A batch that would cross the cap is refused whole: not even its first job goes in.
    doc = refused(cli("--json", "jobs", "add", "--stdin", stdin=f"[{spec('b')}, {spec('c')}]"))
    assert doc["details"] == {"max_jobs": 2, "jobs": 3}  # what the change would have left
    assert snapshot(store) == before
    assert cli("--json", "jobs", "add", spec("b")).code == 0
    before = snapshot(store)
    refused(cli("--json", "jobs", "add", spec("c")))
    refused(cli("--json", "schedule", "add", "*/5 * * * *", "echo hi"))  # the quick-cron path is the same insert
    assert snapshot(store) == before
    # Deleting one makes room again.
    assert cli("--json", "jobs", "delete", "a").code == 0
    assert cli("--json", "jobs", "add", spec("c")).code == 0


def test_apply_past_the_cap_stores_nothing_and_counts_after_pruning(cli: Any, store: Any, monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("SCHEDULER_JOBS_MAX_JOBS", "2")  # the override, without a file
    reload_settings()
    f = tmp_path / "jobs.toml"
    job = {"schedule_kind": "manual", "payload_message": "true"}
    f.write_text(tomli_w.dumps({"jobs": [{"name": n, **job} for n in ("x", "y", "z")]}))
    before = snapshot(store)
    doc = refused(cli("--json", "apply", str(f)))
    assert doc["details"] == {"max_jobs": 2, "jobs": 3}
    assert snapshot(store) == before
    assert cli("--json", "apply", str(f), "--dry-run").code == 0  # the plan itself stores nothing and is shown
    f.write_text(tomli_w.dumps({"jobs": [{"name": n, **job} for n in ("x", "y")]}))
    assert cli("--json", "apply", str(f)).code == 0
    # Replacing both jobs at the cap: the count that matters is the one the apply leaves.
    f.write_text(tomli_w.dumps({"jobs": [{"name": n, **job} for n in ("p", "q")]}))
    refused(cli("--json", "apply", str(f)))  # without pruning it would leave four
    assert snapshot(store)[0] == ["x", "y"]
    out = cli("--json", "apply", str(f), "--prune", "delete")
    assert out.code == 0, out
    assert snapshot(store)[0] == ["p", "q"]


def test_import_past_the_cap_stores_nothing(cli: Any, store: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cap_file(monkeypatch, tmp_path, 1)
    crontab = "0 1 * * * echo one\n0 2 * * * echo two\n"
    before = snapshot(store)
    refused(cli("--json", "import", "crontab", "-", stdin=crontab))
    assert snapshot(store) == before
    assert cli("--json", "import", "crontab", "-", "--dry-run", stdin=crontab).code == 0
    out = cli("--json", "import", "crontab", "-", stdin="0 1 * * * echo one\n")
    assert out.code == 0 and out.json["summary"]["imported"] == 1, out


def test_a_bad_cap_is_config_invalid(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("--json", "jobs", "list").code == 0  # the fixture's database exists before the bad setting
    monkeypatch.setenv("SCHEDULER_JOBS_MAX_JOBS", "-1")
    reload_settings()
    refused(cli("--json", "jobs", "add", spec("a")), "CONFIG_INVALID")
    monkeypatch.setenv("SCHEDULER_JOBS_MAX_JOBS", "0")  # 0: off, so an override can lift a file's cap
    reload_settings()
    assert cli("--json", "jobs", "add", spec("a")).code == 0


def test_concurrent_adds_never_exceed_the_cap(store_url: str, store: Any) -> None:
    """Eight processes add one job each at once under a cap of three: exactly three are stored."""
    env = {**os.environ, "SCHEDULER_JOBS_MAX_JOBS": "3"}
    env.pop("SCHEDULER_DEBUG", None)

    def add(i: int) -> tuple[int, str]:
        res = subprocess.run([*scheduler_cmd(), "--db", store_url, "--json", "jobs", "add", spec(f"c{i}")],
                             capture_output=True, env=env, timeout=120, check=False)
        return res.returncode, json.loads(res.stdout.splitlines()[-1]).get("code", "")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(add, range(8)))
    assert sorted(code for _rc, code in results) == ["", "", "", *["JOB_LIMIT_REACHED"] * 5], results
    assert len(snapshot(store)[0]) == 3
