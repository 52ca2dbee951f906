"""Plugin-owned option and settings classes: a JSON object validated into a frozen attrs instance, and back.

``build_options(cls, raw, prefix)`` validates a job's options object (or a settings table)
into ``cls``, refusing unknown keys and wrong types with per-field details;
``options_to_json(value)`` is what the kernel stores; ``catalogue(cls)`` lists the fields
(what ``scheduler schema jobs --executor NAME`` shows). The kernel validates every plugin's
options with the same code (``scheduler.base.options``), re-exported.
"""

from __future__ import annotations

from scheduler.base.options import build_options, catalogue, options_to_json

__all__ = ["build_options", "catalogue", "options_to_json"]
