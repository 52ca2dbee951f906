"""The kernel's conformance corpus against the shell executor, through ``scheduler.testing``.

The shell executor declares every capability the executor cases ask for and its payload
adapter (``ShellPayloadAdapter``, entry point ``scheduler.conformance_adapters:shell``)
expresses every behaviour and speaks ``posix-shell``, so every case must run and pass:
none may be skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from scheduler_executor_shell import ShellExecutor
from scheduler_executor_shell.conformance import ShellPayloadAdapter

from scheduler.testing import Behaviour, ExecutorConformance, Step


class TestShellThroughEntryPoint(ExecutorConformance):
    """Loaded by entry point, with the adapter its distribution registers: exactly what `scheduler conformance run
    executor shell` and the CI runner do."""

    provider_name = "shell"


class TestShellInProcess(ExecutorConformance):
    """The executor object built directly and the adapter named here (a plain checkout, nothing installed)."""

    payload_adapter = ShellPayloadAdapter
    case_filter: ClassVar[list[str]] = ["executor.stdin-*", "executor.env-*", "executor.exit-*", "executor.posix-shell.*"]

    def make_provider(self) -> ShellExecutor:
        return ShellExecutor()


def test_the_adapter_expresses_every_case_and_shell_claims_every_capability() -> None:
    """No case can be skipped for shell: every capability is declared and every behaviour has a shell form."""
    cases = ExecutorConformance.conformance_cases()
    assert cases
    adapter = ShellPayloadAdapter()
    for case in cases:
        assert set(case.requires) <= ShellExecutor.capabilities, case.id
        behaviour = Behaviour.from_case_input(case.id, case.input)
        assert behaviour.raw is None or behaviour.raw.language in adapter.languages, case.id
        fields = adapter.conformance_payload(behaviour)  # raises NotImplementedError if it could not
        assert set(fields) <= {"payload_message", "executor_options"} and fields["payload_message"].strip(), case.id


def test_stdin_and_env_policy_become_shell_options() -> None:
    behaviour = Behaviour(case_id="x", steps=(Step("stdin_to_stdout", True),), stdin="in\n", env_policy="inherit")
    fields = ShellPayloadAdapter().conformance_payload(behaviour)
    assert fields == {"payload_message": "cat", "executor_options": {"stdin_text": "in\n", "env_policy": "inherit"}}


def test_the_adapter_module_imports_only_the_public_api() -> None:
    source = (Path(__file__).resolve().parents[1] / "scheduler_executor_shell" / "conformance.py").read_text()
    kernel = [line for line in source.splitlines() if line.startswith(("from scheduler", "import scheduler"))]
    assert kernel == ["from scheduler.testing import PosixShellPayloads"]
