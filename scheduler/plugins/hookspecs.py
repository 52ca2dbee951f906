"""pluggy hook specifications: the 1:N extension points of the kernel.

Every hook is prefixed ``scheduler_``. Implementations live in modules registered
under the ``scheduler.hooks`` entry-point group and are called through the typed
facade in ``scheduler.plugins.hooks``; kernel code never calls ``pm.hook`` itself.
Hooks are observers and small decisions; anything that acts on the outside world
is a provider (see ``protocols.py``).
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "scheduler"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def scheduler_run_state_changed(run_id: str, job_id: str, old_status: str | None, new_status: str, at_ms: int) -> None:
    """A run moved from ``old_status`` to ``new_status`` (after the transition committed).

    Called for every run transition, once the transaction that made it committed (never
    for one that rolled back), in the process that committed it:

    * the dispatcher: a run starts (``None`` -> ``running``) or is skipped (``None`` ->
      ``skipped``: misfire, overlap, veto), finishes (``running`` -> ``ok``/``error``/
      ``timeout``/``cancelled``), its completion fails (``running`` -> ``error``), or crash
      recovery ends an orphan (``running``/``recovery_blocked`` -> ``crashed``, or
      ``running`` -> ``recovery_blocked``); auto-pause ends the job's waiting runs
      (``awaiting_approval`` ... -> ``cancelled``);
    * a CLI process: ``runs cancel`` / ``jobs cancel`` of a waiting run, and ``jobs disable``
      / ``delete`` / ``update`` cancelling waiting runs (``pending``, ``awaiting_approval``,
      ``approved`` -> ``cancelled``). Hook modules installed for that process are called.

    ``at_ms`` is when the transition happened. Must be quick; an exception is logged and
    swallowed, and the other observers are still called, so an observer can never block a run.
    """


@hookspec
def scheduler_register_commands(cli: Any) -> None:
    """Add commands to the ``scheduler`` CLI; ``cli`` is the root ``click.Group``.

    Only called when the user invokes a command the kernel does not know, so
    plugins cost nothing on the CLI's common paths.
    """


@hookspec
def scheduler_config_defaults() -> dict[str, Any]:
    """Return configuration defaults a plugin contributes, as ``{"key": value}``.

    ``scheduler config`` shows them beside the kernel's settings; a plugin cannot
    override a kernel key (kernel keys win), and among plugins the first registered wins.
    """
    raise NotImplementedError  # a specification: pluggy calls the plugins' implementations, never this


@hookspec(firstresult=True)
def scheduler_dispatch_veto(job: dict[str, Any], dispatch_kind: str) -> str | None:
    """Return a reason string to skip this dispatch, or None to let it run.

    The first non-None answer wins. A vetoed slot becomes a ``skipped`` run with the
    reason ``veto: <text>``, so nothing is dropped silently.
    """


@hookspec
def scheduler_run_completed(run: dict[str, Any]) -> None:
    """A run reached a terminal state (``ok``, ``error``, ``timeout``, ``cancelled``, ``crashed``
    or ``skipped``) and the transaction that ended it committed.

    ``run`` is the run's full JSON view (as ``runs get`` shows it), read after the commit.
    Called once per run, right after its ``scheduler_run_state_changed``, in the process
    that committed the end (see that hook): the dispatcher for completions, skips and
    crash recovery, a CLI process for runs it cancelled before they started.
    """
