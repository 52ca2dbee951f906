"""Issue 30 defects 2 and 7: a dispatcher whose SQLite file is deleted stops (``DB_VANISHED``) and never starts over
on an empty database; a full disk is ``DB_DISK_FULL``, waited out and shown by ``status``.

Real ``scheduler run`` subprocesses on a real SQLite file, real ``rm`` of its files.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from kernel_testing import add_job, scheduler_cmd, wait_for

from scheduler.base.errors import SchedulerError
from scheduler.plugins.stores import open_store


def cli(db: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, with ``--json``."""
    return subprocess.run([*scheduler_cmd(), "--json", "--db", str(db), *args], capture_output=True, text=True,
                          timeout=timeout)


def last_json(text: str) -> dict:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("{")]
    assert lines, text
    return json.loads(lines[-1])


def test_deleting_the_database_stops_the_dispatcher_at_once_and_nothing_recreates_it(tmp_path: Path) -> None:
    """``rm s.db s.db-wal s.db-shm`` under a running dispatcher: it stops within one renewal (TTL/3) with
    ``DB_VANISHED`` and a non-zero exit, runs nothing more into the deleted file, and no file reappears; the next
    ``scheduler run`` and ``status`` refuse the missing path (``DB_NOT_FOUND``) instead of creating an empty one."""
    db = tmp_path / "s.db"
    store = open_store(db)
    marks = tmp_path / "marks"
    add_job(store, name="tick", schedule_kind="every", schedule_every="1s", payload_message=f"touch:{marks}")
    store.close()
    log = tmp_path / "run.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*scheduler_cmd(), "--db", str(db), "run", "--lease-ttl", "1500ms", "--grace", "1s"],
                                stdout=fh, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: marks.exists() and len(marks.read_text().splitlines()) >= 2, timeout=30, what="runs")
            for name in ("s.db", "s.db-wal", "s.db-shm"):
                (tmp_path / name).unlink(missing_ok=True)
            deleted_at = time.monotonic()
            code = proc.wait(15)
            stopped_after = time.monotonic() - deleted_at
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    out = log.read_text(errors="replace")
    assert code != 0, out
    assert "DB_VANISHED" in out, out
    assert stopped_after < 1500 / 3000 + 2.5, (stopped_after, out)  # one renewal interval, plus the runs' kill grace
    assert "no such table" not in out, out
    assert not db.exists(), "something recreated the deleted database"
    count = len(marks.read_text().splitlines())
    time.sleep(1.0)
    assert len(marks.read_text().splitlines()) == count  # nothing runs any more

    again = cli(db, "run", "--duration", "2s")
    assert again.returncode != 0 and last_json(again.stdout)["code"] == "DB_NOT_FOUND", again
    status = cli(db, "status")
    assert status.returncode != 0 and last_json(status.stdout)["code"] == "DB_NOT_FOUND", status
    assert not db.exists(), "a command that does not add jobs created the database"
    added = cli(db, "jobs", "add", json.dumps({"name": "fresh", "schedule_kind": "manual", "payload_message": "true"}))
    assert added.returncode == 0, added  # adding a job on a path that never held a database still creates one
    assert db.exists()


def test_a_replaced_database_file_is_refused_by_an_open_store(tmp_path: Path) -> None:
    """The path now names another file (restored by hand under an open store): ``verify_identity`` and any new
    connection say ``DB_VANISHED`` rather than mixing two databases in one process."""
    db = tmp_path / "s.db"
    store = open_store(db)
    try:
        store.verify_identity()  # the file it opened: nothing to say
        other = open_store(tmp_path / "other.db")
        other.close()
        os.replace(tmp_path / "other.db", db)
        with pytest.raises(SchedulerError) as err:
            store.verify_identity()
        assert err.value.code == "DB_VANISHED" and "replaced" in err.value.message
    finally:
        store.close()
    with pytest.raises(SchedulerError) as again:
        store.initialize()  # reopening the same store object: still not the file it had
    assert again.value.code == "DB_VANISHED"


def test_a_store_made_without_create_refuses_a_missing_path(tmp_path: Path) -> None:
    """``create=False`` (every CLI command but those adding jobs): ``DB_NOT_FOUND``, and no file is left behind."""
    db = tmp_path / "missing.db"
    with pytest.raises(SchedulerError) as err:
        open_store(db, create=False)
    assert err.value.code == "DB_NOT_FOUND" and err.value.details == {"path": str(db)}
    assert not db.exists()


def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` on ``where``; the reason it cannot be done here, or None once mounted."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (the disk-full test fills a small file system of its own)"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"mount -t tmpfs is not permitted here: {done.stderr.strip()}"
    return None


def test_a_full_disk_is_db_disk_full_waited_out_and_shown_by_status(tmp_path: Path) -> None:
    """A real dispatcher on a 4 MB tmpfs that a filler file then fills: its writes fail ``SQLITE_FULL``; it says
    ``DB_DISK_FULL``, waits and retries (no exit, no ``INTERNAL_ERROR``), runs again once space is freed, and
    ``status`` shows the episode (``db_disk_full``) and the free space."""
    mnt = tmp_path / "small"
    reason = _mount_tmpfs(mnt, "4m")
    if reason:
        pytest.skip(reason)
    proc = None
    try:
        db = mnt / "s.db"
        store = open_store(db)
        job = add_job(store, name="tick", schedule_kind="every", schedule_every="1s", payload_message="echo:x")
        store.close()
        log = tmp_path / "run.log"
        fh = open(log, "wb")  # noqa: SIM115 - the child's log, open for its life
        proc = subprocess.Popen([*scheduler_cmd(), "--db", str(db), "run", "--lease-ttl", "60s", "--grace", "1s"],
                                stdout=fh, stderr=subprocess.STDOUT)
        wait_for(lambda: "ok     tick" in log.read_text(errors="replace"), timeout=30, what="a first run")
        filler = mnt / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
        wait_for(lambda: "DB_DISK_FULL" in log.read_text(errors="replace") or proc.poll() is not None, timeout=60,
                 what="the dispatcher meeting the full disk")
        time.sleep(3)  # several retries into the full disk
        assert proc.poll() is None, log.read_text(errors="replace")  # waiting, not exited
        filler.unlink()
        out_before = log.read_text(errors="replace")
        wait_for(lambda: "database available again" in log.read_text(errors="replace"), timeout=30, what="recovery")
        after = len(log.read_text(errors="replace").split("available again", 1)[1].split("ok     tick")) - 1
        wait_for(lambda: len(log.read_text(errors="replace").split("available again", 1)[1].split("ok     tick")) - 1
                 > after, timeout=30, what="runs after the disk was freed")
        status = cli(db, "status")
        assert status.returncode == 0, status
        shown = last_json(status.stdout)["status"]
        assert shown["db_disk_full"] is not None and shown["db_disk_full"]["attempts"] >= 1, shown["db_disk_full"]
        assert shown["free_bytes"] > 0
        assert proc.poll() is None
        proc.terminate()
        assert proc.wait(30) == 0, log.read_text(errors="replace")
        out = log.read_text(errors="replace")
        assert "INTERNAL_ERROR" not in out and "Traceback" not in out, out
        assert "database full (DB_DISK_FULL)" in out_before, out_before
        assert job["id"]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_sqlite_full_is_db_disk_full_for_every_statement(tmp_path: Path) -> None:
    """``SQLITE_FULL`` from a statement or a commit is ``DB_DISK_FULL`` (retryable for the dispatcher), never a raw
    ``OperationalError``. ``PRAGMA max_page_count`` (per connection) raises the same error class as a full disk."""
    from scheduler.core.dispatcher.config import is_transient

    store = open_store(tmp_path / "s.db")
    try:
        with store.transaction() as tx:
            pages = int(tx.scalar("PRAGMA page_count"))
            tx.scalar(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(SchedulerError) as err, store.transaction() as tx:
            tx.execute("CREATE TABLE filler(x BLOB)")
            tx.execute("INSERT INTO filler VALUES (zeroblob(1000000))")
        assert err.value.code == "DB_DISK_FULL" and is_transient(err.value), err.value
    finally:
        store.close()
