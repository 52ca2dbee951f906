"""Fixtures: a real loopback chat server, real fake `openclaw` executables, real settings, a real executor."""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_executor_main_session import MainSessionExecutor
from scheduler_executor_main_session.loopback import LoopbackChat
from scheduler_toolkit.settings import reload_settings

from scheduler.api import ExecutionRequest, ExecutionResult
from scheduler.testing import LocalRunControl
from scheduler.testing import make_request as build_request

API_KEY = "sk-main-session-9b3e1f-do-not-leak"
KEY_VARIABLE = "MAIN_SESSION_TEST_KEY"


@pytest.fixture(autouse=True)
def _clean_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(("SCHEDULER_EXECUTORS_MAIN_SESSION_", "SCHEDULER_AGENT_")):
            monkeypatch.delenv(name)
    config = tmp_path / "scheduler-settings.toml"
    config.write_text("")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    reload_settings()
    yield
    reload_settings()


@pytest.fixture
def chat(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackChat]:
    """A loopback chat server configured as the main session's endpoint (the kernel's override variables)."""
    server = LoopbackChat().start()
    monkeypatch.setenv("SCHEDULER_EXECUTORS_MAIN_SESSION_BASE_URL", server.base_url)
    monkeypatch.setenv("SCHEDULER_EXECUTORS_MAIN_SESSION_MODEL", "main-model")
    monkeypatch.setenv("SCHEDULER_EXECUTORS_MAIN_SESSION_API_KEY", f"env:{KEY_VARIABLE}")
    monkeypatch.setenv(KEY_VARIABLE, API_KEY)
    yield server
    server.stop()


@pytest.fixture
def api_key() -> str:
    return API_KEY


#: The fake `openclaw`: records argv, stdin and its pid to RECORD, then behaves as VARIANT says.
FAKE = r'''#!{python}
import json, os, subprocess, sys, time
record = {record!r}
variant = {variant!r}
with open(record, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "stdin": sys.stdin.read(), "pid": os.getpid(),
                        "pgid": os.getpgid(0), "env": sorted(os.environ)}}) + "\n")
if variant == "ok":
    mode = sys.argv[sys.argv.index("--mode") + 1]
    print(json.dumps({{"ok": True, "mode": mode, "eventId": "evt-1"}}))
elif variant == "rejected":
    print(json.dumps({{"ok": False, "error": {{"message": "gateway is draining"}}}}))
elif variant == "fails":
    sys.stderr.write("error: gateway unreachable at 127.0.0.1:18789\n"); sys.exit(2)
elif variant == "garbage":
    print("Event queued (not json)")
elif variant == "duplicate":
    sys.stdout.write('{{"ok": true, "ok": false}}\n')
elif variant == "trailing":
    sys.stdout.write('{{"ok": true}} and more\n')
elif variant == "huge":
    sys.stdout.write("x" * 1_000_000)
elif variant == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(record + ".child", "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
'''


@pytest.fixture
def fake_openclaw(tmp_path: Path) -> Callable[[str], tuple[Path, Path]]:
    """Write a fake `openclaw` of the given variant; returns (its path, the file it records calls to)."""
    counter = itertools.count(1)

    def make(variant: str = "ok") -> tuple[Path, Path]:
        n = next(counter)
        path = tmp_path / f"bin{n}" / "openclaw"
        path.parent.mkdir()
        record = tmp_path / f"openclaw-calls-{n}.ndjson"
        path.write_text(FAKE.format(python=sys.executable, record=str(record), variant=variant))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path, record

    return make


def _calls(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


@pytest.fixture
def calls() -> Callable[[Path], list[dict[str, Any]]]:
    """What a fake `openclaw` recorded: one entry per call (argv, stdin, pid, pgid, environment names)."""
    return _calls


class Ran:
    def __init__(self, result: ExecutionResult, control: LocalRunControl, request: ExecutionRequest, elapsed: float) -> None:
        self.result, self.control, self.request, self.elapsed = result, control, request, elapsed


@pytest.fixture
def run_main(tmp_path: Path) -> Callable[..., Ran]:
    counter = itertools.count(1)
    executor = MainSessionExecutor()

    def run(payload: str = "Remind me to water the plants.", *, control: LocalRunControl | None = None,
            credentials: tuple[Any, ...] = (), **fields: Any) -> Ran:
        control = control or LocalRunControl()
        fields.setdefault("session_target", "main")
        request = build_request(payload, artifacts_root=tmp_path / "artifacts", run_id=f"run-{next(counter)}",
                                credentials=credentials, **fields)
        t0 = time.monotonic()
        result = executor.execute(request, control)
        return Ran(result, control, request, time.monotonic() - t0)

    run.executor = executor  # type: ignore[attr-defined]
    return run
