"""The kernel's conformance cases, through the opt-in pytest adapter of ``scheduler.testing``.

Each case describes a behaviour; hello runs POSIX shell payloads, so the kernel's stock
``PosixShellPayloads`` adapter writes them as shell scripts (the installed distribution
registers it as the entry point ``scheduler.conformance_adapters:hello``). ``HelloExecutor``
declares no capabilities, so every case that ``requires`` one (cancel, timeout,
process-group, env-policy, stdin, structured-output, verify) is reported as SKIPPED by the
engine, never as passed; every other case runs and must pass.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
from scheduler_executor_hello import HelloExecutor

from scheduler.testing import ExecutorConformance, PosixShellPayloads, run_conformance


class TestHelloInProcess(ExecutorConformance):
    """The executor object built directly, with the adapter named here: runs even from a plain checkout."""

    payload_adapter = PosixShellPayloads

    def make_provider(self) -> HelloExecutor:
        return HelloExecutor()


@pytest.mark.usefixtures("hello_installed")
class TestHelloThroughEntryPoint(ExecutorConformance):
    """Loaded by entry point exactly as the dispatcher and `scheduler conformance run executor hello` load it,
    with the payload adapter its distribution registers.

    ``case_filter`` narrows the run to cases a capability-less executor takes part in
    (the gated ones would only be skipped).
    """

    provider_name = "hello"
    case_filter: ClassVar[list[str]] = ["executor.exit-*", "executor.stderr-*", "executor.binary-*", "executor.huge-*", "executor.posix-shell.*"]


def test_every_case_without_a_capability_passes_and_the_rest_is_skipped() -> None:
    report = run_conformance("executor", "hello", provider=HelloExecutor(), payload_adapter=PosixShellPayloads)
    assert report.ok, [r.to_json() for r in report.results if r.outcome == "failed"]
    assert report.passed >= 10
    for result in report.results:
        if result.outcome == "skipped" and result.id == "executor.unconfigured-refused":  # it needs no host settings
            assert result.message.startswith("the payload adapter gives no settings"), result.message
        elif result.outcome == "skipped":
            assert result.message.startswith("provider does not declare capability"), result.message
