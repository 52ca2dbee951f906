"""Plugin discovery and loading through stevedore, with a clear load-failure policy.

* Only named drivers are imported: running a shell job never imports the Slack channel.
* A plugin that fails to import is recorded and reported (``plugins list``, ``doctor``);
  it never breaks an unrelated command.
* A configured driver that fails raises a coded ``SchedulerError`` naming its distribution.
* ``SCHEDULER_DISABLE_PLUGINS``: ``all``/``1``, or a comma list of ``group:name`` / ``name``
  entries (``executors:shell``, ``hooks:*``) that are treated as not installed.
* ``SCHEDULER_STRICT_PLUGINS=1``: any load failure while listing is an error too.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from scheduler import PLUGIN_API_VERSION
from scheduler.base.errors import SchedulerError
from scheduler.base.entry_points import (  # discovery lives below the settings, which read secret schemes with it
    dist_name,
    entry_point_names,
    entry_points_of,
    is_available,
    is_disabled,
    strict_loading,
)
from scheduler.base.entry_points import short_group as _short_group
from scheduler.plugins.protocols import PROVIDER_KINDS
from scheduler.settings import apply_settings

#: Older private name, kept for kernel callers that still import it.
_entry_points = entry_points_of


@functools.cache
def _stevedore_managers() -> tuple[type, type]:
    """stevedore's ``DriverManager`` and ``NamedExtensionManager``, each over a listing it is given.

    Built on first use, so importing the loader (``jobs validate`` checks plugin presence)
    does not import stevedore.
    """
    from stevedore import DriverManager, NamedExtensionManager

    class ListedDriverManager(DriverManager):  # type: ignore[misc]
        """A ``DriverManager`` over the entry points it is given (see ``entry_points_of`` for why)."""

        def __init__(self, namespace: str, name: str, listing: list[Any], **kwargs: Any) -> None:
            self.listing = listing
            super().__init__(namespace, name, **kwargs)

        def list_entry_points(self) -> list[Any]:
            return self.listing

    class ListedNamedExtensionManager(NamedExtensionManager):  # type: ignore[misc]
        """A ``NamedExtensionManager`` over the entry points it is given (see ``entry_points_of`` for why)."""

        def __init__(self, namespace: str, names: list[str], listing: list[Any], **kwargs: Any) -> None:
            self.listing = listing
            super().__init__(namespace, names, **kwargs)

        def list_entry_points(self) -> list[Any]:
            return self.listing

    return ListedDriverManager, ListedNamedExtensionManager


_dist_name = dist_name  # older private name


def dist_version(ep: Any) -> str | None:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "version", None)


def check_api(obj: Any, *, group: str, name: str, dist: str) -> None:
    """Refuse a provider whose ``plugin_api`` major differs from the kernel's, or with bad capabilities."""
    api = getattr(obj, "plugin_api", None)
    if group == "scheduler.hooks":
        return
    if not isinstance(api, int) or isinstance(api, bool):
        raise SchedulerError(
            "PLUGIN_API_MISMATCH", f"{_short_group(group)} driver {name!r} from {dist} declares no integer plugin_api"
        )
    if api != PLUGIN_API_VERSION:
        raise SchedulerError(
            "PLUGIN_API_MISMATCH",
            f"{_short_group(group)} driver {name!r} from {dist} targets plugin API {api}, kernel provides {PLUGIN_API_VERSION}",
        )
    caps = getattr(obj, "capabilities", None)
    if not isinstance(caps, (set, frozenset)) or not all(isinstance(c, str) for c in caps):
        raise SchedulerError(
            "PLUGIN_INVALID", f"{_short_group(group)} driver {name!r} from {dist}: capabilities must be a set of strings"
        )


def _load_named(group: str, name: str) -> tuple[Any, str]:
    """Import exactly one named driver through stevedore; return its target object and distribution."""
    if is_disabled(group, name):
        raise SchedulerError("PLUGIN_NOT_FOUND", f"{_short_group(group)} driver {name!r} is disabled by SCHEDULER_DISABLE_PLUGINS")
    listing = entry_points_of(group)
    matches = [ep for ep in listing if ep.name == name]
    if not matches:
        raise SchedulerError("PLUGIN_NOT_FOUND", f"no {_short_group(group)} driver named {name!r} is installed")
    dist = dist_name(matches[0])
    failure: list[BaseException] = []

    def on_failure(_manager: Any, _ep: Any, exc: BaseException) -> None:
        failure.append(exc)

    driver_manager_cls, _ = _stevedore_managers()
    try:
        manager = driver_manager_cls(
            group, name, listing, invoke_on_load=False, on_load_failure_callback=on_failure, on_missing_entrypoints_callback=None
        )
        obj = manager.driver
    except Exception as exc:  # stevedore raises NoMatches (after a load failure), MultipleMatches, ...
        cause = failure[0] if failure else exc
        raise SchedulerError(
            "PLUGIN_LOAD_FAILED",
            f"{_short_group(group)} driver {name!r} from {dist} failed to load: {type(cause).__name__}: {cause}",
            details={"group": group, "name": name, "distribution": dist},
        ) from None
    return obj, dist


def load_driver(group: str, name: str) -> Any:
    """Import exactly one named driver (the entry point's target object), checking its API major.

    Raises ``PLUGIN_NOT_FOUND`` (not installed or disabled) or ``PLUGIN_LOAD_FAILED``
    (import error, naming the distribution) or ``PLUGIN_API_MISMATCH``.
    """
    obj, dist = _load_named(group, name)
    if isinstance(obj, type) or hasattr(obj, "plugin_api"):
        check_api(obj, group=group, name=name, dist=dist)  # a factory function is checked on what it returns
    return obj


def load_provider(kind: str, name: str) -> Any:
    """Load and instantiate a provider of a kind (``executor``, ``channel``, ...), checked against its Protocol.

    The one place a provider object is made: everything the kernel hands a provider before
    first use (its host settings, when it declares ``settings_class``) belongs here.
    """
    group, protocol = PROVIDER_KINDS[kind]
    target, dist = _load_named(group, name)
    if isinstance(target, type) or hasattr(target, "plugin_api"):
        check_api(target, group=group, name=name, dist=dist)
    try:
        provider = target() if isinstance(target, type) or not hasattr(target, "plugin_api") else target
    except Exception as exc:
        raise SchedulerError(
            "PLUGIN_LOAD_FAILED", f"{kind} driver {name!r} from {dist} failed to initialise: {type(exc).__name__}: {exc}"
        ) from None
    check_api(provider, group=group, name=name, dist=dist)
    if not isinstance(provider, protocol):
        missing = [m for m in dir(protocol) if not m.startswith("_") and not hasattr(provider, m)]
        raise SchedulerError(
            "PLUGIN_INVALID", f"{kind} driver {name!r} from {dist} does not implement the {protocol.__name__} protocol (missing: {', '.join(missing)})"
        )
    # Settings go here, and only here: a provider declaring ``settings_class`` gets its validated
    # settings-file table (``[executors.shell]``, ``[channels.slack]``, ``[providers.NAME]``) through
    # ``configure(settings)`` before it is returned; CONFIG_INVALID names the key when it does not validate.
    apply_settings(kind, name, provider)
    return provider


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

    _, named_manager_cls = _stevedore_managers()
    manager = named_manager_cls(
        group, sorted({ep.name for ep in listing}), listing, invoke_on_load=False,
        on_load_failure_callback=on_failure, on_missing_entrypoints_callback=None,
    )
    loaded = {id(ext.entry_point): ext.plugin for ext in manager.extensions}
    return [Loaded(ep, obj=loaded.get(id(ep)), error=failures.get(id(ep))) for ep in listing]
