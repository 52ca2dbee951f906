"""``scheduler-executor-hello``: the smallest useful executor, written for the plugin walkthrough.

``HelloExecutor`` runs a job's ``payload_message`` with ``/bin/sh -c`` and reports
what happened. It is deliberately short (see ``examples/plugin-walkthrough/README.md``
for what a production executor adds) and it declares no capability it does not
have: it cannot be cancelled mid-run, does not record a process identity and
always passes a minimal environment, so ``capabilities`` is empty.
"""

from __future__ import annotations

from scheduler_executor_hello.executor import HelloExecutor

__all__ = ["HelloExecutor"]
