"""``TelegramChannel``: outbox parts as Telegram Bot API messages (``sendMessage``, ``sendDocument``, ``sendMediaGroup``).

The bot token is a secret reference in ``[channels.telegram]``, read at every send. It is part of
every Bot API URL (``/bot<token>/METHOD``), so the channel never repeats a URL or the HTTP
library's exception text, and it redacts ``/bot<token>/`` from the ``httpx`` logger's records.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Literal

import attrs
from scheduler_toolkit.http import PooledHttpClient, endpoint_label, error_for_exception, read_attachment, retry_after_seconds
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
_USER_AGENT = f"scheduler-channel-telegram/{__version__}"

#: The prefix of this channel's error codes (``TELEGRAM_RATE_LIMITED`` ...).
PREFIX = "TELEGRAM"

#: Telegram's limit for one text message (characters after entity parsing).
MAX_MESSAGE_CHARS = 4096
#: Telegram's limit for a document caption.
MAX_CAPTION_CHARS = 1024
#: Files per ``sendMediaGroup``.
MAX_GROUP = 10
#: What the public Bot API accepts per uploaded file (a local Bot API server accepts more: raise the setting).
DEFAULT_MAX_ATTACHMENT_BYTES = 50 * 1024 * 1024
_TOKEN = re.compile(r"^[0-9]{1,20}:[A-Za-z0-9_-]{20,200}$")
_CHAT = re.compile(r"^(-?[0-9]{1,20}|@[A-Za-z][A-Za-z0-9_]{3,64})$")
_BOT_PATH = re.compile(r"/bot[^/\s\"']+/")


class _RedactBotTokens(logging.Filter):
    """Rewrites ``/bot<token>/`` in a log record to ``/bot<redacted>/`` (httpx logs each request URL at INFO)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is left to logging itself
            return True
        if "/bot" in text:
            record.msg, record.args = _BOT_PATH.sub("/bot<redacted>/", text), ()
        return True


_REDACTOR = _RedactBotTokens()


def _install_log_redaction() -> None:
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)


def _chat_problem(value: str) -> str | None:
    return None if _CHAT.match(value) else "must be a numeric chat id (-100…) or @channelusername"


def _url_problem(value: str) -> str | None:
    return None if re.match(r"^https?://[^/\s]+(/[^\s]*)?$", value) else "must be an absolute http:// or https:// URL"


@attrs.frozen(kw_only=True)
class TelegramOptions:
    """A job's ``delivery_options`` for the Telegram channel."""

    parse_mode: Literal["HTML", "MarkdownV2", "Markdown"] | None = attrs.field(
        default=None, metadata={"doc": "Formatting of the text; unset sends plain text (job output is rarely valid markup)."},
    )
    disable_notification: bool = attrs.field(default=False, metadata={"doc": "Deliver silently."})
    protect_content: bool = attrs.field(default=False, metadata={"doc": "Forbid forwarding and saving."})
    message_thread_id: int | None = attrs.field(
        default=None, metadata={"doc": "Forum topic to post in.", "minimum": 1},
    )
    link_preview: bool = attrs.field(default=True, metadata={"doc": "Show link previews in text messages."})


@attrs.frozen(kw_only=True)
class TelegramSettings:
    """``[channels.telegram]`` of the settings file."""

    token: SecretRef | None = attrs.field(default=None, metadata={"doc": "Bot token (from @BotFather); required.", "secret": True})
    api_base: str = attrs.field(
        default="https://api.telegram.org", metadata={"doc": "Bot API root (a local Bot API server, a test server).",
                                                      "check": _url_problem},
    )
    default_chat_id: str | None = attrs.field(
        default=None, metadata={"doc": "Chat for jobs without `delivery_to`.", "check": _chat_problem},
    )
    timeout_s: float = attrs.field(default=10.0, metadata={"doc": "Seconds to wait for an answer.", "minimum": 0.01,
                                                           "maximum": 600})
    upload_timeout_s: float = attrs.field(
        default=120.0, metadata={"doc": "Seconds to wait for a document upload's answer.", "minimum": 0.01, "maximum": 3600},
    )
    connect_timeout_s: float = attrs.field(default=5.0, metadata={"doc": "Seconds to wait for the connection.",
                                                                  "minimum": 0.01, "maximum": 600})
    max_attachment_bytes: int = attrs.field(
        default=DEFAULT_MAX_ATTACHMENT_BYTES, metadata={"doc": "Largest file sent.", "minimum": 0},
    )


def _options(raw: Any) -> TelegramOptions:
    if isinstance(raw, TelegramOptions):
        return raw
    try:
        return build_options(TelegramOptions, raw or {}, "delivery_options")
    except SchedulerError as exc:
        raise PermanentDeliveryError(exc.message, code=f"{PREFIX}_OPTIONS_INVALID") from None


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _answer_error(method: str, status: int, headers: Any, content: bytes) -> DeliveryError | None:
    """The delivery error a Bot API answer means (``{"ok": false, "error_code", "description", "parameters"}``), or None."""
    try:
        answer = json.loads(content)
    except ValueError:
        answer = None
    where = f"telegram {method}"
    if isinstance(answer, dict) and answer.get("ok") is True and 200 <= status < 300:
        return None
    if not isinstance(answer, dict):
        if status == 429 or status >= 500 or 200 <= status < 300:
            return TransientDeliveryError(f"{where} answered HTTP {status} without a Bot API answer",
                                          code=f"{PREFIX}_SERVER_ERROR" if status != 429 else f"{PREFIX}_RATE_LIMITED",
                                          retry_after_s=retry_after_seconds(headers.get("retry-after")))
        answer = {}
    error_code, said_parameters = answer.get("error_code"), answer.get("parameters")
    code = error_code if isinstance(error_code, int) else status
    description = str(answer.get("description") or f"HTTP {status}")[:300]
    parameters = said_parameters if isinstance(said_parameters, dict) else {}
    said = f"{where} failed ({code}): {description}"
    if code == 429 or status == 429:
        retry_after = parameters.get("retry_after")
        seconds = float(retry_after) if isinstance(retry_after, (int, float)) else retry_after_seconds(headers.get("retry-after"))
        return TransientDeliveryError(said, code=f"{PREFIX}_RATE_LIMITED", retry_after_s=seconds)
    if code >= 500 or status >= 500:
        return TransientDeliveryError(said, code=f"{PREFIX}_SERVER_ERROR", retry_after_s=retry_after_seconds(headers.get("retry-after")))
    if code in (401, 404):
        return PermanentDeliveryError(f"{where}: the bot token was refused ({code}: {description})", code=f"{PREFIX}_AUTH_FAILED")
    if code == 403:
        return PermanentDeliveryError(said, code=f"{PREFIX}_FORBIDDEN")
    if "migrate_to_chat_id" in parameters:
        return PermanentDeliveryError(f"{said}; the group is now chat {parameters['migrate_to_chat_id']}: update delivery_to",
                                      code=f"{PREFIX}_CHAT_MIGRATED")
    return PermanentDeliveryError(said, code=f"{PREFIX}_REJECTED")


class TelegramChannel:
    """The ``telegram`` delivery channel (entry point ``scheduler.channels:telegram``)."""

    plugin_api = 3
    #: No ``idempotency-keys``: the Bot API has none, so a part re-sent after a lost answer shows twice.
    #: ``threads``: forum topics (``message_thread_id``).
    capabilities: frozenset[str] = frozenset({"attachments", "threads"})
    limits = ChannelLimits(max_chars=MAX_MESSAGE_CHARS, max_parts=20, supports_attachments=True,
                           max_attachment_bytes=DEFAULT_MAX_ATTACHMENT_BYTES)
    options_class = TelegramOptions
    settings_class = TelegramSettings

    def __init__(self) -> None:
        self._settings = TelegramSettings()
        self._pool = PooledHttpClient(_USER_AGENT, self._settings.timeout_s, self._settings.connect_timeout_s)
        _install_log_redaction()

    def configure(self, settings: TelegramSettings) -> None:
        """Take the validated ``[channels.telegram]`` settings (the loader calls this once)."""
        self._settings = settings
        self.limits = attrs.evolve(type(self).limits, max_attachment_bytes=settings.max_attachment_bytes)
        self.close()
        self._pool = PooledHttpClient(_USER_AGENT, settings.timeout_s, settings.connect_timeout_s)

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        self._pool.close()

    def _token(self) -> str:
        ref = self._settings.token
        if ref is None:
            raise PermanentDeliveryError('no bot token is configured: set [channels.telegram] token = {credential = "env:NAME"}',
                                         code=f"{PREFIX}_NOT_CONFIGURED")
        try:
            token = ref.resolve().strip()
        except SchedulerError as exc:  # names the reference, never the value
            raise PermanentDeliveryError(exc.message, code=exc.code) from None
        if not _TOKEN.match(token):
            raise PermanentDeliveryError(f"the bot token {ref.reference} is not of the form <digits>:<secret>",
                                         code=f"{PREFIX}_TOKEN_INVALID")
        return token

    def _call(self, token: str, method: str, *, json_body: dict[str, Any] | None = None, data: dict[str, str] | None = None,
              files: Any = None) -> dict[str, Any]:
        """One Bot API call: its ``result``, or the classified error (nothing secret in it)."""
        url = f"{self._settings.api_base.rstrip('/')}/bot{token}/{method}"
        kwargs: dict[str, Any] = {"json": json_body} if json_body is not None else {"data": data, "files": files}
        if files:
            import httpx

            s = self._settings
            kwargs["timeout"] = httpx.Timeout(s.upload_timeout_s, connect=s.connect_timeout_s)
        try:
            response = self._pool.get().post(url, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified; the exception text may contain the URL, hence the token
            raise error_for_exception(exc, f"telegram {method} at {endpoint_label(url)}", prefix=PREFIX) from None
        error = _answer_error(method, response.status_code, response.headers, response.content)
        if error is not None:
            error.args = (error.message.replace(token, "<redacted>"),)
            error.message = error.args[0]
            raise error
        result = response.json().get("result")
        return result if isinstance(result, dict) else {"result": result}

    def check_job(self, options: TelegramOptions | None, spec: Any) -> list[dict[str, str]]:
        """Refuse at ``jobs add`` a ``delivery_to`` this channel can never send to (``DELIVERY_TARGET_INVALID``).

        The same check stays at send (``TELEGRAM_TARGET_INVALID``); the message never repeats the value.
        """
        target = (getattr(spec, "delivery_to", None) or "").strip()
        if target and _chat_problem(target):
            return [{"field": "delivery_to", "code": "DELIVERY_TARGET_INVALID",
                     "error": "the telegram channel sends only to a numeric chat id (-100...) or @channelusername"}]
        return []

    def send(self, part: DeliveryPart, route: DeliveryRoute) -> DeliveryReceipt:
        """Send one part: a text message, documents with the text as caption, or both."""
        options = _options(route.options)
        chat = (route.target or self._settings.default_chat_id or "").strip()
        if not chat:
            raise PermanentDeliveryError("no chat: the job has no delivery_to and [channels.telegram] default_chat_id is not set",
                                         code=f"{PREFIX}_TARGET_MISSING")
        if _chat_problem(chat):
            raise PermanentDeliveryError("the delivery target must be a numeric chat id or @channelusername",
                                         code=f"{PREFIX}_TARGET_INVALID")
        files = [read_attachment(a, max_bytes=self.limits.max_attachment_bytes, prefix=PREFIX) for a in part.attachments]
        text = part.body
        if _utf16_len(text) > MAX_MESSAGE_CHARS:
            raise PermanentDeliveryError(f"the part has {_utf16_len(text)} UTF-16 units, over Telegram's {MAX_MESSAGE_CHARS}",
                                         code=f"{PREFIX}_MESSAGE_TOO_LONG")
        token = self._token()
        common: dict[str, Any] = {"chat_id": chat}
        if options.message_thread_id is not None:
            common["message_thread_id"] = options.message_thread_id
        if options.disable_notification:
            common["disable_notification"] = True
        if options.protect_content:
            common["protect_content"] = True
        message_ids: list[int | None] = []
        caption = text if files and text.strip() and _utf16_len(text) <= MAX_CAPTION_CHARS else None
        if text.strip() and caption is None:
            body: dict[str, Any] = {**common, "text": text}
            if options.parse_mode:
                body["parse_mode"] = options.parse_mode
            if not options.link_preview:
                body["link_preview_options"] = {"is_disabled": True}
            message_ids.append(self._call(token, "sendMessage", json_body=body).get("message_id"))
        for start in range(0, len(files), MAX_GROUP):
            batch = files[start:start + MAX_GROUP]
            batch_caption = caption if start == 0 else None
            message_ids.extend(self._send_files(token, common, batch, batch_caption, options.parse_mode))
        if not message_ids:
            raise PermanentDeliveryError("the part has neither text nor attachments", code=f"{PREFIX}_EMPTY")
        first = message_ids[0]
        return DeliveryReceipt(receipt_id=str(first) if first is not None else None,
                               details={"chat_id": chat, "message_ids": message_ids})

    def _send_files(self, token: str, common: dict[str, Any], batch: list[tuple[str, str, bytes]], caption: str | None,
                    parse_mode: str | None) -> list[int | None]:
        fields = {k: (json.dumps(v) if isinstance(v, bool) else str(v)) for k, v in common.items()}
        if len(batch) == 1:
            name, mime, data = batch[0]
            if caption is not None:
                fields["caption"] = caption
                if parse_mode:
                    fields["parse_mode"] = parse_mode
            result = self._call(token, "sendDocument", data=fields, files={"document": (name, data, mime)})
            return [result.get("message_id")]
        media = []
        uploads = {}
        for i, (name, mime, data) in enumerate(batch):
            item: dict[str, Any] = {"type": "document", "media": f"attach://file{i}"}
            if i == 0 and caption is not None:
                item["caption"] = caption
                if parse_mode:
                    item["parse_mode"] = parse_mode
            media.append(item)
            uploads[f"file{i}"] = (name, data, mime)
        fields["media"] = json.dumps(media)
        result = self._call(token, "sendMediaGroup", data=fields, files=uploads)
        messages = result.get("result", [result])
        return [m.get("message_id") for m in messages if isinstance(m, dict)]
