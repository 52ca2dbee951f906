"""Retention as an operations duty: rules, the events delete guard, ``runs prune`` through the CLI, and the dispatcher duty.

Everything runs on a real SQLite file and on PostgreSQL (the ``store`` fixture). History
rows (old runs, settled outbox messages, old events) are written with the SQL the kernel
itself uses, aged as each case needs; the duty runs in real dispatchers (three of them
sharing one PostgreSQL database for the singleton test).
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core.events import append_event
from scheduler.core.job_retention import normalise_job_retention
from scheduler.ops.pruning import EVENT_KIND, prune
from scheduler.ops.retention_rules import Rules
from scheduler.settings import reload_settings
from scheduler.testing import add_job, wait_for

DAY = 86_400_000


def _run(store: Any, job: dict[str, Any], days: float, *, status: str = "ok", dispatch: str | None = None,
         stdout_artifact: str | None = None) -> str:
    """A terminal run of ``job`` that ended ``days`` ago (its finished dispatch too, when ``dispatch`` names one)."""
    run_id = str(uuid.uuid4())
    at = now_ms() - int(days * DAY)
    with store.transaction() as tx:
        if dispatch:
            tx.execute("INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, run_id)"
                       " VALUES (?, ?, 'manual', 'done', ?, ?, ?, ?)", (dispatch, job["id"], at, at, at, run_id))
        tx.execute("INSERT INTO runs(id, job_id, status, attempt, created_at, started_at, finished_at, dispatch_id, stdout_artifact)"
                   " VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)", (run_id, job["id"], status, at - 1000, at - 500, at, dispatch, stdout_artifact))
    return run_id


def _ids(store: Any, sql: str, params: tuple[Any, ...] = ()) -> set[Any]:
    with store.read() as tx:
        return {next(iter(r.values())) for r in tx.all(sql, params)}


def _count(store: Any, sql: str, params: tuple[Any, ...] = ()) -> int:
    with store.read() as tx:
        return int(tx.scalar(sql, params))


def _refused(store: Any, sql: str, params: tuple[Any, ...] = ()) -> SchedulerError:
    with pytest.raises(SchedulerError) as err, store.transaction() as tx:
        tx.execute(sql, params)
    return err.value


def _settings(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for key, value in values.items():
        monkeypatch.setenv(f"SCHEDULER_RETENTION_{key.upper()}", value)
    reload_settings()


# -- the job field ----------------------------------------------------------------------------------


def test_job_retention_field_is_validated_and_normalised() -> None:
    assert normalise_job_retention({"keep_runs": 5, "max_age": "720h"}) == ({"keep_runs": 5, "max_age": "30d"}, [])
    assert normalise_job_retention({"max_age": "forever"})[0] == {"max_age": "forever"}
    for bad, code in [({}, "REQUIRED"), ({"keep_runs": 0}, "OUT_OF_RANGE"), ({"keep_runs": True}, "INVALID_TYPE"),
                      ({"max_age": "30s"}, "OUT_OF_RANGE"), ({"max_age": "soon"}, "INVALID_DURATION"),
                      ({"keep": 3}, "UNKNOWN_FIELD"), ([3], "INVALID_TYPE")]:
        value, problems = normalise_job_retention(bad)
        assert value is None and problems[0]["code"] == code, bad


def test_retention_is_a_job_field_outside_the_artifact(store: Any, cli: Any) -> None:
    bad = cli("--json", "jobs", "add", json.dumps({"name": "r", "executor": "testkit", "schedule_kind": "manual",
                                                   "payload_message": "echo:x", "retention": {"keep_runs": -1}}))
    assert bad.code != 0 and bad.json["code"] == "VALIDATION_FAILED"
    assert bad.json["details"][0]["field"] == "retention.keep_runs"
    assert _count(store, "SELECT COUNT(*) FROM jobs") == 0, "a refused spec stores nothing"
    job = add_job(store, name="r", payload_message="echo:x")
    done = cli("--json", "jobs", "update", "r", json.dumps({"retention": {"keep_runs": 3, "max_age": "48h"}}))
    assert done.code == 0, done
    with store.read() as tx:
        row = tx.one("SELECT retention, artifact_digest FROM jobs WHERE id = ?", (job["id"],))
    assert json.loads(row["retention"]) == {"keep_runs": 3, "max_age": "2d"}
    assert row["artifact_digest"] == job["artifact_digest"], "retention does not change what runs: same artifact"


# -- the events guard -------------------------------------------------------------------------------


def test_events_stay_append_only_except_below_a_recorded_cutoff(store: Any) -> None:
    job = add_job(store, payload_message="echo:x")
    with store.transaction() as tx:
        append_event(tx, "test.old", job_id=job["id"], actor="test", at=now_ms() - 3 * DAY, data={})
        append_event(tx, "test.recent", job_id=job["id"], actor="test", at=now_ms() - DAY // 2, data={})
    kinds = "SELECT kind FROM runtime_events WHERE kind LIKE 'test.%'"
    for sql in ("DELETE FROM runtime_events", "DELETE FROM runtime_events WHERE kind = 'test.old'",
                "UPDATE runtime_events SET kind = 'x' WHERE kind = 'test.old'"):
        err = _refused(store, sql)
        assert err.code == "CONSTRAINT_VIOLATION" and "EVENTS_APPEND_ONLY" in err.message, sql
    if store.dialect == "postgresql":
        assert "EVENTS_APPEND_ONLY" in _refused(store, "TRUNCATE runtime_events").message
    # A cutoff younger than an hour is refused by the table itself; cutoffs are append-only.
    assert _refused(store, "INSERT INTO prune_cutoffs(at, events_before) VALUES (?, ?)", (now_ms(), now_ms() - 60_000)).code \
        == "CONSTRAINT_VIOLATION"
    assert _ids(store, kinds) == {"test.old", "test.recent"}, "nothing changed"

    report = prune(store, Rules(event_age_ms=DAY), actor="test")
    assert report.events >= 1 and report.events_before is not None
    assert _ids(store, kinds) == {"test.recent"}, "only the event older than the cutoff went"
    data = json.loads(_ids(store, "SELECT data FROM runtime_events WHERE kind = ?", (EVENT_KIND,)).pop())
    assert data["counts"]["runtime_events"] == report.events, "the pass records what it pruned"
    for sql in ("DELETE FROM runtime_events", "DELETE FROM runtime_events WHERE kind = 'test.recent'"):
        assert "EVENTS_APPEND_ONLY" in _refused(store, sql).message, "after a pass, newer events are as guarded as before"
    assert "PRUNE_CUTOFFS_APPEND_ONLY" in _refused(store, "UPDATE prune_cutoffs SET events_before = ?", (now_ms(),)).message
    assert "PRUNE_CUTOFFS_APPEND_ONLY" in _refused(store, "DELETE FROM prune_cutoffs").message


# -- runs prune through the CLI ---------------------------------------------------------------------


def test_runs_prune_cli_applies_every_rule_and_keeps_what_is_needed(store: Any, cli: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "artifacts"
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(root))
    a = add_job(store, name="a", payload_message="echo:a")
    b = add_job(store, name="b", payload_message="echo:b", retention={"max_age": "forever"})
    c = add_job(store, name="c", payload_message="echo:c", retention={"keep_runs": 1})
    a_runs = [_run(store, a, d, dispatch=f"{a['id']}:manual:{d}") for d in (5, 4, 3, 2, 1)]  # oldest first
    (root / "runs" / a_runs[0]).mkdir(parents=True)
    (root / "runs" / a_runs[0] / "stdout").write_bytes(b"x" * 10)
    b_runs = [_run(store, b, d) for d in (9, 8, 7)]
    c_runs = [_run(store, c, d) for d in (6, 5, 4)]
    failed_part_run = a_runs[1]
    with store.transaction() as tx:
        now = now_ms()
        # c's oldest run is the source of a retry still to come; a's second oldest has a failed part (retryable).
        tx.execute("INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, source_run_id)"
                   " VALUES (?, ?, 'retry', 'pending', ?, ?, ?, ?)", (f"{c['id']}:retry:1", c["id"], now + DAY, now, now, c_runs[0]))
        for group, status, run_id, age in [("old-done", "delivered", a_runs[2], 3 * DAY), ("old-failed", "failed", failed_part_run, 3 * DAY),
                                           ("new-done", "delivered", a_runs[4], 0), ("old-pending", "pending", None, 3 * DAY)]:
            for part in (1, 2):
                tx.execute("INSERT INTO delivery_outbox(id, run_id, job_id, channel, idempotency_key, group_key, part_index,"
                           " part_count, body, status, due_at, created_at, updated_at) VALUES (?, ?, ?, 'file', ?, ?, ?, 2, 'b', ?, ?, ?, ?)",
                           (f"{group}:{part}", run_id, a["id"], f"{group}:{part}", group, part, status, now - age, now - age, now - age))
        tx.execute("INSERT INTO delivery_attachments(id, outbox_id, ordinal, name, mime_type, size_bytes, sha256, content, created_at)"
                   " VALUES ('att', 'old-done:1', 0, 'o.txt', 'text/plain', 1, ?, ?, ?)", ("0" * 64, b"x", now))
        tx.execute("INSERT INTO execution_artifacts(digest, kind, job_id, payload, payload_bytes, created_at)"
                   " VALUES (?, 'native', 'gone', '{}', 2, ?)", ("sha256:" + "1" * 64, now - 2 * DAY))
    orphan_old, orphan_new = root / "runs" / "orphan-old", root / "runs" / "orphan-new"
    for d in (orphan_old, orphan_new):
        d.mkdir(parents=True)
        (d / "stdout").write_bytes(b"y")
    os.utime(orphan_old, (time.time() - 7200, time.time() - 7200))

    unset = cli("--json", "runs", "prune", "--job", "a")
    assert unset.code != 0 and unset.json["code"] == "RETENTION_NOT_CONFIGURED"
    zero = cli("--json", "runs", "prune", "--keep", "0")
    assert zero.code != 0 and zero.json["code"] == "INVALID_ARGUMENT"

    _settings(monkeypatch, keep_runs="2", delivered_outbox_age="1d")
    all_rows = _count(store, "SELECT COUNT(*) FROM runs")
    dry = cli("--json", "runs", "prune", "--dry-run")
    assert dry.code == 0, dry
    assert _count(store, "SELECT COUNT(*) FROM runs") == all_rows and orphan_old.is_dir(), "a dry run changes nothing"
    assert _count(store, "SELECT COUNT(*) FROM prune_cutoffs") == 0

    done = cli("--json", "runs", "prune")
    assert done.code == 0, done
    assert set(done.json["run_ids"]) == set(dry.json["run_ids"]) == {a_runs[0], a_runs[2], c_runs[1]}
    left = _ids(store, "SELECT id FROM runs")
    assert {a_runs[3], a_runs[4]} <= left, "a keeps its newest two (settings)"
    assert failed_part_run in left, "a run whose failed part may be re-armed stays"
    assert set(b_runs) <= left, "b keeps everything (max_age forever)"
    assert c_runs[0] in left and c_runs[2] in left, "c keeps its newest one and the source of pending work"
    assert _ids(store, "SELECT id FROM job_dispatch_queue WHERE job_id = ?", (a["id"],)) == {
        f"{a['id']}:manual:{d}" for d in (4, 2, 1)}, "the pruned runs' finished dispatches went with them"
    assert _ids(store, "SELECT group_key FROM delivery_outbox") == {"old-failed", "new-done", "old-pending"}
    assert _count(store, "SELECT COUNT(*) FROM delivery_attachments") == 0
    assert _count(store, "SELECT COUNT(*) FROM execution_artifacts WHERE digest = ?", ("sha256:" + "1" * 64,)) == 0
    assert _count(store, "SELECT COUNT(*) FROM execution_artifacts WHERE digest = ?", (a["artifact_digest"],)) == 1
    assert not (root / "runs" / a_runs[0]).exists(), "a pruned run's files go with it"
    assert not orphan_old.exists() and orphan_new.is_dir(), "an old orphan goes; a fresh one may be a starting run's"
    assert done.json["orphans"] == ["orphan-old"]
    assert done.json["counts"]["delivery_outbox"] == 2 and done.json["counts"]["job_dispatch_queue"] == 2  # old-done: with its run
    assert _count(store, "SELECT COUNT(*) FROM prune_cutoffs") == 1
    (event,) = _ids(store, "SELECT data FROM runtime_events WHERE kind = ?", (EVENT_KIND,))
    assert json.loads(event)["counts"] == done.json["counts"]

    flag = cli("--json", "runs", "prune", "--job", "b", "--keep", "1")
    assert flag.code == 0 and flag.json["pruned"] == 0, "a flag does not override b's forever"
    aged = cli("--json", "runs", "prune", "--job", "b", "--keep", "1", "--older-than", "8d")
    assert aged.code == 0 and set(aged.json["run_ids"]) == set(b_runs[:2]), "--older-than wins over the job's max_age"
    human = cli("runs", "prune", "--dry-run")
    assert human.code == 0 and "would prune 0 run(s)" in human.out


# -- the dispatcher duty ----------------------------------------------------------------------------


def test_dispatcher_applies_retention_on_sqlite(store: Any, dispatcher: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if store.dialect != "sqlite":
        pytest.skip("the shared-database duty is tested with three dispatchers below")
    job = add_job(store, payload_message="echo:x")
    runs = [_run(store, job, d) for d in (4, 3, 2, 1)]
    _settings(monkeypatch, keep_runs="1", interval="1s")
    d = dispatcher(artifacts_root=tmp_path / "artifacts")
    wait_for(lambda: _ids(store, "SELECT id FROM runs") == {runs[-1]}, timeout=20, what="retention pass")
    d.stop()
    (row,) = _ids(store, "SELECT actor FROM prune_cutoffs")
    assert row == d.dispatcher.owner


def test_three_dispatchers_apply_retention_once_per_interval(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.plugins.stores import open_store
    from scheduler.testing import RunningDispatcher

    store = open_store(pg_url)
    try:
        jobs = [add_job(store, payload_message=f"echo:{i}") for i in range(3)]
        runs = {j["id"]: [_run(store, j, d) for d in (30, 20, 10, 5, 4, 3, 2, 1)] for j in jobs}
        keep_source = runs[jobs[0]["id"]][0]
        with store.transaction() as tx:  # a finished chain dispatch still names its source run: lineage stays
            tx.execute("INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, source_run_id)"
                       " VALUES ('chain-x', ?, 'chain', 'done', 0, 0, 0, ?)", (jobs[1]["id"], keep_source))
            for i in range(1200):  # more than two batches of old events
                append_event(tx, "test.old", actor="test", at=now_ms() - 2 * DAY - i, data={})
        _settings(monkeypatch, keep_runs="3", event_age="1d", interval="3s", batch="500")
        started = time.monotonic()
        ds = [RunningDispatcher(store, artifacts_root=tmp_path / "artifacts", exclusive=False) for _ in range(3)]
        expected = {r for j in jobs for r in runs[j["id"]][-3:]} | {keep_source}
        wait_for(lambda: _ids(store, "SELECT id FROM runs") == expected, timeout=30, what="retention pass")
        time.sleep(max(0.0, 10.0 - (time.monotonic() - started)))
        for d in ds:
            d.stop()
        with store.read() as tx:
            cutoffs = tx.all("SELECT at, actor FROM prune_cutoffs ORDER BY at")
            events = [json.loads(r["data"]) for r in tx.all("SELECT data FROM runtime_events WHERE kind = ?", (EVENT_KIND,))]
            old_left = tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind = 'test.old'")
        owners = {d.dispatcher.owner for d in ds}
        assert 2 <= len(cutoffs) <= 4, cutoffs
        assert all(b["at"] - a["at"] >= 3000 for a, b in itertools.pairwise(cutoffs)), "one pass per interval, whoever runs it"
        assert {c["actor"] for c in cutoffs} <= owners
        deleted = sum(e["counts"]["runs"] for e in events)
        assert deleted == 3 * 8 - len(expected), "every run deleted exactly once, counted once"
        assert sum(e["counts"]["runtime_events"] for e in events) >= 1200 and old_left == 0
        assert _count(store, "SELECT COUNT(*) FROM job_dispatch_queue WHERE id = 'chain-x'") == 1
    finally:
        store.close()
