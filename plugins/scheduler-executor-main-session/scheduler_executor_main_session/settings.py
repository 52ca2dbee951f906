"""Host settings of the main-session executor (``[executors.main-session]``).

::

    [executors.main-session]
    base_url      = "http://127.0.0.1:18789/v1"     # the OpenAI-compatible root; {base_url}/chat/completions
    model         = "openclaw"
    api_key       = "env:OPENCLAW_GATEWAY_TOKEN"    # a reference (env:NAME or file:/path), never the key
    default_mode  = "reply"                         # or "event"
    openclaw_path = "/usr/local/bin/openclaw"       # event mode; default: `openclaw` on PATH

Without ``base_url`` / ``model`` / ``api_key`` the agent executor's plain variables
``SCHEDULER_AGENT_BASE_URL``, ``SCHEDULER_AGENT_MODEL`` and ``SCHEDULER_AGENT_API_KEY`` (the key
itself) are used, so one gateway serves both targets. Every key can be overridden the
kernel's way: ``SCHEDULER_EXECUTORS_MAIN_SESSION_<KEY>``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

import attrs
from scheduler_toolkit.settings import SecretRef, plugin_settings

from scheduler.api import SchedulerError

ENV_BASE_URL = "SCHEDULER_AGENT_BASE_URL"
ENV_MODEL = "SCHEDULER_AGENT_MODEL"
ENV_API_KEY = "SCHEDULER_AGENT_API_KEY"


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the chat endpoint's base URL (None when it can)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (use api_key)"
    if parts.query or parts.fragment:
        return "must not have a query or a fragment"
    return None


def _check_url(value: str | None) -> str | None:
    return None if value is None else (f"the base URL {url_problem(value)}" if url_problem(value) else None)


def _check_command(value: str | None) -> str | None:
    if value is None:
        return None
    if not value or "\x00" in value:
        return "must be a non-empty path without NUL"
    if "/" in value and not os.path.isabs(os.path.expanduser(value)):
        return "must be an absolute path or a bare program name looked up on PATH"
    return None


@attrs.frozen(kw_only=True)
class MainSessionSettings:
    """``[executors.main-session]`` (the executor's ``settings_class``)."""

    base_url: str | None = attrs.field(default=None, metadata={
        "check": _check_url, "doc": "OpenAI-compatible root of the gateway (default: $SCHEDULER_AGENT_BASE_URL)."})
    model: str | None = attrs.field(default=None, metadata={
        "doc": "Model named in the chat request (default: $SCHEDULER_AGENT_MODEL)."})
    api_key: SecretRef | None = attrs.field(default=None, metadata={
        "secret": True, "doc": "Bearer token reference, env:NAME or file:/path (default: $SCHEDULER_AGENT_API_KEY)."})
    default_mode: Literal["reply", "event"] = attrs.field(default="reply", metadata={
        "doc": "Mode of a job that sets none: `reply` (chat turn) or `event` (openclaw system event)."})
    openclaw_path: str = attrs.field(default="openclaw", metadata={
        "check": _check_command, "doc": "The openclaw command of event mode: an absolute path, or a name looked up on PATH."})
    event_timeout_s: float = attrs.field(default=30.0, metadata={
        "minimum": 0.1, "maximum": 3600, "doc": "Longest the openclaw command may run (MAIN_SESSION_COMMAND_TIMEOUT)."})
    event_max_output_bytes: int = attrs.field(default=64 * 1024, metadata={
        "minimum": 256, "maximum": 16 * 1024 * 1024, "doc": "Cap of the command's stdout and of its stderr."})
    kill_grace_s: float = attrs.field(default=0.2, metadata={
        "minimum": 0, "maximum": 30, "doc": "SIGTERM to SIGKILL grace when the command's group is stopped."})
    connect_timeout_s: float = attrs.field(default=10.0, metadata={
        "minimum": 0.05, "maximum": 600, "doc": "Limit of one connection attempt to the chat endpoint."})
    max_reply_bytes: int = attrs.field(default=16 * 1024 * 1024, metadata={
        "minimum": 1024, "doc": "Cap of the chat response body (MAIN_SESSION_REPLY_TOO_LARGE)."})


def resolve_settings() -> MainSessionSettings:
    """The table with ``SCHEDULER_EXECUTORS_MAIN_SESSION_*`` overrides, read from the environment now."""
    return plugin_settings("executor", "main-session", MainSessionSettings, environ=dict(os.environ))


@attrs.frozen(kw_only=True, repr=False)
class ChatEndpoint:
    """Where a reply-mode turn goes; ``repr`` never shows the key."""

    url: str
    model: str | None
    key_ref: SecretRef | None = None
    key_from_env: bool = False

    @property
    def chat_url(self) -> str:
        return self.url.rstrip("/") + "/chat/completions"

    def resolve_key(self, environ: Mapping[str, str]) -> str | None:
        if self.key_from_env:
            value = environ.get(ENV_API_KEY)
            if not value:
                raise SchedulerError("SECRET_UNRESOLVED", f"{ENV_API_KEY} is empty")
            return value
        return self.key_ref.resolve() if self.key_ref is not None else None

    def __repr__(self) -> str:
        return f"ChatEndpoint(url={self.url!r}, model={self.model!r}, key=<redacted>)"


def chat_endpoint(settings: MainSessionSettings, environ: Mapping[str, str]) -> ChatEndpoint:
    """The chat endpoint: the settings first, then the agent's plain variables."""
    url = settings.base_url or environ.get(ENV_BASE_URL)
    if not url:
        raise SchedulerError("MAIN_SESSION_ENDPOINT_UNCONFIGURED", "no chat endpoint for the main session: set "
                             f"[executors.main-session] base_url or {ENV_BASE_URL}")
    problem = url_problem(url)
    if problem:
        where = "[executors.main-session] base_url" if settings.base_url else ENV_BASE_URL
        raise SchedulerError("CONFIG_INVALID", f"{where}: the base URL {problem}")
    model = settings.model or environ.get(ENV_MODEL)
    if settings.api_key is not None:
        return ChatEndpoint(url=url, model=model, key_ref=settings.api_key)
    return ChatEndpoint(url=url, model=model, key_from_env=bool(environ.get(ENV_API_KEY)))
