"""``scheduler import openclaw`` against a fake ``openclaw`` executable and the legacy jobs file, on SQLite and PostgreSQL.

The fixture ``tests/fixtures/openclaw/jobs.json`` is written from the documented shapes of
OpenClaw's cron jobs (schedule kinds at/every/cron, sessionTarget, payload kinds, delivery).
The fake executable answers ``cron list --json`` with job summaries and ``cron get ID --json``
with the full record, and logs every call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "fixtures" / "openclaw" / "jobs.json"
JOBS = json.loads(FIXTURE.read_text())["jobs"]


def fake_openclaw(tmp_path: Path, jobs: list[dict[str, Any]], *, fail: str | None = None) -> Path:
    """A small Python program that behaves like ``openclaw cron list/get --json`` over ``jobs``."""
    data = tmp_path / "openclaw-jobs.json"
    data.write_text(json.dumps(jobs))
    script = tmp_path / "openclaw"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        args = sys.argv[1:]
        with open({str(tmp_path / 'calls.log')!r}, "a") as log:
            log.write(" ".join(args) + "\\n")
        jobs = json.load(open({str(data)!r}))
        if {fail!r} == "exit":
            sys.stderr.write("gateway not reachable\\n"); sys.exit(3)
        if {fail!r} == "garbage":
            print("<html>not json</html>"); sys.exit(0)
        if args[:3] == ["cron", "list", "--json"]:
            print(json.dumps({{"jobs": [{{k: j[k] for k in ("id", "name", "enabled", "schedule") if k in j}} for j in jobs],
                              "total": len(jobs)}}))
        elif args[:2] == ["cron", "get"] and args[3:] == ["--json"]:
            found = [j for j in jobs if j["id"] == args[2]]
            if not found:
                sys.stderr.write("not found\\n"); sys.exit(1)
            print(json.dumps(found[0]))
        else:
            sys.stderr.write("usage\\n"); sys.exit(2)
        """))
    script.chmod(0o755)
    return script


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in report["results"]}


def stored(cli: Any) -> dict[str, dict[str, Any]]:
    jobs = {}
    for j in cli("--json", "jobs", "list").json["jobs"]:
        opts = j["executor_options"]
        j["executor_options"] = json.loads(opts) if isinstance(opts, str) else opts
        jobs[j["name"]] = j
    return jobs


def test_import_from_the_openclaw_cli(cli: Any, store: Any, tmp_path: Path) -> None:
    binary = fake_openclaw(tmp_path, JOBS)
    out = cli("--json", "import", "openclaw", "--binary", str(binary))
    assert out.code == 1 and out.json["code"] == "IMPORT_FAILED", out  # some jobs cannot be imported: non-zero exit
    report = out.json["details"]
    assert report["source"] == {"kind": "openclaw-cli", "location": f"{binary} cron list --json"}
    results = by_name(report)
    assert {n: (r["status"], r.get("code")) for n, r in results.items()} == {
        "Morning brief": ("imported", None), "Reminder": ("imported", None), "Quarter past": ("imported", None),
        "Every seven minutes": ("imported", None), "Disk report": ("imported", None),
        "Fast poll": ("failed", "INEXACT_EVERY"), "Webhook post": ("failed", "UNSUPPORTED_DELIVERY"),
        "Announce to last route": ("imported", None), "Old one-shot": ("skipped", "AT_IN_PAST"),
        "Foreign session": ("failed", "UNSUPPORTED_SESSION"),
    }
    assert report["summary"] == {"total": 10, "imported": 6, "would_import": 0, "skipped": 1, "failed": 3,
                                 "warnings": report["summary"]["warnings"]}
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == "cron list --json" and len(calls) == 11  # then one `cron get ID --json` per job
    jobs = stored(cli)
    assert set(jobs) == {"Morning brief", "Reminder", "Quarter past", "Every seven minutes", "Disk report", "Announce to last route"}
    brief = jobs["Morning brief"]
    assert brief["id"] == "openclaw-cron:8f0c7a52-1b9e-4c1e-9a33-0d6a2b1f0001"
    assert (brief["schedule_kind"], brief["schedule_cron"], brief["schedule_tz"]) == ("cron", "0 7 * * 1-5", "America/Los_Angeles")
    assert brief["session_target"] == "isolated" and brief["run_timeout_ms"] == 300_000
    assert brief["executor_options"] == {"model": "anthropic/claude-sonnet-4", "thinking": "high"}
    assert (brief["delivery_mode"], brief["delivery_channel"], brief["delivery_to"]) == ("always", "openclaw", "slack:channel:C1234567890")
    assert any("xhigh" in w for w in results["Morning brief"]["warnings"])
    reminder = jobs["Reminder"]  # `at` stays `at`; an ISO time without a zone is UTC
    assert (reminder["schedule_kind"], reminder["schedule_at"]) == ("at", "2099-02-01T16:00:00.000Z")
    assert reminder["session_target"] == "main" and reminder["executor_options"] == {"mode": "event"}
    assert reminder["run_timeout_ms"] == 120_000
    quarter = jobs["Quarter past"]  # 15 min anchored at :15 -> exact cron
    assert (quarter["schedule_kind"], quarter["schedule_cron"], quarter["schedule_tz"]) == ("cron", "0,15,30,45 * * * *", "UTC")
    assert quarter["executor_options"] == {"mode": "event", "event_mode": "queue"}
    seven = jobs["Every seven minutes"]  # 7 min does not divide an hour: anchored every on the source's phase
    assert (seven["schedule_kind"], seven["schedule_every"], seven["state"]) == ("every", "7m", "disabled")
    assert seven["executor_options"] == {"mode": "event", "agent_id": "ops"}
    with store.read() as tx:
        next_run = tx.scalar("SELECT next_run_at FROM jobs WHERE name = 'Every seven minutes'")
    assert (next_run - 1767225630000) % 420_000 == 0
    assert results["Every seven minutes"]["exact_schedule"] is True
    disk = jobs["Disk report"]  # a command payload: one shell command
    assert disk["session_target"] == "shell"
    assert disk["payload_message"] == "export LANG=C NOTE='it'\"'\"'s'; df -h /srv"
    assert disk["executor_options"] == {"env_policy": "inherit", "working_dir": "/tmp", "stdin_text": "in"}
    assert any("UTC assumed" in w for w in results["Disk report"]["warnings"])
    last = jobs["Announce to last route"]  # isolated without delivery: announce to the last route -> none, with a warning
    assert last["delivery_mode"] == "none" and results["Announce to last route"]["warnings"]
    # A second import recognises what it imported (by id) and skips it.
    again = cli("--json", "import", "openclaw", "--binary", str(binary))
    assert {r["status"] for n, r in by_name(again.json["details"]).items() if n in jobs} == {"skipped"}
    assert len(stored(cli)) == 6


def test_allow_inexact_every_dry_run_and_legacy_file(cli: Any, store: Any, tmp_path: Path) -> None:
    good = [j for j in JOBS if j["name"] in ("Fast poll", "Quarter past", "Reminder")]
    legacy = tmp_path / "jobs.json"
    legacy.write_text(json.dumps({"version": 1, "jobs": good}))
    dry = cli("--json", "import", "openclaw", "--legacy-json", str(legacy), "--dry-run")
    assert dry.code == 1 and by_name(dry.json["details"])["Fast poll"]["code"] == "INEXACT_EVERY"
    dry = cli("--json", "import", "openclaw", "--legacy-json", str(legacy), "--dry-run", "--allow-inexact-every")
    assert dry.code == 0, dry
    assert dry.json["dry_run"] is True and dry.json["summary"]["would_import"] == 3
    fast = by_name(dry.json)["Fast poll"]
    assert fast["exact_schedule"] is False and any("INEXACT_EVERY" in w for w in fast["warnings"])
    assert stored(cli) == {}  # a dry run stores nothing
    out = cli("--json", "import", "openclaw", "--legacy-json", str(legacy), "--allow-inexact-every")
    assert out.code == 0 and out.json["source"]["kind"] == "legacy-json"
    assert stored(cli)["Fast poll"]["schedule_every"] == "1s"


def test_source_failures_are_coded_and_store_nothing(cli: Any, store: Any, tmp_path: Path) -> None:
    for fail, code in (("exit", "OPENCLAW_COMMAND_FAILED"), ("garbage", "IMPORT_SOURCE_INVALID")):
        d = tmp_path / fail
        d.mkdir()
        out = cli("--json", "import", "openclaw", "--binary", str(fake_openclaw(d, JOBS, fail=fail)))
        assert out.code == 1 and out.json["code"] == code, out
    assert cli("--json", "import", "openclaw", "--binary", str(tmp_path / "nope")).json["code"] == "IMPORT_SOURCE_NOT_FOUND"
    assert cli("--json", "import", "openclaw", "--legacy-json", str(tmp_path / "no.json")).json["code"] == "IMPORT_SOURCE_NOT_FOUND"
    (tmp_path / "bad.json").write_text('{"jobs": {"a": 1}}')
    assert cli("--json", "import", "openclaw", "--legacy-json", str(tmp_path / "bad.json")).json["code"] == "IMPORT_SOURCE_INVALID"
    assert stored(cli) == {}


def test_default_binary_from_path_through_the_real_cli(tmp_path: Path) -> None:
    """No --binary: `openclaw` is found on PATH; the command runs as a subprocess, exit 0 when every job imports."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_openclaw(bindir, [j for j in JOBS if j["name"] in ("Morning brief", "Disk report")])
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("OPENCLAW_BIN", None)
    cmd = [sys.executable, "-m", "scheduler", "--db", str(tmp_path / "s.db"), "import", "openclaw"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "imported 2 of 2" in out.stdout


def test_every_as_cron_only_when_exact() -> None:
    from scheduler.ops.importers.openclaw import every_as_cron

    assert every_as_cron(60_000, 0) == "* * * * *"
    assert every_as_cron(20 * 60_000, 5 * 60_000) == "5,25,45 * * * *"
    assert every_as_cron(6 * 3_600_000, 3_600_000 + 30 * 60_000) == "30 1,7,13,19 * * *"
    assert every_as_cron(86_400_000, 7 * 3_600_000) == "0 7 * * *"
    assert every_as_cron(7 * 60_000, 0) is None  # does not divide an hour
    assert every_as_cron(5 * 3_600_000, 0) is None  # does not divide a day
    assert every_as_cron(60_000, 30_000) is None  # phase off the minute
    assert every_as_cron(90_000, 0) is None


def test_issue29_defect_11_reimporting_a_job_that_now_fails_conversion_is_already_imported(cli: Any, store: Any,
                                                                                          tmp_path: Path) -> None:
    """Before: the second import reported Fast poll ``failed`` (INEXACT_EVERY) and exited 1 though it was imported."""
    legacy = tmp_path / "jobs.json"
    legacy.write_text(json.dumps({"version": 1, "jobs": [j for j in JOBS if j["name"] in ("Fast poll", "Quarter past")]}))
    first = cli("--json", "import", "openclaw", "--legacy-json", str(legacy), "--allow-inexact-every")
    assert first.code == 0 and first.json["summary"]["imported"] == 2, first
    again = cli("--json", "import", "openclaw", "--legacy-json", str(legacy))  # without the flag the conversion fails
    assert again.code == 0, again
    assert {n: (r["status"], r["code"]) for n, r in by_name(again.json).items()} == {
        "Fast poll": ("skipped", "ALREADY_IMPORTED"), "Quarter past": ("skipped", "ALREADY_IMPORTED")}
    assert again.json["summary"]["skipped"] == 2 and again.json["summary"]["failed"] == 0
    assert set(stored(cli)) == {"Fast poll", "Quarter past"}
