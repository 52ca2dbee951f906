"""Host settings of the agent executor (``[executors.agent]``) and the endpoint a run talks to.

The kernel's settings file has one flat table per plugin whose values are strings,
numbers, booleans, lists of strings or tables of strings. Named endpoints are therefore
three tables of strings keyed by endpoint name, plus a table of prices keyed by model::

    [executors.agent]
    default_endpoint = "local"
    endpoint_urls   = { local = "http://127.0.0.1:11434/v1", hosted = "https://llm.example/v1" }
    endpoint_models = { local = "llama3.1:8b", hosted = "small-model" }
    endpoint_keys   = { hosted = "env:HOSTED_LLM_KEY" }     # references only: env:NAME or file:/path
    prices          = { "small-model" = "0.15/0.60" }      # USD per million prompt/completion tokens
    capability_discovery = { hosted = "off" }             # auto (default) | off
    gateway_endpoints    = ["gw"]                         # endpoints whose /health may be read for capabilities
    thinking_mapping     = { hosted = "drop" }            # send (default) | drop | refuse

Capability discovery (``GET <root>/v1/info``, then ``GET <root>/health`` for an endpoint named in
``gateway_endpoints`` only) runs only for a turn that needs a capability: today a turn handed
credentials of medium ``env``, which need ``chat-completions-env-inject-v1``. A plain turn sends
no probe. ``capability_discovery = "off"`` never probes that endpoint (such a turn is refused).
``thinking_mapping`` says what ``executor_options.thinking`` becomes on that endpoint:
``send`` it as ``reasoning_effort``, ``drop`` it with a warning, or ``refuse`` the job at add and
at run (``AGENT_THINKING_UNSUPPORTED``).

The plain environment variables ``SCHEDULER_AGENT_BASE_URL``, ``SCHEDULER_AGENT_MODEL`` and
``SCHEDULER_AGENT_API_KEY`` (the key itself, as most clients of such APIs read it) define the
endpoint named ``default``; they win over ``endpoint_*.default`` in the file. Every key of the
table can also be overridden the kernel's way (``SCHEDULER_EXECUTORS_AGENT_<KEY>``).

A job names an endpoint (``executor_options.endpoint``) and may choose another model, never
another URL: the configured key goes only where the operator sent it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import attrs
from scheduler_toolkit.settings import SecretRef, plugin_settings

from scheduler.api import SchedulerError

#: The plain variables that define the endpoint named ``default``.
ENV_BASE_URL = "SCHEDULER_AGENT_BASE_URL"
ENV_MODEL = "SCHEDULER_AGENT_MODEL"
ENV_API_KEY = "SCHEDULER_AGENT_API_KEY"
DEFAULT_ENDPOINT = "default"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_PRICE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*([0-9]+(?:\.[0-9]+)?)\s*$")


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an endpoint's base URL (None when it can)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (use endpoint_keys for the API key)"
    if parts.query or parts.fragment:
        return "must not have a query or a fragment"
    return None


def _check_urls(value: dict[str, str]) -> str | None:
    for name, url in value.items():
        if not _NAME.match(name):
            return f"endpoint name {name!r} must match {_NAME.pattern}"
        problem = url_problem(url)
        if problem:
            return f"endpoint {name!r}: the base URL {problem}"
    return None


def _check_names(value: dict[str, str]) -> str | None:
    bad = [n for n in value if not _NAME.match(n)]
    return f"endpoint name {bad[0]!r} must match {_NAME.pattern}" if bad else None


def _check_keys(value: dict[str, str]) -> str | None:
    """Each value must be a secret reference; the message never repeats a rejected value (it may be a key)."""
    problem = _check_names(value)
    if problem:
        return problem
    for name, ref in value.items():
        try:
            SecretRef.parse(ref)
        except ValueError as exc:
            return f"endpoint {name!r}: {exc}"
    return None


def parse_price(text: str) -> tuple[float, float] | None:
    """``"0.15/0.60"`` -> (0.15, 0.6) USD per million prompt / completion tokens; None when malformed."""
    match = _PRICE.match(text)
    if not match:
        return None
    prompt, completion = float(match.group(1)), float(match.group(2))
    return (prompt, completion) if math.isfinite(prompt) and math.isfinite(completion) else None


def _check_prices(value: dict[str, str]) -> str | None:
    for model, text in value.items():
        if parse_price(text) is None:
            return f"price of {model!r} must be 'PROMPT/COMPLETION' in USD per million tokens, e.g. '0.15/0.60'"
    return None


#: ``capability_discovery`` values: ``auto`` probes when a turn needs a capability, ``off`` never probes.
DISCOVERY_MODES = ("auto", "off")
#: ``thinking_mapping`` values: what ``executor_options.thinking`` becomes on an endpoint.
THINKING_MAPPINGS = ("send", "drop", "refuse")


def _check_choices(choices: tuple[str, ...]) -> Callable[[dict[str, str]], str | None]:
    """A check of a table keyed by endpoint name whose values must be one of ``choices``."""

    def check(value: dict[str, str]) -> str | None:
        problem = _check_names(value)
        if problem:
            return problem
        for name, choice in value.items():
            if choice not in choices:
                return f"endpoint {name!r}: {choice!r} is not one of {', '.join(choices)}"
        return None

    return check


def _check_name_list(value: list[str]) -> str | None:
    bad = [n for n in value if not _NAME.match(n)]
    return f"endpoint name {bad[0]!r} must match {_NAME.pattern}" if bad else None


def _check_dir(value: str) -> str | None:
    return None if os.path.isabs(os.path.expanduser(value)) else "must be an absolute path"


@attrs.frozen(kw_only=True)
class AgentSettings:
    """``[executors.agent]`` (the executor's ``settings_class``)."""

    default_endpoint: str = attrs.field(default=DEFAULT_ENDPOINT, metadata={
        "doc": "Endpoint of a job that names none (`default` is the one SCHEDULER_AGENT_BASE_URL defines)."})
    endpoint_urls: dict[str, str] = attrs.field(factory=dict, metadata={
        "check": _check_urls, "doc": "Endpoint name -> base URL; the executor POSTs {base URL}/chat/completions."})
    endpoint_models: dict[str, str] = attrs.field(factory=dict, metadata={
        "check": _check_names, "doc": "Endpoint name -> model used when the job sets none."})
    endpoint_keys: dict[str, str] = attrs.field(factory=dict, metadata={
        "check": _check_keys, "doc": "Endpoint name -> API key reference (env:NAME or file:/path, never the key)."})
    prices: dict[str, str] = attrs.field(factory=dict, metadata={
        "check": _check_prices,
        "doc": "Model (or ENDPOINT:MODEL) -> 'PROMPT/COMPLETION' USD per million tokens; needed for cost and max_cost."})
    workspace: str | None = attrs.field(default=None, metadata={
        "check": _check_dir, "doc": "Directory heartbeat files are read from; a path resolving outside it is refused."})
    state_dir: str | None = attrs.field(default=None, metadata={
        "check": _check_dir,
        "doc": "No longer used: session conversations are kept by the kernel (executor_state); accepted so older settings"
               " files stay valid."})
    idle_timeout_s: float = attrs.field(default=120.0, metadata={
        "minimum": 0.05, "maximum": 86_400, "doc": "A response that sends no byte for this long is abandoned (AGENT_IDLE_TIMEOUT)."})
    connect_timeout_s: float = attrs.field(default=10.0, metadata={
        "minimum": 0.05, "maximum": 600, "doc": "Limit of one TCP/TLS connection attempt."})
    max_attempts: int = attrs.field(default=4, metadata={
        "minimum": 1, "maximum": 20, "doc": "Attempts for 429, 5xx and connection failures (inside the run deadline)."})
    max_backoff_s: float = attrs.field(default=30.0, metadata={
        "minimum": 0, "maximum": 3600, "doc": "Longest wait between attempts (a longer Retry-After gives up)."})
    max_output_bytes: int = attrs.field(default=16 * 1024 * 1024, metadata={
        "minimum": 1024, "doc": "Cap of the reply (and of the reasoning stream); beyond it the turn is stopped."})
    heartbeat_max_bytes: int = attrs.field(default=16 * 1024, metadata={
        "minimum": 256, "maximum": 1024 * 1024, "doc": "Longest heartbeat file put in a prompt (the rest is cut, marked)."})
    session_max_turns: int = attrs.field(default=20, metadata={
        "minimum": 1, "maximum": 1000, "doc": "context_mode=session: turns kept per job (oldest trimmed)."})
    session_max_bytes: int = attrs.field(default=256 * 1024, metadata={
        "minimum": 1024, "maximum": 1024 * 1024,
        "doc": "context_mode=session: bytes of conversation kept per job (the kernel keeps at most 1 MiB of state)."})
    discovery_ttl_s: float = attrs.field(default=300.0, metadata={
        "minimum": 0, "maximum": 86_400,
        "doc": "How long an endpoint's /v1/info or /health answer is cached, a failed probe as long as a declaration."})
    capability_discovery: dict[str, str] = attrs.field(factory=dict, metadata={
        "check": _check_choices(DISCOVERY_MODES),
        "doc": "Endpoint name -> `auto` (default: probe /v1/info only for a turn that needs a capability, i.e. env"
               " credentials) or `off` (never probe; such a turn is refused with GATEWAY_ENV_INJECT_UNSUPPORTED)."})
    gateway_endpoints: list[str] = attrs.field(factory=list, metadata={
        "check": _check_name_list,
        "doc": "Endpoints declared gateways (OpenClaw): only for these is GET /health read when /v1/info declares nothing."})
    thinking_mapping: dict[str, str] = attrs.field(factory=dict, metadata={
        "check": _check_choices(THINKING_MAPPINGS),
        "doc": "Endpoint name -> what executor_options.thinking becomes: `send` (default, as reasoning_effort), `drop`"
               " (not sent; the run records a warning) or `refuse` (AGENT_THINKING_UNSUPPORTED at add and at run)."})


def resolve_settings(environ: Mapping[str, str] | None = None) -> AgentSettings:
    """``[executors.agent]`` with ``SCHEDULER_EXECUTORS_AGENT_*`` overrides; ``CONFIG_INVALID`` naming the key."""
    return plugin_settings("executor", "agent", AgentSettings, environ=environ)


@attrs.frozen(kw_only=True, repr=False)
class Endpoint:
    """Where one turn goes. ``repr`` shows the name and URL, never the key."""

    name: str
    base_url: str
    model: str | None
    #: Where the key comes from: a reference, or the plain variable; None: no key (a local server).
    key_ref: SecretRef | None = None
    key_from_env: str | None = None

    def resolve_key(self, environ: Mapping[str, str]) -> str | None:
        """The API key now (``SECRET_UNRESOLVED`` naming only the reference when it is missing)."""
        if self.key_from_env is not None:
            value = environ.get(self.key_from_env)
            if not value:
                raise SchedulerError("SECRET_UNRESOLVED", f"{self.key_from_env} is empty")
            return value
        return self.key_ref.resolve() if self.key_ref is not None else None

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def __repr__(self) -> str:
        return f"Endpoint(name={self.name!r}, base_url={self.base_url!r}, model={self.model!r}, key=<redacted>)"


def resolve_endpoint(settings: AgentSettings, name: str | None, environ: Mapping[str, str]) -> Endpoint:
    """The endpoint a job names (or the default one), from the settings and the plain variables."""
    name = name or settings.default_endpoint
    url = settings.endpoint_urls.get(name)
    model = settings.endpoint_models.get(name)
    key_ref = SecretRef.parse(settings.endpoint_keys[name]) if name in settings.endpoint_keys else None
    key_env = None
    if name == DEFAULT_ENDPOINT:
        url = environ.get(ENV_BASE_URL) or url
        model = environ.get(ENV_MODEL) or model
        if environ.get(ENV_API_KEY):
            key_ref, key_env = None, ENV_API_KEY
    if not url:
        known = sorted(set(settings.endpoint_urls) | ({DEFAULT_ENDPOINT} if environ.get(ENV_BASE_URL) else set()))
        if name == DEFAULT_ENDPOINT and not known:
            raise SchedulerError("AGENT_ENDPOINT_UNCONFIGURED", f"no agent endpoint is configured: set {ENV_BASE_URL} or "
                                 "[executors.agent] endpoint_urls in the settings file")
        raise SchedulerError("AGENT_ENDPOINT_UNKNOWN",
                             f"agent endpoint {name!r} is not configured (known: {', '.join(known) or 'none'})")
    problem = url_problem(url)
    if problem:
        where = ENV_BASE_URL if name == DEFAULT_ENDPOINT and environ.get(ENV_BASE_URL) else f"endpoint_urls.{name}"
        raise SchedulerError("CONFIG_INVALID", f"{where}: the base URL {problem}")
    return Endpoint(name=name, base_url=url, model=model, key_ref=key_ref, key_from_env=key_env)


def price_of(settings: AgentSettings, endpoint: str, model: str) -> tuple[float, float] | None:
    """USD per million (prompt, completion) tokens of ``model`` on ``endpoint`` (``ENDPOINT:MODEL`` first)."""
    text = settings.prices.get(f"{endpoint}:{model}") or settings.prices.get(model)
    return parse_price(text) if text else None
