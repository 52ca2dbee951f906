"""For plugins that add CLI commands (``scheduler_register_commands``): the CLI's output contract.

``emit(payload, human)`` prints ``{"ok": true, **payload}`` under ``--json`` and calls
``human()`` otherwise; ``table(rows, headers)`` renders a human table. Raise
``SchedulerError`` for failures: the CLI prints it as ``{"ok": false, ...}`` and exits non-zero.
The kernel's own commands use the same code (``scheduler.toolkit.cli_output``), re-exported.
"""

from __future__ import annotations

from scheduler.toolkit.cli_output import emit, table

__all__ = ["emit", "table"]
