"""Importing one named driver of an entry-point group through stevedore, checked against the plugin API.

Cheap to import (no provider Protocols, no settings, no stevedore until a driver is loaded),
so opening a store by URL (``scheduler.plugins.stores``) costs a command nothing more.
Making a provider object out of a driver (its Protocol, its settings) is ``scheduler.plugins.loader``.

* Only named drivers are imported: running a shell job never imports the Slack channel.
* A configured driver that fails raises a coded ``SchedulerError`` naming its distribution.
* A driver switched off by ``SCHEDULER_DISABLE_PLUGINS`` is treated as not installed.
"""

from __future__ import annotations

import functools
from typing import Any

from scheduler import PLUGIN_API_VERSION
from scheduler.base.entry_points import dist_name, entry_points_of, is_disabled, short_group
from scheduler.base.errors import SchedulerError
from scheduler.base.plugin_kinds import declares_api


@functools.cache
def stevedore_managers() -> tuple[type, type]:
    """stevedore's ``DriverManager`` and ``NamedExtensionManager``, each over a listing it is given.

    Built on first use, so importing the plugin layer (``jobs validate`` checks plugin presence)
    does not import stevedore.
    """
    from stevedore import DriverManager, NamedExtensionManager

    class ListedDriverManager(DriverManager):
        """A ``DriverManager`` over the entry points it is given (see ``entry_points_of`` for why)."""

        def __init__(self, namespace: str, name: str, listing: list[Any], **kwargs: Any) -> None:
            self.listing = listing
            super().__init__(namespace, name, **kwargs)

        def list_entry_points(self) -> list[Any]:
            return self.listing

    class ListedNamedExtensionManager(NamedExtensionManager):
        """A ``NamedExtensionManager`` over the entry points it is given (see ``entry_points_of`` for why)."""

        def __init__(self, namespace: str, names: list[str], listing: list[Any], **kwargs: Any) -> None:
            self.listing = listing
            super().__init__(namespace, names, **kwargs)

        def list_entry_points(self) -> list[Any]:
            return self.listing

    return ListedDriverManager, ListedNamedExtensionManager


def dist_version(ep: Any) -> str | None:
    """The version of the distribution that registered entry point ``ep`` (None when unknown), for listings."""
    dist = getattr(ep, "dist", None)
    return getattr(dist, "version", None)


#: What changed from an earlier plugin API major to this kernel's, said when a provider built for it is refused.
API_CHANGES: dict[int, str] = {
    2: ("plugin API 3 keeps only the contract in scheduler.api (helpers moved to the scheduler-toolkit "
        "distribution, scheduler_toolkit.*), makes optional members Protocols checked at load (a settings_class "
        "needs configure, options_class must be an attrs class), adds the proof_verifier kind, and wants plugin_api "
        "written as the literal 3; see 'From plugin API 2 to 3' in docs/plugins.md"),
}


def check_api(obj: Any, *, group: str, name: str, dist: str) -> None:
    """Refuse a provider whose ``plugin_api`` major differs from the kernel's, or with bad capabilities."""
    api = getattr(obj, "plugin_api", None)
    if not declares_api(group):  # hook modules, steps, secret schemes, conformance adapters
        return
    if not isinstance(api, int) or isinstance(api, bool):
        raise SchedulerError(
            "PLUGIN_API_MISMATCH", f"{short_group(group)} driver {name!r} from {dist} declares no integer plugin_api"
        )
    if api != PLUGIN_API_VERSION:
        change = API_CHANGES.get(api)
        raise SchedulerError(
            "PLUGIN_API_MISMATCH",
            f"{short_group(group)} driver {name!r} from {dist} targets plugin API {api}, kernel provides {PLUGIN_API_VERSION}"
            + (f": {change}" if change else ""),
            details={"group": group, "name": name, "distribution": dist, "plugin_api": api,
                     "kernel_plugin_api": PLUGIN_API_VERSION, **({"changed": change} if change else {})},
        )
    caps = getattr(obj, "capabilities", None)
    if not isinstance(caps, (set, frozenset)) or not all(isinstance(c, str) for c in caps):
        raise SchedulerError(
            "PLUGIN_INVALID", f"{short_group(group)} driver {name!r} from {dist}: capabilities must be a set of strings"
        )


def load_named(group: str, name: str) -> tuple[Any, str]:
    """Import exactly one named driver through stevedore; return its target object and distribution (unchecked).

    Raises ``PLUGIN_NOT_FOUND`` (not installed or disabled) or ``PLUGIN_LOAD_FAILED``
    (import error, naming the distribution).
    """
    if is_disabled(group, name):
        raise SchedulerError("PLUGIN_NOT_FOUND", f"{short_group(group)} driver {name!r} is disabled by SCHEDULER_DISABLE_PLUGINS")
    listing = entry_points_of(group)
    matches = [ep for ep in listing if ep.name == name]
    if not matches:
        raise SchedulerError("PLUGIN_NOT_FOUND", f"no {short_group(group)} driver named {name!r} is installed")
    dist = dist_name(matches[0])
    failure: list[BaseException] = []

    def on_failure(_manager: Any, _ep: Any, exc: BaseException) -> None:
        failure.append(exc)

    driver_manager_cls, _ = stevedore_managers()
    try:
        manager = driver_manager_cls(
            group, name, listing, invoke_on_load=False, on_load_failure_callback=on_failure, on_missing_entrypoints_callback=None
        )
        obj = manager.driver
    except Exception as exc:  # noqa: BLE001 - stevedore raises NoMatches (after a load failure), MultipleMatches, ...
        cause = failure[0] if failure else exc
        raise SchedulerError(
            "PLUGIN_LOAD_FAILED",
            f"{short_group(group)} driver {name!r} from {dist} failed to load: {type(cause).__name__}: {cause}",
            details={"group": group, "name": name, "distribution": dist},
        ) from None
    return obj, dist


def load_driver(group: str, name: str) -> Any:
    """Import exactly one named driver (the entry point's target object), checking its API major.

    Raises ``PLUGIN_NOT_FOUND`` (not installed or disabled) or ``PLUGIN_LOAD_FAILED``
    (import error, naming the distribution) or ``PLUGIN_API_MISMATCH``.
    """
    obj, dist = load_named(group, name)
    if isinstance(obj, type) or hasattr(obj, "plugin_api"):
        check_api(obj, group=group, name=name, dist=dist)  # a factory function is checked on what it returns
    return obj
