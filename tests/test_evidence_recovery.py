"""A run of an evidence job whose ``scheduler run`` process is killed with SIGKILL gets terminal evidence on recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from evidence_support import events_of, evidence_row
from kernel_testing import RunningDispatcher, add_job, run_rows, scheduler_cmd, wait_for

from scheduler.core.queue import enqueue_manual
from scheduler.evidence.verify import verify_run


def test_kill9_mid_run_gives_an_interrupted_evidence_row(store: Any, store_url: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    job = add_job(store, name="long", executor="shell", payload_message="sleep 30", evidence={"retention": "7d"})
    plain = add_job(store, name="plain", executor="shell", payload_message="sleep 30")
    log = open(tmp_path / "dispatcher.log", "wb")  # noqa: SIM115 - the child's log, open for its life
    proc = subprocess.Popen([*scheduler_cmd(), "--db", store_url, "run", "--lease-ttl", "1500ms", "--grace", "1s"],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        enqueue_manual(store, job["id"])
        enqueue_manual(store, plain["id"])
        for j in (job, plain):
            wait_for(lambda j=j: [r for r in run_rows(store, j["id"]) if r["status"] == "running" and r["executor_handle"]],
                     timeout=30, what="process recorded")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    d = RunningDispatcher(store)
    try:
        run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "crashed"], timeout=30, what="crashed")[0]
        other = wait_for(lambda: [r for r in run_rows(store, plain["id"]) if r["status"] == "crashed"], timeout=30,
                         what="crashed")[0]
    finally:
        d.stop()
    assert run["evidence_status"] == "interrupted" and other["evidence_status"] is None
    row = evidence_row(store, run["id"])
    assert row["status"] == "interrupted" and row["error_code"] == "INTERRUPTED" and row["envelope"] is None
    assert row["provider"] == "checksum" and row["retention_policy"] == "7d" and row["retention_until"] > row["created_at"]
    payload = json.loads(row["canonical_payload"])
    assert payload["run_id"] == run["id"] and payload["result"]["status"] == "crashed"
    assert payload["artifact_digest"] == run["artifact_digest"] == row["artifact_digest"]
    assert evidence_row(store, other["id"]) is None
    assert [k for k, _ in events_of(store, run["id"]) if k.startswith("evidence.")] == ["evidence.interrupted"]
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_NOT_VERIFIED" and check.details["record_error_code"] == "INTERRUPTED"
