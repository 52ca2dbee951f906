"""Issue 9, defect 7: the files the scheduler creates are not world-readable.

The adversarial run found the database, the pid file and artifact files ``0644`` and
directories ``0755`` under the default umask. Now, whatever the umask: files ``0600`` and
directories ``0700`` (``SCHEDULER_STORAGE_FILE_MODE=group``: ``0660`` and ``2770``); SQLite
gives ``-wal``/``-shm`` the database file's mode; ``doctor`` warns about world access.
And a failed open by another user must not leave ``-wal``/``-shm`` files that lock the owner
out (it did: ``attempt to write a readonly database`` for the owner afterwards).

Real ``scheduler`` processes throughout. The other-user tests need root (to switch uid);
since this interpreter lives under ``/root`` (mode 0700), other users run the same
``scheduler`` code with the system ``/usr/bin/python3`` (same minor version) and the
virtualenv's site-packages.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import scheduler_cmd, wait_for

from scheduler.core.filemodes import FILE_MODE_ENV

SITE_PACKAGES = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


#: A job whose ``jobs add`` creates the database (the commands that only read or check refuse a missing one).
ADD_JOB = json.dumps({"name": "first", "schedule_kind": "manual", "payload_message": "true"})


def cli(db: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> dict[str, Any]:
    out = subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", *args], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **(env or {})}, preexec_fn=lambda: os.umask(0o022))
    assert "Traceback" not in out.stdout + out.stderr, out
    data = json.loads(out.stdout.strip().splitlines()[-1])
    if check:
        assert out.returncode == 0 and data.get("ok", True), out
    return data


def _exercise(db: Path, env: dict[str, str], tmp_path: Path) -> dict[str, Path]:
    """Create a database, run a dispatcher that offloads output, and note every file made meanwhile."""
    big = 200_000  # over the 64 KiB offload threshold
    cli(db, "jobs", "add", json.dumps([
        {"name": "big", "schedule_kind": "manual", "payload_message": f"head -c {big} /dev/zero | tr '\\0' x"},
        {"name": "binary", "schedule_kind": "manual", "payload_message": "printf '\\000\\001\\377'"},
    ]), env=env)
    for name in ("big", "binary"):
        cli(db, "jobs", "run", name, env=env)
    log = tmp_path / "run.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*scheduler_cmd(), "--db", str(db), "run", "--duration", "3s", "--lease-ttl", "2s"],
                                stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                preexec_fn=lambda: os.umask(0o022))  # noqa: PLW1509 - the umask under test
        try:
            wait_for(lambda: "holds lease" in log.read_text(errors="replace") or proc.poll() is not None, timeout=20,
                     what="dispatcher start")
            wal, shm, pid = Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}.dispatcher.pid")
            live = {"wal": mode(wal), "shm": mode(shm), "pid": mode(pid)}  # while the dispatcher has them open
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, log.read_text(errors="replace")
    runs = {name: cli(db, "runs", "get", cli(db, "runs", "list", name, env=env)["runs"][0]["id"], env=env)["run"]
            for name in ("big", "binary")}
    root = db.parent / "artifacts"
    return {"live": live, "root": root, "runs": runs}  # type: ignore[dict-item]


def test_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Before the fix: database, WAL, SHM, pid file and artifacts 0644, directories 0755."""
    db = tmp_path / "data" / "nested" / "scheduler.db"  # the scheduler creates both directories
    seen = _exercise(db, {}, tmp_path)
    assert mode(db) == 0o600
    assert seen["live"] == {"wal": 0o600, "shm": 0o600, "pid": 0o600}
    assert mode(tmp_path / "data") == 0o700 and mode(db.parent) == 0o700
    root = seen["root"]
    for name in ("big", "binary"):
        artifact = root / seen["runs"][name]["stdout_artifact"]
        assert mode(artifact) == 0o600, name
        assert mode(artifact.parent) == 0o700
    assert mode(root) == 0o700 and mode(root / "runs") == 0o700


def test_group_mode_shares_with_the_group_only(tmp_path: Path) -> None:
    env = {FILE_MODE_ENV: "group"}
    db = tmp_path / "shared" / "scheduler.db"
    seen = _exercise(db, env, tmp_path)
    assert mode(db) == 0o660
    assert seen["live"] == {"wal": 0o660, "shm": 0o660, "pid": 0o660}
    assert mode(db.parent) == 0o2770  # setgid: files created inside inherit the directory's group
    root = seen["root"]
    artifact = root / seen["runs"]["big"]["stdout_artifact"]
    assert mode(artifact) == 0o660 and mode(artifact.parent) == 0o2770 and mode(root) == 0o2770


def test_existing_files_keep_their_mode_and_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "scheduler.db"
    cli(db, "jobs", "add", ADD_JOB)  # only commands adding jobs create a missing database (issue 30)
    os.chmod(db, 0o640)  # an operator's deliberate choice is not undone on the next open
    cli(db, "jobs", "list")
    assert mode(db) == 0o640
    refused = cli(tmp_path / "other.db", "jobs", "add", ADD_JOB, env={FILE_MODE_ENV: "world"}, check=False)
    assert refused["code"] == "CONFIG_INVALID" and FILE_MODE_ENV in refused["error"]
    assert not (tmp_path / "other.db").exists()


def test_doctor_warns_about_world_access_without_failing(tmp_path: Path) -> None:
    db = tmp_path / "scheduler.db"
    cli(db, "jobs", "add", ADD_JOB)  # only commands adding jobs create a missing database (issue 30)
    report = cli(db, "doctor")
    check = next(c for c in report["checks"] if c["check"] == "file_modes")
    assert check["ok"] is True and check["warning"] is False and "no world access" in check["detail"]
    os.chmod(db, 0o644)
    (tmp_path / "artifacts").mkdir(mode=0o755)
    os.chmod(tmp_path / "artifacts", 0o755)
    report = cli(db, "doctor")  # still healthy (exit 0): a warning, not a failure
    check = next(c for c in report["checks"] if c["check"] == "file_modes")
    assert check["ok"] is True and check["warning"] is True
    assert f"{db} (0644)" in check["detail"] and "artifacts (0755)" in check["detail"]
    human = subprocess.run([*scheduler_cmd(), "--db", str(db), "doctor"], capture_output=True, text=True, timeout=60)
    assert human.returncode == 0 and "warning: readable or writable by every user" in human.stdout


def _export(db: Path, output: Path, umask: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", "export", "--output", str(output)], capture_output=True,
                          text=True, timeout=120, preexec_fn=lambda: os.umask(umask))


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask022", "umask000"])
def test_export_output_is_private_whatever_the_umask_and_when_the_file_exists(tmp_path: Path, umask: int) -> None:
    """Issue 30, defect 10: ``export --output`` was 0644 (0666 under umask 000), and it holds every job spec."""
    db = tmp_path / "scheduler.db"
    cli(db, "jobs", "add", json.dumps({"name": "spec", "schedule_kind": "manual", "payload_message": "echo the-spec"}))
    fresh = tmp_path / "fresh.toml"
    out = _export(db, fresh, umask)
    assert out.returncode == 0, out
    assert mode(fresh) == 0o600 and "the-spec" in fresh.read_text()
    existing = tmp_path / "existing.toml"
    existing.write_text("old contents\n")
    os.chmod(existing, 0o666)
    out = _export(db, existing, umask)
    assert out.returncode == 0, out
    assert mode(existing) == 0o600 and existing.read_text() == fresh.read_text()
    link = tmp_path / "link.toml"
    link.symlink_to(existing)  # a symlink is followed: its target is replaced, the link stays
    assert _export(db, link, umask).returncode == 0
    assert link.is_symlink() and mode(existing) == 0o600
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused = _export(db, fifo, umask)  # what is not a regular file is not replaced (nor written into)
    assert refused.returncode != 0 and json.loads(refused.stdout.strip().splitlines()[-1])["code"] == "EXPORT_WRITE_FAILED"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


# -- other users -----------------------------------------------------------------------------------


def _code_unreachable_by_others() -> str | None:
    """Why another user cannot run this checkout's code (a directory on the way is closed to others), or None."""
    import scheduler

    for code_path in (SITE_PACKAGES, Path(scheduler.__file__).resolve().parent):
        for directory in [code_path, *code_path.parents]:
            if directory.exists() and not directory.stat().st_mode & stat.S_IXOTH:
                return (f"other users cannot reach this checkout's code: {directory} is closed to them "
                        f"({oct(directory.stat().st_mode & 0o777)}); clone into a directory other users can traverse")
    return None


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A world-writable sticky directory like /tmp, reachable by other users (pytest's tmp dirs are 0700)."""
    if os.geteuid() != 0:
        pytest.skip("switching to other users needs root")
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"no {SYSTEM_PYTHON} for other users (this interpreter is under a 0700 home)")
    reason = _code_unreachable_by_others()
    if reason:
        pytest.skip(reason)
    path = Path(tempfile.mkdtemp(prefix="scheduler-modes-", dir="/tmp"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(uid: int, gid: int, groups: list[int], db: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    """``scheduler --db DB --json ARGS`` as another user (umask 022), with the same code as this test."""
    code = (f"import site, sys; site.addsitedir({str(SITE_PACKAGES)!r}); "
            "from scheduler.cli.main import main; sys.exit(main(sys.argv[1:]))")

    def switch() -> None:
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
        os.umask(0o022)

    out = subprocess.run([str(SYSTEM_PYTHON), "-c", code, "--db", str(db), "--json", *args], capture_output=True, text=True,
                         timeout=120, cwd="/", preexec_fn=switch,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **(env or {})})
    assert "Traceback" not in out.stdout + out.stderr, out
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def _job(name: str) -> str:
    return json.dumps({"name": name, "schedule_kind": "manual", "payload_message": "true"})


def _foreign_files(directory: Path, owner: int) -> list[str]:
    return sorted(f"{p.name} uid={p.stat().st_uid} {oct(mode(p))}" for p in directory.rglob("*") if p.stat().st_uid != owner)


OWNER, OTHER, MEMBER, GROUP = 60001, 65534, 60002, 60100


def test_another_user_cannot_lock_the_owner_out(shared_dir: Path) -> None:
    """Before the fix: the other user's failed open left -wal/-shm (0644, theirs); the owner then got
    ``DB_INIT_FAILED: attempt to write a readonly database``."""
    db = shared_dir / "scheduler.db"
    code, _ = as_user(OWNER, OWNER, [], db, "jobs", "add", _job("first"))
    assert code == 0
    assert mode(db) == 0o600 and db.stat().st_uid == OWNER
    code, refused = as_user(OTHER, OTHER, [], db, "jobs", "list")
    assert code != 0 and refused["ok"] is False  # cannot open someone else's private database
    assert _foreign_files(shared_dir, OWNER) == []  # and left nothing behind
    code, added = as_user(OWNER, OWNER, [], db, "jobs", "add", _job("second"))
    assert code == 0, added
    code, listed = as_user(OWNER, OWNER, [], db, "jobs", "list")
    assert code == 0 and {j["name"] for j in listed["jobs"]} == {"first", "second"}


def test_group_mode_lets_group_members_share_without_locking_anyone_out(shared_dir: Path) -> None:
    env = {FILE_MODE_ENV: "group"}
    db = shared_dir / "team" / "scheduler.db"
    code, _ = as_user(OWNER, GROUP, [], db, "jobs", "add", _job("first"), env=env)
    assert code == 0
    assert mode(db.parent) == 0o2770 and mode(db) == 0o660 and db.stat().st_gid == GROUP
    code, added = as_user(MEMBER, MEMBER, [GROUP], db, "jobs", "add", _job("by-member"), env=env)
    assert code == 0, added
    code, refused = as_user(OTHER, OTHER, [], db, "jobs", "list", env=env)
    assert code != 0 and refused["ok"] is False  # outside the group: no access at all
    for path in db.parent.iterdir():  # whatever the member left is the group's too
        assert path.stat().st_gid == GROUP and mode(path) & 0o060 == 0o060, path
    code, added = as_user(OWNER, GROUP, [], db, "jobs", "add", _job("second"), env=env)
    assert code == 0, added
