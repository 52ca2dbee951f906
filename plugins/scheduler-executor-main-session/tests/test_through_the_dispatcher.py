"""Main-session runs through a real dispatcher on a real SQLite file (loopback chat server, fake `openclaw`).

A job with ``session_target: main`` and no ``executor`` runs on this distribution's driver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scheduler_executor_main_session.loopback import Answer

from scheduler.testing import RunningDispatcher, add_job, run_cli, run_rows, sqlite_store, wait_for

FINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "scheduler.db"


@pytest.fixture
def store(db: Path) -> Any:
    s = sqlite_store(db)
    yield s
    s.close()


@pytest.fixture
def dispatcher(store: Any) -> Any:
    d = RunningDispatcher(store, lease_ttl_ms=3000)
    yield d
    if d.thread.is_alive():
        d.stop()


def _start(db: Path, job: dict[str, Any]) -> None:
    code, out, err = run_cli("--json", "jobs", "run", job["id"], db=str(db))
    assert code == 0, out + err


def _final(store: Any, job: dict[str, Any], timeout: float = 15) -> dict[str, Any]:
    (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] in FINAL], timeout=timeout,
                      what=f"the final run of {job['name']}")
    return run


def _view(db: Path, run_id: str) -> dict[str, Any]:
    code, out, err = run_cli("--json", "runs", "get", run_id, db=str(db))
    assert code == 0, out + err
    return json.loads(out)["run"]


def test_a_reply_through_the_dispatcher(chat, db, store, dispatcher, api_key) -> None:
    chat.enqueue(Answer(content='{"noted": true}', usage={"prompt_tokens": 40, "completion_tokens": 4}))
    job = add_job(store, name="tell-main", session_target="main", executor=None, output_format="json",
                  payload_message="Note that the backup finished.")
    _start(db, job)
    run = _final(store, job)
    assert (run["status"], run["error_code"], run["executor"]) == ("ok", None, "main-session")
    view = _view(db, run["id"])
    assert view["output_valid"] is True and view["output_parsed"] == {"noted": True}
    assert view["usage"] == {"model": "main-model", "prompt_tokens": 40, "completion_tokens": 4, "total_tokens": 44}
    assert view["executor_handle"]["kind"] == "main-session-reply"
    code, out, _ = run_cli("runs", "output", run["id"], db=str(db))
    assert code == 0 and out == '{"noted": true}'
    (seen,) = chat.requests
    assert seen.headers["x-openclaw-session-key"] == "agent:main:main" and seen.headers["x-scheduler-run-id"] == run["id"]
    dispatcher.stop()
    for path in db.parent.glob("scheduler.db*"):
        assert api_key.encode() not in path.read_bytes(), path


def test_an_event_through_the_dispatcher(fake_openclaw, calls, monkeypatch, db, store, dispatcher) -> None:
    path, record = fake_openclaw("ok")
    monkeypatch.setenv("SCHEDULER_EXECUTORS_MAIN_SESSION_OPENCLAW_PATH", str(path))
    job = add_job(store, name="poke-main", session_target="main", executor=None, payload_message="Wake up.",
                  executor_options={"mode": "event", "event_mode": "now"})
    _start(db, job)
    run = _final(store, job)
    assert (run["status"], run["exit_code"]) == ("ok", 0), run
    assert json.loads(_view(db, run["id"])["stdout_excerpt"])["eventId"] == "evt-1"
    (call,) = calls(record)
    assert call["argv"][:3] == ["system", "event", "--text"] and call["argv"][4:] == ["--mode", "now", "--json"]


def test_cancelling_a_running_event(fake_openclaw, calls, monkeypatch, db, store, dispatcher) -> None:
    from scheduler_toolkit.process import group_alive

    path, record = fake_openclaw("hang")
    monkeypatch.setenv("SCHEDULER_EXECUTORS_MAIN_SESSION_OPENCLAW_PATH", str(path))
    job = add_job(store, name="stuck-event", session_target="main", executor=None, payload_message="Hello?",
                  executor_options={"mode": "event"})
    _start(db, job)
    wait_for(lambda: Path(str(record) + ".child").exists(), what="the fake openclaw to be running")
    (running,) = [r for r in run_rows(store, job["id"]) if r["status"] == "running"]
    code, out, err = run_cli("--json", "runs", "cancel", running["id"], db=str(db))
    assert code == 0, out + err
    run = _final(store, job, timeout=10)
    assert run["status"] == "cancelled" and run["process_signal"] in ("SIGTERM", "SIGKILL")
    assert not group_alive(calls(record)[0]["pgid"])


def test_cancelling_a_running_reply(chat, db, store, dispatcher) -> None:
    chat.enqueue(Answer(delay_s=30))
    job = add_job(store, name="slow-main", session_target="main", executor=None, payload_message="Take your time.")
    _start(db, job)
    running = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running" and r["executor_handle"]],
                       what="the request to be running")
    wait_for(lambda: chat.requests, what="the request to reach the server")
    code, out, err = run_cli("--json", "runs", "cancel", running[0]["id"], db=str(db))
    assert code == 0, out + err
    run = _final(store, job, timeout=10)
    assert run["status"] == "cancelled" and run["process_signal"] == "aborted: cancelled"
    wait_for(lambda: chat.disconnects, timeout=5, what="the server to see the connection close")


def test_a_missing_openclaw_through_the_dispatcher(monkeypatch, tmp_path, db, store, dispatcher) -> None:
    monkeypatch.setenv("SCHEDULER_EXECUTORS_MAIN_SESSION_OPENCLAW_PATH", str(tmp_path / "no-openclaw"))
    job = add_job(store, name="no-cli", session_target="main", executor=None, payload_message="Hi.",
                  executor_options={"mode": "event"})
    _start(db, job)
    run = _final(store, job)
    assert (run["status"], run["error_code"]) == ("error", "MAIN_SESSION_COMMAND_NOT_FOUND")
    assert run["executor_handle"] is None


def test_constraints_it_cannot_enforce_are_refused(store) -> None:
    from scheduler.api import SchedulerError

    for constraints in ({"max_tokens": 100}, {"sandbox": True}, {"network": "none"}):
        with pytest.raises(SchedulerError) as exc:
            add_job(store, name="capped-main", session_target="main", executor=None, payload_message="x",
                    constraints=constraints)
        assert "SCHEDULER_GOVERNANCE_DENIED" in json.dumps(exc.value.details)
