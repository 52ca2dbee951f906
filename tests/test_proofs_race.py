"""The replay ledger under contention: of several dispatchers presenting one proof id, exactly one claim wins.

Two forms: three threads on three separate store connections released together by a barrier
(SQLite and PostgreSQL), and three real ``scheduler run --shared`` processes on PostgreSQL
claiming three dispatches of a job whose proof file holds one proof.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest
from kernel_testing import add_job, run_rows, scheduler_cmd, wait_for
from test_proofs_support import jwt_declaration, mint_jwt, rsa_key, write_public_pem

from scheduler.base.errors import SchedulerError
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.rows import JobRow
from scheduler.core.spec import spec_from_row
from scheduler.plugins.stores import open_store

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


@attrs.define
class Started:
    """The parts of a ``ClaimedRun`` the proof step reads."""

    run_id: str
    dispatch_id: str
    job: JobRow
    dispatch_kind: str = "manual"
    source_run_id: str | None = None


def test_three_connections_racing_for_one_proof_id_one_claim_wins(store_url: str, tmp_path: Path) -> None:
    from scheduler.pipeline.proofs import step as proofs

    key = rsa_key()
    pub = write_public_pem(key, tmp_path / "pub.pem")
    source = tmp_path / "proof.jwt"
    setup = open_store(store_url)
    try:
        job = add_job(setup, name="raced", payload_message="echo:x",
                      authorization_proof=jwt_declaration({"file": str(source)}, public_key_file=str(pub)))
        source.write_text(mint_jwt(key, job["artifact_digest"], jti="contested"))
        spec = spec_from_row(job)
        stores = [open_store(store_url) for _ in range(3)]
        barrier = threading.Barrier(3)
        outcomes: list[Any] = [None] * 3

        def contend(i: int) -> None:
            started = Started(run_id=f"run-{i}", dispatch_id=f"{job['id']}:manual:{i}", job=JobRow.from_row(job))
            barrier.wait()
            try:
                proofs.verify(stores[i], started, spec, RunOutcomes())
                outcomes[i] = "claimed"
            except SchedulerError as exc:
                outcomes[i] = exc.code

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for s in stores:
            s.close()
        assert sorted(outcomes) == ["PROOF_REPLAYED", "PROOF_REPLAYED", "claimed"], outcomes
        winner = outcomes.index("claimed")
        with setup.read() as tx:
            claims = tx.all("SELECT dispatch_id, run_id FROM authorization_proof_replay WHERE proof_id = 'contested'")
            assert tx.scalar("SELECT enabled FROM jobs WHERE id = ?", (job["id"],)) == 0  # the losers quarantined it
        assert claims == [{"dispatch_id": f"{job['id']}:manual:{winner}", "run_id": f"run-{winner}"}]
    finally:
        setup.close()


@pytest.mark.postgres
def test_three_real_dispatchers_on_postgres_exactly_one_claim_wins(pg_url: str, tmp_path: Path) -> None:
    from scheduler.core.queue import enqueue_manual

    key = rsa_key()
    pub = write_public_pem(key, tmp_path / "pub.pem")
    source = tmp_path / "proof.jwt"
    store = open_store(pg_url)
    procs: list[subprocess.Popen] = []
    try:
        marker = tmp_path / "ran"
        job = add_job(store, name="fleet", executor="shell", payload_message=f"echo ran >> {marker}", overlap_policy="allow",
                      authorization_proof=jwt_declaration({"file": str(source)}, public_key_file=str(pub)))
        source.write_text(mint_jwt(key, job["artifact_digest"], jti="one-for-three"))
        for i in range(3):
            log = tmp_path / f"d{i}.log"
            procs.append(subprocess.Popen(
                [*scheduler_cmd(), "--db", pg_url, "run", "--shared", "--lease-ttl", "1500ms", "--grace", "1s"],
                stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115 - the child's log, open for its life
                env={**os.environ, "SCHEDULER_ARTIFACTS_DIR": str(tmp_path / "artifacts")}))
            wait_for(lambda log=log: "holds lease" in log.read_text(errors="replace"), timeout=20, what="dispatcher ready")
        for _ in range(3):
            enqueue_manual(store, job["id"])
        runs = wait_for(lambda: (rows := [r for r in run_rows(store, job["id"]) if r["status"] in TERMINAL])
                        and len(rows) == 3 and rows, timeout=30, what="three finished runs")
        outcome = sorted((r["status"], r["error_code"]) for r in runs)
        assert outcome == [("error", "PROOF_REPLAYED"), ("error", "PROOF_REPLAYED"), ("ok", None)], outcome
        assert marker.read_text() == "ran\n"
        with store.read() as tx:
            claims = tx.all("SELECT run_id FROM authorization_proof_replay")
        ok_run = next(r for r in runs if r["status"] == "ok")
        assert claims == [{"run_id": ok_run["id"]}]
        assert json.loads(ok_run["proof_json"])["claim"] == "claimed"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        store.close()
