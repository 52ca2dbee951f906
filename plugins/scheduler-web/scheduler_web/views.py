"""What the pages show that no operation returns as such: a schedule in words, a chart, masked targets, time filters.

Pure functions of the views ``scheduler.api.ops`` returns; no database access here.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from scheduler.api import SchedulerError

#: Outcome colours of the chart (a status not named here is grey).
OUTCOME_COLOURS = {"ok": "#2e7d32", "error": "#c62828", "timeout": "#ef6c00", "crashed": "#6a1b9a", "cancelled": "#757575",
                   "skipped": "#bdbdbd"}


def schedule_words(job: dict[str, Any]) -> str:
    """A job's schedule as a phrase: ``cron 0 3 * * * (Europe/Berlin)``, ``every 1h``, ``once at ...``, ``manual only``."""
    kind = job.get("schedule_kind")
    if kind == "cron":
        return f"cron {job.get('schedule_cron')} ({job.get('schedule_tz') or 'UTC'})"
    if kind == "every":
        return f"every {_duration(job.get('schedule_every'))}"
    if kind == "at":
        return f"once at {job.get('schedule_at')}"
    if job.get("parent_id"):
        return f"after its parent ({job.get('trigger_on') or 'any outcome'})"
    return "manual only"


def _duration(value: Any) -> str:
    """Milliseconds as the shortest exact unit (``90m`` -> ``90m``, 3600000 -> ``1h``); text as it is."""
    if not isinstance(value, int):
        return str(value)
    for unit, ms in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if value % ms == 0:
            return f"{value // ms}{unit}"
    return f"{value}ms"


def mask_target(target: Any) -> str:
    """A delivery target fit to show: a URL keeps its scheme and host only (a webhook URL's path is often its secret)."""
    if target is None:
        return ""
    text = str(target)
    if "://" not in text:
        return text
    parts = urlsplit(text)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    rest = "/…" if (parts.path not in ("", "/") or parts.query) else "/"
    return f"{parts.scheme}://{host}{port}{rest}"


def masked_job(job: dict[str, Any]) -> dict[str, Any]:
    """The job view with ``delivery_to`` and ``watchdog_alert_to`` masked (``mask_target``)."""
    out = dict(job)
    for key in ("delivery_to", "watchdog_alert_to"):
        if out.get(key):
            out[key] = mask_target(out[key])
    return out


def parse_instant(text: str | None, field: str) -> int | None:
    """An ISO-8601 instant (a value without an offset is UTC) as epoch milliseconds; blank is None; else ``INVALID_ARGUMENT``."""
    if text is None or not text.strip():
        return None
    raw = text.strip().replace("Z", "+00:00")
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise SchedulerError("INVALID_ARGUMENT", f"{field}: not an ISO-8601 instant: {text!r}") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return round(value.timestamp() * 1000)


def duration_chart(runs: list[dict[str, Any]], *, width: int = 640, height: int = 120) -> str:
    """An inline SVG bar chart of ``runs`` (newest first, as ``list_runs`` gives them), drawn oldest to newest.

    Bar height is the run's duration (relative to the longest), colour its outcome; each bar has a
    ``<title>`` (status, duration, start). Every value is escaped: the SVG is inserted as markup.
    """
    ordered = list(reversed(runs))
    if not ordered:
        return ""
    longest = max((r.get("duration_ms") or 0) for r in ordered) or 1
    step = min(width / len(ordered), 16.0)  # a few runs make narrow bars from the left, not a wall of colour
    bar = max(1.0, step * 0.75)
    bars = []
    for i, run in enumerate(ordered):
        ms = run.get("duration_ms") or 0
        h = max(2.0, (height - 4) * ms / longest)
        colour = OUTCOME_COLOURS.get(str(run.get("status")), "#90a4ae")
        title = html.escape(f"{run.get('status')} · {ms} ms · {run.get('started_at') or run.get('created_at')}")
        bars.append(f'<rect x="{i * step:.1f}" y="{height - h:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{colour}"'
                    f' data-status="{html.escape(str(run.get("status")))}"><title>{title}</title></rect>')
    return (f'<svg class="chart" role="img" aria-label="duration and outcome of the last {len(ordered)} runs"'
            f' viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
            + "".join(bars) + "</svg>")
