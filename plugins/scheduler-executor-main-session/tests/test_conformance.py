"""The kernel's conformance corpus, plus this distribution's own cases, against the main-session executor."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from scheduler_executor_main_session import MainSessionExecutor
from scheduler_executor_main_session.conformance import (
    CASES_DIR,
    CONFORMANCE_KEY,
    NEEDS_EXIT_STATUS,
    OVERRIDES,
    MainSessionPayloadAdapter,
)

from scheduler.testing import Behaviour, ExecutorConformance, Step, run_conformance

_TOUCHED = ("SCHEDULER_EXECUTORS_MAIN_SESSION_BASE_URL", *OVERRIDES)


@pytest.fixture(autouse=True)
def _restore_variables() -> Iterator[None]:
    """The adapter points this process's settings at its scripted server; put the variables back after."""
    saved = {k: os.environ.get(k) for k in _TOUCHED}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class TestMainSessionThroughEntryPoint(ExecutorConformance):
    """Loaded by entry point with the adapter its distribution registers, plus its own cases."""

    provider_name = "main-session"
    extra_fixtures = (CASES_DIR,)


class TestMainSessionInProcess(ExecutorConformance):
    """The executor object built directly and the adapter named here."""

    payload_adapter = MainSessionPayloadAdapter
    extra_fixtures = (CASES_DIR,)
    case_filter: ClassVar[list[str]] = ["executor.main-session.*", "executor.run-timeout", "executor.cancel-running"]

    def make_provider(self) -> MainSessionExecutor:
        return MainSessionExecutor()


def test_the_whole_corpus_passes_or_is_skipped_for_a_stated_reason() -> None:
    report = run_conformance("executor", "main-session", extra=[CASES_DIR])
    assert report.error is None and report.failed == 0, report.to_json()
    outcomes = {r.id: r for r in report.results}
    own = [i for i in outcomes if i.startswith("executor.main-session.")]
    assert len(own) == 4 and all(outcomes[i].outcome == "passed" for i in own)
    for case in ("executor.run-timeout", "executor.timeout-sigterm-ignored", "executor.cancel-running"):
        assert outcomes[case].outcome == "passed", case
    for case in NEEDS_EXIT_STATUS:
        assert outcomes[case].outcome == "skipped" and "exit status" in outcomes[case].message
    for result in report.results:
        assert result.outcome != "skipped" or result.message, result.id
        assert CONFORMANCE_KEY not in result.message


def test_the_adapter_declines_what_a_reply_cannot_be() -> None:
    adapter = MainSessionPayloadAdapter()
    fields = adapter.conformance_payload(Behaviour(case_id="x", steps=(Step("stdout", "hi\n"), Step("sleep_ms", 5))))
    assert fields["executor_options"] == {"mode": "reply"}
    assert fields["payload_message"].endswith('conformance-script: {"steps": [["stdout", "hi\\n"], ["sleep_ms", 5]]}')
    for behaviour in (Behaviour(case_id="x", steps=(Step("exit", 3),)), Behaviour(case_id="x", steps=(Step("stdout_hex", "00ff"),)),
                      Behaviour(case_id="x", steps=(Step("spawn_child_ms", 10),)),
                      Behaviour(case_id="x", steps=(Step("stdout", "a"),), stdin="in"),
                      Behaviour(case_id="x", steps=(Step("stdout", "a"),), env_policy="minimal"),
                      Behaviour(case_id="executor.exit-zero-stdout", steps=(Step("stdout", "a"),))):
        with pytest.raises(NotImplementedError):
            adapter.conformance_payload(behaviour)


def test_the_package_imports_only_the_public_api() -> None:
    root = Path(__file__).resolve().parents[1] / "scheduler_executor_main_session"
    for path in root.glob("*.py"):
        kernel = [line.strip() for line in path.read_text().splitlines()
                  if line.strip().startswith(("from scheduler.", "import scheduler"))]
        assert all(line.startswith("from scheduler.api") for line in kernel), (path, kernel)
        assert not [line for line in path.read_text().splitlines()
                    if line.strip().startswith(("from scheduler_executor_agent", "import scheduler_executor_agent"))], path
