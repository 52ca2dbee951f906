"""The plugin inventory: every installed plugin across all groups, with its load status (``plugins list``, ``doctor``)."""

from __future__ import annotations

from typing import Any

from scheduler.base.entry_points import dist_name, entry_points_of, is_disabled, strict_loading
from scheduler.base.errors import SchedulerError
from scheduler.base.plugin_kinds import HOOKS_GROUP, declares_api
from scheduler.plugins.drivers import check_api, dist_version
from scheduler.plugins.hooks import make_plugin_manager, register_hook_modules
from scheduler.plugins.loader import load_group
from scheduler.plugins.protocols import GROUPS


def inventory(load: bool = True) -> list[dict[str, Any]]:
    """Every installed plugin across all groups, with its load status (for ``plugins list`` and ``doctor``).

    With ``load`` each plugin is imported to find failures (``failed``: it did not import;
    ``invalid``: it imported but the kernel refuses it, such as another API major or a hook
    module implementing a hook that does not exist); failures are recorded in the row, never
    raised (unless strict loading is on).
    """
    rows: list[dict[str, Any]] = []
    for group in GROUPS:
        results: dict[int, tuple[str, str | None, Any]] = {}
        if load:
            results = _hook_results() if group == HOOKS_GROUP else _provider_results(group)
        for ep in sorted(entry_points_of(group), key=lambda e: e.name):
            row: dict[str, Any] = {
                "group": group,
                "name": ep.name,
                "distribution": dist_name(ep),
                "version": dist_version(ep),
                "target": ep.value,
                "status": "not loaded",
                "error": None,
                "plugin_api": None,
                "capabilities": [],
            }
            if is_disabled(group, ep.name):
                row["status"] = "disabled"
            elif load:
                status, error, obj = results.get(_ep_key(ep), ("failed", "entry point vanished while loading", None))
                row["status"], row["error"] = status, error
                if status == "ok":
                    row["plugin_api"] = getattr(obj, "plugin_api", None)
                    row["capabilities"] = sorted(getattr(obj, "capabilities", ()) or ())
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


def _ep_key(ep: Any) -> Any:
    """Identity of an entry point across two readings of the metadata."""
    return (ep.group, ep.name, ep.value, dist_name(ep))


def _provider_results(group: str) -> dict[Any, tuple[str, str | None, Any]]:
    """``(status, error, object)`` per entry point of a provider group, after importing each."""
    out: dict[Any, tuple[str, str | None, Any]] = {}
    for item in load_group(group):
        key = _ep_key(item.entry_point)
        if item.error is not None:
            out[key] = ("failed", f"{type(item.error).__name__}: {item.error}", None)
            continue
        try:
            if declares_api(group) and (isinstance(item.obj, type) or hasattr(item.obj, "plugin_api")):
                check_api(item.obj, group=group, name=item.name, dist=item.distribution)
        except SchedulerError as exc:
            out[key] = ("invalid", f"{exc.code}: {exc.message}", None)
            continue
        out[key] = ("ok", None, item.obj)
    return out


def _hook_results() -> dict[Any, tuple[str, str | None, Any]]:
    """``(status, error, module)`` per hook module, registered into a plugin manager exactly as the kernel does."""
    pm = make_plugin_manager(load_entry_points=False)
    failures = {(f.name, f.target, f.distribution): f for f in register_hook_modules(pm)}
    out: dict[Any, tuple[str, str | None, Any]] = {}
    for ep in entry_points_of(HOOKS_GROUP):
        failed = failures.get((ep.name, ep.value, dist_name(ep)))
        if failed is not None:
            out[_ep_key(ep)] = (failed.status, failed.error, None)
        else:
            out[_ep_key(ep)] = ("ok", None, pm.get_plugin(f"entrypoint:{ep.name}"))
    return out
