"""The ``external`` evidence provider through a real dispatcher: an attestor someone else runs, over both transports.

The attestor is ``scheduler_provider_external.reference_attestor`` (HMAC-SHA256 with a key
the scheduler never sees): run as a real subprocess per request (command transport), or
answering behind a real HTTP server on loopback (``LoopbackHTTPServer``). Real shell runs
through a real dispatcher on SQLite and PostgreSQL; ``runs evidence`` re-verifies through the
CLI, asking the attestor again. An attestor that answers late or malformed fails closed: a
``verify.required`` run ends ``error`` (``EVIDENCE_ATTESTATION_FAILED`` /
``EVIDENCE_VERIFICATION_FAILED``) with the provider's code on its row.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from evidence_support import (
    artifacts_dir,  # noqa: F401  (the autouse artifacts-root fixture)
    events_of,
    evidence_row,
    run_job,
    use_settings,
)
from scheduler_provider_external import reference_attestor

from scheduler.evidence.verify import verify_run
from scheduler.testing.http import LoopbackHTTPServer, Recorded, Reply

KEY = "attestor-only-key-7d1f"


class Attestor:
    """The reference attestor behind a loopback HTTP server; ``behave`` changes how it answers each operation."""

    def __init__(self) -> None:
        self.behaviour: dict[str, Callable[[Recorded], Any]] = {}
        self.server = LoopbackHTTPServer(self._answer)

    def _answer(self, request: Recorded) -> Any:
        operation = request.json()["operation"]
        if operation in self.behaviour:
            return self.behaviour[operation](request)
        return Reply(json=reference_attestor.reply(request.json(), KEY.encode()))

    def operations(self) -> list[str]:
        return [r.json()["operation"] for r in self.server.requests]


@pytest.fixture
def attestor() -> Iterator[Attestor]:
    a = Attestor()
    yield a
    a.server.close()


def command_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **extra: Any) -> None:
    monkeypatch.setenv("ATTEST_KEY", KEY)
    use_settings(monkeypatch, tmp_path, {"providers.external": {
        "command": [sys.executable, "-m", "scheduler_provider_external.reference_attestor", "--key-env", "ATTEST_KEY"],
        "pass_env": ["ATTEST_KEY"], "methods": ["hmac-sha256"], "timeout_s": 20, **extra}})


def http_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, attestor: Attestor, **extra: Any) -> None:
    use_settings(monkeypatch, tmp_path, {"providers.external": {
        "url": attestor.server.url + "/v1/evidence", "methods": ["hmac-sha256"], "timeout_s": 10, **extra}})


REQUIRED = {"provider": "external", "verify": {"required": True}}


def assert_verified_by_external(store: Any, cli: Any, run: dict[str, Any], attestor_label: str) -> None:
    assert run["status"] == "ok" and run["evidence_status"] == "verified", run
    row = evidence_row(store, run["id"])
    assert row["status"] == "attested" and row["verified"] == 1 and json.loads(row["methods"]) == ["hmac-sha256"]
    data = json.loads(row["envelope"])["data"]
    assert data["method"] == "hmac-sha256" and data["attestor"].startswith(attestor_label), data
    assert data["payload_digest"] == "sha256:" + row["payload_sha256"] and data["attestation"]["mac"]
    assert KEY not in row["envelope"] and KEY not in (row["verification"] or "")
    out = cli("--json", "runs", "evidence", run["id"])
    assert out.code == 0, out
    assert {k: out.json[k] for k in ("ok", "verified", "provider", "method")} == {
        "ok": True, "verified": True, "provider": "external", "method": "hmac-sha256"}


def test_command_attestor_attests_and_reverifies(store: Any, dispatcher: Any, cli: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    command_settings(monkeypatch, tmp_path)
    dispatcher()
    _job, run = run_job(store, payload_message="echo attested", evidence=REQUIRED)
    assert_verified_by_external(store, cli, run, "command:")
    # Another key on this host: the attestor no longer vouches for the envelope, and re-verification says so.
    monkeypatch.setenv("ATTEST_KEY", "another-key")
    check = verify_run(store, run["id"])
    assert not check.verified and check.code == "EVIDENCE_EXTERNAL_REJECTED", check


def test_http_attestor_attests_and_reverifies(store: Any, dispatcher: Any, cli: Any, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, attestor: Attestor) -> None:
    http_settings(monkeypatch, tmp_path, attestor)
    dispatcher()
    _job, run = run_job(store, payload_message="echo attested", evidence=REQUIRED)
    assert_verified_by_external(store, cli, run, "http:http://127.0.0.1:")
    assert attestor.operations() == ["attest", "verify", "verify"]  # at the run, then by runs evidence
    request = attestor.server.requests[0].json()
    assert request["payload"] == evidence_row(store, run["id"])["canonical_payload"]


LATE = Reply(action="hang", seconds=30)
MALFORMED = Reply(body=b'{"schema": "scheduler.evidence.external-answer", "version": 1, "ok": tr')  # cut short


@pytest.mark.parametrize(("operation", "answer", "code"), [
    ("attest", LATE, "EVIDENCE_EXTERNAL_TIMEOUT"),
    ("attest", MALFORMED, "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("verify", LATE, "EVIDENCE_EXTERNAL_TIMEOUT"),
    ("verify", MALFORMED, "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
])
def test_a_late_or_malformed_http_answer_fails_the_required_run(
        store: Any, dispatcher: Any, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attestor: Attestor,
        operation: str, answer: Reply, code: str) -> None:
    http_settings(monkeypatch, tmp_path, attestor, timeout_s=1)
    attestor.behaviour[operation] = lambda _request: answer
    dispatcher()
    _job, run = run_job(store, payload_message="echo out", evidence=REQUIRED)
    run_code = "EVIDENCE_ATTESTATION_FAILED" if operation == "attest" else "EVIDENCE_VERIFICATION_FAILED"
    assert run["status"] == "error" and run["error_code"] == run_code and run["exit_code"] == 0, run
    assert run["evidence_status"] == "failed" and code in run["error_message"]
    row = evidence_row(store, run["id"])
    assert row["status"] == "failed" and row["error_code"] == code and row["verified"] == 0
    assert (row["envelope"] is None) == (operation == "attest")
    failed = [d for k, d in events_of(store, run["id"]) if k == "evidence.failed"]
    assert failed and failed[0]["code"] == code and failed[0]["required"] is True
    out = cli("--json", "runs", "evidence", run["id"])
    assert out.code != 0 and out.json["code"] == "EVIDENCE_NOT_VERIFIED", out


@pytest.mark.parametrize(("program", "code"), [
    ("import sys; sys.stdin.read(); print('not json')", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("import sys, time; sys.stdin.read(); time.sleep(30)", "EVIDENCE_EXTERNAL_TIMEOUT"),
    ("import sys; sys.stdin.read(); print('{}'); print('{}')", "EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS"),
])
def test_a_late_or_malformed_command_answer_fails_the_required_run(
        store: Any, dispatcher: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: str, code: str) -> None:
    use_settings(monkeypatch, tmp_path, {"providers.external": {
        "command": [sys.executable, "-c", program], "methods": ["hmac-sha256"], "timeout_s": 1}})
    dispatcher()
    _job, run = run_job(store, payload_message="echo out", evidence=REQUIRED)
    assert run["status"] == "error" and run["error_code"] == "EVIDENCE_ATTESTATION_FAILED", run
    row = evidence_row(store, run["id"])
    assert row["status"] == "failed" and row["error_code"] == code, row["error_code"]
