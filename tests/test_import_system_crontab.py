"""System crontabs (``/etc/crontab``, ``/etc/cron.d/*``: a user field) and jobs that run as another account.

Issue 31 item 1: the user field was read as the first word of the command, so ``root test -e / || cmd``
ran ``cmd``. Covered: ``scheduler import crontab --system`` on a corpus of Debian-format system
crontab files (every job line imported with its user, or refused with a code), the guard line run
by a real dispatcher as root, ``executor_options.user = "nobody"`` really running as nobody, the
adder's identity bound into the artifact (an edited row is refused), a non-root adder refused at
add (the real CLI in a subprocess running as nobody) and at run, unknown users, and the croniter
extensions cron refuses. This machine runs the tests as root; the tests that need it skip otherwise.
"""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_job_once

import scheduler
from scheduler.testing import unreachable_by_others

CORPUS = Path(__file__).parent / "fixtures" / "crontab" / "system"
ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="running as another account needs root")


def _report(out: Any) -> dict[str, Any]:
    return out.json["details"] if out.json.get("code") == "IMPORT_FAILED" else out.json


def _options(job: dict[str, Any]) -> dict[str, Any]:
    opts = job["executor_options"]
    return json.loads(opts) if isinstance(opts, str) else opts


@ROOT
def test_guard_line_runs_as_root_and_never_runs_its_right_hand_side(cli: Any, store: Any, dispatcher: Any,
                                                                   tmp_path: Path) -> None:
    """The issue's reproduction: with --system the line runs ``test -e / || echo ...`` as root, as cron would."""
    source = tmp_path / "f"
    source.write_text("* * * * * root test -e / || echo GUARD-BYPASSED\n")
    out = cli("--json", "import", "crontab", "--system", str(source))
    assert out.code == 0, out
    (result,) = out.json["results"]
    assert result["status"] == "imported" and result["user"] == "root" and out.json["system"] is True
    (job,) = cli("--json", "jobs", "list").json["jobs"]
    assert job["payload_message"] == "test -e / || echo GUARD-BYPASSED"
    opts = _options(job)
    assert opts["user"] == "root" and opts["added_by"] == "root" and opts["added_by_uid"] == 0
    run = run_job_once(store, dispatcher, job)
    assert run["status"] == "ok", run
    assert "GUARD-BYPASSED" not in (run["stdout_excerpt"] or "") and not run["stderr_excerpt"], run


def test_system_paths_are_read_with_a_user_field() -> None:
    from scheduler.ops.importers.crontab import is_system_path

    assert is_system_path("/etc/crontab") and is_system_path("/etc/cron.d/certbot")
    assert not is_system_path("/etc/cron.daily/x") and not is_system_path("-") and not is_system_path(None)
    assert not is_system_path("crontab")  # a relative file named crontab is a user crontab


@ROOT
def test_debian_corpus_imports_every_job_line_with_its_user_or_a_code(cli: Any, store: Any) -> None:
    """13 job lines in the formats of cron's /etc/crontab and the cron.d files of anacron, certbot, e2fsprogs,
    mdadm, ntpsec, php and sysstat: each imported as ``user`` + command, or refused with a code."""
    results: list[dict[str, Any]] = []
    for path in sorted(CORPUS.iterdir()):
        out = cli("--json", "import", "crontab", "--system", str(path))
        assert out.code in (0, 1), out
        results += [dict(r, file=path.name) for r in _report(out)["results"]]
    assert len(results) == 13
    jobs = {j["name"]: j for j in cli("--json", "jobs", "list").json["jobs"]}
    for r in results:
        user = r["text"].split()[5]
        assert r["user"] == user
        if r["file"] == "ntpsec":  # no ntpsec account here: refused, never imported as a command
            assert (r["status"], r["code"]) == ("failed", "RUN_AS_USER_UNKNOWN") and r["name"] is None
            continue
        assert r["status"] == "imported", r
        job = jobs[r["name"]]
        assert _options(job)["user"] == "root"
        assert not job["payload_message"].split("; ")[-1].startswith("root"), job["payload_message"]
    e2 = [jobs[r["name"]]["payload_message"] for r in results if r["file"] == "e2scrub_all"]
    ends = ("test -e /run/systemd/system || SERVICE_MODE=1 /sbin/e2scrub_all -A -r", "e2scrub_all_cron")
    assert all(p.endswith(ends) for p in e2) and len(e2) == 2
    mdadm = next(jobs[r["name"]] for r in results if r["file"] == "mdadm")
    assert "$(date +%d) -le 7" in mdadm["payload_message"] and "stdin_text" not in _options(mdadm)


def test_user_crontab_format_is_unchanged(cli: Any, store: Any, tmp_path: Path) -> None:
    source = tmp_path / "crontab"
    source.write_text("* * * * * root-tool --flag\n")
    out = cli("--json", "import", "crontab", str(source))
    assert out.code == 0 and out.json["system"] is False, out
    (job,) = cli("--json", "jobs", "list").json["jobs"]
    assert job["payload_message"] == "root-tool --flag" and "user" not in _options(job)


@ROOT
def test_unknown_user_is_refused_in_the_report(cli: Any, store: Any, tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_text("@daily no-such-account-31 echo hi\n5 4 * * * root echo ok\n")
    out = cli("--json", "import", "crontab", "--system", str(source))
    assert out.code == 1 and out.json["code"] == "IMPORT_FAILED", out
    lines = {r["line"]: r for r in out.json["details"]["results"]}
    assert (lines[1]["status"], lines[1]["code"]) == ("failed", "RUN_AS_USER_UNKNOWN")
    assert lines[2]["status"] == "imported"
    assert [j["payload_message"] for j in cli("--json", "jobs", "list").json["jobs"]] == ["echo ok"]


@pytest.mark.parametrize("expr", ["0 0 L * *", "0 0 15W * *", "0 0 * * sun#2", "0 0 * * 5L", "0 0 ? * *", "H * * * *",
                                  "0 0 LW * *"])
def test_croniter_extensions_are_refused(cli: Any, store: Any, tmp_path: Path, expr: str) -> None:
    source = tmp_path / "crontab"
    source.write_text(f"{expr} echo x\n0 3 * jan-mar mon-fri,sun echo y\n*/5 1-5/2 1,15 * * echo z\n")
    out = cli("--json", "import", "crontab", str(source))
    assert out.code == 1, out
    lines = {r["line"]: r for r in out.json["details"]["results"]}
    assert (lines[1]["status"], lines[1]["code"]) == ("failed", "CRON_SYNTAX_UNSUPPORTED"), lines[1]
    assert lines[2]["status"] == lines[3]["status"] == "imported"


@ROOT
def test_a_job_runs_as_nobody_through_the_dispatcher(store: Any, dispatcher: Any) -> None:
    nobody = pwd.getpwnam("nobody")
    job = add_job(store, executor="shell", name="as-nobody", payload_message='id -u; id -g; echo "$HOME $LOGNAME $USER $SHELL"',
                  executor_options={"user": "nobody", "working_dir": "/"}, schedule_kind="manual")
    run = run_job_once(store, dispatcher, job)
    assert run["status"] == "ok", run
    assert run["stdout_excerpt"] == f"{nobody.pw_uid}\n{nobody.pw_gid}\n{nobody.pw_dir} nobody nobody /bin/sh\n"


@ROOT
def test_an_edited_adder_is_refused_before_the_run(store: Any, dispatcher: Any, store_url: str) -> None:
    if store_url.startswith("postgres"):
        pytest.skip("edits the SQLite file directly")
    job = add_job(store, executor="shell", name="edited", payload_message="id -u", executor_options={"user": "nobody", "working_dir": "/"},
                  schedule_kind="manual")
    path = store_url.removeprefix("sqlite:///") if store_url.startswith("sqlite:") else store_url
    with sqlite3.connect(path) as conn:
        (text,) = conn.execute("SELECT executor_options FROM jobs WHERE id = ?", (job["id"],)).fetchone()
        opts = json.loads(text)
        opts["user"] = "root"
        conn.execute("UPDATE jobs SET executor_options = ? WHERE id = ?", (json.dumps(opts), job["id"]))
    run = run_job_once(store, dispatcher, job)
    assert (run["status"], run["error_code"]) == ("error", "EXECUTION_ARTIFACT_MISMATCH"), run


@ROOT
def test_a_job_whose_adder_is_no_longer_allowed_is_refused_at_run(store: Any, dispatcher: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A job bound (consistently) with an adder who may not name users: the run is refused, nothing runs."""
    from scheduler.core import run_as

    monkeypatch.setattr(run_as, "adder_identity", lambda: ("nobody", 65534))
    monkeypatch.setattr(run_as, "may_name_users", lambda name, uid: True)  # the list allowed it when it was added
    job = add_job(store, executor="shell", name="was-allowed", payload_message="echo RAN", executor_options={"user": "nobody"},
                  schedule_kind="manual")
    monkeypatch.undo()
    run = run_job_once(store, dispatcher, job)
    assert (run["status"], run["error_code"]) == ("error", "RUN_AS_NOT_ALLOWED"), run
    assert not run["stdout_excerpt"]


#: The CLI from the venv's site-packages under a system interpreter of the same version: the venv's own interpreter
#: may live under a directory only root can enter (/root/.pyenv here), which nobody could not execute.
_CLI = ("import site, sys; site.addsitedir(sys.argv.pop(1)); from scheduler.cli.main import main; sys.exit(main(sys.argv[1:]))")


def _system_python() -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = next((p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip(f"no system {version} that the nobody account can run")
    return found


def _as_nobody(args: list[str], db: Path, env_dir: Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess running as nobody (uid, gid and groups dropped by subprocess)."""
    nobody = pwd.getpwnam("nobody")
    site_dir = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    if (unreachable := unreachable_by_others(site_dir, os.path.dirname(scheduler.__file__))) is not None:
        pytest.skip(unreachable)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(env_dir), "TZ": "UTC"}
    if config is not None:
        env["SCHEDULER_CONFIG"] = str(config)
    return subprocess.run([_system_python(), "-c", _CLI, site_dir, "--db", str(db), "--json", *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd="/", user=nobody.pw_uid, group=nobody.pw_gid,
                          extra_groups=[])


@ROOT
def test_a_non_root_adder_is_refused_at_add_and_at_import(tmp_path: Path) -> None:
    shared = Path(tempfile.mkdtemp(prefix="run-as-", dir="/tmp"))
    try:
        shared.chmod(0o777)
        db = shared / "s.db"
        first = json.dumps({"name": "first", "schedule_kind": "manual", "payload_message": "true"})
        made = subprocess.run([sys.executable, "-m", "scheduler", "--db", str(db), "--json", "jobs", "add", first],
                              capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        for f in shared.iterdir():
            f.chmod(0o666)
        spec = json.dumps({"name": "sneaky", "schedule_kind": "manual", "payload_message": "id -u",
                           "executor_options": {"user": "root", "added_by": "root", "added_by_uid": 0}})
        out = _as_nobody(["jobs", "add", spec], db, shared)
        assert out.returncode != 0, out.stdout + out.stderr
        assert json.loads(out.stdout or out.stderr)["code"] == "RUN_AS_NOT_ALLOWED", out.stdout + out.stderr
        plain = _as_nobody(["jobs", "add", json.dumps({"name": "mine", "schedule_kind": "manual",
                                                                   "payload_message": "id -u"})], db, shared)
        assert plain.returncode == 0, plain.stdout + plain.stderr  # nobody can write the database: only `user` is refused
        source = shared / "f"
        source.write_text("* * * * * root echo hi\n")
        source.chmod(0o644)
        imp = _as_nobody(["import", "crontab", "--system", str(source)], db, shared)
        doc = json.loads(imp.stdout or imp.stderr)
        assert imp.returncode == 1 and doc["details"]["results"][0]["code"] == "RUN_AS_NOT_ALLOWED", doc
        root_job = json.dumps({"name": "root-made", "schedule_kind": "manual", "payload_message": "id -u",
                               "executor_options": {"user": "nobody", "working_dir": "/"}})
        made = subprocess.run([sys.executable, "-m", "scheduler", "--db", str(db), "--json", "jobs", "add", root_job],
                              capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stdout + made.stderr
        update = _as_nobody(["jobs", "update", "root-made", json.dumps({"payload_message": "id -u; id -g"})], db, shared)
        assert json.loads(update.stdout or update.stderr)["code"] == "RUN_AS_NOT_ALLOWED", update.stdout + update.stderr
        listed = subprocess.run([sys.executable, "-m", "scheduler", "--db", str(db), "--json", "jobs", "list"],
                                capture_output=True, text=True, timeout=120)
        jobs = {j["name"]: j for j in json.loads(listed.stdout)["jobs"]}
        assert sorted(jobs) == ["first", "mine", "root-made"] and jobs["root-made"]["payload_message"] == "id -u"
        # [identity] run_as_users grants it, but only from a root-owned file nobody else can write.
        trusted = shared / "etc"
        trusted.mkdir(mode=0o755)
        config = trusted / "config.toml"
        config.write_text('[identity]\nrun_as_users = ["nobody"]\n')
        config.chmod(0o644)
        listed_ok = _as_nobody(["jobs", "add", json.dumps({"name": "granted", "schedule_kind": "manual",
                                                           "payload_message": "id -u",
                                                           "executor_options": {"user": "nobody"}})], db, shared, config)
        assert listed_ok.returncode == 0, listed_ok.stdout + listed_ok.stderr
        opts = json.loads(listed_ok.stdout)["job"]["executor_options"]
        opts = json.loads(opts) if isinstance(opts, str) else opts
        assert (opts["added_by"], opts["added_by_uid"]) == ("nobody", 65534), opts
        config.chmod(0o666)  # writable by anyone: the list grants nothing
        loose = _as_nobody(["jobs", "add", json.dumps({"name": "loose", "schedule_kind": "manual",
                                                       "payload_message": "id -u",
                                                       "executor_options": {"user": "nobody"}})], db, shared, config)
        assert json.loads(loose.stdout or loose.stderr)["code"] == "RUN_AS_NOT_ALLOWED", loose.stdout + loose.stderr
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)
