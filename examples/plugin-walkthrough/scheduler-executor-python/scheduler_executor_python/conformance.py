"""``PythonPayloads``: the python executor's conformance payload adapter.

The conformance engine describes each executor case as a behaviour: a list of steps
such as ``stdout`` (print this text), ``exit`` (end with this status), ``sleep_ms``
(keep running), ``ignore_sigterm``, ``stdin_to_stdout``... plus, for some cases, text
for standard input and an environment policy. This adapter writes the steps as
Python source, one statement per step, and maps stdin and the environment policy to
``PythonOptions`` (``stdin_text``, ``env_policy``). It takes no raw payload language,
so the shell-only cases (``executor/posix-shell/``) are skipped with that reason.

The engine finds it through the entry point ``scheduler.conformance_adapters:python``
(see ``pyproject.toml``). An adapter needs no kernel import: it receives the
behaviour object, returns a dict of job fields, and raises ``NotImplementedError`` for
anything it cannot express (that case is then skipped, never passed).
"""

from __future__ import annotations

from typing import Any

#: First line of every generated payload: the names the steps use.
PRELUDE = "import os, signal, subprocess, sys, time\nout, err = sys.stdout.buffer, sys.stderr.buffer"


class PythonPayloads:
    """Writes a conformance behaviour as a Python payload for ``PythonExecutor``."""

    #: Raw payload languages accepted verbatim: none (there are no raw Python cases in the corpus).
    languages: frozenset[str] = frozenset()

    def conformance_payload(self, behaviour: Any) -> dict[str, Any]:
        """``payload_message`` (Python source) and ``executor_options`` for ``behaviour``."""
        if behaviour.raw is not None:
            raise NotImplementedError(f"raw {behaviour.raw.language} payloads cannot run as Python")
        options: dict[str, Any] = {}
        if behaviour.stdin is not None:
            options["stdin_text"] = behaviour.stdin
        if behaviour.env_policy is not None:
            options["env_policy"] = behaviour.env_policy
        source = "\n".join([PRELUDE, *(self.statement(step.action, step.value) for step in behaviour.steps)])
        fields: dict[str, Any] = {"payload_message": source}
        if options:
            fields["executor_options"] = options
        return fields

    def statement(self, action: str, value: Any) -> str:
        """The Python statement of one step."""
        if action == "stdout":
            return f"out.write({value.encode()!r}); out.flush()"
        if action == "stderr":
            return f"err.write({value.encode()!r}); err.flush()"
        if action == "stdout_hex":
            return f"out.write(bytes.fromhex({value!r})); out.flush()"
        if action == "stdout_zeros":
            return f"[out.write(bytes(min(65536, {int(value)} - i))) for i in range(0, {int(value)}, 65536)]; out.flush()"
        if action == "stdout_env":
            return f"out.write((os.environ.get({value!r}, '') + '\\n').encode()); out.flush()"
        if action == "stdin_to_stdout":
            return "out.write(sys.stdin.buffer.read()); out.flush()"
        if action == "sleep_ms":
            return f"time.sleep({int(value) / 1000!r})"
        if action == "ignore_sigterm":
            return "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
        if action == "spawn_child_ms":
            child = f"import time; time.sleep({int(value) / 1000!r})"
            return (
                f"subprocess.Popen([sys.executable, '-c', {child!r}], stdin=subprocess.DEVNULL, "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
            )
        if action == "exit":
            return f"out.flush(); err.flush(); sys.exit({int(value)})"
        raise NotImplementedError(f"step {action!r} has no Python form here")


__all__ = ["PythonPayloads"]
