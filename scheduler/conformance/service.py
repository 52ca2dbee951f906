"""Service adapters: how a channel's conformance cases reach a loopback stand-in of its service.

A channel conformance case says what the *service* answers ("accept", "rate limit with
Retry-After 7", "500", "hang", "reset the connection", "reject", "refuse the
credentials") and what the channel must make of it (a receipt, a
``TransientDeliveryError`` with ``retry_after_s``, a ``PermanentDeliveryError``; the
idempotency key carried, the body whole, the files sent, no secret in the error). Each
real service speaks its own protocol, so each channel distribution supplies a small
**service adapter**: an object with

    conformance_service(request: ServiceRequest) -> stand-in

that starts a loopback stand-in of its service able to give each answer, and says how
to point the channel at it. The stand-in is any object with

* ``settings``: the channel's ``[channels.NAME]`` table as the settings file would hold it
  (secret fields as ``{"credential": "env:NAME"}``); the engine validates it with the
  channel's ``settings_class`` and calls ``configure``;
* ``secrets``: environment variables the secret references read (``{"NAME": "value"}``);
  the engine sets them while the case runs, and none of the values may appear in an
  error, a receipt or a log record of the channel;
* ``target`` / ``options``: the route's ``target`` (``delivery_to``) and the job's
  ``delivery_options`` (validated with the channel's ``options_class``);
* ``respond_with(answer)``: how to answer the next delivery attempt (one ``send``) with
  a ``ServiceAnswer``;
* ``received()``: every delivery attempt the service saw, in order, as
  ``ReceivedMessage``\\ s (``accepted`` false when it was not answered with success);
* ``close()``: stop the stand-in (release anything hanging);
* optionally ``problems``: a list of strings, what the stand-in could not understand
  (reported as failures of the case).

When the service cannot give an answer at all (SMTP has no ``Retry-After``), the
adapter raises ``NotImplementedError("why")`` (a builtin: no kernel import needed) and
the case is **skipped** with that reason, never passed.

``HttpStandIn`` is the stock stand-in for HTTP services: a threaded HTTP/1.1
server on 127.0.0.1 that records every request and maps each answer to an HTTP reply
(200, 429 + ``Retry-After``, 500, no answer, a reset mid-body, 400, 401); a subclass
says how to read a delivered message out of a request (``message_of``) and, where the
service answers differently, overrides ``reply_for``.
It is built on ``scheduler.conformance.loopback.LoopbackHTTPServer``, which is also the
scripted server of the channels' own tests (as ``scheduler.testing.http``): there it
replies per path from a queue the test fills; a stand-in instead answers whatever the
channel calls with the attempt's answer.

The engine finds a channel's adapter, in this order: the one given explicitly
(``--adapter MODULE:ATTR``, ``service_adapter=`` of ``run_kind`` or of a pytest class);
the channel itself when it has a ``conformance_service`` method; the entry point named
like the channel in the group ``scheduler.conformance_adapters``. A channel with none
of them is one failure, ``CONFORMANCE_NO_SERVICE_ADAPTER``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from email import policy as email_policy
from email.parser import BytesParser
from email.utils import collapse_rfc2231_value
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.conformance.loopback import LoopbackHTTPServer, Recorded, Reply
from scheduler.conformance.payload import ADAPTER_GROUP, adapter_from_entry_points, load_adapter_spec

#: The method every service adapter has.
SERVICE_METHOD = "conformance_service"

#: What a stand-in can be asked to answer, with what it means (the schema's ``service_answer`` lists the same).
ANSWERS: dict[str, str] = {
    "accept": "take the message and answer with success (HTTP 200 and the service's success body)",
    "rate_limit": "refuse for now because of a rate limit, saying when to come back if retry_after_s is set (HTTP 429 + Retry-After)",
    "server_error": "fail on the service's side, worth retrying (HTTP 500; SMTP 451)",
    "timeout": "take the request and never answer (the channel's own timeout must end the attempt)",
    "reset": "reset the connection in the middle of the answer (TCP RST after part of the reply)",
    "reject": "refuse the message for good: bad destination or malformed request (HTTP 400; SMTP 554)",
    "auth_reject": "refuse the channel's credentials (HTTP 401, or the service's own 'invalid token' answer; SMTP 535)",
}


@attrs.frozen(kw_only=True)
class ServiceAnswer:
    """How the stand-in answers one delivery attempt: ``kind`` from ``ANSWERS``; ``retry_after_s`` with ``rate_limit``."""

    kind: str = attrs.field(validator=attrs.validators.in_(ANSWERS))
    retry_after_s: int | None = None

    @property
    def accepts(self) -> bool:
        """True for ``accept``: the message counts as delivered."""
        return self.kind == "accept"

    @classmethod
    def from_case(cls, data: Mapping[str, Any]) -> ServiceAnswer:
        """From one entry of a channel case's ``input.answers`` (already schema-validated)."""
        return cls(kind=data["answer"], retry_after_s=data.get("retry_after_s"))


@attrs.frozen(kw_only=True)
class ServiceRequest:
    """What the engine asks a service adapter for: a stand-in for one case.

    ``answers`` are the answers the case will ask for, one per attempt, in order (decline
    one you cannot give with ``NotImplementedError`` now, rather than mid-case);
    ``workdir`` is an empty directory of the case (certificates, secret files...);
    ``timeout_s`` is how long the channel should wait for an answer: put it in the
    settings you return, the ``timeout`` answer hangs for longer.
    """

    case_id: str
    channel: str
    answers: tuple[ServiceAnswer, ...]
    workdir: Path
    timeout_s: float = 2.0


@attrs.frozen(kw_only=True)
class ReceivedFile:
    """A file the service received with a message."""

    name: str
    content: bytes


@attrs.frozen(kw_only=True)
class ReceivedMessage:
    """One delivery attempt as the service saw it, in the service's terms.

    ``text`` is the message text as the service would show it (an e-mail's text part, a
    chat message, a caption); ``idempotency_key`` is where the service reads one (None
    when the request carried none); ``accepted`` is whether the stand-in answered it
    with success.
    """

    text: str = ""
    idempotency_key: str | None = None
    files: tuple[ReceivedFile, ...] = ()
    accepted: bool = True

    def summary(self) -> dict[str, Any]:
        """A short JSON form for failure messages (the text shortened, files by name and size)."""
        text = self.text if len(self.text) <= 200 else f"{self.text[:200]}... ({len(self.text)} chars)"
        return {"text": text, "idempotency_key": self.idempotency_key,
                "files": [{"name": f.name, "bytes": len(f.content)} for f in self.files], "accepted": self.accepted}


# --------------------------------------------------------------------------- a loopback HTTP stand-in


@attrs.frozen(kw_only=True)
class HttpRequest:
    """One request the HTTP stand-in received (header names lower-case)."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON (``ValueError`` when it is not)."""
        return json.loads(self.body)

    def form(self) -> tuple[dict[str, str], dict[str, tuple[str, str, bytes]]]:
        """``(fields, files)`` of an ``application/x-www-form-urlencoded`` or ``multipart/form-data`` body.

        ``files`` maps the form field name to ``(filename, content_type, content)``.
        """
        ctype = self.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):
            message = BytesParser(policy=email_policy.HTTP).parsebytes(
                f"Content-Type: {ctype}\r\n\r\n".encode("latin-1") + self.body
            )
            fields: dict[str, str] = {}
            files: dict[str, tuple[str, str, bytes]] = {}
            for part in message.iter_parts():
                param = part.get_param("name", header="content-disposition") or ""
                name = param if isinstance(param, str) else collapse_rfc2231_value(param)  # an RFC 2231 name: its text
                payload = part.get_payload(decode=True)
                content = payload if isinstance(payload, bytes) else b""
                filename = part.get_filename()
                if filename is not None:
                    files[name] = (filename, part.get_content_type(), content)
                else:
                    fields[name] = content.decode(part.get_content_charset() or "utf-8", "replace")
            return fields, files
        parsed = parse_qs(self.body.decode("utf-8", "replace"), keep_blank_values=True)
        return {k: v[-1] for k, v in parsed.items()}, {}


@attrs.frozen(kw_only=True)
class HttpReply:
    """What the HTTP stand-in does with a request: ``respond``, ``hang`` (never answer) or ``reset`` (RST mid-body)."""

    status: int = 200
    json: Any = None
    body: bytes = b""
    headers: Mapping[str, str] = attrs.Factory(dict)
    action: str = attrs.field(default="respond", validator=attrs.validators.in_(("respond", "hang", "reset")))


class HttpStandIn:
    """A stand-in HTTP service on 127.0.0.1 (port 0), answering each attempt as the engine asks.

    Subclass it in your channel's ``conformance.py``: set ``settings`` / ``secrets`` /
    ``target`` / ``options`` in ``__init__`` (after ``super().__init__()``, which starts the
    server: ``self.url`` is its base URL), implement ``message_of`` and, where your service
    answers differently from the defaults, ``accepted_reply`` or ``reply_for``. By default
    every request is one attempt: ``handle`` records ``message_of(request)`` (accepted when
    the current answer is ``accept``) and replies ``reply_for(answer, request)``. Override
    ``handle`` when one attempt takes several requests (an upload, then the message).
    """

    #: How long a ``timeout`` answer holds the connection without answering (released early by ``close``).
    hang_s: float = 60.0

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}
        self.secrets: dict[str, str] = {}
        self.target: str | None = None
        self.options: dict[str, Any] = {}
        #: What the stand-in could not understand (the engine reports each as a problem of the case).
        self.problems: list[str] = []
        #: Every request received, in order.
        self.requests: list[HttpRequest] = []
        self.answer = ServiceAnswer(kind="accept")
        self._messages: list[ReceivedMessage] = []
        self._lock = threading.Lock()
        self._server = LoopbackHTTPServer(self._answer, request_queue_size=64, thread_name="conformance-stand-in")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        return self._server.url

    def respond_with(self, answer: ServiceAnswer) -> None:
        """Answer the next delivery attempt(s) with ``answer``."""
        with self._lock:
            self.answer = answer

    def received(self) -> list[ReceivedMessage]:
        """Every message seen so far, in order."""
        with self._lock:
            return list(self._messages)

    def record(self, message: ReceivedMessage) -> None:
        """Add one seen message (``handle`` does this; call it yourself when you override ``handle``)."""
        with self._lock:
            self._messages.append(message)

    def handle(self, request: HttpRequest) -> HttpReply:
        """One request = one attempt: record the message it carries and answer it with the current answer."""
        answer = self.answer
        message = self.message_of(request)
        if message is not None:
            self.record(attrs.evolve(message, accepted=answer.accepts))
        return self.reply_for(answer, request)

    def message_of(self, request: HttpRequest) -> ReceivedMessage | None:
        """The message a request delivers (None for a request that delivers none); raise ``ValueError`` for garbage."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to read a message (message_of)")

    def accepted_reply(self, request: HttpRequest) -> HttpReply:
        """The service's success answer (default: 200 ``{"ok": true}``)."""
        return HttpReply(status=200, json={"ok": True})

    def reply_for(self, answer: ServiceAnswer, request: HttpRequest) -> HttpReply:
        """The HTTP reply of an answer: 200, 429 (+ ``Retry-After``), 500, nothing, a reset, 400, 401."""
        kind = answer.kind
        if kind == "accept":
            return self.accepted_reply(request)
        if kind == "rate_limit":
            headers = {"retry-after": str(answer.retry_after_s)} if answer.retry_after_s is not None else {}
            return HttpReply(status=429, json={"ok": False, "error": "rate limited"}, headers=headers)
        if kind == "server_error":
            return HttpReply(status=500, json={"ok": False, "error": "internal error"})
        if kind == "timeout":
            return HttpReply(action="hang")
        if kind == "reset":
            return HttpReply(status=200, json={"ok": True, "padding": "x" * 200}, action="reset")
        if kind == "reject":
            return HttpReply(status=400, json={"ok": False, "error": "bad request"})
        if kind == "auth_reject":
            return HttpReply(status=401, json={"ok": False, "error": "unauthorized"})
        raise NotImplementedError(f"no HTTP reply for the answer {kind!r}")

    def close(self) -> None:
        """Stop the server and release every hanging request."""
        self._server.close()

    # -- plumbing, used by the handler thread

    def _answer(self, recorded: Recorded) -> Reply:
        """The loopback server's catch-all: every request, whatever its path, is one call of ``handle``."""
        request = HttpRequest(method=recorded.method, path=recorded.path, query=recorded.query,
                              headers=recorded.headers, body=recorded.body)
        reply = self._dispatch(request)
        return Reply(status=reply.status, json=reply.json, body=reply.body, headers=dict(reply.headers),
                     action=reply.action, seconds=self.hang_s)

    def _dispatch(self, request: HttpRequest) -> HttpReply:
        with self._lock:
            self.requests.append(request)
        try:
            return self.handle(request)
        except Exception as exc:  # noqa: BLE001 - what the channel sent could not be read: a failure of the case
            with self._lock:
                self.problems.append(f"{request.method} {request.path}: {type(exc).__name__}: {exc}")
            return HttpReply(status=400, json={"ok": False, "error": "the stand-in could not read the request"})


# --------------------------------------------------------------------------- finding a channel's adapter


def _instantiate(obj: Any) -> Any:
    return obj() if isinstance(obj, type) else obj


def check_service_adapter(adapter: Any, where: str) -> Any:
    """Return ``adapter`` if it has a callable ``conformance_service``; else ``CONFORMANCE_ADAPTER_INVALID``."""
    if not callable(getattr(adapter, SERVICE_METHOD, None)):
        raise SchedulerError("CONFORMANCE_ADAPTER_INVALID", f"service adapter {where} has no {SERVICE_METHOD}(request) method")
    return adapter


def resolve_service_adapter(name: str | None, provider: Any, explicit: Any = None) -> Any:
    """The service adapter of the channel ``name`` / ``provider`` (order: see the module docstring).

    ``explicit`` may be an adapter object, an adapter class or a ``MODULE:ATTR`` string.
    Raises ``CONFORMANCE_NO_SERVICE_ADAPTER`` when there is none and
    ``CONFORMANCE_ADAPTER_INVALID`` when the one found cannot be loaded or used.
    """
    if explicit is not None:
        if isinstance(explicit, str):
            return check_service_adapter(load_adapter_spec(explicit, "service"), explicit)
        return check_service_adapter(_instantiate(explicit), repr(explicit))
    if callable(getattr(provider, SERVICE_METHOD, None)):
        return provider
    if name:
        found = adapter_from_entry_points(name, SERVICE_METHOD, "service")
        if found is not None:
            return found
    label = f"channel {name!r}" if name else f"channel {type(provider).__name__}"
    raise SchedulerError(
        "CONFORMANCE_NO_SERVICE_ADAPTER",
        f"{label} has no conformance service adapter, so there is no stand-in of its service to send to: give the channel "
        f"a {SERVICE_METHOD}(request) method, register an entry point named {name or 'after the channel'!r} in the group "
        f"{ADAPTER_GROUP}, or pass one explicitly (--adapter MODULE:ATTR, service_adapter=...)",
    )


__all__ = [
    "ANSWERS",
    "SERVICE_METHOD",
    "HttpReply",
    "HttpRequest",
    "HttpStandIn",
    "ReceivedFile",
    "ReceivedMessage",
    "ServiceAnswer",
    "ServiceRequest",
    "check_service_adapter",
    "resolve_service_adapter",
]
