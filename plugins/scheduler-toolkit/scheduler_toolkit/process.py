"""Process helpers for executors that run local processes (Linux ``/proc``) and providers that run helper programs.

``process_identity(pid)`` returns ``"ticks:<start time>"`` (or ``None`` when no such
process exists: it already exited), which together with the PID tells a process
apart from a later one that reuses the number; ``same_process(pid, identity)`` compares.
``kill_group(pgid, grace_s, reap=...)`` sends SIGTERM (and SIGCONT) to a whole process
group, SIGKILL after ``grace_s``, and returns the strongest signal used once the group is
confirmed gone; ``reap`` (for example ``Popen.poll``) is called while waiting so your own
child does not linger as a zombie. It raises ``SchedulerError("PROCESS_GROUP_SURVIVED")``
when members remain even after SIGKILL (stuck in uninterruptible I/O).
``orphan_group_safe_to_kill`` is what a ``recover`` implementation asks before it signals a
recorded group; ``group_alive`` and ``live_group_members`` look at a group;
``leftovers_after_reap(pgid)`` is the cheap check (one ``killpg``, no ``/proc`` scan) whether
members of a group may remain once you reaped its leader.

``run_bounded(argv, data, timeout_s=..., max_stdout=..., env=minimal_env())`` runs a helper
program (``ssh-keygen``, an attestor) with stdin, a deadline and output caps, killing its
whole group past them, and returns a ``Completed``; ``snippet(output)`` is a short printable
excerpt for an error message.

``run_bounded`` and its companions are this distribution's (``scheduler_toolkit.helper_programs``); the
process-group helpers are the kernel's own code (``scheduler.core.processes``, which crash recovery
and the conformance runner use too), re-exported.
"""

from __future__ import annotations

from scheduler.core.processes import (
    LOADER_ENV_NAMES,
    LOADER_ENV_PREFIXES,
    group_alive,
    is_loader_variable,
    kill_group,
    leftovers_after_reap,
    live_group_members,
    orphan_group_safe_to_kill,
    process_identity,
    same_process,
)
from scheduler_toolkit.helper_programs import Completed, minimal_env, run_bounded, snippet

__all__ = [
    "LOADER_ENV_NAMES",
    "LOADER_ENV_PREFIXES",
    "Completed",
    "group_alive",
    "is_loader_variable",
    "kill_group",
    "leftovers_after_reap",
    "live_group_members",
    "minimal_env",
    "orphan_group_safe_to_kill",
    "process_identity",
    "run_bounded",
    "same_process",
    "snippet",
]
