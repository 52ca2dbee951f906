"""The kernel's stock conformance corpus against the python executor, a non-shell executor.

Every portable case describes a behaviour, and ``PythonPayloads`` writes it as Python
code. Cases needing a capability the executor does not declare (``verify``) and the
shell-only cases (raw ``posix-shell`` payloads) are skipped with the reason; every other
case runs and must pass.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
from scheduler_executor_python import PythonExecutor
from scheduler_executor_python.conformance import PythonPayloads

from scheduler.testing import ExecutorConformance, run_conformance


class TestPythonInProcess(ExecutorConformance):
    """The executor object built directly, with its adapter named here: runs even from a plain checkout."""

    payload_adapter = PythonPayloads

    def make_provider(self) -> PythonExecutor:
        return PythonExecutor()


@pytest.mark.usefixtures("python_installed")
class TestPythonThroughEntryPoint(ExecutorConformance):
    """Loaded by entry point, with the adapter its distribution registers (``scheduler.conformance_adapters``),
    exactly as `scheduler conformance run executor python` and the CI runner do."""

    provider_name = "python"
    case_filter: ClassVar[list[str]] = ["executor.exit-*", "executor.stdin-*", "executor.cancel-*", "executor.process-*"]


def test_the_report_passes_everything_it_can_express() -> None:
    report = run_conformance("executor", "python", provider=PythonExecutor(), payload_adapter=PythonPayloads)
    assert report.ok, [r.to_json() for r in report.results if r.outcome == "failed"]
    skipped = {r.id: r.message for r in report.results if r.outcome == "skipped"}
    for case_id, reason in skipped.items():
        if case_id == "executor.unconfigured-refused":  # it needs no host settings: the empty-settings case is not for it
            assert reason.startswith("the payload adapter gives no settings"), reason
        elif case_id.startswith("executor.posix-shell."):
            assert reason.startswith("written in posix-shell; payload adapter PythonPayloads does not accept it"), reason
        else:
            assert reason == "provider does not declare capability verify", (case_id, reason)
    assert report.passed >= 20 and report.passed + len(skipped) == len(report.results)
