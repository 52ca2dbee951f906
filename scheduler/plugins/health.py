"""What installed providers report about this host, for ``scheduler doctor`` (the optional ``HealthReporting`` member).

A provider's view of its host belongs to the provider: the shell executor knows whether its
runs get a cgroup of their own or only a process group (issue 30 defect 6), the kernel does
not. ``provider_checks()`` loads each installed, enabled provider that is not switched off,
exactly as a run would (``load_provider``: settings applied), and collects the checks of those
that implement ``health_checks``. A provider that does not load is the ``plugins`` check's
business and is left out here; a ``health_checks`` that raises is a failing check naming it.
The channels also judge the settings file's ``[notifications] routes`` (``notification_routes``):
a destination a channel could never send to fails the check, as it stops ``scheduler run``.
"""

from __future__ import annotations

from typing import Any

from scheduler.base.entry_points import entry_points_of, is_disabled
from scheduler.base.errors import SchedulerError
from scheduler.core.members import HealthReporting
from scheduler.plugins.loader import load_provider
from scheduler.plugins.options import route_problems
from scheduler.plugins.protocols import PROVIDER_KINDS
from scheduler.settings import current_settings


def provider_checks() -> list[dict[str, Any]]:
    """Every ``HealthReporting`` provider's doctor checks, each tagged with ``provider`` (``"executor shell"``), then the
    ``notification_routes`` check when ``[notifications] routes`` is set."""
    checks: list[dict[str, Any]] = []
    for kind, (group, _protocol) in PROVIDER_KINDS.items():
        for name in sorted({ep.name for ep in entry_points_of(group) if not is_disabled(group, ep.name)}):
            try:
                provider = load_provider(kind, name)
            except SchedulerError:
                continue  # reported by the plugins check
            if not isinstance(provider, HealthReporting):
                continue
            try:
                found = list(provider.health_checks())
            except Exception as exc:  # noqa: BLE001 - third-party plugin code: a failing check, never a traceback
                found = [{"check": f"{kind}_{name}", "ok": False, "detail": f"health_checks raised {type(exc).__name__}: {exc}"}]
            checks += [{**check, "provider": f"{kind} {name}"} for check in found if isinstance(check, dict)]
    return [*checks, *_routes_check()]


def _routes_check() -> list[dict[str, Any]]:
    """``notification_routes``: the channels' judgement of ``[notifications] routes`` (none: no check)."""
    routes = current_settings().notifications.routes
    if not routes:
        return []
    problems = route_problems(routes)
    detail = "; ".join(f"{p['field'].split('.', 1)[1]}: {p['code']}: {p['error']}" for p in problems)
    return [{"check": "notification_routes", "ok": not problems, "problems": problems,
             "detail": detail or f"{len(routes)} route(s), each a destination its channel can send to"}]


__all__ = ["provider_checks"]
