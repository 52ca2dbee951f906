"""``WebhookChannel``: one JSON POST per outbox part, signed per the Standard Webhooks specification.

Each part becomes a POST of ``{"type", "timestamp", "data"}`` to the job's ``delivery_to``
(or the configured default URL) with the headers ``webhook-id`` (the part's idempotency
key, identical on every retry), ``webhook-timestamp`` and ``webhook-signature``
(``v1,<base64 HMAC-SHA256>`` made by the ``standardwebhooks`` package from the signing
secret). A receiver verifies the signature with any Standard Webhooks library and
drops a ``webhook-id`` it has seen before, so a retried part is never shown twice.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import attrs
from scheduler_toolkit.http import PooledHttpClient, endpoint_label, error_for_exception, error_for_status, read_attachment
from scheduler_toolkit.options import build_options
from scheduler_toolkit.settings import SecretRef
from scheduler_toolkit.types import ChannelLimits

from scheduler.api import DeliveryPart, DeliveryReceipt, DeliveryRoute, PermanentDeliveryError, SchedulerError

__version__ = "0.1.0"
_USER_AGENT = f"scheduler-channel-webhook/{__version__}"

#: The prefix of this channel's error codes (``WEBHOOK_RATE_LIMITED`` ...).
PREFIX = "WEBHOOK"

DEFAULT_MAX_CHARS = 100_000
DEFAULT_MAX_ATTACHMENT_BYTES = 1024 * 1024
#: Headers the channel sets itself; neither settings nor options may replace them.
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "webhook-id", "webhook-timestamp", "webhook-signature",
                              "idempotency-key"})
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_EVENT_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _http_url_problem(value: str) -> str | None:
    """The check of a URL setting: an absolute ``http``/``https`` URL, else the error message (never the value)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an absolute http:// or https:// URL"
    return None


def _headers_problem(value: dict[str, str]) -> str | None:
    for name, text in value.items():
        if not _HEADER_NAME.match(name):
            return f"{name!r} is not a valid header name"
        if name.lower() in RESERVED_HEADERS:
            return f"{name!r} is set by the channel itself and cannot be replaced"
        if "\r" in text or "\n" in text:
            return f"the value of {name!r} must not contain line breaks"
    return None


def _check_headers(_instance: object, attribute: attrs.Attribute, value: dict[str, str]) -> None:
    problem = _headers_problem(value)
    if problem:
        raise ValueError(f"{attribute.name}: {problem}")


def _check_event_type(_instance: object, attribute: attrs.Attribute, value: str) -> None:
    if not _EVENT_TYPE.match(value):
        raise ValueError(f"{attribute.name} must be 1-128 characters of letters, digits, '.', '_' or '-'")


@attrs.frozen(kw_only=True)
class WebhookOptions:
    """A job's ``delivery_options`` for the webhook channel."""

    event_type: str = attrs.field(
        default="scheduler.delivery", validator=_check_event_type,
        metadata={"doc": "The payload's `type` field (Standard Webhooks event type)."},
    )
    headers: dict[str, str] = attrs.field(
        factory=dict, validator=_check_headers,
        metadata={"doc": "Extra request headers. Stored in the job spec in plain text: never put a secret here"
                         " (use the settings file's `headers`, also not secret, or the signing secret)."},
    )
    include_attachment_content: bool = attrs.field(
        default=True, metadata={"doc": "Embed attachments base64-encoded (`content_base64`); false sends their metadata only."},
    )


@attrs.frozen(kw_only=True)
class WebhookSettings:
    """``[channels.webhook]`` of the settings file."""

    url: str | None = attrs.field(
        default=None, metadata={"doc": "Endpoint used when a job names no `delivery_to`.", "check": _http_url_problem},
    )
    secret: SecretRef | None = attrs.field(
        default=None, metadata={"doc": "Signing secret, `whsec_` + base64 (Standard Webhooks); required to send.", "secret": True},
    )
    timeout_s: float = attrs.field(default=10.0, metadata={"doc": "Seconds to wait for the answer.", "minimum": 0.01, "maximum": 600})
    connect_timeout_s: float = attrs.field(
        default=5.0, metadata={"doc": "Seconds to wait for the connection.", "minimum": 0.01, "maximum": 600},
    )
    max_chars: int = attrs.field(
        default=DEFAULT_MAX_CHARS, metadata={"doc": "Characters of output per part (longer output is split).", "minimum": 100},
    )
    max_attachment_bytes: int = attrs.field(
        default=DEFAULT_MAX_ATTACHMENT_BYTES, metadata={"doc": "Largest attachment embedded in a payload.", "minimum": 0},
    )
    headers: dict[str, str] = attrs.field(
        factory=dict, validator=_check_headers, metadata={"doc": "Extra headers sent with every request (not secrets)."},
    )


def _options(raw: Any) -> WebhookOptions:
    """The job's validated options (the kernel hands an instance; a plain object is validated here)."""
    if isinstance(raw, WebhookOptions):
        return raw
    try:
        return build_options(WebhookOptions, raw or {}, "delivery_options")
    except SchedulerError as exc:
        raise PermanentDeliveryError(exc.message, code=f"{PREFIX}_OPTIONS_INVALID") from None


def _signer(secret: SecretRef | None) -> Any:
    """A ``standardwebhooks.Webhook`` for the configured secret, read now (so a rotated secret applies at once)."""
    if secret is None:
        raise PermanentDeliveryError("no signing secret is configured: set [channels.webhook] secret ="
                                     " {credential = \"env:NAME\"}", code=f"{PREFIX}_NOT_CONFIGURED")
    try:
        value = secret.resolve()
    except SchedulerError as exc:  # SECRET_UNRESOLVED names the reference, never the value
        raise PermanentDeliveryError(exc.message, code=exc.code) from None
    raw = value.strip()
    raw = raw.removeprefix("whsec_")
    try:
        key = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) < 16:
        raise PermanentDeliveryError(f"the signing secret {secret.reference} is not a Standard Webhooks secret"
                                     " (whsec_ followed by base64 of at least 16 bytes)", code=f"{PREFIX}_SECRET_INVALID")
    from standardwebhooks.webhooks import Webhook

    return Webhook(key)


class WebhookChannel:
    """The ``webhook`` delivery channel (entry point ``scheduler.channels:webhook``)."""

    plugin_api = 3
    #: ``idempotency-keys``: every retry of a part carries the same ``webhook-id`` (and ``Idempotency-Key``),
    #: which Standard Webhooks receivers use to drop duplicates.
    capabilities: frozenset[str] = frozenset({"idempotency-keys", "attachments"})
    limits = ChannelLimits(max_chars=DEFAULT_MAX_CHARS, max_parts=20, supports_attachments=True,
                           max_attachment_bytes=DEFAULT_MAX_ATTACHMENT_BYTES)
    options_class = WebhookOptions
    settings_class = WebhookSettings

    def __init__(self) -> None:
        self._settings = WebhookSettings()
        self._pool = PooledHttpClient(_USER_AGENT, self._settings.timeout_s, self._settings.connect_timeout_s)

    def configure(self, settings: WebhookSettings) -> None:
        """Take the validated ``[channels.webhook]`` settings (the loader calls this once)."""
        self._settings = settings
        self.limits = attrs.evolve(type(self).limits, max_chars=settings.max_chars,
                                   max_attachment_bytes=settings.max_attachment_bytes)
        self.close()
        self._pool = PooledHttpClient(_USER_AGENT, settings.timeout_s, settings.connect_timeout_s)

    def close(self) -> None:
        """Close the pooled HTTP connections (a later ``send`` opens new ones)."""
        self._pool.close()

    def check_job(self, options: WebhookOptions | None, spec: Any) -> list[dict[str, str]]:
        """Refuse at ``jobs add`` a ``delivery_to`` this channel can never POST to (``DELIVERY_TARGET_INVALID``).

        Only an absolute ``http://`` or ``https://`` URL is a webhook target: ``file:///etc/passwd``
        or ``javascript:alert(1)`` would otherwise be stored and fail only at send (where the same
        check stays, as ``WEBHOOK_TARGET_INVALID``). The message never repeats the value.
        """
        target = getattr(spec, "delivery_to", None)
        if target and _http_url_problem(target):
            return [{"field": "delivery_to", "code": "DELIVERY_TARGET_INVALID",
                     "error": "the webhook channel sends only to an absolute http:// or https:// URL"}]
        return []

    def send(self, part: DeliveryPart, route: DeliveryRoute) -> DeliveryReceipt:
        """POST one part; raise ``TransientDeliveryError`` / ``PermanentDeliveryError`` when it did not go out."""
        options = _options(route.options)
        url = route.target or self._settings.url
        if not url:
            raise PermanentDeliveryError("no URL: the job has no delivery_to and [channels.webhook] url is not set",
                                         code=f"{PREFIX}_TARGET_MISSING")
        if _http_url_problem(url):
            raise PermanentDeliveryError("the delivery target must be an absolute http:// or https:// URL",
                                         code=f"{PREFIX}_TARGET_INVALID")
        where = f"webhook {endpoint_label(url)}"
        signer = _signer(self._settings.secret)
        now = datetime.now(UTC).replace(microsecond=0)
        attachments = []
        for attachment in part.attachments:
            name, mime, data = read_attachment(attachment, max_bytes=self.limits.max_attachment_bytes, prefix=PREFIX)
            entry: dict[str, Any] = {"name": name, "mime_type": mime, "size_bytes": len(data),
                                     "sha256": attachment.get("sha256") or _sha256(data)}
            if options.include_attachment_content:
                entry["content_base64"] = base64.b64encode(data).decode("ascii")
            attachments.append(entry)
        payload = {
            "type": options.event_type,
            "timestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "data": {
                "idempotency_key": part.idempotency_key,
                "run_id": part.run_id,
                "job_id": part.job_id,
                "part": {"index": part.index, "count": part.count},
                "body": part.body,
                "attachments": attachments,
            },
        }
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        signature = signer.sign(msg_id=part.idempotency_key, timestamp=now, data=body)
        headers = {
            **self._settings.headers,
            **options.headers,
            "content-type": "application/json",
            "webhook-id": part.idempotency_key,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature,
            "idempotency-key": part.idempotency_key,
        }
        try:
            response = self._pool.get().post(url, content=body.encode("utf-8"), headers=headers)
        except Exception as exc:  # noqa: BLE001 - httpx errors: classified, the text (it may hold the URL) not repeated
            raise error_for_exception(exc, where, prefix=PREFIX) from None
        error = error_for_status(response.status_code, response.headers, response.content, where, prefix=PREFIX)
        if error is not None:
            raise error
        return DeliveryReceipt(receipt_id=part.idempotency_key,
                               details={"status_code": response.status_code, "endpoint": endpoint_label(url),
                                        "webhook_id": part.idempotency_key})


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
