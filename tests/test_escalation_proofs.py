"""A job with an authorization proof AND an ``authorization_ref`` that escalates into an approval gate.

Through a real dispatcher on SQLite and PostgreSQL, with a real RS256 JWT minted in the test
and the side-loaded ``testauthz`` provider (``tests/support/scheduler-authorization-testkit``):

- the approval row the escalation opens carries the verified proof's window
  (``proof_not_before``, ``proof_expires_at``, ``proof_clock_skew_ms``);
- after approval the run re-checks window and revocations from the record, without reading its
  source again and without a second claim; a proof revoked (``scheduler proofs revoke``) or
  expired while the run waited ends the approved run ``PROOF_REVOKED`` / ``PROOF_EXPIRED`` with
  nothing of the payload run;
- the approval notice of an ``authorization`` gate leaves through the delivery outbox and
  reaches a loopback webhook, signed, once, naming the approval.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for
from test_authorization import _sideloaded, requests, testauthz  # noqa: F401  (the side-loaded provider's fixtures)
from test_proofs_support import jwt_declaration, mint_jwt, rsa_key, write_public_pem

from scheduler.core.queue import enqueue_manual
from scheduler.testing.http import LoopbackHTTPServer

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"escalation-notice-secret-32bytes").decode()


def _job(store: Any, tmp_path: Path, key: Any, *, skew_s: int = 30, **spec: Any) -> tuple[dict[str, Any], Path, Path]:
    """A testkit job touching a marker, with a JWT proof read from a file, authorised by ``testauthz:escalate``."""
    pub = write_public_pem(key, tmp_path / "proof-pub.pem")
    source, marker = tmp_path / "proof.jwt", tmp_path / "ran"
    job = add_job(store, payload_message=f"touch:{marker}", authorization_ref="testauthz:escalate",
                  authorization_proof=jwt_declaration({"file": str(source)}, public_key_file=str(pub), clock_skew_s=skew_s),
                  **spec)
    return job, source, marker


def _waiting(store: Any, job_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (run,) = wait_for(lambda: [r for r in run_rows(store, job_id) if r["status"] == "awaiting_approval"], timeout=30,
                      what="the escalated run to wait for approval")
    with store.read() as tx:
        (approval,) = tx.all("SELECT * FROM approvals WHERE run_id = ?", (run["id"],))
    return run, approval


def _finished(store: Any, job_id: str) -> dict[str, Any]:
    (run,) = wait_for(lambda: [r for r in run_rows(store, job_id) if r["status"] in TERMINAL], timeout=30,
                      what="the approved run to finish")
    return run


def _claims(store: Any, proof_id: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT proof_id, dispatch_id, run_id, claimed_at FROM authorization_proof_replay WHERE proof_id = ?",
                      (proof_id,))


def test_the_escalation_gate_carries_the_proof_window_and_the_approved_run_rechecks_it(
        store: Any, dispatcher: Any, tmp_path: Path, testauthz: Path, cli: Any) -> None:  # noqa: F811 - the fixture imported above
    key = rsa_key()
    job, source, marker = _job(store, tmp_path, key)
    source.write_text(mint_jwt(key, job["artifact_digest"], jti="escalated-1", exp_in=600))
    dispatcher()
    enqueue_manual(store, job["id"])
    run, approval = _waiting(store, job["id"])
    record = json.loads(run["proof_json"])
    assert (record["status"], record["claim"], record["proof_id"]) == ("verified", "claimed", "escalated-1")
    assert approval["gate_kind"] == "authorization" and approval["status"] == "pending"
    assert (approval["proof_not_before"], approval["proof_expires_at"], approval["proof_clock_skew_ms"]) == (
        record["not_before"], record["expires_at"], 30_000)
    assert record["expires_at"] - record["not_before"] == 600_000
    claims = _claims(store, "escalated-1")
    assert [(c["dispatch_id"], c["run_id"]) for c in claims] == [(run["dispatch_id"], run["id"])]
    source.unlink()  # the approved run must not read its source again
    decided = cli("--json", "approvals", "approve", approval["id"], "--note", "proof checked")
    assert decided.code == 0, decided
    done = _finished(store, job["id"])
    assert (done["id"], done["status"]) == (run["id"], "ok") and marker.exists()
    rechecked = json.loads(done["proof_json"])
    assert rechecked["claim"] == "rechecked-after-approval" and rechecked["proof_id"] == "escalated-1"
    assert _claims(store, "escalated-1") == claims  # no second claim, the first untouched
    assert len(requests(testauthz)) == 1  # the provider was not asked again either


def test_a_proof_revoked_while_the_run_waits_ends_the_approved_run_proof_revoked(
        store: Any, dispatcher: Any, tmp_path: Path, testauthz: Path, cli: Any) -> None:  # noqa: F811 - the fixture imported above
    key = rsa_key()
    job, source, marker = _job(store, tmp_path, key)
    source.write_text(mint_jwt(key, job["artifact_digest"], jti="revoke-me", exp_in=600))
    dispatcher()
    enqueue_manual(store, job["id"])
    run, approval = _waiting(store, job["id"])
    assert approval["proof_expires_at"] == json.loads(run["proof_json"])["expires_at"]
    claims = _claims(store, "revoke-me")
    revoked = cli("--json", "proofs", "revoke", "--proof-id", "revoke-me", "--reason", "leaked while waiting")
    assert revoked.code == 0, revoked
    assert cli("--json", "approvals", "approve", approval["id"]).code == 0
    done = _finished(store, job["id"])
    assert (done["id"], done["status"], done["error_code"]) == (run["id"], "error", "PROOF_REVOKED"), done
    assert not marker.exists()
    assert json.loads(done["proof_json"])["status"] == "denied"
    assert _claims(store, "revoke-me") == claims  # the re-check claimed nothing


def test_a_proof_that_expired_while_the_run_waited_ends_it_proof_expired(
        store: Any, dispatcher: Any, tmp_path: Path, testauthz: Path, cli: Any) -> None:  # noqa: F811 - the fixture imported above
    key = rsa_key()
    job, source, marker = _job(store, tmp_path, key, skew_s=0)
    source.write_text(mint_jwt(key, job["artifact_digest"], jti="short-lived", exp_in=3))
    dispatcher()
    enqueue_manual(store, job["id"])
    _run, approval = _waiting(store, job["id"])
    assert approval["proof_clock_skew_ms"] == 0
    wait_for(lambda: time.time() * 1000 >= approval["proof_expires_at"] + 50, timeout=10, what="the proof to expire")
    assert cli("--json", "approvals", "approve", approval["id"]).code == 0
    done = _finished(store, job["id"])
    assert (done["status"], done["error_code"]) == ("error", "PROOF_EXPIRED"), done
    assert not marker.exists()


# -- the approval notice of an authorization gate -----------------------------------------------------------------


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LoopbackHTTPServer]:
    """A loopback webhook receiver; the webhook channel signs with a known secret, retries are quick."""
    from scheduler.settings import reload_settings

    config = tmp_path / "scheduler.toml"
    config.write_text('[channels.webhook]\nsecret = {credential = "env:TEST_WEBHOOK_SECRET"}\ntimeout_s = 2\n'
                      "[delivery]\nretry_base_ms = 30\nretry_max_ms = 200\nclaim_ttl_ms = 600\n")
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    reload_settings()
    srv = LoopbackHTTPServer()
    yield srv
    srv.close()


def test_the_approval_notice_of_an_authorization_gate_reaches_the_webhook_once(
        store: Any, dispatcher: Any, tmp_path: Path, testauthz: Path, receiver: LoopbackHTTPServer, cli: Any) -> None:  # noqa: F811 - the fixture imported above
    from standardwebhooks import Webhook

    marker = tmp_path / "ran-notice"
    job = add_job(store, name="deploy-gated", payload_message=f"touch:{marker}", authorization_ref="testauthz:escalate-critical",
                  delivery_mode="always", delivery_channel="webhook", delivery_to=f"{receiver.url}/hook")
    enqueue_manual(store, job["id"])
    dispatcher()
    run, approval = _waiting(store, job["id"])
    assert approval["gate_kind"] == "authorization" and approval["risk_level"] == "critical"
    got = wait_for(lambda: receiver.to("/hook"), timeout=20, what="the approval notice at the webhook")
    (notice,) = got
    Webhook(WEBHOOK_SECRET).verify(notice.body, {k: notice.headers[k] for k in ("webhook-id", "webhook-timestamp",
                                                                                "webhook-signature")})
    assert notice.headers["webhook-id"] == f"{approval['id']}:approval-notice:part:1/1"
    text = notice.body.decode()
    assert "[Approval required] deploy-gated" in text and "escalated by its authorization policy" in text
    assert "risk critical" in text and "needs a human" in text
    assert f"scheduler approvals approve {approval['id']}" in text and f"scheduler approvals reject {approval['id']}" in text
    assert not marker.exists()

    def outbox() -> list[dict[str, Any]]:
        with store.read() as tx:
            return tx.all("SELECT run_id, status, idempotency_key FROM delivery_outbox WHERE job_id = ?", (job["id"],))

    (row,) = wait_for(lambda: [r for r in outbox() if r["status"] == "delivered"], timeout=10, what="the notice delivered")
    assert row["run_id"] == run["id"] and row["idempotency_key"] == notice.headers["webhook-id"]
    assert len(outbox()) == 1
    # Deciding sends nothing more for the notice; the run's own result is a second message of its own.
    assert cli("--json", "approvals", "approve", approval["id"]).code == 0
    done = _finished(store, job["id"])
    assert done["status"] == "ok" and marker.exists()
    results = wait_for(lambda: (hooks := receiver.to("/hook")) and len(hooks) >= 2 and hooks, timeout=20,
                       what="the run's result at the webhook")
    assert [r.headers["webhook-id"] for r in results].count(notice.headers["webhook-id"]) == 1
