"""Making provider objects out of plugin drivers, and loading whole groups, with a clear load-failure policy.

* Only named drivers are imported (``scheduler.plugins.drivers``): running a shell job never
  imports the Slack channel.
* A plugin that fails to import is recorded and reported (``plugins list``, ``doctor``);
  it never breaks an unrelated command.
* A configured driver that fails raises a coded ``SchedulerError`` naming its distribution.
* ``SCHEDULER_DISABLE_PLUGINS``: ``all``/``1``, or a comma list of ``group:name`` / ``name``
  entries (``executors:shell``, ``hooks:*``) that are treated as not installed.
* ``SCHEDULER_STRICT_PLUGINS=1``: any load failure while listing is an error too.
"""

from __future__ import annotations

from typing import Any

import attrs

from scheduler.base.entry_points import dist_name, entry_points_of, is_disabled
from scheduler.base.errors import SchedulerError
from scheduler.core.members import Configurable, Named, member_problems
from scheduler.plugins.drivers import check_api, load_named, stevedore_managers
from scheduler.plugins.protocols import PROVIDER_KINDS
from scheduler.settings import plugin_settings


def load_provider(kind: str, name: str) -> Any:
    """Load and instantiate a provider of a kind (``executor``, ``channel``, ...), checked against its Protocol.

    The one place a provider object is made: everything the kernel hands a provider before
    first use belongs here: the name it was loaded under (``registered_as``, when it is
    ``Named``), then its host settings (when it declares ``settings_class``).
    """
    group, protocol = PROVIDER_KINDS[kind]
    target, dist = load_named(group, name)
    if isinstance(target, type) or hasattr(target, "plugin_api"):
        check_api(target, group=group, name=name, dist=dist)
    try:
        provider = target() if isinstance(target, type) or not hasattr(target, "plugin_api") else target
    except Exception as exc:  # noqa: BLE001 - any failure of third-party plugin code is reported, coded
        raise SchedulerError(
            "PLUGIN_LOAD_FAILED", f"{kind} driver {name!r} from {dist} failed to initialise: {type(exc).__name__}: {exc}"
        ) from None
    check_api(provider, group=group, name=name, dist=dist)
    if not isinstance(provider, protocol):
        missing = [m for m in dir(protocol) if not m.startswith("_") and not hasattr(provider, m)]
        raise SchedulerError(
            "PLUGIN_INVALID", f"{kind} driver {name!r} from {dist} does not implement the {protocol.__name__} protocol (missing: {', '.join(missing)})"
        )
    check_members(provider, kind=kind, name=name, dist=dist)
    if isinstance(provider, Named):
        provider.registered_as(name)
    apply_settings(kind, name, provider)
    return provider


def check_members(provider: Any, *, kind: str, name: str, dist: str) -> None:
    """Refuse (``PLUGIN_INVALID``) a provider that declares only part of an optional-member Protocol.

    Each optional member is a Protocol of its own (``scheduler.core.members``): a
    ``settings_class`` without ``configure`` would have its settings validated and then
    silently ignored, an ``options_class`` that is not an attrs class cannot validate a job's
    options. Checked once here, so the kernel can ask ``isinstance`` everywhere else.
    """
    problems = member_problems(provider)
    if problems:
        protocol, problem = problems[0]
        raise SchedulerError("PLUGIN_INVALID", f"{kind} driver {name!r} from {dist}: {problem}",
                             details={"protocol": protocol, "problems": [p for _protocol, p in problems]})


def apply_settings(kind: str, name: str, provider: Any) -> Any:
    """Give a loaded provider its host settings: validate its ``settings_class`` table and call ``configure``.

    Settings go here, and only here: a ``Configurable`` provider gets its validated
    settings-file table (``[executors.shell]``, ``[channels.slack]``, ``[providers.NAME]``)
    through ``configure(settings)`` before it is returned; ``CONFIG_INVALID`` names the key
    when it does not validate. Returns the settings (None for a provider that is not
    ``Configurable``).
    """
    if not isinstance(provider, Configurable) or provider.settings_class is None:
        return None
    settings = plugin_settings(kind, name, provider.settings_class)
    provider.configure(settings)
    return settings


@attrs.frozen
class Loaded:
    """One entry point of a group after an attempt to import it: its object, or why it failed."""

    entry_point: Any
    obj: Any = None
    error: BaseException | None = None

    @property
    def name(self) -> str:
        """The entry point's name (the driver name users write)."""
        return str(self.entry_point.name)

    @property
    def distribution(self) -> str:
        """The distribution that registered it."""
        return dist_name(self.entry_point)


def load_group(group: str, names: list[str] | None = None) -> list[Loaded]:
    """Import every enabled entry point of ``group`` (or only ``names``) through stevedore; failures recorded, never raised.

    Disabled entry points are neither imported nor returned. Used by ``inventory`` and to
    register hook modules, so both see the same listing and the same failures.
    """
    listing = [ep for ep in entry_points_of(group) if not is_disabled(group, ep.name)]
    if names is not None:
        listing = [ep for ep in listing if ep.name in names]
    if not listing:
        return []
    failures: dict[int, BaseException] = {}

    def on_failure(_manager: Any, ep: Any, exc: BaseException) -> None:
        failures[id(ep)] = exc

    _, named_manager_cls = stevedore_managers()
    manager = named_manager_cls(
        group, sorted({ep.name for ep in listing}), listing, invoke_on_load=False,
        on_load_failure_callback=on_failure, on_missing_entrypoints_callback=None,
    )
    loaded = {id(ext.entry_point): ext.plugin for ext in manager.extensions}
    return [Loaded(ep, obj=loaded.get(id(ep)), error=failures.get(id(ep))) for ep in listing]
