"""CLI output: one JSON object with ``"ok"`` in ``--json`` mode, aligned tables and local times otherwise.

``emit``, ``table`` and ``json_mode`` are the contract plugin commands share
(``scheduler.toolkit.cli_output``, offered to plugins as ``scheduler_toolkit.cli``); this module
adds the CLI's own renderings: errors, ``key: value`` lines and local times.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import click

from scheduler.toolkit.cli_output import echo_json, emit, json_mode, table

__all__ = ["emit", "error_out", "json_mode", "kv", "local_time", "table"]


def local_time(iso: str | None) -> str:
    """An ISO-8601 ``Z`` instant shown in the local zone with its abbreviation (``-`` for none)."""
    if not iso:
        return "-"
    dt = datetime.fromisoformat(iso).astimezone()
    return dt.strftime("%Y-%m-%d %H:%M:%S %Z")


def kv(pairs: Iterable[tuple[str, Any]]) -> None:
    """Print ``key: value`` lines aligned on the colon; an object or array value as compact JSON (never a Python repr)."""
    items = [(k, "-" if v is None else json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v)
             for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0)
    for k, v in items:
        click.echo(f"{k.rjust(width)}: {v}")


def error_out(code: str, message: str, details: Any = None) -> None:
    """Print an error: the JSON object on stdout in JSON mode, the message on stderr otherwise."""
    if json_mode() or "--json" in sys.argv:
        obj: dict[str, Any] = {"ok": False, "error": message, "code": code}
        if details is not None:
            obj["details"] = details
        echo_json(obj)
    else:
        click.echo(f"error [{code}]: {message}", err=True)
        if isinstance(details, list):
            for item in details[:50]:
                if isinstance(item, dict) and "field" in item:
                    click.echo(f"  - {_where(item)}{item['field']}: {item.get('error')} ({item.get('code')})", err=True)


def _where(item: dict[str, Any]) -> str:
    """Which file, item and job a detail is about (``apply`` and arrays give them), as a prefix of its line."""
    parts = [str(item["file"])] if item.get("file") is not None else []
    if item.get("index") is not None:
        parts.append(f"[{item['index']}]")
    if item.get("job") is not None:
        parts.append(f"job {item['job']!r}")
    return " ".join(parts) + ": " if parts else ""
