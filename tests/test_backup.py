"""scheduler backup / restore through the real CLI: a database under load (a real `scheduler run` process running many
short jobs) backed up, restored and passing `doctor`; restore refused while a dispatcher holds the database; PostgreSQL
refused with a pointer to the pg_dump recipe."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from kernel_testing import add_job, scheduler_cmd, wait_for

from scheduler.plugins.stores import open_store


def cli(db: Path | str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("jobs", "runs", "job_dispatch_queue")}
    finally:
        conn.close()


@pytest.fixture
def loaded(tmp_path: Path):
    """A SQLite database with a real dispatcher running many short jobs (and one whose output is offloaded)."""
    db = tmp_path / "live" / "scheduler.db"
    store = open_store(db)
    for i in range(8):
        add_job(store, executor="shell", name=f"tick-{i}", schedule_kind="every", schedule_every="1s", payload_message="echo tick")
    add_job(store, executor="shell", name="big", schedule_kind="every", schedule_every="1s", payload_message="head -c 150000 /dev/zero | tr '\\0' x")
    store.close()
    log = open(tmp_path / "dispatcher.log", "wb")  # noqa: SIM115 - the child's log, open for its life
    proc = subprocess.Popen([*scheduler_cmd(), "--db", str(db), "run", "--concurrency", "8", "--lease-ttl", "3s", "--grace", "1s"],
                            stdout=log, stderr=subprocess.STDOUT)
    yield db, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    log.close()


def test_backup_under_load_restores_and_passes_doctor(loaded, tmp_path: Path) -> None:
    db, proc = loaded
    wait_for(lambda: counts(db)["runs"] >= 30 and Path(db.parent / "artifacts").is_dir(), timeout=60, what="runs under load")
    before = counts(db)
    out = cli(db, "backup", str(tmp_path / "bk"))
    assert out.returncode == 0, out
    result = json.loads(out.stdout)["backup"]
    after = counts(db)
    assert proc.poll() is None  # the dispatcher kept running
    assert after["runs"] > before["runs"] or wait_for(lambda: counts(db)["runs"] > before["runs"], timeout=20)
    # a snapshot between the two moments, exactly as the manifest says
    assert before["runs"] <= result["rows"]["runs"] <= counts(db)["runs"]
    assert counts(tmp_path / "bk" / "scheduler.db") == {k: result["rows"][k] for k in ("jobs", "runs", "job_dispatch_queue")}
    assert result["artifacts"]["files"] >= 1 and result["missing_artifacts"] == []
    assert not list(tmp_path.glob(".bk.partial-*"))
    # a second backup into the same place is refused and changes nothing
    again = cli(db, "backup", str(tmp_path / "bk"))
    assert again.returncode != 0 and json.loads(again.stdout)["code"] == "BACKUP_TARGET_EXISTS"

    target = tmp_path / "restored" / "scheduler.db"
    out = cli(target, "restore", str(tmp_path / "bk"))
    assert out.returncode == 0, out
    assert counts(target) == counts(tmp_path / "bk" / "scheduler.db")
    doctor = cli(target, "doctor")
    assert doctor.returncode == 0, doctor.stdout
    assert json.loads(doctor.stdout)["healthy"] is True
    # every terminal run's offloaded output came along and still matches its SHA-256
    conn = sqlite3.connect(target)
    rows = conn.execute("SELECT id FROM runs WHERE stdout_artifact IS NOT NULL AND status = 'ok'").fetchall()
    conn.close()
    assert rows
    for (run_id,) in rows[:3]:
        got = subprocess.run([*scheduler_cmd(), "--db", str(target), "runs", "output", run_id], capture_output=True, timeout=60)
        assert got.returncode == 0 and got.stdout == b"x" * 150000, got.stderr


def test_restore_is_refused_while_a_dispatcher_holds_the_database(loaded, tmp_path: Path) -> None:
    db, proc = loaded
    wait_for(lambda: counts(db)["runs"] >= 3, timeout=60, what="runs")
    assert cli(db, "backup", str(tmp_path / "bk")).returncode == 0
    inode = db.stat().st_ino
    out = cli(db, "restore", str(tmp_path / "bk"))
    assert out.returncode != 0
    assert json.loads(out.stdout)["code"] == "RESTORE_DATABASE_IN_USE", out.stdout
    assert db.stat().st_ino == inode and not list(db.parent.glob("*.pre-restore-*"))
    assert proc.poll() is None
    # once the dispatcher is stopped, the same restore goes through atomically, keeping the old file beside it
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    out = cli(db, "restore", str(tmp_path / "bk"))
    assert out.returncode == 0, out
    restored = json.loads(out.stdout)["restore"]
    assert db.stat().st_ino != inode and Path(restored["kept"]["database"]).is_file()
    assert counts(db)["runs"] == restored["rows"]["runs"]
    assert cli(db, "doctor").returncode == 0


def test_restore_refuses_a_damaged_backup_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "scheduler.db"
    store = open_store(db)
    add_job(store, executor="shell", name="a", schedule_kind="every", schedule_every="1h", payload_message="true")
    store.close()
    assert cli(db, "backup", str(tmp_path / "bk")).returncode == 0
    with open(tmp_path / "bk" / "scheduler.db", "r+b") as fh:
        fh.seek(200)
        fh.write(b"\xff\xff")
    before = db.read_bytes()
    out = cli(db, "restore", str(tmp_path / "bk"))
    assert out.returncode != 0 and json.loads(out.stdout)["code"] == "BACKUP_INVALID"
    assert db.read_bytes() == before and not list(tmp_path.glob(".scheduler.db.restore-*"))
    out = cli(db, "restore", str(tmp_path / "nothing-here"))
    assert json.loads(out.stdout)["code"] == "NOT_FOUND"


def test_backup_on_postgresql_points_to_the_pg_dump_recipe(pg_url: str, tmp_path: Path) -> None:
    for command in ("backup", "restore"):
        out = cli(pg_url, command, str(tmp_path / "bk"))
        assert out.returncode != 0
        err = json.loads(out.stdout)
        assert err["code"] == "BACKUP_UNSUPPORTED_STORE" and "docs/operations.md" in err["error"]
    assert not (tmp_path / "bk").exists()
    assert "pg_dump" in (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
