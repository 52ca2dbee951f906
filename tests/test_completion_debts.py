"""Issue 28 items 1 and 2: completion debts and the per-run delivery checkpoint, on SQLite and PostgreSQL.

The completion that enqueues a run's messages opens its debt in the same transaction; the debt
stays open until reconciliation finds every part of the run delivered (``reconciled``) or settled
otherwise (``failed``), a claim-store error fails the completion closed
(``COMPLETION_CLAIM_UNAVAILABLE``: nothing enqueued), ``deliveries checkpoint RUN`` shows each
part, and ``status`` / ``doctor`` show open and overdue debts. A real ``scheduler run`` killed with
SIGKILL while a part is being sent leaves the debt open; the next dispatcher delivers the part and
reconciles it. Loopback webhook receivers; the CLI in-process and as subprocesses.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import run_rows, scheduler_cmd, wait_for

from scheduler.core.debts import budget_ms
from scheduler.settings import current_settings, reload_settings
from scheduler.settings.kernel import DeliverySettings
from scheduler.testing.http import LoopbackHTTPServer, Recorded, Reply

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


class GatedReceiver:
    """A webhook receiver that answers 200, or holds every request while ``gate`` is clear."""

    def __init__(self) -> None:
        self.server = LoopbackHTTPServer()
        self.gate = threading.Event()
        self.gate.set()
        self.holding = threading.Event()
        self.accepted: list[str] = []
        self.server.default("/hook", self._answer)

    def _answer(self, request: Recorded) -> Reply:
        if not self.gate.is_set():
            self.holding.set()
            self.gate.wait(30)
        key = request.headers["webhook-id"]
        if key not in self.accepted:
            self.accepted.append(key)
        return Reply(json={"ok": True})


@pytest.fixture
def receiver() -> Iterator[GatedReceiver]:
    r = GatedReceiver()
    yield r
    r.gate.set()
    r.server.close()


def config(tmp_path: Path, *, claim_ttl_ms: int = 600) -> dict[str, str]:
    path = tmp_path / "scheduler.toml"
    path.write_text('[channels.webhook]\nsecret = {credential = "env:TEST_WEBHOOK_SECRET"}\nmax_chars = 100\ntimeout_s = 5\n'
                    f"[delivery]\nretry_base_ms = 30\nretry_max_ms = 200\nclaim_ttl_ms = {claim_ttl_ms}\n")
    return {"SCHEDULER_CONFIG": str(path), "TEST_WEBHOOK_SECRET": SECRET}


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = config(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reload_settings()
    return env


def add_delivering(cli: Any, receiver: GatedReceiver, name: str, **fields: Any) -> dict[str, Any]:
    spec = {"name": name, "schedule_kind": "manual", "executor": "testkit", "payload_message": "echo:" + "d" * 250,
            "delivery_mode": "always", "delivery_channel": "webhook", "delivery_to": f"{receiver.server.url}/hook", **fields}
    out = cli("--json", "jobs", "add", json.dumps(spec))
    assert out.code == 0, out
    job: dict[str, Any] = out.json["job"]
    return job


def checkpoint(cli: Any, run_id: str) -> dict[str, Any]:
    out = cli("--json", "deliveries", "checkpoint", run_id)
    assert out.code == 0, out
    view: dict[str, Any] = out.json["checkpoint"]
    return view


def debts(cli: Any) -> dict[str, Any]:
    out = cli("--json", "status")
    assert out.code == 0, out
    summary: dict[str, Any] = out.json["status"]["completion_debts"]
    return summary


def doctor_check(cli: Any) -> dict[str, Any]:
    out = cli("--json", "doctor").json
    (check,) = [c for c in (out.get("checks") or out.get("details") or []) if c["check"] == "completion_debts"]
    return check


def test_the_debt_opens_with_the_completion_and_closes_when_every_part_is_delivered(
    cli: Any, store: Any, dispatcher: Any, receiver: GatedReceiver, settings: dict[str, str],
) -> None:
    job = add_delivering(cli, receiver, "report")
    receiver.gate.clear()  # the receiver holds the first part: the run's delivery is under way
    dispatcher()
    assert cli("--json", "jobs", "run", "report").code == 0
    (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], what="the run")
    assert receiver.holding.wait(20)
    view = checkpoint(cli, run["id"])
    assert view["parts"] >= 3 and view["delivered"] == 0 and view["pending"] == view["parts"] and not view["complete"]
    assert view["debt"]["status"] == "open" and view["debt"]["job_id"] == job["id"] and view["debt"]["session"] == "shell"
    assert view["debt"]["overdue"] is False
    (message,) = view["messages"]
    assert message["group"] == f"{run['id']}:delivery" and message["resume_at_part"] == 1
    assert [p["part_index"] for p in message["parts"]] == list(range(1, view["parts"] + 1))
    assert message["parts"][0]["status"] == "claimed" and {p["status"] for p in message["parts"][1:]} == {"pending"}
    assert debts(cli)["open"] == 1 and debts(cli)["overdue"] == 0
    assert doctor_check(cli)["ok"] is True
    short = cli("--json", "deliveries", "checkpoint", run["id"][-8:])  # the short form, as every runs command takes
    assert short.code == 0 and short.json["checkpoint"]["run_id"] == run["id"]
    receiver.gate.set()
    wait_for(lambda: (v := checkpoint(cli, run["id"]))["complete"] and v["debt"]["status"] == "reconciled", timeout=30,
             what="every part delivered and the debt reconciled")
    done = checkpoint(cli, run["id"])
    assert done["delivered"] == done["parts"] and done["next_due_at"] is None and done["messages"][0]["resume_at_part"] is None
    assert [p["receipt_id"] is not None for p in done["messages"][0]["parts"]] == [True] * done["parts"]
    assert debts(cli) == {"open": 0, "overdue": 0, "failed": 0, "overdue_debts": []}
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM runtime_events WHERE kind = 'delivery.debt_settled' AND run_id = ?",
                         (run["id"],)) == 1
    missing = cli("--json", "deliveries", "checkpoint", "no-such-run")
    assert missing.code != 0 and missing.json["code"] == "NOT_FOUND"


def test_a_run_without_messages_has_no_debt_and_a_failed_part_fails_it(
    cli: Any, store: Any, dispatcher: Any, receiver: GatedReceiver, settings: dict[str, str],
) -> None:
    quiet = cli("--json", "jobs", "add", json.dumps({"name": "quiet", "schedule_kind": "manual", "executor": "testkit",
                                                     "payload_message": "ok"})).json["job"]
    job = add_delivering(cli, receiver, "refused")
    receiver.server.default("/hook", Reply(status=410))  # gone for good: the first part fails, the rest with it
    dispatcher()
    for name in ("quiet", "refused"):
        assert cli("--json", "jobs", "run", name).code == 0
    (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], what="the run")
    wait_for(lambda: checkpoint(cli, run["id"])["debt"]["status"] == "failed", timeout=30, what="the debt failed")
    view = checkpoint(cli, run["id"])
    assert view["complete"] and view["failed"] == view["parts"] and view["delivered"] == 0
    assert debts(cli)["failed"] == 1
    (ran,) = wait_for(lambda: [r for r in run_rows(store, quiet["id"]) if r["status"] == "ok"], what="the quiet run")
    assert checkpoint(cli, ran["id"]) | {"run_id": None} == {
        "run_id": None, "parts": 0, "delivered": 0, "pending": 0, "claimed": 0, "failed": 0, "cancelled": 0, "complete": True,
        "next_due_at": None, "messages": [], "debt": None}
    receiver.server.default("/hook", Reply(json={"ok": True}))
    first = view["messages"][0]["parts"][0]["id"]
    assert cli("--json", "deliveries", "retry", first).code == 0  # re-armed: the debt is open again, then reconciled
    wait_for(lambda: checkpoint(cli, run["id"])["debt"]["status"] == "reconciled", timeout=30, what="reconciled after retry")
    with store.read() as tx:
        kinds = [r["kind"] for r in tx.all("SELECT kind FROM runtime_events WHERE run_id = ? AND kind LIKE 'delivery.debt_%'"
                                           " ORDER BY id", (run["id"],))]
    # failed, then reconciled (reopened between them when a reconciliation pass saw the re-armed part still pending)
    assert kinds in (["delivery.debt_settled", "delivery.debt_reopened", "delivery.debt_settled"],
                     ["delivery.debt_settled", "delivery.debt_settled"])


def test_a_claim_store_error_fails_the_completion_closed(
    cli: Any, store: Any, store_url: str, dispatcher: Any, receiver: GatedReceiver, settings: dict[str, str],
) -> None:
    job = add_delivering(cli, receiver, "unclaimed")
    quiet = cli("--json", "jobs", "add", json.dumps({"name": "quiet", "schedule_kind": "manual", "executor": "testkit",
                                                     "payload_message": "ok"})).json["job"]
    d = dispatcher()
    with store.transaction() as tx:  # the claim store breaks under a running dispatcher
        tx.execute("ALTER TABLE completion_debts RENAME TO completion_debts_away")
    try:
        from scheduler.core.queue import enqueue_manual

        enqueue_manual(store, job["id"])
        enqueue_manual(store, quiet["id"])
        (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "error"], what="the refused completion")
        (ran,) = wait_for(lambda: [r for r in run_rows(store, quiet["id"]) if r["status"] == "ok"], what="the quiet run")
        d.stop()
    finally:
        with store.transaction() as tx:
            tx.execute("ALTER TABLE completion_debts_away RENAME TO completion_debts")
    assert run["error_code"] == "COMPLETION_FAILED" and "COMPLETION_CLAIM_UNAVAILABLE" in run["error_message"]
    with store.read() as tx:  # fail closed: no message of the run was enqueued without its owner
        assert tx.scalar("SELECT COUNT(*) FROM delivery_outbox WHERE run_id = ?", (run["id"],)) == 0
        assert tx.scalar("SELECT COUNT(*) FROM completion_debts") == 0
    assert receiver.accepted == [] and ran["error_code"] is None


def test_an_open_debt_is_overdue_after_the_whole_retry_budget(
    cli: Any, store: Any, dispatcher: Any, receiver: GatedReceiver, settings: dict[str, str],
) -> None:
    job = add_delivering(cli, receiver, "stuck")
    receiver.gate.clear()
    dispatcher()
    assert cli("--json", "jobs", "run", "stuck").code == 0
    (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], what="the run")
    assert receiver.holding.wait(20)
    view = checkpoint(cli, run["id"])  # the receiver holds its first part: the debt stays open
    delivery = current_settings().delivery
    budget = budget_ms(view["parts"], 5, delivery)
    with store.transaction() as tx:  # opened longer ago than its whole budget
        tx.execute("UPDATE completion_debts SET created_at = created_at - ? WHERE run_id = ?", (budget + 1000, run["id"]))
    summary = debts(cli)
    assert summary["open"] == 1 and summary["overdue"] == 1 and summary["overdue_debts"][0]["run_id"] == run["id"]
    assert checkpoint(cli, run["id"])["debt"]["overdue"] is True
    check = doctor_check(cli)
    assert check["ok"] is False and "1 overdue" in check["detail"]
    assert cli("--json", "doctor").code != 0


def test_the_budget_adds_every_parts_backoffs_and_a_claim_ttl() -> None:
    delivery = DeliverySettings(retry_base_ms=1000, retry_max_ms=3000, max_attempts=4, claim_ttl_ms=500)
    # waits between 4 attempts: 1000, 2000, 3000 (capped) = 6000, +20 % jitter, + one claim TTL; per part
    assert budget_ms(1, 4, delivery) == 7200 + 500
    assert budget_ms(3, 4, delivery) == 3 * (7200 + 500)
    assert budget_ms(0, 1, delivery) == 500


def sub(store_url: str, *args: str, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([*scheduler_cmd(), "--db", store_url, "--json", *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env})
    assert out.returncode == 0, (out.stdout, out.stderr)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_kill9_leaves_the_debt_open_and_the_next_dispatcher_reconciles_it(
    store_url: str, store: Any, tmp_path: Path, receiver: GatedReceiver,
) -> None:
    from test_dispatcher_process import Proc

    env = config(tmp_path, claim_ttl_ms=1000)
    spec = {"name": "killed", "schedule_kind": "manual", "executor": "testkit", "payload_message": "echo:" + "k" * 250,
            "delivery_mode": "always", "delivery_channel": "webhook", "delivery_to": f"{receiver.server.url}/hook"}
    job = sub(store_url, "jobs", "add", json.dumps(spec), env=env)["job"]
    receiver.gate.clear()
    first = Proc(store_url, log=tmp_path / "first.log", env=env)
    try:
        first.wait_ready()
        sub(store_url, "jobs", "run", "killed", env=env)
        assert receiver.holding.wait(30), first.output()
        (run,) = [r for r in run_rows(store, job["id"]) if r["status"] == "ok"]
        first.kill()  # SIGKILL while the first part is being sent
        first.p.wait(10)
    finally:
        first.close()
    receiver.gate.set()
    view = sub(store_url, "deliveries", "checkpoint", run["id"], env=env)["checkpoint"]
    assert view["debt"]["status"] == "open" and view["delivered"] == 0 and view["messages"][0]["parts"][0]["status"] == "claimed"
    assert sub(store_url, "status", env=env)["status"]["completion_debts"]["open"] == 1
    second = Proc(store_url, log=tmp_path / "second.log", env=env)
    try:
        second.wait_ready()
        wait_for(lambda: sub(store_url, "deliveries", "checkpoint", run["id"], env=env)["checkpoint"]["debt"]["status"]
                 == "reconciled", timeout=60, what="reconciled by the next dispatcher")
    finally:
        second.kill(15)
        second.p.wait(20)
        second.close()
    done = sub(store_url, "deliveries", "checkpoint", run["id"], env=env)["checkpoint"]
    assert done["complete"] and done["delivered"] == done["parts"]
    assert sorted(receiver.accepted) == sorted(p["id"] for p in done["messages"][0]["parts"])  # each part shown once
    assert sub(store_url, "status", env=env)["status"]["completion_debts"]["open"] == 0


def test_capabilities_say_checkpoints_and_run_scoped_completion(tmp_path: Path) -> None:
    out = subprocess.run([*scheduler_cmd(), "--json", "capabilities"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    caps = json.loads(out.stdout)["capabilities"]
    assert caps["multipart_delivery_checkpoints"] is True and caps["completion_delivery_scope"] == "run"
