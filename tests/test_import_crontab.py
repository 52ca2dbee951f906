"""``scheduler import crontab`` on fixture crontabs, standard input and a fake ``crontab`` on PATH (SQLite and PostgreSQL).

Covers cron's own rules: environment lines, ``@daily``-style macros (``@reboot`` reported),
the ``%`` stdin rules, comments directly above a line as its description, every line that is
not imported reported with its number, deterministic unique names; and one imported job run
by a real dispatcher through the shell executor, its ``%`` lines arriving on standard input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from kernel_testing import run_rows, wait_for

FIXTURE = Path(__file__).parent / "fixtures" / "crontab" / "user.crontab"


def stored(cli: Any) -> dict[str, dict[str, Any]]:
    jobs = {}
    for j in cli("--json", "jobs", "list").json["jobs"]:
        opts = j["executor_options"]
        j["executor_options"] = json.loads(opts) if isinstance(opts, str) else opts
        jobs[j["name"]] = j
    return jobs


def by_line(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["line"]: r for r in report["results"]}


def test_percent_rules() -> None:
    from scheduler.ops.importers.crontab import split_percent

    assert split_percent("date") == ("date", None)
    assert split_percent("echo 50\\% done") == ("echo 50% done", None)
    assert split_percent("mail root%Dear root,%%90\\% full.%") == ("mail root", "Dear root,\n\n90% full.\n")
    assert split_percent("cat%") == ("cat", "")
    assert split_percent("printf '\\n'%a") == ("printf '\\n'", "a")  # other backslashes are left alone


def test_import_a_crontab_file(cli: Any, store: Any, tmp_path: Path) -> None:
    out = cli("--json", "import", "crontab", str(FIXTURE))
    assert out.code == 1 and out.json["code"] == "IMPORT_FAILED", out  # unsupported lines make the exit non-zero
    report = out.json["details"]
    lines = by_line(report)
    assert {n: (r["status"], r.get("code")) for n, r in lines.items()} == {
        9: ("imported", None), 10: ("imported", None), 11: ("failed", "UNSUPPORTED_SCHEDULE"), 12: ("imported", None),
        13: ("imported", None), 14: ("failed", "UNSUPPORTED_LINE"), 15: ("failed", "INVALID_CRON"),
    }
    assert lines[14]["text"] == "this line is not cron"
    env = {e["key"]: e for e in report["environment"]}
    assert set(env) == {"SHELL", "CRON_TZ", "MAILTO", "BACKUP_DIR"} and "not imported" in env["MAILTO"]["handled"]
    jobs = stored(cli)
    backup = jobs[lines[9]["name"]]
    assert backup["name"].startswith("cron-tar-") and backup["schedule_cron"] == "30 2 * * *"
    assert backup["schedule_tz"] == "Europe/Berlin"
    assert backup["description"] == "Nightly backup of the home directory\n(kept for 30 days)"
    assert backup["payload_message"] == ("export BACKUP_DIR=/srv/backup; /bin/bash -c "
                                         "'tar czf \"$BACKUP_DIR/home.tgz\" ~ && echo 100% done'")
    assert backup["executor_options"] == {"working_dir": "~"}
    mail = jobs[lines[10]["name"]]
    assert mail["schedule_cron"] == "0 0 * * *" and mail["description"] is None
    assert mail["executor_options"]["stdin_text"] == "Dear root,\n\nthe disk is 90% full.\n"
    assert mail["payload_message"].endswith("-c 'mail -s \"daily\" root'")
    # The same line twice: two jobs, names derived deterministically and kept unique.
    assert lines[13]["name"] == lines[12]["name"] + "-2"
    assert jobs[lines[12]["name"]]["schedule_cron"] == "*/15 9-17 * * mon-fri"
    # Importing again skips what is there (same derived names); the bad lines are still reported.
    again = cli("--json", "import", "crontab", str(FIXTURE)).json["details"]
    assert [r["status"] for r in again["results"] if r["name"] in jobs] == ["skipped"] * 4
    assert again["summary"]["failed"] == 3
    assert len(stored(cli)) == 4


def test_dry_run_stdin_and_a_clean_crontab_exits_zero(cli: Any, store: Any) -> None:
    text = "CRON_TZ=UTC\n# ping it\n@hourly echo ping\n"
    dry = cli("--json", "import", "crontab", "-", "--dry-run", stdin=text)
    assert dry.code == 0, dry
    assert dry.json["summary"]["would_import"] == 1 and dry.json["results"][0]["status"] == "would_import"
    assert stored(cli) == {}
    out = cli("--json", "import", "crontab", "-", stdin=text)
    assert out.code == 0 and out.json["summary"]["imported"] == 1
    job = next(iter(stored(cli).values()))
    assert (job["schedule_cron"], job["schedule_tz"], job["description"]) == ("0 * * * *", "UTC", "ping it")


def fake_crontab(bindir: Path, text: str | None) -> None:
    """A ``crontab`` program whose ``-l`` prints ``text`` (or says there is none, as cron does)."""
    bindir.mkdir(exist_ok=True)
    script = bindir / "crontab"
    body = f"sys.stdout.write({text!r})" if text is not None else \
        "sys.stderr.write('no crontab for tester\\n'); sys.exit(1)"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        assert sys.argv[1:] == ["-l"], sys.argv
        {body}
        """))
    script.chmod(0o755)


def test_default_source_is_crontab_l_on_path(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "TZ": "UTC"}
    cmd = [sys.executable, "-m", "scheduler", "--db", str(tmp_path / "s.db"), "--json", "import", "crontab"]
    fake_crontab(bindir, None)
    empty = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert empty.returncode == 0 and json.loads(empty.stdout)["summary"]["total"] == 0, empty.stderr
    fake_crontab(bindir, "*/5 * * * * date -u\n")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["source"] == {"kind": "crontab", "location": "crontab -l"} and doc["summary"]["imported"] == 1


def test_an_imported_job_runs_with_its_stdin_and_environment(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    """The shell executor runs the imported command: exported variables and the `%` stdin arrive."""
    from scheduler.core.queue import enqueue_manual
    from scheduler.ops.importers import run_import
    from scheduler.ops.importers.crontab import parse

    out_file = tmp_path / "out.txt"
    items, _ = parse(f"GREETING=hello there\nCRON_TZ=UTC\n0 0 1 1 * (echo \"$GREETING\"; cat) > {out_file}%line 1%50\\% done\n")
    run_import(store, items, dry_run=False, same_name_is_import=True)
    assert items[0].status == "imported", items[0]
    dispatcher()
    enqueue_manual(store, items[0].job_id)
    wait_for(lambda: [r for r in run_rows(store, items[0].job_id) if r["status"] in ("ok", "error")], what="finished run")
    assert [r["status"] for r in run_rows(store, items[0].job_id)] == ["ok"]
    assert out_file.read_text() == "hello there\nline 1\n50% done"
