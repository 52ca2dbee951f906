"""CLI output: one JSON object with ``"ok"`` in ``--json`` mode, aligned tables and local times otherwise."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any, Callable, Iterable, Sequence

import click


def json_mode() -> bool:
    """Whether the current invocation asked for ``--json``."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if isinstance(ctx.obj, dict) and "json" in ctx.obj:
            return bool(ctx.obj["json"])
        ctx = ctx.parent
    return False


def emit(payload: dict[str, Any], human: Callable[[], None] | None = None) -> None:
    """Print a success: ``{"ok": true, ...}`` in JSON mode, else the human rendering."""
    if json_mode() or human is None:
        _echo_json({"ok": True, **payload}, indent=None if json_mode() else 2)
    else:
        human()


def _echo_json(obj: dict[str, Any], *, indent: int | None = None) -> None:
    """Print one JSON object; text the stream cannot encode (a lone surrogate) is escaped, never fatal."""
    text = json.dumps(obj, indent=indent, default=str, ensure_ascii=False)
    try:
        text.encode(getattr(sys.stdout, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        text = json.dumps(obj, indent=indent, default=str, ensure_ascii=True)
    click.echo(text)


def local_time(iso: str | None) -> str:
    """An ISO-8601 ``Z`` instant shown in the local zone with its abbreviation (``-`` for none)."""
    if not iso:
        return "-"
    dt = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone()
    return dt.strftime("%Y-%m-%d %H:%M:%S %Z")


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> None:
    """Print an aligned plain-text table."""
    body = [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    line = "  ".join(h.upper().ljust(widths[i]) for i, h in enumerate(headers))
    click.echo(line.rstrip())
    for row in body:
        click.echo("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    if not body:
        click.echo("(none)")


def kv(pairs: Iterable[tuple[str, Any]]) -> None:
    """Print ``key: value`` lines aligned on the colon."""
    items = [(k, "-" if v is None else v) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0)
    for k, v in items:
        click.echo(f"{k.rjust(width)}: {v}")


def error_out(code: str, message: str, details: Any = None) -> None:
    """Print an error: the JSON object on stdout in JSON mode, the message on stderr otherwise."""
    if json_mode() or "--json" in sys.argv:
        obj: dict[str, Any] = {"ok": False, "error": message, "code": code}
        if details is not None:
            obj["details"] = details
        _echo_json(obj)
    else:
        click.echo(f"error [{code}]: {message}", err=True)
        if isinstance(details, list):
            for item in details[:50]:
                if isinstance(item, dict) and "field" in item:
                    click.echo(f"  - {item['field']}: {item.get('error')} ({item.get('code')})", err=True)
