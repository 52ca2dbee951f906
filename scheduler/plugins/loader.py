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

import os
from typing import Any

from scheduler import PLUGIN_API_VERSION
from scheduler.errors import SchedulerError

_ALL = {"1", "all", "*", "true", "yes"}


def _short_group(group: str) -> str:
    return group.split(".", 1)[1] if group.startswith("scheduler.") else group


def is_disabled(group: str, name: str) -> bool:
    """Whether ``SCHEDULER_DISABLE_PLUGINS`` switches this driver off."""
    raw = os.environ.get("SCHEDULER_DISABLE_PLUGINS", "").strip()
    if not raw:
        return False
    if raw.lower() in _ALL:
        return True
    short = _short_group(group)
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        if ":" in item:
            g, n = item.split(":", 1)
            if g in (short, group) and n in ("*", name):
                return True
        elif item == name:
            return True
    return False


def strict_loading() -> bool:
    """Whether ``SCHEDULER_STRICT_PLUGINS`` makes every load failure fatal."""
    return os.environ.get("SCHEDULER_STRICT_PLUGINS", "").strip().lower() in _ALL


def _entry_points(group: str) -> list[Any]:
    from importlib.metadata import entry_points

    return list(entry_points(group=group))


def _dist_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "unknown distribution"


def _dist_version(ep: Any) -> str | None:
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


def load_driver(group: str, name: str) -> Any:
    """Import exactly one named driver (the entry point's target object), checking its API major.

    Raises ``PLUGIN_NOT_FOUND`` (not installed or disabled) or ``PLUGIN_LOAD_FAILED``
    (import error, naming the distribution) or ``PLUGIN_API_MISMATCH``.
    """
    if is_disabled(group, name):
        raise SchedulerError("PLUGIN_NOT_FOUND", f"{_short_group(group)} driver {name!r} is disabled by SCHEDULER_DISABLE_PLUGINS")
    matches = [ep for ep in _entry_points(group) if ep.name == name]
    if not matches:
        raise SchedulerError("PLUGIN_NOT_FOUND", f"no {_short_group(group)} driver named {name!r} is installed")
    from stevedore import DriverManager
    from stevedore.exception import NoMatches

    failure: list[BaseException] = []

    def on_failure(_manager: Any, ep: Any, exc: BaseException) -> None:
        failure.append(exc)

    def manager() -> Any:
        return DriverManager(
            namespace=group,
            name=name,
            invoke_on_load=False,
            on_load_failure_callback=on_failure,
            on_missing_entrypoints_callback=lambda _names: None,
        )

    dist = _dist_name(matches[0])
    try:
        try:
            driver_manager = manager()
        except NoMatches:
            if failure:
                raise
            # stevedore keeps a group's entry points for the life of the process; this driver was
            # installed after the group was first read (a long-running dispatcher): read it again.
            DriverManager.ENTRY_POINT_CACHE.pop(group, None)
            driver_manager = manager()
        obj = driver_manager.driver
    except Exception as exc:  # stevedore raises NoMatches/NoUniqueMatch/RuntimeError
        cause = failure[0] if failure else exc
        raise SchedulerError(
            "PLUGIN_LOAD_FAILED",
            f"{_short_group(group)} driver {name!r} from {dist} failed to load: {type(cause).__name__}: {cause}",
            details={"group": group, "name": name, "distribution": dist},
        ) from None
    if isinstance(obj, type) or hasattr(obj, "plugin_api"):
        check_api(obj, group=group, name=name, dist=dist)  # a factory function is checked on what it returns
    return obj


def load_provider(kind: str, name: str) -> Any:
    """Load and instantiate a provider of a kind (``executor``, ``channel``, ...), checked against its Protocol."""
    from scheduler.plugins.protocols import PROVIDER_KINDS

    group, protocol = PROVIDER_KINDS[kind]
    target = load_driver(group, name)
    dist = next((_dist_name(ep) for ep in _entry_points(group) if ep.name == name), "unknown distribution")
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
    return provider


def inventory(load: bool = True) -> list[dict[str, Any]]:
    """Every installed plugin across all groups, with its load status (for ``plugins list`` and ``doctor``).

    With ``load`` each plugin is imported to find failures; import errors are
    recorded in the row, never raised (unless strict loading is on).
    """
    from scheduler.plugins.protocols import GROUPS

    rows: list[dict[str, Any]] = []
    for group in GROUPS:
        for ep in sorted(_entry_points(group), key=lambda e: e.name):
            row: dict[str, Any] = {
                "group": group,
                "name": ep.name,
                "distribution": _dist_name(ep),
                "version": _dist_version(ep),
                "target": ep.value,
                "status": "not loaded",
                "error": None,
                "plugin_api": None,
                "capabilities": [],
            }
            if is_disabled(group, ep.name):
                row["status"] = "disabled"
            elif load:
                try:
                    obj = ep.load()
                    if isinstance(obj, type) or hasattr(obj, "plugin_api"):
                        check_api(obj, group=group, name=ep.name, dist=row["distribution"])
                    row["status"] = "ok"
                    row["plugin_api"] = getattr(obj, "plugin_api", None)
                    row["capabilities"] = sorted(getattr(obj, "capabilities", ()) or ())
                except SchedulerError as exc:
                    row["status"], row["error"] = "invalid", f"{exc.code}: {exc.message}"
                except Exception as exc:
                    row["status"], row["error"] = "failed", f"{type(exc).__name__}: {exc}"
            rows.append(row)
    if strict_loading():
        bad = [r for r in rows if r["status"] in ("failed", "invalid")]
        if bad:
            first = bad[0]
            raise SchedulerError(
                "PLUGIN_LOAD_FAILED",
                f"{len(bad)} plugin(s) failed to load (strict mode); first: {first['name']} from {first['distribution']}: {first['error']}",
                details=bad,
            )
    return rows
