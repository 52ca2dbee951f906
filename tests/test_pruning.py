"""Evidence retention and run pruning: ``retention_until``, ``runs prune``, tombstones, files, the one event.

Runs are real (a dispatcher in the test process runs real shell commands and testkit
steps on SQLite and PostgreSQL); evidence rows for the pruning matrix are written the
way the completion transaction stores them, with the retention deadline each case needs
(one already passed, one NULL = forever, one with a payload bound to another run).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core.queue import enqueue_manual
from scheduler.evidence.retention import MAX_RETENTION_MS, retention_ms, retention_until
from scheduler.ops.pruning import EVENT_KIND, prune_runs
from scheduler.testing import add_job, run_rows, wait_for

DAY = 86_400_000


# -- retention policies -------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "period"), [
    ("30m", 30 * 60_000), ("12h", 12 * 3_600_000), ("90d", 90 * DAY), ("2w", 14 * DAY), ("7y", 7 * 365 * DAY),
    ("100y", 100 * 365 * DAY), ("forever", None), ("indefinite", None), (None, None),
])
def test_retention_until_of_each_policy(policy: str | None, period: int | None) -> None:
    now = 1_767_225_600_000
    assert retention_ms(policy) == period
    assert retention_until(policy, now) == (None if period is None else now + period)


@pytest.mark.parametrize("policy", ["0d", "101y", "36501d", "5 d", " 5d", "-1d", "+1d", "1M", "1s", "1.5d", "", "d", "٣d",
                                    "forever ", "Forever", "1d2h", 5, ["1d"], True])
def test_retention_refuses_anything_else(policy: Any) -> None:
    with pytest.raises(SchedulerError) as err:
        retention_until(policy, 0)
    assert err.value.code == "EVIDENCE_RETENTION_INVALID"


def test_retention_limit_is_one_hundred_years() -> None:
    assert retention_ms("100y") == MAX_RETENTION_MS and retention_ms("5214w") < MAX_RETENTION_MS
    with pytest.raises(SchedulerError):
        retention_ms("5215w")


# -- pruning ------------------------------------------------------------------------------------


def _runs(store: Any, dispatcher: Any, tmp_path: Path, commands: dict[str, tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Run each ``label -> (executor, payload)`` once through a real dispatcher; the finished run rows by label."""
    jobs = {label: add_job(store, executor=executor, payload_message=payload) for label, (executor, payload) in commands.items()}
    d = dispatcher(artifacts_root=tmp_path / "artifacts")
    for job in jobs.values():
        enqueue_manual(store, job["id"])
    out = {}
    for label, job in jobs.items():
        out[label] = wait_for(lambda j=job: next((r for r in run_rows(store, j["id"]) if r["finished_at"]), None),
                              timeout=30, what=f"run of {label}")
    d.stop()
    return out


def _age(store: Any, run: dict[str, Any], days: int) -> None:
    with store.transaction() as tx:
        at = now_ms() - days * DAY
        tx.execute("UPDATE runs SET finished_at = ?, started_at = ?, created_at = ? WHERE id = ?", (at, at - 500, at - 1000, run["id"]))


def _evidence(store: Any, run: dict[str, Any], *, retention_until: int | None, payload_run: str | None = None) -> str:
    """An evidence row as the completion transaction writes it (canonical payload bound to the run)."""
    payload = json.dumps({"run_id": payload_run or run["id"], "job_id": run["job_id"], "result": {"status": run["status"]}},
                         sort_keys=True, separators=(",", ":"))
    record_id = str(uuid.uuid4())
    with store.transaction() as tx:
        tx.execute(
            "INSERT INTO evidence_records(id, run_id, job_id, provider, methods, payload_sha256, canonical_payload, envelope,"
            " artifact_digest, verified, created_at, status, retention_policy, retention_until)"
            " VALUES (?, ?, ?, 'checksum', '[\"sha256\"]', ?, ?, '{}', ?, 0, ?, 'attested', ?, ?)",
            (record_id, run["id"], run["job_id"], hashlib.sha256(payload.encode()).hexdigest(), payload,
             run.get("artifact_digest"), now_ms(), "test", retention_until),
        )
    return record_id


def _count(store: Any, sql: str, params: tuple[Any, ...] = ()) -> int:
    with store.read() as tx:
        return int(tx.scalar(sql, params))


def test_prune_keeps_retained_evidence_deletes_expired_and_leaves_tombstones(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    big = "head -c 200000 /dev/zero | tr '\\0' x"
    runs = _runs(store, dispatcher, tmp_path, {
        "retained": ("shell", big), "expired": ("testkit", "echo:a"), "plain": ("testkit", "echo:b"),
        "recent": ("testkit", "echo:c"), "referenced": ("testkit", "echo:d"), "unbound": ("testkit", "echo:e"),
    })
    root = tmp_path / "artifacts"
    assert runs["retained"]["stdout_artifact"], "the big output must be offloaded"
    offloaded = root / runs["retained"]["stdout_artifact"]
    assert offloaded.is_file()
    for label in ("retained", "expired", "plain", "referenced", "unbound"):
        _age(store, runs[label], 40)
    kept_id = _evidence(store, runs["retained"], retention_until=None)
    _evidence(store, runs["expired"], retention_until=now_ms() - DAY)
    _evidence(store, runs["unbound"], retention_until=None, payload_run=runs["plain"]["id"])
    with store.transaction() as tx:  # pending retry work bound to "referenced" as its source run
        tx.execute("INSERT INTO job_dispatch_queue(id, job_id, kind, status, due_at, created_at, updated_at, source_run_id)"
                   " VALUES (?, ?, 'retry', 'pending', ?, ?, ?, ?)",
                   (f"{runs['referenced']['job_id']}:retry:x", runs["referenced"]["job_id"], now_ms() + DAY, now_ms(), now_ms(),
                    runs["referenced"]["id"]))
    events_before = _count(store, "SELECT COUNT(*) FROM runtime_events")

    plan = prune_runs(store, older_than_ms=30 * DAY, dry_run=True, artifacts_root=root)
    assert sorted(plan.pruned) == sorted(runs[k]["id"] for k in ("retained", "expired", "plain"))
    assert _count(store, "SELECT COUNT(*) FROM runs") == 6 and offloaded.is_file(), "a dry run changes nothing"
    assert _count(store, "SELECT COUNT(*) FROM runtime_events") == events_before

    report = prune_runs(store, older_than_ms=30 * DAY, artifacts_root=root)
    assert sorted(report.pruned) == sorted(plan.pruned)
    assert report.tombstoned == [runs["retained"]["id"]] and report.evidence_deleted == [runs["expired"]["id"]]
    assert [s["run_id"] for s in report.skipped] == [runs["unbound"]["id"]] and "another run" in report.skipped[0]["reason"]
    with store.read() as tx:
        left = {r["id"] for r in tx.all("SELECT id FROM runs")}
        evidence = {r["run_id"]: r for r in tx.all("SELECT * FROM evidence_records")}
        tombstones = tx.all("SELECT * FROM run_tombstones")
        events = tx.all("SELECT * FROM runtime_events WHERE kind = ?", (EVENT_KIND,))
    assert left == {runs[k]["id"] for k in ("recent", "referenced", "unbound")}
    assert set(evidence) == {runs["retained"]["id"], runs["unbound"]["id"]}, "retained evidence outlives its run; expired goes"
    assert len(tombstones) == 2  # issue 29, defect 8: the run whose expired evidence went leaves one too
    (stone,) = [t for t in tombstones if t["run_id"] == runs["retained"]["id"]]
    (gone,) = [t for t in tombstones if t["run_id"] == runs["expired"]["id"]]
    assert (gone["evidence_id"], gone["reason"]) == (None, "pruned; evidence expired and deleted")
    assert (stone["run_id"], stone["evidence_id"], stone["status"]) == (runs["retained"]["id"], kept_id, runs["retained"]["status"])
    assert stone["job_id"] == runs["retained"]["job_id"] and stone["job_name"] and stone["pruned_at"]
    assert not offloaded.exists() and not (root / "runs" / runs["retained"]["id"]).exists() and report.files_removed >= 1
    assert len(events) == 1, "one runtime event records the prune"
    data = json.loads(events[0]["data"])
    assert data["pruned"] == 3 and data["tombstoned"] == [runs["retained"]["id"]] and sorted(data["run_ids"]) == sorted(plan.pruned)

    again = prune_runs(store, older_than_ms=30 * DAY, artifacts_root=root)
    assert again.pruned == [] and _count(store, "SELECT COUNT(*) FROM runtime_events WHERE kind = ?", (EVENT_KIND,)) == 1


def test_prune_by_job_and_never_running_work(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    runs = _runs(store, dispatcher, tmp_path, {"a": ("testkit", "echo:a"), "b": ("testkit", "echo:b")})
    for run in runs.values():
        _age(store, run, 10)
    with store.transaction() as tx:  # a run still running (crashed dispatcher, not yet recovered) is never pruned
        tx.execute("INSERT INTO runs(id, job_id, status, attempt, created_at, started_at) VALUES (?, ?, 'running', 1, ?, ?)",
                   ("running-run", runs["a"]["job_id"], now_ms() - 20 * DAY, now_ms() - 20 * DAY))
    report = prune_runs(store, older_than_ms=DAY, job_id=runs["a"]["job_id"])
    assert report.pruned == [runs["a"]["id"]]
    with store.read() as tx:
        assert {r["id"] for r in tx.all("SELECT id FROM runs")} == {runs["b"]["id"], "running-run"}


def test_runs_prune_cli(store: Any, store_url: str, dispatcher: Any, tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    runs = _runs(store, dispatcher, tmp_path, {"old": ("testkit", "echo:a"), "new": ("testkit", "echo:b")})
    _age(store, runs["old"], 10)
    _evidence(store, runs["old"], retention_until=now_ms() + 365 * DAY)

    bad = cli("--json", "runs", "prune", "--older-than", "ten days")
    assert bad.code != 0 and bad.json["code"] == "INVALID_DURATION"
    missing = cli("--json", "runs", "prune", "--older-than", "1d", "--job", "no-such-job")
    assert missing.code != 0 and missing.json["code"] == "NOT_FOUND"
    dry = cli("--json", "runs", "prune", "--older-than", "1d", "--dry-run")
    assert dry.code == 0 and dry.json["dry_run"] is True and dry.json["run_ids"] == [runs["old"]["id"]]
    assert _count(store, "SELECT COUNT(*) FROM runs") == 2
    done = cli("--json", "runs", "prune", "--older-than", "1d")
    assert done.code == 0, done
    assert (done.json["pruned"], done.json["tombstoned"], done.json["evidence_deleted"]) == (1, 1, 0)
    assert _count(store, "SELECT COUNT(*) FROM run_tombstones WHERE run_id = ?", (runs["old"]["id"],)) == 1
    human = cli("runs", "prune", "--older-than", "1d")
    assert human.code == 0 and "pruned 0 run(s)" in human.out


def test_issue29_defect_8_pruning_expired_evidence_leaves_a_tombstone(store: Any, dispatcher: Any, tmp_path: Path, cli: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``evidence_deleted 1, tombstoned 0`` and no trace of the run; now a tombstone without an evidence row."""
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    runs = _runs(store, dispatcher, tmp_path, {"old": ("testkit", "echo:a")})
    _age(store, runs["old"], 10)
    _evidence(store, runs["old"], retention_until=now_ms() - DAY)
    done = cli("--json", "runs", "prune", "--older-than", "1d")
    assert done.code == 0, done
    assert (done.json["pruned"], done.json["tombstoned"], done.json["evidence_retained"], done.json["evidence_deleted"]) == (1, 1, 0, 1)
    assert done.json["counts"]["run_tombstones"] == 1 and done.json["counts"]["evidence_records"] == 1
    with store.read() as tx:
        stone = tx.one("SELECT * FROM run_tombstones WHERE run_id = ?", (runs["old"]["id"],))
        assert tx.scalar("SELECT COUNT(*) FROM evidence_records") == 0
    assert stone is not None and stone["evidence_id"] is None and stone["reason"] == "pruned; evidence expired and deleted"
    assert stone["job_id"] == runs["old"]["job_id"] and stone["status"] == "ok"
    # the run is known to have existed: its evidence is missing, not the run itself
    check = cli("--json", "runs", "evidence", runs["old"]["id"])
    assert check.code != 0 and check.json["code"] == "EVIDENCE_RECORD_MISSING", check
    human = cli("runs", "prune", "--older-than", "1d")
    assert human.code == 0 and "0 tombstoned (0 with retained evidence, 0 with expired evidence deleted)" in human.out
