"""``OpenClawChannel``: outbox parts as messages sent by an OpenClaw Gateway's ``message`` tool.

Each part is one ``POST <gateway>/tools/invoke`` with
``{"tool": "message", "args": {"action": "send", "channel", "target", "message", ...}}`` and
the Gateway's bearer token. The Gateway then delivers it on whichever chat service it is
connected to (Telegram, Slack, Discord, WhatsApp, Signal, iMessage, ...). Its answers are
``200 {"ok": true, "result"}``, ``400 {"ok": false, "error": {"type", "message"}}``, 401,
404 (tool not available under the Gateway's tool policy), 429 with ``Retry-After``; a tool
result with ``isError`` is a failed attempt too.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
from scheduler_toolkit.http import PooledHttpClient, endpoint_label, error_for_exception, error_for_status
from scheduler_toolkit.options import build_options
from scheduler_toolkit.settings import SecretRef
from scheduler_toolkit.types import ChannelLimits, DeliveryError

from scheduler.api import (
    DeliveryPart,
    DeliveryReceipt,
    DeliveryRoute,
    PermanentDeliveryError,
    SchedulerError,
    TransientDeliveryError,
)

__version__ = "0.1.0"
_USER_AGENT = f"scheduler-channel-openclaw/{__version__}"

#: The prefix of this channel's error codes (``OPENCLAW_RATE_LIMITED`` ...).
PREFIX = "OPENCLAW"

DEFAULT_GATEWAY = "http://127.0.0.1:18789"
#: Gateway-side chunking aims at 4096; leave room for a part prefix.
DEFAULT_MAX_CHARS = 3500
#: Chat services the Gateway's message tool knows; ``<channel>:<target>`` / ``<channel>/<target>`` selects one.
KNOWN_CHANNELS = frozenset({"whatsapp", "telegram", "discord", "googlechat", "slack", "mattermost", "signal", "imessage",
                            "msteams", "matrix"})
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_TOKEN = re.compile(r"^[\x21-\x7e]+$")
_INVALID_REQUEST = re.compile(r"invalid|validation|schema|bad_request|unknown_tool|not_found", re.IGNORECASE)


def _url_problem(value: str) -> str | None:
    return None if re.match(r"^https?://[^/\s]+(/[^\s]*)?$", value) else "must be an absolute http:// or https:// URL"


def _name_problem(value: str) -> str | None:
    return None if _NAME.match(value) else "must be a channel name such as telegram or slack"


def _check_name(_instance: object, attribute: attrs.Attribute, value: str | None) -> None:
    if value is not None and _name_problem(value):
        raise ValueError(f"{attribute.name} must be a channel name such as telegram or slack")


@attrs.frozen(kw_only=True)
class OpenClawOptions:
    """A job's ``delivery_options`` for the OpenClaw channel."""

    channel: str | None = attrs.field(
        default=None, validator=_check_name,
        metadata={"doc": "Gateway channel (telegram, slack, ...) when `delivery_to` has no `<channel>:` prefix."},
    )
    account: str | None = attrs.field(default=None, metadata={"doc": "Account id, when the Gateway has several for the channel."})
    thread_id: str | None = attrs.field(default=None, metadata={"doc": "Thread to post in (Telegram forum topic, Slack thread ts)."})
    reply_to: str | None = attrs.field(default=None, metadata={"doc": "Message id to reply to."})
    silent: bool = attrs.field(default=False, metadata={"doc": "Deliver without a notification where the service supports it."})


@attrs.frozen(kw_only=True)
class OpenClawSettings:
    """``[channels.openclaw]`` of the settings file."""

    gateway_url: str = attrs.field(default=DEFAULT_GATEWAY, metadata={"doc": "OpenClaw Gateway base URL.", "check": _url_problem})
    token: SecretRef | None = attrs.field(
        default=None, metadata={"doc": "Gateway token or password (bearer); unset for a Gateway with auth mode none.",
                                "secret": True},
    )
    default_channel: str | None = attrs.field(
        default=None, metadata={"doc": "Gateway channel when neither `delivery_to` nor the options name one.",
                                "check": _name_problem},
    )
    account_id: str | None = attrs.field(default=None, metadata={"doc": "Default account id for the channel."})
    session_key: str | None = attrs.field(default=None, metadata={"doc": "Session key the Gateway resolves tool policy with"
                                                                         " (default: its main session)."})
    timeout_s: float = attrs.field(default=15.0, metadata={"doc": "Seconds to wait for the Gateway's answer.", "minimum": 0.01,
                                                           "maximum": 600})
    connect_timeout_s: float = attrs.field(default=5.0, metadata={"doc": "Seconds to wait for the connection.",
                                                                  "minimum": 0.01, "maximum": 600})
    max_chars: int = attrs.field(default=DEFAULT_MAX_CHARS, metadata={"doc": "Characters of output per message.",
                                                                      "minimum": 256, "maximum": 100000})


def _options(raw: Any) -> OpenClawOptions:
    if isinstance(raw, OpenClawOptions):
        return raw
    try:
        return build_options(OpenClawOptions, raw or {}, "delivery_options")
    except SchedulerError as exc:
        raise PermanentDeliveryError(exc.message, code=f"{PREFIX}_OPTIONS_INVALID") from None


def split_target(target: str, channel: str | None) -> tuple[str | None, str]:
    """``telegram:123`` / ``telegram/123`` -> ``("telegram", "123")``; any other target keeps ``channel``.

    A prefix that names a known channel wins over ``channel`` only when they agree (or ``channel`` is unset).
    """
    match = re.match(r"^([a-z]+)[:/](.+)$", target)
    if match and match.group(1) in KNOWN_CHANNELS:
        prefix, rest = match.group(1), match.group(2).strip()
        if channel is not None and channel != prefix:
            raise PermanentDeliveryError(f"delivery_to names channel {prefix!r} but the options name {channel!r}",
                                         code=f"{PREFIX}_TARGET_INVALID")
        return prefix, rest
    return channel, target


def _text_of(result: Any) -> str:
    """The text of a tool result's ``content`` blocks (what the tool said), shortened."""
    if not isinstance(result, dict):
        return ""
    parts = [str(c.get("text")) for c in result.get("content") or [] if isinstance(c, dict) and c.get("text")]
    return " ".join(" ".join(parts).split())[:300]


def _message_id(result: Any) -> str | None:
    if not isinstance(result, dict):
        return None
    details = result.get("details")
    for holder in (result, details if isinstance(details, dict) else {}):
        for key in ("messageId", "message_id", "id"):
            value = holder.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                return str(value)
    return None


class OpenClawChannel:
    """The ``openclaw`` delivery channel (entry point ``scheduler.channels:openclaw``)."""

    plugin_api = 3
    #: ``threads``: ``thread_id`` / ``reply_to`` are passed to the message tool. No ``attachments`` (the tool takes
    #: media as paths or URLs on the Gateway's side, not uploads) and no ``idempotency-keys`` (the part's key is
    #: sent as ``Idempotency-Key``, but the Gateway's HTTP tool endpoint does not promise to honour it).
    capabilities: frozenset[str] = frozenset({"threads"})
    limits = ChannelLimits(max_chars=DEFAULT_MAX_CHARS, max_parts=20, supports_attachments=False, max_attachment_bytes=0)
    options_class = OpenClawOptions
    settings_class = OpenClawSettings

    def __init__(self) -> None:
        self._settings = OpenClawSettings()
        self._pool = PooledHttpClient(_USER_AGENT, self._settings.timeout_s, self._settings.connect_timeout_s)

    def configure(self, settings: OpenClawSettings) -> None:
        """Take the validated ``[channels.openclaw]`` settings (the loader calls this once)."""
        self._settings = settings
        self.limits = attrs.evolve(type(self).limits, max_chars=settings.max_chars)
        self.close()
        self._pool = PooledHttpClient(_USER_AGENT, settings.timeout_s, settings.connect_timeout_s)

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        self._pool.close()

    def _token(self) -> str | None:
        ref = self._settings.token
        if ref is None:
            return None
        try:
            token = ref.resolve().strip()
        except SchedulerError as exc:  # names the reference, never the value
            raise PermanentDeliveryError(exc.message, code=exc.code) from None
        if not _TOKEN.match(token):
            raise PermanentDeliveryError(f"the Gateway token {ref.reference} contains spaces or control characters",
                                         code=f"{PREFIX}_TOKEN_INVALID")
        return token

    def send(self, part: DeliveryPart, route: DeliveryRoute) -> DeliveryReceipt:
        """Send one part through the Gateway's ``message`` tool."""
        s = self._settings
        options = _options(route.options)
        if part.attachments:
            raise PermanentDeliveryError("the OpenClaw channel sends text only; this part has attachments",
                                         code=f"{PREFIX}_ATTACHMENTS_UNSUPPORTED")
        if not part.body.strip():
            raise PermanentDeliveryError("the part has no text", code=f"{PREFIX}_EMPTY")
        target = (route.target or "").strip()
        if not target:
            raise PermanentDeliveryError("no target: the job has no delivery_to (e.g. telegram:123456 or slack:channel:C123)",
                                         code=f"{PREFIX}_TARGET_MISSING")
        channel, target = split_target(target, options.channel or None)
        channel = channel or s.default_channel
        if not target:
            raise PermanentDeliveryError("the delivery target has a channel but no destination", code=f"{PREFIX}_TARGET_INVALID")
        account = options.account or s.account_id
        args: dict[str, Any] = {"action": "send", "target": target, "message": part.body}
        if channel:
            args["channel"] = channel
        if account:
            args["accountId"] = account
        if options.thread_id:
            args["threadId"] = options.thread_id
        if options.reply_to:
            args["replyTo"] = options.reply_to
        if options.silent:
            args["silent"] = True
        request: dict[str, Any] = {"tool": "message", "args": args}
        if s.session_key:
            request["sessionKey"] = s.session_key
        headers = {"content-type": "application/json", "idempotency-key": part.idempotency_key}
        token = self._token()
        if token:
            headers["authorization"] = f"Bearer {token}"
        if channel:
            headers["x-openclaw-message-channel"] = channel
        if account:
            headers["x-openclaw-account-id"] = account
        url = f"{s.gateway_url.rstrip('/')}/tools/invoke"
        where = f"openclaw gateway {endpoint_label(url)}"
        try:
            content = json.dumps(request, ensure_ascii=False).encode("utf-8")
            response = self._pool.get().post(url, content=content, headers=headers)
        except Exception as exc:  # noqa: BLE001 - classified; the exception text is not repeated
            raise error_for_exception(exc, where, prefix=PREFIX) from None
        error = self._answer_error(response, where)
        if error is not None:
            if token:
                error.message = error.message.replace(token, "<redacted>")
                error.args = (error.message,)
            raise error
        result = response.json().get("result")
        return DeliveryReceipt(receipt_id=_message_id(result), details={"channel": channel, "target": target})

    @staticmethod
    def _answer_error(response: Any, where: str) -> DeliveryError | None:
        status = response.status_code
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            if 200 <= status < 300:
                return TransientDeliveryError(f"{where} answered HTTP {status} without a tool answer",
                                              code=f"{PREFIX}_SERVER_ERROR")
            return error_for_status(status, response.headers, response.content, where, prefix=PREFIX)
        said_error = answer.get("error")
        error = said_error if isinstance(said_error, dict) else {}
        kind, said = str(error.get("type") or ""), " ".join(str(error.get("message") or "").split())[:300]
        if status == 404:
            return PermanentDeliveryError(f"{where}: the message tool is not available (not found, or not allowed by the"
                                          " Gateway's tool policy)" + (f": {said}" if said else ""), code=f"{PREFIX}_TOOL_UNAVAILABLE")
        if status in (401, 403):
            return PermanentDeliveryError(f"{where} refused the token (HTTP {status})", code=f"{PREFIX}_AUTH_FAILED")
        if not 200 <= status < 300 and status != 400:
            return error_for_status(status, response.headers, response.content, where, prefix=PREFIX)
        if answer.get("ok") is not True:
            detail = f"{where}: {kind or 'error'}" + (f": {said}" if said else "")
            if status == 400 and _INVALID_REQUEST.search(kind):
                return PermanentDeliveryError(detail, code=f"{PREFIX}_REJECTED")
            return TransientDeliveryError(detail, code=f"{PREFIX}_TOOL_ERROR")
        result = answer.get("result")
        if isinstance(result, dict) and (result.get("isError") is True or result.get("ok") is False):
            text = _text_of(result) or str(result.get("error") or "")[:300]
            return TransientDeliveryError(f"{where}: the message tool failed" + (f": {text}" if text else ""),
                                          code=f"{PREFIX}_TOOL_ERROR")
        return None
