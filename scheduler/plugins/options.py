"""Per-job options owned by plugins, and the providers loaded to validate jobs.

The job spec carries one JSON object per plugin it names (``executor_options``,
``delivery_options``); the plugin declares what it accepts as an attrs
``options_class``. The kernel validates the object with that class when the job is
added or updated (when the plugin is installed) and again when a run starts, and
never names an option itself. The pipeline's steps check their own declarations
against their providers with ``provider_for`` (``scheduler.core.steps.Step.check_installed``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.options import build_options, option_problems, options_to_json
from scheduler.core.members import JobChecking, options_class_of
from scheduler.core.spec import JobSpec, url_has_credentials
from scheduler.plugins.loader import load_provider

#: Spec field -> (provider kind, attribute of JobSpec naming the driver).
OPTION_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("executor_options", "executor", "executor_name"),
    ("delivery_options", "channel", "delivery_channel"),
)


def _driver(spec: Any, attr: str) -> str | None:
    value = getattr(spec, attr)
    return value() if callable(value) else value


#: Providers loaded for validation in this process: validating an array of jobs loads each plugin once.
_validators: dict[tuple[str, str], Any] = {}
#: Plugins that could not be loaded, and until when that answer is kept (monotonic seconds): a miss costs a
#: metadata scan, so 500 jobs naming a missing plugin must not pay it 500 times; a fix is seen seconds later.
_misses: dict[tuple[str, str], float] = {}
MISS_TTL_S = 5.0


def provider_for(kind: str, name: str) -> Any | None:
    """The provider loaded for validation, or None when it is not installed or cannot load (the missing-plugin rule
    reports that). Loaded once per process; a miss is remembered for ``MISS_TTL_S``."""
    key = (kind, name)
    if key in _validators:
        return _validators[key]
    if _misses.get(key, 0.0) > time.monotonic():
        return None
    try:
        _validators[key] = load_provider(kind, name)
    except SchedulerError:
        _misses[key] = time.monotonic() + MISS_TTL_S
        return None
    return _validators[key]


def option_problems_of(spec: Any) -> tuple[dict[str, dict[str, Any]], list[dict[str, str]]]:
    """Validate every plugin-owned options object of a spec (``OPTION_FIELDS``) against its installed plugin.

    Returns the normalised objects (non-default values only) by field, and per-field
    problems. A plugin that is not installed leaves its object as given.
    """
    normalised: dict[str, dict[str, Any]] = {}
    problems: list[dict[str, str]] = []
    for field, kind, attr in OPTION_FIELDS:
        raw = getattr(spec, field)
        name = _driver(spec, attr)
        if name is None:
            if raw:
                problems.append({"field": field, "code": "CONFLICT", "error": f"options given but the job names no {kind}"})
            continue
        provider = provider_for(kind, name)
        if provider is None:
            continue
        cls = options_class_of(provider)
        if cls is None:
            if raw:
                problems.append({"field": field, "code": "UNKNOWN_FIELD", "error": f"{kind} {name!r} takes no options"})
            continue
        kwargs, found = option_problems(cls, raw, field)
        problems += found
        if not found:
            try:
                instance = cls(**kwargs)
            except (TypeError, ValueError) as exc:
                problems.append({"field": field, "code": "INVALID_VALUE", "error": str(exc)})
                continue
            normalised[field] = options_to_json(instance)
            problems += job_problems(provider, instance, spec, field)
    problems += alert_target_problems(spec)
    return normalised, problems


def alert_target_problems(spec: Any) -> list[dict[str, str]]:
    """The watchdog alert channel's judgement of ``watchdog_alert_to``, as its ``check_job`` judges ``delivery_to``.

    A watchdog alert goes to ``watchdog_alert_channel`` at ``watchdog_alert_to`` (never with the job's
    ``delivery_options``): the channel is asked about a copy of the spec routed there, with no options,
    and each ``delivery_to`` problem is reported on ``watchdog_alert_to``.
    """
    name, target = getattr(spec, "watchdog_alert_channel", None), getattr(spec, "watchdog_alert_to", None)
    if not name or not target or not attrs.has(type(spec)):
        return []
    provider = provider_for("channel", name)
    if provider is None:
        return []
    routed = attrs.evolve(spec, delivery_channel=name, delivery_to=target, delivery_options={})
    found = job_problems(provider, None, routed, "watchdog_alert_to")
    return [{**p, "field": "watchdog_alert_to"} if p.get("field") == "delivery_to" else p for p in found]


def route_problems(routes: Sequence[str]) -> list[dict[str, str]]:
    """The judgement of ``[notifications] routes`` (``CHANNEL:DESTINATION``), as a job's ``delivery_to`` is judged at add.

    Every notification is copied to the outbox with its route's destination, so a destination
    is refused before anything is sent or stored (``scheduler run`` does not start, ``config
    --check`` and ``doctor`` fail): a URL with credentials in it (``URL_CREDENTIALS_REFUSED``),
    and what the route's channel could never send to, judged by its ``check_job`` on a job routed
    there (``DELIVERY_TARGET_INVALID``). A route without a destination (the channel's default) and
    one naming a channel that is not installed are not judged here. Each problem's ``field`` is
    ``notifications.routes[i]``; the message never repeats the destination.
    """
    problems: list[dict[str, str]] = []
    for index, route in enumerate(routes):
        channel, _, target = route.partition(":")
        field = f"notifications.routes[{index}]"
        if not target:
            continue
        if url_has_credentials(target):
            problems.append({"field": field, "code": "URL_CREDENTIALS_REFUSED",
                             "error": f"the {channel} route must not carry credentials in its URL (the outbox keeps every"
                                      " destination in plain text); put the secret in the channel's settings as a credential"
                                      " reference"})
            continue
        provider = provider_for("channel", channel)
        if provider is None:
            continue
        routed = JobSpec(name="notifications", schedule_kind="manual", payload_message="", delivery_mode="always",
                         delivery_channel=channel, delivery_to=target)
        problems += [{**p, "field": field} for p in job_problems(provider, None, routed, field) if p.get("field") == "delivery_to"]
    return problems


def check_routes(settings: Any) -> None:
    """Refuse settings whose ``[notifications] routes`` fail ``route_problems``: the first problem's code, all in details.

    ``scheduler run`` calls it before it starts, and a SIGHUP reload before it installs new
    settings (``Parts.settings_check``), so no notification is stored for such a destination.
    """
    problems = route_problems(settings.notifications.routes)
    if problems:
        first = problems[0]
        raise SchedulerError(first["code"], f"[notifications] {first['field'].split('.', 1)[1]}: {first['error']}",
                             details=problems)


def job_problems(provider: Any, options: Any, spec: Any, field: str) -> list[dict[str, str]]:
    """The provider's own judgement of the job (``JobChecking.check_job``), when it has one; a broken check is a problem."""
    if not isinstance(provider, JobChecking):
        return []
    try:
        found = provider.check_job(options, spec)
    except SchedulerError as exc:
        return [{"field": field, "code": exc.code, "error": exc.message}]
    except Exception as exc:  # noqa: BLE001 - third-party plugin code: reported, never a traceback
        return [{"field": field, "code": "PLUGIN_INVALID", "error": f"{type(exc).__name__}: {exc}"}]
    return [dict(p) for p in found or ()]


def channel_options_for(channel: Any, raw: Any) -> Any:
    """A channel's options instance for a part (from the job's stored ``delivery_options``); None without an options class.

    ``DELIVERY_OPTIONS_INVALID`` when the stored object no longer fits the channel's class.
    """
    cls = options_class_of(channel)
    if cls is None:
        if raw:
            raise SchedulerError("DELIVERY_OPTIONS_INVALID", "the channel takes no delivery_options")
        return None
    try:
        return build_options(cls, raw or {}, "delivery_options")
    except SchedulerError as exc:
        raise SchedulerError("DELIVERY_OPTIONS_INVALID", exc.message, details=exc.details) from None
