"""The kernel's conformance cases, through the opt-in pytest adapter.

``HelloExecutor`` declares no capabilities, so every case that ``requires`` one (cancel,
timeout, process-group, env-policy, structured-output, verify) is reported as SKIPPED by
the engine, never as passed; the six basic cases run and must pass.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

import pytest
from scheduler_executor_hello import HelloExecutor

from scheduler.conformance.pytest_plugin import ExecutorConformance


def _installed() -> bool:
    try:
        distribution("scheduler-executor-hello")
    except PackageNotFoundError:
        return False
    return True


#: Tests that load the plugin by entry point need `pip install -e .` (entry points live in the installed metadata).
needs_install = pytest.mark.skipif(
    not _installed(), reason="scheduler-executor-hello is not installed (run `pip install -e .` in its directory)"
)


class TestHelloInProcess(ExecutorConformance):
    """The executor object built directly: runs even from a plain checkout."""

    def make_provider(self) -> HelloExecutor:
        return HelloExecutor()


@needs_install
class TestHelloThroughEntryPoint(ExecutorConformance):
    """Loaded by entry point exactly as the dispatcher and `scheduler conformance run executor hello` load it.

    ``case_filter`` narrows the run to the cases a capability-less executor can take part in
    (the gated ones would only be skipped).
    """

    provider_name = "hello"
    case_filter = ["executor.exit-*", "executor.stderr-*", "executor.stdin-*", "executor.binary-*", "executor.huge-*"]
