"""``scheduler-executor-python``: a non-shell example executor for the plugin walkthrough.

``PythonExecutor`` runs a job's ``payload_message`` as Python source in a child
interpreter of its own process group, records the process handle before the payload
can act, enforces the deadline and cancellation (SIGTERM, then SIGKILL), captures
both streams through ``StreamRecorder`` and parses structured output.
``PythonPayloads`` (in ``conformance``) is its conformance payload adapter: it writes
each conformance case's behaviour as Python code.
"""

from __future__ import annotations

from scheduler_executor_python.executor import PythonExecutor, PythonOptions

__all__ = ["PythonExecutor", "PythonOptions"]
