"""scheduler-executor-shell: the ``shell`` executor driver of the scheduler.

Runs a job's payload with a POSIX shell in its own process group, with timeouts,
cancellation, output capture, structured output, verification and an environment
policy. See ``README.md`` for options and guarantees.
"""

from __future__ import annotations

from scheduler_executor_shell.executor import ShellExecutor

__version__ = "0.1.0"

__all__ = ["ShellExecutor", "__version__"]
