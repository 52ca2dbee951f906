"""``EmailChannel``: each outbox part as one e-mail, sent over SMTP with the standard library.

Transport security is ``starttls`` (the default: a plain connection upgraded with STARTTLS,
refused when the server does not offer it), ``tls`` (implicit TLS, usually port 465) or
``plain``. ``plain`` is accepted only for a loopback host (a local relay), and is otherwise
refused when the channel is configured (``EMAIL_PLAINTEXT_REFUSED``). Certificates are
verified against the system store or ``ca_file``. The password is a secret reference read at
every send and never repeated in an error.

One SMTP connection per part: connect, (STARTTLS,) login, send, quit. There is no pool to
share between threads.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import smtplib
import socket
import ssl
from email.message import EmailMessage
from email.utils import formatdate, getaddresses, parseaddr
from typing import Any, Literal

import attrs
from scheduler_toolkit.http import read_attachment
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

PREFIX = "EMAIL"
DEFAULT_PORTS = {"starttls": 587, "tls": 465, "plain": 25}
DEFAULT_MAX_CHARS = 100_000
DEFAULT_MAX_ATTACHMENT_BYTES = 25 * 1024 * 1024
_SUBJECT_FIELDS = {"job_id": "job", "run_id": "run", "index": 1, "count": 1, "first_line": "line"}
_SIMPLE_ADDRESS = re.compile(r"^[^@\s<>,;\"]+@[^@\s<>,;\"]+$")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine by its name or a loopback address (no DNS lookup)."""
    name = host.strip().lower().rstrip(".")
    if name in ("localhost", "localhost.localdomain") or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def _addresses(text: str) -> list[str] | None:
    """The addresses of a comma-separated list (display names allowed), or None when one is malformed."""
    if "\r" in text or "\n" in text:
        return None
    found = [addr for _name, addr in getaddresses([text]) if addr]
    if not found or any(not _SIMPLE_ADDRESS.match(a) for a in found):
        return None
    if len(found) != len([p for p in text.split(",") if p.strip()]):
        return None
    return found


def _address_problem(value: str) -> str | None:
    return None if _addresses(value) else "must be an e-mail address, or several separated by commas"


def _check_address_list(_instance: object, attribute: attrs.Attribute, value: Any) -> None:
    items = [value] if isinstance(value, str) else list(value or ())
    for item in items:
        if _address_problem(item):
            raise ValueError(f"{attribute.name}: {item!r} is not an e-mail address")


def _check_subject(_instance: object, attribute: attrs.Attribute, value: str | None) -> None:
    if value is None:
        return
    if "\r" in value or "\n" in value:
        raise ValueError(f"{attribute.name} must be one line")
    try:
        value.format_map(_SUBJECT_FIELDS)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise ValueError(f"{attribute.name}: unknown or malformed placeholder ({exc}); known: "
                         + ", ".join("{" + k + "}" for k in _SUBJECT_FIELDS)) from None


@attrs.frozen(kw_only=True)
class EmailOptions:
    """A job's ``delivery_options`` for the e-mail channel."""

    subject: str | None = attrs.field(
        default=None, validator=_check_subject,
        metadata={"doc": "Subject template: {first_line}, {job_id}, {run_id}, {index}, {count}. Default: the body's first line."},
    )
    cc: tuple[str, ...] = attrs.field(default=(), validator=_check_address_list, metadata={"doc": "Copy recipients."})
    reply_to: str | None = attrs.field(default=None, validator=_check_address_list, metadata={"doc": "Reply-To address."})


@attrs.frozen(kw_only=True)
class EmailSettings:
    """``[channels.email]`` of the settings file."""

    host: str = attrs.field(default="localhost", metadata={"doc": "SMTP server."})
    port: int | None = attrs.field(default=None, metadata={"doc": "Port; default 587 (starttls), 465 (tls), 25 (plain).",
                                                           "minimum": 1, "maximum": 65535})
    security: Literal["starttls", "tls", "plain"] = attrs.field(
        default="starttls", metadata={"doc": "`starttls`, `tls` (implicit) or `plain` (loopback hosts only)."},
    )
    username: str | None = attrs.field(default=None, metadata={"doc": "Login name; no login when unset."})
    password: SecretRef | None = attrs.field(default=None, metadata={"doc": "Login password.", "secret": True})
    from_address: str | None = attrs.field(default=None, metadata={"doc": "Sender address (From); required to send.",
                                                                   "check": _address_problem})
    default_to: str | None = attrs.field(default=None, metadata={"doc": "Recipients of jobs without `delivery_to`.",
                                                                 "check": _address_problem})
    subject_prefix: str = attrs.field(default="[scheduler]", metadata={"doc": "Put before every subject."})
    ca_file: str | None = attrs.field(default=None, metadata={"doc": "PEM file of CA certificates to verify the server with"
                                                                     " (default: the system store)."})
    timeout_s: float = attrs.field(default=30.0, metadata={"doc": "Seconds per network operation.", "minimum": 0.01,
                                                           "maximum": 600})
    max_chars: int = attrs.field(default=DEFAULT_MAX_CHARS, metadata={"doc": "Characters of output per message.",
                                                                      "minimum": 100})
    max_attachment_bytes: int = attrs.field(default=DEFAULT_MAX_ATTACHMENT_BYTES,
                                            metadata={"doc": "Largest attachment.", "minimum": 0})


def _options(raw: Any) -> EmailOptions:
    if isinstance(raw, EmailOptions):
        return raw
    try:
        return build_options(EmailOptions, raw or {}, "delivery_options")
    except SchedulerError as exc:
        raise PermanentDeliveryError(exc.message, code=f"{PREFIX}_OPTIONS_INVALID") from None


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _reply_text(error: Any) -> str:
    text = error.decode("utf-8", "replace") if isinstance(error, bytes) else str(error)
    return " ".join(text.split())[:200]


def _by_code(code: int, said: str, permanent_code: str) -> DeliveryError:
    if 400 <= code < 500:
        return TransientDeliveryError(said, code=f"{PREFIX}_TEMPORARY_FAILURE")
    return PermanentDeliveryError(said, code=permanent_code)


def error_for_smtp(exc: BaseException, where: str) -> DeliveryError:
    """The delivery error an ``smtplib`` / socket / TLS exception means (4xx transient, 5xx permanent)."""
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        said = f"{where}: login refused ({exc.smtp_code} {_reply_text(exc.smtp_error)})"
        if 400 <= exc.smtp_code < 500:
            return TransientDeliveryError(said, code=f"{PREFIX}_TEMPORARY_FAILURE")
        return PermanentDeliveryError(said, code=f"{PREFIX}_AUTH_FAILED")
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return PermanentDeliveryError(f"{where}: the server does not support {_reply_text(exc)}", code=f"{PREFIX}_AUTH_UNSUPPORTED")
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = {addr: code for addr, (code, _msg) in exc.recipients.items()}
        said = f"{where}: every recipient was refused: " + "; ".join(
            f"{addr} ({code} {_reply_text(msg)})" for addr, (code, msg) in exc.recipients.items())
        if any(400 <= c < 500 for c in codes.values()):
            return TransientDeliveryError(said, code=f"{PREFIX}_TEMPORARY_FAILURE")
        return PermanentDeliveryError(said, code=f"{PREFIX}_RECIPIENTS_REFUSED")
    if isinstance(exc, smtplib.SMTPSenderRefused):
        return _by_code(exc.smtp_code, f"{where}: sender refused ({exc.smtp_code} {_reply_text(exc.smtp_error)})",
                        f"{PREFIX}_SENDER_REFUSED")
    if isinstance(exc, smtplib.SMTPResponseException):  # data refused, greeting refused (SMTPConnectError), HELO ...
        return _by_code(exc.smtp_code, f"{where}: the server answered {exc.smtp_code} {_reply_text(exc.smtp_error)}",
                        f"{PREFIX}_REJECTED")
    if _caused_by(exc, ssl.SSLError) or _caused_by(exc, ssl.CertificateError):
        reason = "certificate verification failed" if _caused_by(exc, ssl.SSLCertVerificationError) else "TLS handshake failed"
        return PermanentDeliveryError(f"{where}: {reason} ({type(exc).__name__})", code=f"{PREFIX}_TLS_FAILED")
    if _caused_by(exc, TimeoutError) or _caused_by(exc, socket.timeout):
        return TransientDeliveryError(f"{where}: no answer in time", code=f"{PREFIX}_TIMEOUT")
    if isinstance(exc, (smtplib.SMTPException, OSError)):
        return TransientDeliveryError(f"{where}: connection failed ({type(exc).__name__})", code=f"{PREFIX}_CONNECTION_FAILED")
    return TransientDeliveryError(f"{where}: sending failed ({type(exc).__name__})", code=f"{PREFIX}_CONNECTION_FAILED")


class EmailChannel:
    """The ``email`` delivery channel (entry point ``scheduler.channels:email``)."""

    plugin_api = 3
    #: No ``idempotency-keys``: SMTP has none. The Message-ID is derived from the part's key, which lets
    #: some mailboxes fold a repeat, but nothing guarantees it.
    capabilities: frozenset[str] = frozenset({"attachments"})
    limits = ChannelLimits(max_chars=DEFAULT_MAX_CHARS, max_parts=20, supports_attachments=True,
                           max_attachment_bytes=DEFAULT_MAX_ATTACHMENT_BYTES)
    options_class = EmailOptions
    settings_class = EmailSettings

    def __init__(self) -> None:
        self._settings = EmailSettings()

    def configure(self, settings: EmailSettings) -> None:
        """Take the validated ``[channels.email]`` settings; refuse plaintext SMTP to anything but loopback."""
        if settings.security == "plain" and not is_loopback(settings.host):
            raise SchedulerError(
                "EMAIL_PLAINTEXT_REFUSED",
                f"[channels.email] security = \"plain\" is only allowed for a loopback host, not {settings.host!r}:"
                " use \"starttls\" or \"tls\"", details={"key": "channels.email.security", "host": settings.host})
        self._settings = settings
        self.limits = attrs.evolve(type(self).limits, max_chars=settings.max_chars,
                                   max_attachment_bytes=settings.max_attachment_bytes)

    @property
    def port(self) -> int:
        """The port the channel connects to."""
        return self._settings.port or DEFAULT_PORTS[self._settings.security]

    def _tls_context(self) -> ssl.SSLContext:
        try:
            return ssl.create_default_context(cafile=self._settings.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise PermanentDeliveryError(f"[channels.email] ca_file cannot be used: {type(exc).__name__}",
                                         code=f"{PREFIX}_TLS_FAILED") from None

    def _password(self) -> str | None:
        s = self._settings
        if s.username is None:
            return None
        if s.password is None:
            raise PermanentDeliveryError('a username but no password is configured: set [channels.email] password ='
                                         ' {credential = "env:NAME"}', code=f"{PREFIX}_NOT_CONFIGURED")
        try:
            return s.password.resolve()
        except SchedulerError as exc:
            raise PermanentDeliveryError(exc.message, code=exc.code) from None

    def build_message(self, part: DeliveryPart, options: EmailOptions, recipients: list[str], sender: str) -> EmailMessage:
        """The message for one part: text body, attachments, deterministic Message-ID."""
        s = self._settings
        message = EmailMessage()
        message["From"] = sender
        message["To"] = ", ".join(recipients)
        if options.cc:
            message["Cc"] = ", ".join(options.cc)
        if options.reply_to:
            message["Reply-To"] = options.reply_to
        first_line = next((line.strip() for line in part.body.splitlines() if line.strip()), "job delivery")[:150]
        if options.subject:
            subject = options.subject.format_map({"job_id": part.job_id, "run_id": part.run_id, "index": part.index,
                                                  "count": part.count, "first_line": first_line})
        else:
            subject = first_line + (f" ({part.index}/{part.count})" if part.count > 1 else "")
        message["Subject"] = " ".join(f"{s.subject_prefix} {subject}".split())
        message["Date"] = formatdate(usegmt=True)
        domain = parseaddr(sender)[1].rpartition("@")[2] or "scheduler.invalid"
        digest = hashlib.sha256(part.idempotency_key.encode("utf-8")).hexdigest()[:40]
        message["Message-ID"] = f"<{digest}@{domain}>"
        message["X-Scheduler-Idempotency-Key"] = part.idempotency_key
        message["X-Scheduler-Job-Id"] = part.job_id
        message["X-Scheduler-Run-Id"] = part.run_id
        message.set_content(part.body or " ", charset="utf-8")
        for attachment in part.attachments:
            name, mime, data = read_attachment(attachment, max_bytes=self.limits.max_attachment_bytes, prefix=PREFIX)
            maintype, _, subtype = mime.partition("/")
            if not maintype or not subtype:
                maintype, subtype = "application", "octet-stream"
            message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
        return message

    def check_job(self, options: EmailOptions | None, spec: Any) -> list[dict[str, str]]:
        """Refuse at ``jobs add`` a ``delivery_to`` this channel can never send to (``DELIVERY_TARGET_INVALID``).

        The same check stays at send (``EMAIL_TARGET_INVALID``); the message never repeats the value.
        """
        target = (getattr(spec, "delivery_to", None) or "").strip()
        if target and _address_problem(target):
            return [{"field": "delivery_to", "code": "DELIVERY_TARGET_INVALID",
                     "error": "the email channel sends only to e-mail addresses separated by commas"}]
        return []

    def send(self, part: DeliveryPart, route: DeliveryRoute) -> DeliveryReceipt:
        """Send one part as one e-mail; raise ``TransientDeliveryError`` / ``PermanentDeliveryError`` when it did not go out."""
        s = self._settings
        options = _options(route.options)
        if not s.from_address:
            raise PermanentDeliveryError("no sender: set [channels.email] from_address", code=f"{PREFIX}_NOT_CONFIGURED")
        target = (route.target or s.default_to or "").strip()
        if not target:
            raise PermanentDeliveryError("no recipient: the job has no delivery_to and [channels.email] default_to is not set",
                                         code=f"{PREFIX}_TARGET_MISSING")
        recipients = _addresses(target)
        if recipients is None:
            raise PermanentDeliveryError("the delivery target must be e-mail addresses separated by commas",
                                         code=f"{PREFIX}_TARGET_INVALID")
        message = self.build_message(part, options, recipients, s.from_address)
        password = self._password()
        envelope_from = parseaddr(s.from_address)[1]
        envelope_to = recipients + [parseaddr(a)[1] for a in options.cc]
        where = f"smtp {s.host}:{self.port}"
        try:
            refused = self._transmit(message, envelope_from, envelope_to, password)
        except DeliveryError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            error = error_for_smtp(exc, where)
            if password:
                error.message = error.message.replace(password, "<redacted>")
                error.args = (error.message,)
            raise error from None
        if refused:
            listed = "; ".join(f"{addr} ({code} {_reply_text(msg)})" for addr, (code, msg) in refused.items())
            raise PermanentDeliveryError(f"{where} accepted the message for some recipients but refused {listed}; it is not"
                                         " sent again, so the accepted ones do not get it twice",
                                         code=f"{PREFIX}_SOME_RECIPIENTS_REFUSED")
        return DeliveryReceipt(receipt_id=message["Message-ID"],
                               details={"recipients": envelope_to, "server": f"{s.host}:{self.port}"})

    def _transmit(self, message: EmailMessage, sender: str, recipients: list[str], password: str | None) -> dict[str, Any]:
        s = self._settings
        context = self._tls_context() if s.security != "plain" else None
        if s.security == "tls":
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(s.host, self.port, timeout=s.timeout_s, context=context)
        else:
            smtp = smtplib.SMTP(s.host, self.port, timeout=s.timeout_s)
        try:
            smtp.ehlo()
            if s.security == "starttls":
                if not smtp.has_extn("starttls"):
                    raise PermanentDeliveryError(f"smtp {s.host}:{self.port} does not offer STARTTLS; nothing was sent"
                                                 " (use security = \"tls\" if it expects implicit TLS)",
                                                 code=f"{PREFIX}_STARTTLS_UNSUPPORTED")
                smtp.starttls(context=context)
                smtp.ehlo()
            if s.username is not None and password is not None:
                smtp.login(s.username, password)
            return smtp.send_message(message, from_addr=sender, to_addrs=recipients)
        finally:
            try:
                smtp.quit()
            except Exception:  # noqa: BLE001 - the outcome is already decided
                smtp.close()
