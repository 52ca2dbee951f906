"""The kernel's conformance corpus, plus the agent's own cases, against the agent executor and its scripted model.

The agent declares ``timeout``, ``cancel``, ``output-capture``, ``structured-output``,
``token-cap`` and ``cost-cap``; cases needing anything else are skipped by the engine, and
its payload adapter declines, with the reason, what a turn cannot be (an exit status,
raw non-UTF-8 bytes, child processes, stdin, an environment policy, shell scripts).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from scheduler_executor_agent import AgentExecutor
from scheduler_executor_agent.conformance import CASES_DIR, CONFORMANCE_KEY, NEEDS_EXIT_STATUS, AgentPayloadAdapter

from scheduler.testing import Behaviour, ExecutorConformance, Step, run_conformance

_PLAIN = ("SCHEDULER_AGENT_BASE_URL", "SCHEDULER_AGENT_MODEL", "SCHEDULER_AGENT_API_KEY")


@pytest.fixture(autouse=True)
def _restore_plain_variables() -> Iterator[None]:
    """The adapter points the process's default endpoint at its scripted model; put the variables back after."""
    saved = {k: os.environ.get(k) for k in _PLAIN}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class TestAgentThroughEntryPoint(ExecutorConformance):
    """Loaded by entry point with the adapter its distribution registers, plus the agent's own cases."""

    provider_name = "agent"
    extra_fixtures = (CASES_DIR,)


class TestAgentInProcess(ExecutorConformance):
    """The executor object built directly and the adapter named here."""

    payload_adapter = AgentPayloadAdapter
    extra_fixtures = (CASES_DIR,)
    case_filter: ClassVar[list[str]] = ["executor.agent.*", "executor.run-timeout", "executor.cancel-running"]

    def make_provider(self) -> AgentExecutor:
        return AgentExecutor()


def test_the_whole_corpus_passes_or_is_skipped_for_a_stated_reason() -> None:
    report = run_conformance("executor", "agent", extra=[CASES_DIR])
    assert report.error is None and report.failed == 0, report.to_json()
    outcomes = {r.id: r for r in report.results}
    agent_cases = [i for i in outcomes if i.startswith("executor.agent.")]
    assert agent_cases and all(outcomes[i].outcome == "passed" for i in agent_cases)
    for case in ("executor.run-timeout", "executor.timeout-sigterm-ignored", "executor.cancel-running"):
        assert outcomes[case].outcome == "passed", case
    for case in NEEDS_EXIT_STATUS:
        assert outcomes[case].outcome == "skipped" and "exit status" in outcomes[case].message
    for result in report.results:
        assert result.outcome != "skipped" or result.message, result.id
        assert CONFORMANCE_KEY not in result.message


def test_the_adapter_writes_scripts_and_declines_what_a_turn_cannot_be() -> None:
    adapter = AgentPayloadAdapter()
    fields = adapter.conformance_payload(Behaviour(case_id="x", steps=(Step("stdout", "hi\n"), Step("sleep_ms", 5))))
    assert fields["executor_options"] == {"endpoint": "default"}
    assert fields["payload_message"].endswith('conformance-script: {"steps": [["stdout", "hi\\n"], ["sleep_ms", 5]]}')
    text = adapter.conformance_payload(Behaviour(case_id="x", steps=(Step("stdout_hex", "6869"),)))
    assert '["stdout", "hi"]' in text["payload_message"]
    for behaviour in (Behaviour(case_id="x", steps=(Step("exit", 3),)), Behaviour(case_id="x", steps=(Step("stdout_hex", "00ff"),)),
                      Behaviour(case_id="x", steps=(Step("spawn_child_ms", 10),)),
                      Behaviour(case_id="x", steps=(Step("stdout", "a"),), stdin="in"),
                      Behaviour(case_id="x", steps=(Step("stdout", "a"),), env_policy="minimal"),
                      Behaviour(case_id="executor.exit-zero-stdout", steps=(Step("stdout", "a"),))):
        with pytest.raises(NotImplementedError):
            adapter.conformance_payload(behaviour)


def test_the_adapter_module_imports_only_the_public_api() -> None:
    root = Path(__file__).resolve().parents[1] / "scheduler_executor_agent"
    for path in root.glob("*.py"):
        kernel = [line for line in path.read_text().splitlines() if line.startswith(("from scheduler.", "import scheduler"))]
        assert all(line.startswith(("from scheduler.api", "from scheduler.testing")) for line in kernel), (path, kernel)
