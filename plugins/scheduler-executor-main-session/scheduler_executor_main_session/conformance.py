"""The main-session executor's conformance payload adapter (``scheduler.conformance_adapters:main-session``).

Each case runs in reply mode against a scripted ``LoopbackChat`` on ``127.0.0.1`` (started
once per process); the adapter points this process's ``[executors.main-session]`` at it
through the kernel's override variables (``SCHEDULER_EXECUTORS_MAIN_SESSION_BASE_URL`` ...)
and writes each behaviour as a message carrying a ``conformance-script:`` line the server
acts out: ``stdout`` is reply text, ``stderr`` reasoning text, ``sleep_ms`` a pause before
the (whole, non-streamed) reply, ``stdout_env`` the run variable sent as a request header.
Declined, so the case is skipped with the reason: exit statuses (a turn has none, and the
stock cases that expect ``exit_code: 0``), raw bytes that are not UTF-8, child processes,
stdin and environment policies. The executor's own cases (``conformance_cases/``) check the
same behaviours without an exit status.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from scheduler_executor_main_session.loopback import SCRIPT_MARKER, LoopbackChat

CASES_DIR = Path(__file__).resolve().parent / "conformance_cases"
CONFORMANCE_KEY = "conformance-main-key-41d2b7"
KEY_VARIABLE = "SCHEDULER_MAIN_SESSION_CONFORMANCE_KEY"
OVERRIDES = {
    "SCHEDULER_EXECUTORS_MAIN_SESSION_MODEL": "conformance-model",
    "SCHEDULER_EXECUTORS_MAIN_SESSION_API_KEY": f"env:{KEY_VARIABLE}",
    KEY_VARIABLE: CONFORMANCE_KEY,
}
NEEDS_EXIT_STATUS = frozenset({
    "executor.exit-zero-stdout", "executor.stderr-captured", "executor.stdin-empty-by-default", "executor.binary-output",
    "executor.huge-output-offloaded", "executor.extra-env-visible", "executor.structured-json-valid",
    "executor.structured-json-invalid", "executor.structured-ndjson-valid", "executor.structured-ndjson-invalid",
})

_LOCK = threading.Lock()
_CHAT: LoopbackChat | None = None


def scripted_endpoint() -> LoopbackChat:
    global _CHAT
    with _LOCK:
        if _CHAT is None:
            _CHAT = LoopbackChat().start()
        return _CHAT


def point_settings_at(chat: LoopbackChat) -> None:
    os.environ["SCHEDULER_EXECUTORS_MAIN_SESSION_BASE_URL"] = chat.base_url
    os.environ.update(OVERRIDES)


class MainSessionPayloadAdapter:
    """Behaviours as scripted main-session replies (see the module docstring)."""

    languages: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.chat = scripted_endpoint()

    def conformance_payload(self, behaviour: Any) -> dict[str, Any]:
        point_settings_at(self.chat)
        if behaviour.case_id in NEEDS_EXIT_STATUS:
            raise NotImplementedError("the case expects exit_code 0, a process exit status; a main-session reply has none "
                                      "(checked by the executor's own executor.main-session.* cases)")
        if behaviour.raw is not None:
            raise NotImplementedError(f"a main-session payload is a message, not {behaviour.raw.language}")
        if behaviour.stdin is not None:
            raise NotImplementedError("a main-session turn has no standard input")
        if behaviour.env_policy is not None:
            raise NotImplementedError("a main-session turn gets no process environment to filter")
        steps: list[list[Any]] = []
        for step in behaviour.steps:
            action, value = step.action, step.value
            if action == "exit":
                raise NotImplementedError("a main-session reply has no exit status")
            if action == "spawn_child_ms":
                raise NotImplementedError("a main-session reply starts no processes")
            if action == "stdout_hex":
                try:
                    action, value = "stdout", bytes.fromhex(value).decode("utf-8")
                except UnicodeDecodeError:
                    raise NotImplementedError("a reply is text: these bytes are not UTF-8") from None
            steps.append([action, value])
        script = json.dumps({"steps": steps}, ensure_ascii=True)
        return {"payload_message": f"Reply by following this scripted test exactly.\n{SCRIPT_MARKER} {script}",
                "executor_options": {"mode": "reply"}}
