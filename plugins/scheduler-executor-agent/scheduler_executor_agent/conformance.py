"""The agent executor's conformance payload adapter (entry point ``scheduler.conformance_adapters:agent``).

An agent's payload is a prompt, and what a model answers is not up to the executor, so the
adapter pairs each case with a scripted model: it starts a ``LoopbackModel`` on
``127.0.0.1`` (once per process), points the endpoint ``default`` at it through
``SCHEDULER_AGENT_BASE_URL`` / ``SCHEDULER_AGENT_MODEL`` / ``SCHEDULER_AGENT_API_KEY`` in this
process's environment, and writes each behaviour as a prompt carrying a
``conformance-script:`` line that the loopback model acts out. The executor under test runs
unchanged: the real prompt assembly, HTTP client, stream parsing, capture and limits.

How steps map: ``stdout`` is reply text, ``stderr`` is reasoning text (the executor records
it on stderr), ``stdout_zeros`` is NUL characters in the reply, ``stdout_env`` prints the run
variable the executor sends as a request header (``x-scheduler-run-id`` ...), ``sleep_ms`` is
a pause of the model, ``stdin_to_stdout`` copies nothing (a turn has no standard input) and
``ignore_sigterm`` changes nothing (stopping a turn needs no cooperation). Declined, so the
case is skipped with the reason: raw bytes that are not UTF-8 text, ``exit`` and child
processes, ``stdin`` and ``env_policy`` options, and the stock cases that expect a process
exit status (``exit_code: 0``), which a turn does not have; the same behaviours are checked
without an exit status by the agent's own cases in ``conformance_cases/``.

Only the conformance engine (and the tests) import this module.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from scheduler_executor_agent.loopback import SCRIPT_MARKER, LoopbackModel
from scheduler_executor_agent.settings import ENV_API_KEY, ENV_BASE_URL, ENV_MODEL

#: The agent's own executor cases (``--fixtures`` / ``SCHEDULER_CONFORMANCE_FIXTURES`` / ``extra_fixtures``).
CASES_DIR = Path(__file__).resolve().parent / "conformance_cases"
#: The key the scripted endpoint is given (it must never appear in a result).
CONFORMANCE_KEY = "conformance-key-7c1d0e"

#: Stock cases whose expectations include a process exit status (``exit_code: 0``).
NEEDS_EXIT_STATUS = frozenset({
    "executor.exit-zero-stdout", "executor.stderr-captured", "executor.stdin-empty-by-default", "executor.binary-output",
    "executor.huge-output-offloaded", "executor.extra-env-visible", "executor.structured-json-valid",
    "executor.structured-json-invalid", "executor.structured-ndjson-valid", "executor.structured-ndjson-invalid",
})

_LOCK = threading.Lock()
_MODEL: LoopbackModel | None = None


def scripted_endpoint() -> LoopbackModel:
    """The process's scripted model, started on first use."""
    global _MODEL
    with _LOCK:
        if _MODEL is None:
            _MODEL = LoopbackModel().start()
        return _MODEL


def point_default_endpoint_at(model: LoopbackModel) -> None:
    """Make the endpoint ``default`` of this process the scripted model (the plain variables)."""
    os.environ[ENV_BASE_URL] = model.base_url
    os.environ[ENV_MODEL] = "conformance-model"
    os.environ[ENV_API_KEY] = CONFORMANCE_KEY


class AgentPayloadAdapter:
    """Behaviours as scripted agent turns (see the module docstring).

    The scripted model starts with the adapter; the process environment is pointed at it
    each time a case's payload is written, right before the engine runs that case.
    """

    languages: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.model = scripted_endpoint()

    def conformance_payload(self, behaviour: Any) -> dict[str, Any]:
        point_default_endpoint_at(self.model)
        if behaviour.case_id in NEEDS_EXIT_STATUS:
            raise NotImplementedError("the case expects exit_code 0, a process exit status; an agent turn has none "
                                      "(its behaviour is checked by the agent's own executor.agent.* cases)")
        if behaviour.raw is not None:
            raise NotImplementedError(f"an agent's payload is a prompt, not {behaviour.raw.language}")
        if behaviour.stdin is not None:
            raise NotImplementedError("an agent turn has no standard input")
        if behaviour.env_policy is not None:
            raise NotImplementedError("an agent turn gets no process environment to filter")
        steps: list[list[Any]] = []
        for step in behaviour.steps:
            action, value = step.action, step.value
            if action == "exit":
                raise NotImplementedError("an agent turn has no exit status")
            if action == "spawn_child_ms":
                raise NotImplementedError("an agent turn starts no processes")
            if action == "stdout_hex":
                try:
                    action, value = "stdout", bytes.fromhex(value).decode("utf-8")
                except UnicodeDecodeError:
                    raise NotImplementedError("an agent reply is text: these bytes are not UTF-8") from None
            steps.append([action, value])
        script = json.dumps({"steps": steps}, ensure_ascii=True)
        return {
            "payload_message": f"Reply by following this scripted test exactly.\n{SCRIPT_MARKER} {script}",
            "executor_options": {"endpoint": "default"},
        }


__all__ = [
    "CASES_DIR",
    "CONFORMANCE_KEY",
    "NEEDS_EXIT_STATUS",
    "AgentPayloadAdapter",
    "point_default_endpoint_at",
    "scripted_endpoint",
]
