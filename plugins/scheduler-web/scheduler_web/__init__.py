"""scheduler-web: a server-rendered web view of the scheduler (``scheduler web``).

Jobs, runs, approvals, the delivery outbox and the runtime's status, read and acted on only
through ``scheduler.api.ops`` (the functions the CLI's commands call), so the view works on
every store the kernel opens (SQLite, PostgreSQL) and records every action as the CLI does.
``create_app`` builds the ASGI application (Starlette, Jinja2 templates with autoescape on);
``scheduler web`` (``scheduler_web.hooks``) serves it with uvicorn.
"""

from __future__ import annotations

from scheduler_web.app import WebConfig, create_app

__all__ = ["WebConfig", "create_app"]
