"""The hook module, called through the kernel's typed facade (``scheduler.testing.hooks_with``)."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner
from scheduler_executor_hello import hooks as hello_hooks

from scheduler.testing import hooks_with, run_cli


def facade():
    """The kernel's hook facade with only this module registered (no other installed plugins)."""
    return hooks_with(hello_hooks)


def test_state_changes_are_logged(tmp_path, monkeypatch) -> None:
    log = tmp_path / "states.ndjson"
    monkeypatch.setenv(hello_hooks.LOG_ENV, str(log))
    hooks = facade()
    hooks.run_state_changed("run-1", "job-1", None, "running", 1000)
    hooks.run_state_changed("run-1", "job-1", "running", "ok", 2000)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(entry["old"], entry["new"]) for entry in lines] == [(None, "running"), ("running", "ok")]


def test_state_log_is_off_by_default(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(hello_hooks.LOG_ENV, raising=False)
    facade().run_state_changed("run-1", "job-1", None, "running", 1000)  # no file, no error


def test_veto_only_while_the_pause_file_exists(tmp_path, monkeypatch) -> None:
    pause = tmp_path / "pause"
    monkeypatch.setenv(hello_hooks.PAUSE_ENV, str(pause))
    hooks = facade()
    job = {"id": "job-1", "name": "greet", "executor": "hello"}
    assert hooks.dispatch_veto(job, "schedule") is None
    pause.touch()
    assert "paused" in hooks.dispatch_veto(job, "schedule")
    assert hooks.dispatch_veto(job, "manual") is None  # a user's explicit `jobs run` is not held back
    assert hooks.dispatch_veto({**job, "executor": "shell"}, "schedule") is None


def test_register_commands_adds_hello() -> None:
    root = click.Group("scheduler")
    facade().register_commands(root)
    facade().register_commands(root)  # twice is harmless
    result = CliRunner().invoke(root, ["hello", "--name", "tester"])
    assert result.exit_code == 0, result.output
    assert "hello, tester" in result.output


@pytest.mark.usefixtures("hello_installed")
def test_scheduler_hello_command_through_the_real_cli() -> None:
    code, out, err = run_cli("--json", "hello", "--name", "cli")
    assert code == 0, err
    assert json.loads(out) == {"ok": True, "greeting": "hello, cli (from scheduler-executor-hello)"}
