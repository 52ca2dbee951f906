"""The e-mail channel's conformance service adapter (entry point ``scheduler.conformance_adapters:email``).

For each conformance case it starts a loopback SMTP server (``aiosmtpd``, in the test extra:
``pip install 'scheduler-channel-email[test]'``) in its own event-loop thread, which checks
the login, and points the channel at it: ``[channels.email]`` ``host`` 127.0.0.1, its port,
``security = "plain"`` (allowed for loopback only), a user name and a fresh password read
from the environment. The case's answer is given at the SMTP stage where a real server
gives it: ``auth_reject`` refuses the login (535); the others answer the message's DATA:
``accept`` (250), ``server_error`` (451, worth retrying), ``reject`` (554), ``timeout``
(no answer) and ``reset`` (the connection is aborted). SMTP has no ``Retry-After``, so a
rate limit that names one is declined (the case is skipped); one without is a 421. The
message's text part, its attachments and its ``X-Scheduler-Idempotency-Key`` header are
what the service received (the channel does not declare ``idempotency-keys``: SMTP cannot
drop a repeat). Only the conformance engine imports this module.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from email import message_from_bytes, policy
from email.message import Message
from typing import Any

from scheduler.testing import ReceivedFile, ReceivedMessage, ServiceAnswer, ServiceRequest

USER = "conformance"
SENDER = "scheduler@conformance.example"
RECIPIENT = "ops@conformance.example"
#: SMTP replies per answer, at DATA.
DATA_REPLIES = {
    "accept": "250 2.0.0 OK queued",
    "rate_limit": "421 4.7.0 Too many messages, try again later",
    "server_error": "451 4.3.0 Local error in processing",
    "reject": "554 5.7.1 Message refused",
}


class _QuietAiosmtpd(logging.Filter):
    """Drops aiosmtpd's own deprecation notice, logged at WARNING on every successful login (nothing to act on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "login_data is deprecated" not in str(record.msg)


_QUIET = _QuietAiosmtpd()


def _payload_bytes(part: Message) -> bytes:
    """A part's decoded payload, b"" when it has none (a multipart part decodes to None)."""
    payload = part.get_payload(decode=True)
    return payload if isinstance(payload, bytes) else b""


def parse_message(data: bytes, *, accepted: bool) -> ReceivedMessage:
    """What a recipient sees of a message: its text part (lines ending in LF), its attachments, the idempotency-key header."""
    message = message_from_bytes(data, policy=policy.default)
    body = message.get_body(preferencelist=("plain",))
    text = body.get_content().replace("\r\n", "\n") if body is not None else ""
    files = tuple(ReceivedFile(name=part.get_filename() or "", content=_payload_bytes(part))
                  for part in message.iter_attachments())
    return ReceivedMessage(text=text, idempotency_key=message.get("X-Scheduler-Idempotency-Key"), files=files,
                           accepted=accepted)


class _SmtpServer:
    """An SMTP server on 127.0.0.1 answering each attempt as told."""

    hang_s = 60.0

    def __init__(self, request: ServiceRequest) -> None:
        from aiosmtpd.smtp import SMTP, AuthResult

        self.password = secrets.token_urlsafe(24)
        variable = f"SCHEDULER_CONFORMANCE_EMAIL_PASSWORD_{secrets.token_hex(4).upper()}"
        self.secrets = {variable: self.password}
        self.target = RECIPIENT
        self.options: dict[str, Any] = {}
        self.problems: list[str] = []
        self.answer = ServiceAnswer(kind="accept")
        self._messages: list[ReceivedMessage] = []
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="conformance-smtp", daemon=True)
        self._thread.start()
        owner = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                answer = owner.answer
                if not session.authenticated:
                    owner.problems.append("the message was sent without logging in with the configured user name")
                if answer.kind == "reset":
                    owner._record(envelope.content, accepted=False)
                    server.transport.abort()
                    return "250 never seen"
                if answer.kind == "timeout":
                    owner._record(envelope.content, accepted=False)
                    await asyncio.sleep(owner.hang_s)
                    return "250 too late"
                reply = DATA_REPLIES.get(answer.kind)
                if reply is None:  # auth_reject: the login was refused, DATA never comes
                    owner.problems.append(f"DATA arrived although the answer was {answer.kind}")
                    reply = "554 5.7.1 Not authenticated"
                owner._record(envelope.content, accepted=answer.accepts)
                return reply

        def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> Any:
            login = auth_data.login.decode() if isinstance(auth_data.login, bytes) else auth_data.login
            password = auth_data.password.decode() if isinstance(auth_data.password, bytes) else auth_data.password
            if (login, password) != (USER, owner.password):
                owner.problems.append("the login did not carry the configured user name and password")
                return AuthResult(success=False, handled=False)
            return AuthResult(success=owner.answer.kind != "auth_reject", handled=False)

        def factory() -> Any:
            return SMTP(Handler(), hostname="localhost", loop=self.loop, authenticator=authenticator,
                        auth_require_tls=False)

        mail_log = logging.getLogger("mail.log")
        if _QUIET not in mail_log.filters:
            mail_log.addFilter(_QUIET)

        create = self.loop.create_server(factory, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(create, self.loop).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.settings = {"host": "127.0.0.1", "port": port, "security": "plain", "username": USER,
                         "password": {"credential": f"env:{variable}"}, "from_address": SENDER,
                         "timeout_s": request.timeout_s}

    def _record(self, data: bytes, *, accepted: bool) -> None:
        try:
            message = parse_message(data, accepted=accepted)
        except Exception as exc:  # noqa: BLE001 - a message that cannot be read is the case's failure
            self.problems.append(f"the message cannot be read: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._messages.append(message)

    def respond_with(self, answer: ServiceAnswer) -> None:
        if answer.kind == "rate_limit" and answer.retry_after_s is not None:
            raise NotImplementedError("SMTP has no Retry-After")
        self.answer = answer

    def received(self) -> list[ReceivedMessage]:
        with self._lock:
            return list(self._messages)

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def shutdown() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class EmailService:
    """Starts an ``_SmtpServer`` per case."""

    def conformance_service(self, request: ServiceRequest) -> _SmtpServer:
        for answer in request.answers:
            if answer.kind == "rate_limit" and answer.retry_after_s is not None:
                raise NotImplementedError("SMTP has no Retry-After: a 421 or 451 reply cannot say when to come back")
        return _SmtpServer(request)


__all__ = ["EmailService", "parse_message"]
