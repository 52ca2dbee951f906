"""Formerly the process helpers for executors; they are ``scheduler_toolkit.process`` now.

Every name this module exported still imports from here for one release, with a
``DeprecationWarning`` naming its new import; it defines no names of its own.
"""

from __future__ import annotations

from scheduler.base.deprecation import moved_names as _moved_names

__all__: list[str] = []

#: Every name this module exported -> where it lives now (one release).
__getattr__ = _moved_names(__name__, {
    **dict.fromkeys(("Completed", "minimal_env", "run_bounded", "snippet"), "scheduler_toolkit.process"),
    **dict.fromkeys(("group_alive", "kill_group", "leftovers_after_reap", "live_group_members", "orphan_group_safe_to_kill",
                     "process_identity", "same_process"), ("scheduler_toolkit.process", "scheduler.core.processes")),
})
