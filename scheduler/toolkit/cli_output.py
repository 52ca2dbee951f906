"""The CLI's output contract, for the kernel's commands and for plugins that add commands.

``emit(payload, human)`` prints ``{"ok": true, **payload}`` under ``--json`` and calls
``human()`` otherwise; ``table(rows, headers)`` renders a human table. It sits below the
CLI so that the toolkit can offer it to plugins (``scheduler_toolkit.cli``) while the kernel's
own commands use it too; ``scheduler.cli.output`` adds the CLI's own error and ``key: value``
renderings on top. Light on purpose: every command's
start-up imports it (click, json and sys only).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

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
        echo_json({"ok": True, **payload}, indent=None if json_mode() else 2)
    else:
        human()


def echo_json(obj: dict[str, Any], *, indent: int | None = None) -> None:
    """Print one JSON object; text the stream cannot encode (a lone surrogate) is escaped, never fatal."""
    text = json.dumps(obj, indent=indent, default=str, ensure_ascii=False)
    try:
        text.encode(getattr(sys.stdout, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        text = json.dumps(obj, indent=indent, default=str, ensure_ascii=True)
    click.echo(text)


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


__all__ = ["echo_json", "emit", "json_mode", "table"]
