"""Run ids as users see them: ``short_run_id(run_id)``, the last 8 characters that listings show and that every
command taking a run (``runs get``, ``runs cancel`` ...) takes back.

The kernel's own code (``scheduler.base.run_ids``), re-exported: a plugin that shows runs (the web
view, a chat bot) shows them as the CLI does.
"""

from __future__ import annotations

from scheduler.base.run_ids import short_run_id

__all__ = ["short_run_id"]
