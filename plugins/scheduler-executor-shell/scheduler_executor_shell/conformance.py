"""The shell executor's conformance payload adapter (entry point ``scheduler.conformance_adapters:shell``).

The conformance engine describes each executor case as a behaviour ("print this",
"exit with 3", "ignore SIGTERM"...). ``ShellPayloadAdapter`` writes it as a POSIX
shell script (the kernel's stock ``PosixShellPayloads``) and maps the two behaviours
that need per-job options onto ``ShellOptions``: standard input (``stdin_text``) and
the environment policy (``env_policy``). It also accepts the raw ``posix-shell`` cases,
the shell-only part of the corpus. Only the conformance engine imports this module.
"""

from __future__ import annotations

from scheduler.testing import PosixShellPayloads


class ShellPayloadAdapter(PosixShellPayloads):
    """POSIX shell payloads, with stdin and the environment policy through ``executor_options``."""

    stdin_option = "stdin_text"
    env_policy_option = "env_policy"


__all__ = ["ShellPayloadAdapter"]
