"""The typed facade over pluggy through which the kernel calls hooks.

The plugin manager is built by ``make_plugin_manager`` (never at import time), which
registers the hook modules found in the ``scheduler.hooks`` entry-point group with
the same failure policy as every other plugin: a failing module is recorded, not
fatal (unless strict loading is on).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import attrs
import pluggy

from scheduler.base.entry_points import strict_loading
from scheduler.base.errors import SchedulerError
from scheduler.base.plugin_kinds import HOOKS_GROUP
from scheduler.core.rows import JSONObject
from scheduler.plugins import hookspecs
from scheduler.plugins.loader import load_group

log = logging.getLogger(__name__)


@attrs.frozen
class HookLoadFailure:
    """A hook module that was not registered, and why: ``failed`` (it did not import) or ``invalid``.

    ``invalid`` is a module pluggy refuses: an ``@hookimpl`` naming no hookspec (a misspelled
    hook name) or with arguments its hookspec does not have. ``plugins list`` and ``doctor``
    report these; the other hook modules keep working.
    """

    name: str
    distribution: str
    target: str
    status: str
    error: str

    def to_json(self) -> dict[str, str]:
        """The failure as a plain dict (error ``details``)."""
        return attrs.asdict(self)


def register_hook_modules(pm: pluggy.PluginManager) -> list[HookLoadFailure]:
    """Register every enabled ``scheduler.hooks`` module with ``pm``, each on its own; return the ones that failed.

    Modules are imported through the loader (stevedore, same listing and disable switch as
    every other plugin). A module is checked right after it is registered, so one module's
    unknown hook is that module's failure, never everyone's; a refused module is unregistered.
    """
    failures: list[HookLoadFailure] = []
    for item in load_group(HOOKS_GROUP):
        ep = item.entry_point
        error, status = item.error, "failed"
        if error is None:
            registered = False
            try:
                registered = pm.register(item.obj, name=f"entrypoint:{item.name}") is not None
                pm.check_pending()
            except Exception as exc:  # noqa: BLE001 - pluggy.PluginValidationError, or a module or name registered twice
                if registered:
                    pm.unregister(item.obj)
                error, status = exc, "invalid"
        if error is not None:
            failures.append(HookLoadFailure(item.name, item.distribution, str(ep.value), status, f"{type(error).__name__}: {error}"))
            log.warning("hook plugin %s from %s failed to load: %s", item.name, item.distribution, error)
    return failures


def make_plugin_manager(
    extra: Iterable[object] = (), *, load_entry_points: bool = True, failures: list[HookLoadFailure] | None = None
) -> pluggy.PluginManager:
    """A plugin manager with the kernel hookspecs, entry-point hook modules and ``extra`` registered.

    Hook modules that did not load are appended to ``failures`` when given (``doctor`` and
    ``plugins list`` report them) and are fatal only in strict mode.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if load_entry_points:
        found = register_hook_modules(pm)
        if failures is not None:
            failures.extend(found)
        if found and strict_loading():
            first = found[0]
            raise SchedulerError(
                "PLUGIN_LOAD_FAILED", f"hook plugin {first.name} from {first.distribution} failed: {first.error}",
                details=[f.to_json() for f in found],
            )
    for obj in extra:
        pm.register(obj)
    pm.check_pending()
    return pm


class Hooks:
    """Typed calls into the hook system; the only way kernel code reaches pluggy."""

    def __init__(self, pm: pluggy.PluginManager | None = None) -> None:
        self.pm = pm if pm is not None else make_plugin_manager()

    def _notify_each(self, name: str, **kwargs: Any) -> None:
        """Call every implementation of an observer hook; one failing observer never silences the others."""
        for impl in reversed(getattr(self.pm.hook, name).get_hookimpls()):  # pluggy order: last registered first
            try:
                impl.function(*[kwargs[arg] for arg in impl.argnames])
            except Exception:
                log.exception("%s hook of %s failed", name, impl.plugin_name)

    def wants(self, name: str) -> bool:
        """Whether any plugin implements the hook ``name`` (skip building arguments nobody reads)."""
        return bool(getattr(self.pm.hook, name).get_hookimpls())

    def run_state_changed(self, run_id: str, job_id: str, old_status: str | None, new_status: str, at_ms: int) -> None:
        """Notify observers of a committed transition; observer errors are logged, never raised."""
        self._notify_each(
            "scheduler_run_state_changed", run_id=run_id, job_id=job_id, old_status=old_status, new_status=new_status, at_ms=at_ms
        )

    def run_completed(self, run: JSONObject) -> None:
        """Notify observers that a run's completion committed."""
        self._notify_each("scheduler_run_completed", run=run)

    def dispatch_veto(self, job: dict[str, Any], dispatch_kind: str) -> str | None:
        """First veto reason from any plugin, or None. A failing hook vetoes (fail closed)."""
        try:
            return self.pm.hook.scheduler_dispatch_veto(job=job, dispatch_kind=dispatch_kind)
        except Exception as exc:
            log.exception("scheduler_dispatch_veto hook failed")
            return f"veto hook failed: {type(exc).__name__}"

    def register_commands(self, cli: Any) -> None:
        """Let plugins add CLI commands."""
        self.pm.hook.scheduler_register_commands(cli=cli)

    def config_defaults(self) -> dict[str, Any]:
        """Merged configuration defaults contributed by plugins (earlier registrations win)."""
        merged: dict[str, Any] = {}
        # pluggy returns results last-registered first; applying them in that order lets the
        # earliest registration's value be written last, so it wins.
        for part in self.pm.hook.scheduler_config_defaults():
            if isinstance(part, dict):
                merged.update(part)
        return merged
