"""``SlackChannel``: outbox parts as Slack messages, by incoming webhook or by the Web API.

* **API mode** (a bot token): ``chat.postMessage`` to a channel id, in a thread when the job's
  ``delivery_options.thread_ts`` names one; files go through Slack's external upload flow
  (``files.getUploadURLExternal`` per file, the bytes to the returned upload URL, then one
  ``files.completeUploadExternal`` that shares every file in one message with the part's text
  as its comment).
* **Webhook mode** (an incoming-webhook URL): one JSON POST of the text; the webhook is bound
  to its channel, so ``delivery_to`` is not used and files cannot be sent.

The token and the webhook URL are secret references in ``[channels.slack]``, read at every send.
Neither reaches an error message; webhook, trigger and upload URL paths are redacted from the
``httpx`` logger's records.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Literal

import attrs
from scheduler_toolkit.http import (
    PooledHttpClient,
    endpoint_label,
    error_for_exception,
    error_for_status,
    read_attachment,
    retry_after_seconds,
)
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
_USER_AGENT = f"scheduler-channel-slack/{__version__}"

#: The prefix of this channel's error codes (``SLACK_RATE_LIMITED`` ...).
PREFIX = "SLACK"

#: Slack advises at most 4,000 characters of ``text`` per message (it truncates past 40,000).
DEFAULT_MAX_CHARS = 4000
DEFAULT_MAX_ATTACHMENT_BYTES = 100 * 1024 * 1024
_THREAD_TS = re.compile(r"^[0-9]{1,12}\.[0-9]{1,9}$")
_CHANNEL = re.compile(r"^[#@]?[A-Za-z0-9._-]{1,80}$")
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")
_SECRET_PATHS = re.compile(r"/(services|triggers|workflows|upload/v1)/[^\s\"']+")

#: ``ok: false`` errors that mean the token cannot do this, now or later.
AUTH_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired", "no_permission",
                         "missing_scope", "not_allowed_token_type", "ekm_access_denied", "team_access_not_granted",
                         "access_denied", "org_login_required", "two_factor_setup_required"})
#: ``ok: false`` errors about the destination.
CHANNEL_ERRORS = frozenset({"channel_not_found", "not_in_channel", "is_archived", "channel_is_archived", "no_service",
                            "action_prohibited", "posting_to_general_channel_denied", "restricted_action",
                            "restricted_action_read_only_channel", "restricted_action_thread_only_channel"})
#: ``ok: false`` errors worth retrying later.
TRANSIENT_ERRORS = frozenset({"ratelimited", "rate_limited", "internal_error", "fatal_error", "service_unavailable",
                              "request_timeout", "team_added_to_org", "upload_timeout"})


class _RedactSecretPaths(logging.Filter):
    """Rewrites webhook, trigger and upload URL paths in a log record (httpx logs each request URL at INFO)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - left to logging itself
            return True
        if _SECRET_PATHS.search(text):
            record.msg, record.args = _SECRET_PATHS.sub(lambda m: f"/{m.group(1)}/<redacted>", text), ()
        return True


_REDACTOR = _RedactSecretPaths()


def _install_log_redaction() -> None:
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)


def _url_problem(value: str) -> str | None:
    return None if re.match(r"^https?://[^/\s]+(/[^\s]*)?$", value) else "must be an absolute http:// or https:// URL"


def _channel_problem(value: str) -> str | None:
    return None if _CHANNEL.match(value) else "must be a channel id such as C0123456789"


def _check_thread_ts(_instance: object, attribute: attrs.Attribute, value: str | None) -> None:
    if value is not None and not _THREAD_TS.match(value):
        raise ValueError(f"{attribute.name} must be a Slack message timestamp such as 1712345678.123456")


@attrs.frozen(kw_only=True)
class SlackOptions:
    """A job's ``delivery_options`` for the Slack channel."""

    thread_ts: str | None = attrs.field(
        default=None, validator=_check_thread_ts,
        metadata={"doc": "Reply in the thread of this parent message (`ts`, e.g. 1712345678.123456)."},
    )
    reply_broadcast: bool = attrs.field(default=False, metadata={"doc": "With `thread_ts`: also show the reply in the channel."})
    mrkdwn: bool = attrs.field(default=True, metadata={"doc": "Let Slack format the text as mrkdwn."})
    unfurl_links: bool = attrs.field(default=False, metadata={"doc": "Show previews of linked pages."})
    unfurl_media: bool = attrs.field(default=True, metadata={"doc": "Show previews of linked media."})


@attrs.frozen(kw_only=True)
class SlackSettings:
    """``[channels.slack]`` of the settings file."""

    mode: Literal["auto", "api", "webhook"] = attrs.field(
        default="auto", metadata={"doc": "`api` (bot token), `webhook` (incoming webhook) or `auto`: api when a token is set."},
    )
    token: SecretRef | None = attrs.field(default=None, metadata={"doc": "Bot token (xoxb-...) for API mode.", "secret": True})
    webhook_url: SecretRef | None = attrs.field(
        default=None, metadata={"doc": "Incoming-webhook URL for webhook mode (it is a credential).", "secret": True},
    )
    api_base: str = attrs.field(default="https://slack.com/api", metadata={"doc": "Web API root.", "check": _url_problem})
    default_channel: str | None = attrs.field(
        default=None, metadata={"doc": "Channel id for jobs without `delivery_to` (API mode).", "check": _channel_problem},
    )
    timeout_s: float = attrs.field(default=10.0, metadata={"doc": "Seconds to wait for an answer.", "minimum": 0.01,
                                                           "maximum": 600})
    upload_timeout_s: float = attrs.field(default=120.0, metadata={"doc": "Seconds to wait for a file upload's answer.",
                                                                   "minimum": 0.01, "maximum": 3600})
    connect_timeout_s: float = attrs.field(default=5.0, metadata={"doc": "Seconds to wait for the connection.",
                                                                  "minimum": 0.01, "maximum": 600})
    max_chars: int = attrs.field(default=DEFAULT_MAX_CHARS, metadata={"doc": "Characters of output per message.",
                                                                      "minimum": 100, "maximum": 40000})
    max_attachment_bytes: int = attrs.field(default=DEFAULT_MAX_ATTACHMENT_BYTES,
                                            metadata={"doc": "Largest file uploaded (API mode).", "minimum": 0})


def _options(raw: Any) -> SlackOptions:
    if isinstance(raw, SlackOptions):
        return raw
    try:
        return build_options(SlackOptions, raw or {}, "delivery_options")
    except SchedulerError as exc:
        raise PermanentDeliveryError(exc.message, code=f"{PREFIX}_OPTIONS_INVALID") from None


def _resolve(ref: SecretRef | None, what: str, setting: str) -> str:
    if ref is None:
        raise PermanentDeliveryError(f"no {what} is configured: set [channels.slack] {setting} = {{credential = \"env:NAME\"}}",
                                     code=f"{PREFIX}_NOT_CONFIGURED")
    try:
        return ref.resolve().strip()
    except SchedulerError as exc:  # names the reference, never the value
        raise PermanentDeliveryError(exc.message, code=exc.code) from None


def error_for_slack(method: str, error: str, headers: Any) -> DeliveryError:
    """The delivery error an ``ok: false`` answer means."""
    said = f"slack {method} failed: {error}"
    if error in ("ratelimited", "rate_limited"):
        return TransientDeliveryError(said, code=f"{PREFIX}_RATE_LIMITED", retry_after_s=retry_after_seconds(headers.get("retry-after")))
    if error in TRANSIENT_ERRORS:
        return TransientDeliveryError(said, code=f"{PREFIX}_SERVER_ERROR", retry_after_s=retry_after_seconds(headers.get("retry-after")))
    if error in AUTH_ERRORS:
        return PermanentDeliveryError(said, code=f"{PREFIX}_AUTH_FAILED")
    if error in CHANNEL_ERRORS:
        return PermanentDeliveryError(said, code=f"{PREFIX}_CHANNEL_UNAVAILABLE")
    return PermanentDeliveryError(said, code=f"{PREFIX}_REJECTED")


class SlackChannel:
    """The ``slack`` delivery channel (entry point ``scheduler.channels:slack``)."""

    plugin_api = 3
    #: API mode: files and threads. Webhook mode narrows the instance's set to none (see ``configure``).
    #: No ``idempotency-keys``: Slack's message API has none.
    capabilities: frozenset[str] = frozenset({"attachments", "threads"})
    limits = ChannelLimits(max_chars=DEFAULT_MAX_CHARS, max_parts=20, supports_attachments=True,
                           max_attachment_bytes=DEFAULT_MAX_ATTACHMENT_BYTES)
    options_class = SlackOptions
    settings_class = SlackSettings

    def __init__(self) -> None:
        self._settings = SlackSettings()
        self._pool = PooledHttpClient(_USER_AGENT, self._settings.timeout_s, self._settings.connect_timeout_s)
        _install_log_redaction()

    @property
    def mode(self) -> str:
        """``api`` or ``webhook``: the configured mode, ``auto`` resolved by which secret is set."""
        s = self._settings
        if s.mode != "auto":
            return s.mode
        return "webhook" if s.token is None and s.webhook_url is not None else "api"

    def configure(self, settings: SlackSettings) -> None:
        """Take the validated ``[channels.slack]`` settings (the loader calls this once)."""
        self._settings = settings
        api = self.mode == "api"
        self.capabilities = type(self).capabilities if api else frozenset()
        self.limits = attrs.evolve(type(self).limits, max_chars=settings.max_chars, supports_attachments=api,
                                   max_attachment_bytes=settings.max_attachment_bytes if api else 0)
        self.close()
        self._pool = PooledHttpClient(_USER_AGENT, settings.timeout_s, settings.connect_timeout_s)

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        self._pool.close()

    def _upload_timeout(self) -> Any:
        import httpx

        return httpx.Timeout(self._settings.upload_timeout_s, connect=self._settings.connect_timeout_s)

    def _post(self, url: str, where: str, **kwargs: Any) -> Any:
        try:
            return self._pool.get().post(url, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified; the exception text may hold a secret URL
            raise error_for_exception(exc, where, prefix=PREFIX) from None

    # -- send ------------------------------------------------------------------------------------

    def check_job(self, options: SlackOptions | None, spec: Any) -> list[dict[str, str]]:
        """Refuse at ``jobs add`` a ``delivery_to`` this channel can never send to (``DELIVERY_TARGET_INVALID``).

        The same check stays at send (``SLACK_TARGET_INVALID``); the message never repeats the value.

        In webhook mode the webhook's own channel is used and ``delivery_to`` is ignored, so it is not judged.
        """
        target = (getattr(spec, "delivery_to", None) or "").strip()
        if self.mode == "api" and target and _channel_problem(target):
            return [{"field": "delivery_to", "code": "DELIVERY_TARGET_INVALID",
                     "error": "the slack channel (API mode) sends only to a channel id such as C0123456789"}]
        return []

    def send(self, part: DeliveryPart, route: DeliveryRoute) -> DeliveryReceipt:
        """Send one part as one Slack message (its files shared with it in API mode)."""
        options = _options(route.options)
        if self.mode == "webhook":
            return self._send_webhook(part, options)
        return self._send_api(part, route, options)

    def _message_fields(self, options: SlackOptions) -> dict[str, Any]:
        fields: dict[str, Any] = {"mrkdwn": options.mrkdwn, "unfurl_links": options.unfurl_links,
                                  "unfurl_media": options.unfurl_media}
        if options.thread_ts:
            fields["thread_ts"] = options.thread_ts
            if options.reply_broadcast:
                fields["reply_broadcast"] = True
        return fields

    def _send_webhook(self, part: DeliveryPart, options: SlackOptions) -> DeliveryReceipt:
        if part.attachments:
            raise PermanentDeliveryError("files cannot be sent through an incoming webhook: configure a bot token (API mode)",
                                         code=f"{PREFIX}_ATTACHMENTS_UNSUPPORTED")
        if not part.body.strip():
            raise PermanentDeliveryError("the part has no text", code=f"{PREFIX}_EMPTY")
        url = _resolve(self._settings.webhook_url, "incoming-webhook URL", "webhook_url")
        if _url_problem(url):
            raise PermanentDeliveryError(f"the incoming-webhook URL {self._settings.webhook_url} is not an http(s) URL",
                                         code=f"{PREFIX}_WEBHOOK_URL_INVALID")
        where = f"slack incoming webhook at {endpoint_label(url)}"
        payload = {"text": part.body, **self._message_fields(options)}
        response = self._post(url, where, content=json.dumps(payload, ensure_ascii=False).encode("utf-8"),
                              headers={"content-type": "application/json; charset=utf-8"})
        error = error_for_status(response.status_code, response.headers, response.content, where, prefix=PREFIX)
        if error is not None:
            reason = response.content[:100].decode("utf-8", "replace").strip()
            if isinstance(error, PermanentDeliveryError) and (response.status_code in (404, 410) or reason in CHANNEL_ERRORS):
                raise PermanentDeliveryError(error.message, code=f"{PREFIX}_CHANNEL_UNAVAILABLE")
            raise error
        return DeliveryReceipt(receipt_id=None, details={"mode": "webhook", "status_code": response.status_code})

    def _token(self) -> str:
        token = _resolve(self._settings.token, "bot token", "token")
        if not _PRINTABLE.match(token):
            raise PermanentDeliveryError(f"the bot token {self._settings.token} contains spaces or control characters",
                                         code=f"{PREFIX}_TOKEN_INVALID")
        return token

    def _api(self, token: str, method: str, *, json_body: dict[str, Any] | None = None, form: dict[str, str] | None = None
             ) -> dict[str, Any]:
        """One Web API call: its answer when ``ok``, else the classified error."""
        url = f"{self._settings.api_base.rstrip('/')}/{method}"
        headers = {"authorization": f"Bearer {token}"}
        if json_body is not None:
            headers["content-type"] = "application/json; charset=utf-8"
            response = self._post(url, f"slack {method}", content=json.dumps(json_body, ensure_ascii=False).encode("utf-8"),
                                  headers=headers)
        else:
            response = self._post(url, f"slack {method}", data=form, headers=headers)
        error = error_for_status(response.status_code, response.headers, response.content, f"slack {method}", prefix=PREFIX)
        if error is not None:
            raise error
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise TransientDeliveryError(f"slack {method} answered HTTP {response.status_code} without a Web API answer",
                                         code=f"{PREFIX}_SERVER_ERROR")
        if answer.get("ok") is not True:
            raise error_for_slack(method, str(answer.get("error") or "unknown_error")[:100], response.headers)
        return answer

    def _send_api(self, part: DeliveryPart, route: DeliveryRoute, options: SlackOptions) -> DeliveryReceipt:
        channel = (route.target or self._settings.default_channel or "").strip()
        if not channel:
            raise PermanentDeliveryError("no channel: the job has no delivery_to and [channels.slack] default_channel is not set",
                                         code=f"{PREFIX}_TARGET_MISSING")
        if _channel_problem(channel):
            raise PermanentDeliveryError("the delivery target must be a Slack channel id such as C0123456789",
                                         code=f"{PREFIX}_TARGET_INVALID")
        files = [read_attachment(a, max_bytes=self.limits.max_attachment_bytes, prefix=PREFIX) for a in part.attachments]
        if not files and not part.body.strip():
            raise PermanentDeliveryError("the part has neither text nor files", code=f"{PREFIX}_EMPTY")
        token = self._token()
        if files:
            return self._send_files(token, channel, part, options, files)
        answer = self._api(token, "chat.postMessage", json_body={"channel": channel, "text": part.body,
                                                                 **self._message_fields(options)})
        return DeliveryReceipt(receipt_id=str(answer.get("ts")) if answer.get("ts") else None,
                               details={"mode": "api", "channel": answer.get("channel") or channel, "ts": answer.get("ts")})

    def _send_files(self, token: str, channel: str, part: DeliveryPart, options: SlackOptions,
                    files: list[tuple[str, str, bytes]]) -> DeliveryReceipt:
        """The external upload flow. Nothing is visible until the last call shares the files."""
        uploaded = []
        for name, mime, data in files:
            ticket = self._api(token, "files.getUploadURLExternal", form={"filename": name, "length": str(len(data))})
            upload_url, file_id = ticket.get("upload_url"), ticket.get("file_id")
            if not isinstance(upload_url, str) or _url_problem(upload_url) or not isinstance(file_id, str):
                raise TransientDeliveryError("slack files.getUploadURLExternal answered without an upload URL or file id",
                                             code=f"{PREFIX}_SERVER_ERROR")
            where = f"slack file upload to {endpoint_label(upload_url)}"
            # The upload URL is pre-signed: the bot token is not sent there.
            response = self._post(upload_url, where, content=data, headers={"content-type": mime},
                                  timeout=self._upload_timeout())
            error = error_for_status(response.status_code, response.headers, response.content, where, prefix=PREFIX)
            if error is not None:
                raise error
            uploaded.append({"id": file_id, "title": name})
        form = {"files": json.dumps(uploaded), "channel_id": channel}
        if part.body.strip():
            form["initial_comment"] = part.body
        if options.thread_ts:
            form["thread_ts"] = options.thread_ts
        answer = self._api(token, "files.completeUploadExternal", form=form)
        ids = [f.get("id") for f in answer.get("files") or [] if isinstance(f, dict)] or [f["id"] for f in uploaded]
        return DeliveryReceipt(receipt_id=ids[0], details={"mode": "api", "channel": channel, "file_ids": ids})
