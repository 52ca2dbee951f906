"""The kernel's conformance cases, through the opt-in pytest adapter.

``HelloExecutor`` declares no capabilities, so every case that ``requires`` one (cancel,
timeout, process-group, env-policy, structured-output, verify) is reported as SKIPPED by
the engine, never as passed; the six basic cases run and must pass.
"""

from __future__ import annotations


import pytest
from scheduler_executor_hello import HelloExecutor

from scheduler.conformance.pytest_plugin import ExecutorConformance



class TestHelloInProcess(ExecutorConformance):
    """The executor object built directly: runs even from a plain checkout."""

    def make_provider(self) -> HelloExecutor:
        return HelloExecutor()


@pytest.mark.usefixtures("hello_installed")
class TestHelloThroughEntryPoint(ExecutorConformance):
    """Loaded by entry point exactly as the dispatcher and `scheduler conformance run executor hello` load it.

    ``case_filter`` narrows the run to the cases a capability-less executor can take part in
    (the gated ones would only be skipped).
    """

    provider_name = "hello"
    case_filter = ["executor.exit-*", "executor.stderr-*", "executor.stdin-*", "executor.binary-*", "executor.huge-*"]
