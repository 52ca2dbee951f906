"""The agent example (``examples/agent/``) is real: its spec validates and one turn of it runs.

The example's settings file is used as written except for the one setting it says to
change, the endpoint's base URL, which is pointed at the agent plugin's loopback model
server (``scheduler_executor_agent.loopback.LoopbackModel``, 127.0.0.1, port 0). No real
model is needed. The turn goes through a real ``scheduler run`` process on a SQLite file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.settings import reload_settings
from scheduler.testing import run_cli

loopback = pytest.importorskip("scheduler_executor_agent.loopback", reason="scheduler-executor-agent is not installed")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "agent"
SPEC = EXAMPLE / "agent-job.json"
CONFIG = EXAMPLE / "config.toml"
OLLAMA_URL = "http://127.0.0.1:11434/v1"
FINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


@pytest.fixture
def model() -> Iterator[Any]:
    server = loopback.LoopbackModel().start()
    yield server
    server.stop()


@pytest.fixture
def example_settings(model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example's config.toml with its one setting (the base URL) pointed at the loopback model."""
    text = CONFIG.read_text()
    assert text.count(f'= "{OLLAMA_URL}"') == 1, "the example sets its Ollama URL once"
    path = tmp_path / "config.toml"
    path.write_text(text.replace(f"= \"{OLLAMA_URL}\"", f"= \"{model.base_url}\""))
    for name in list(os.environ):  # the plain variables would win over the file
        if name.startswith(("SCHEDULER_AGENT_", "SCHEDULER_EXECUTORS_AGENT_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    reload_settings()
    return path


def _json(*args: str, db: str | None = None) -> dict[str, Any]:
    code, out, err = run_cli("--json", *args, db=db)
    assert code == 0, out + err
    return json.loads(out)


def test_the_example_settings_point_at_the_one_endpoint_the_job_names() -> None:
    settings = tomllib.loads(CONFIG.read_text())["executors"]["agent"]
    spec = json.loads(SPEC.read_text())
    assert settings["endpoint_urls"] == {spec["executor_options"]["endpoint"]: OLLAMA_URL}
    assert spec["session_target"] == "isolated" and "executor" not in spec
    assert spec["output_format"] == "json" and spec["constraints"]["max_tokens"] > 0
    assert "THE ONE SETTING TO CHANGE" in CONFIG.read_text()


def test_the_example_spec_and_settings_validate(example_settings: Path) -> None:
    assert _json("config", "--check")["ok"] is True
    job = _json("jobs", "validate", "--file", str(SPEC))["job"]
    assert job["session_target"] == "isolated" and job["executor_options"]["endpoint"] == "local"


def test_one_turn_of_the_example_job_through_scheduler_run(example_settings: Path, model: Any, tmp_path: Path) -> None:
    reply = '{"status": "All systems nominal; no open incidents."}'
    model.enqueue(loopback.Reply(chunks=['{"status": ', '"All systems nominal;', ' no open incidents."}'],
                                 usage={"prompt_tokens": 120, "completion_tokens": 14}))
    db = str(tmp_path / "scheduler.db")
    added = _json("jobs", "add", "--file", str(SPEC), db=db)
    job = added["job"]
    _json("jobs", "run", job["id"], db=db)
    env = {k: v for k, v in os.environ.items() if k != "SCHEDULER_DB"}
    dispatcher = subprocess.Popen([sys.executable, "-m", "scheduler", "--db", db, "run", "--duration", "60s"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        runs: list[dict[str, Any]] = []
        while time.monotonic() < deadline and dispatcher.poll() is None:
            runs = [r for r in _json("runs", "list", job["id"], db=db)["runs"] if r["status"] in FINAL]
            if runs:
                break
            time.sleep(0.1)
    finally:
        dispatcher.send_signal(signal.SIGTERM)
        log = dispatcher.communicate(timeout=30)[0]
    assert dispatcher.returncode == 0, log
    assert len(runs) == 1, log
    run = _json("runs", "get", runs[0]["id"], db=db)["run"]
    assert (run["status"], run["error_code"]) == ("ok", None), run
    code, out, err = run_cli("runs", "output", run["id"], db=db)
    assert code == 0 and out == reply, err
    assert run["output_valid"] is True and run["output_parsed"] == json.loads(reply)
    assert run["usage"]["prompt_tokens"] == 120 and run["usage"]["completion_tokens"] == 14
    assert run["usage"]["model"] == "llama3.1:8b" and run["usage"]["endpoint"] == "local"
    (sent,) = model.chat_requests()
    assert sent.body["model"] == "llama3.1:8b" and sent.body["stream"] is True
    assert sent.body["max_tokens"] <= 2000 and sent.headers["x-scheduler-run-id"] == run["id"]
    assert "Reply with only a JSON object" in sent.body["messages"][-1]["content"]
