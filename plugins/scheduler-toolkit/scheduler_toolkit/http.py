"""What HTTP plugins share: failure classification, ``Retry-After``, redaction, attachments, a pooled client, an abortable request.

A channel's ``send`` must end in a receipt, a ``TransientDeliveryError`` (worth retrying:
timeouts, connection failures, 408, 429, 5xx, with ``retry_after_s`` from ``Retry-After``) or
a ``PermanentDeliveryError`` (retrying cannot help: other 4xx, rejected credentials, a
redirect, a bad URL, a bad attachment), with a stable ``<PREFIX>_*`` code of the channel's own
(``WEBHOOK_RATE_LIMITED``, ``SLACK_AUTH_FAILED`` ...). Messages name the endpoint by scheme,
host and port only (``endpoint_label``): URLs often carry tokens in their path or query, and
nothing secret may reach an exception message or a log. The first-party channels (webhook,
Slack, Telegram, OpenClaw, email) had one copy each of this:

* ``endpoint_label(url)``, ``retry_after_seconds(header)``;
* ``error_for_status(status, headers, body, where, prefix=...)``: the error an HTTP answer
  means, None for a 2xx;
* ``error_for_exception(exc, where, prefix=...)``: the error an ``httpx`` exception means;
* ``read_attachment(attachment, max_bytes=..., prefix=...)``: ``(name, mime_type, content)``
  of a staged outbox attachment, its size and SHA-256 checked;
* ``PooledHttpClient(user_agent, timeout_s, connect_timeout_s)``: the channel's one pooled
  ``httpx.Client``, made on first use, never following redirects;
* ``AbortableRequest(client, url, headers, body, name=...)``: one streamed JSON ``POST`` in a
  helper thread that an executor's worker can stop at once (the agent and main-session
  executors talk to their agents through it).

``httpx`` is this distribution's dependency, but it is imported only where it is used (the
pooled client's first ``get()``, ``error_for_exception``): the e-mail channel reads its
attachments through this module without paying for an HTTP stack it never uses.
"""

from __future__ import annotations

import hashlib
import queue
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scheduler.api import PermanentDeliveryError, TransientDeliveryError
from scheduler.plugins.protocols import DeliveryError

_SNIPPET = 200


def endpoint_label(url: str) -> str:
    """``scheme://host[:port]`` of a URL: what messages show instead of the URL."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delta-seconds or an HTTP date; None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def _snippet(body: bytes) -> str:
    """A short single-line excerpt of a response body for an error message."""
    text = body[:_SNIPPET * 4].decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:_SNIPPET] + ("..." if len(text) > _SNIPPET else "")


def error_for_status(status: int, headers: Mapping[str, str], body: bytes, where: str, *, prefix: str) -> DeliveryError | None:
    """The delivery error an HTTP answer means (codes ``PREFIX_RATE_LIMITED``, ``_TIMEOUT``, ``_SERVER_ERROR``,
    ``_AUTH_FAILED``, ``_REDIRECTED``, ``_REJECTED``), or None for a 2xx."""
    if 200 <= status < 300:
        return None
    said = _snippet(body)
    detail = f"{where} answered HTTP {status}" + (f": {said}" if said else "")
    if status == 429:
        return TransientDeliveryError(detail, code=f"{prefix}_RATE_LIMITED",
                                      retry_after_s=retry_after_seconds(headers.get("retry-after")))
    if status == 408:
        return TransientDeliveryError(detail, code=f"{prefix}_TIMEOUT", retry_after_s=retry_after_seconds(headers.get("retry-after")))
    if status >= 500:
        return TransientDeliveryError(detail, code=f"{prefix}_SERVER_ERROR",
                                      retry_after_s=retry_after_seconds(headers.get("retry-after")))
    if status in (401, 403):
        return PermanentDeliveryError(detail, code=f"{prefix}_AUTH_FAILED")
    if 300 <= status < 400:
        return PermanentDeliveryError(f"{where} answered HTTP {status} (a redirect; redirects are not followed:"
                                      " configure the final URL)", code=f"{prefix}_REDIRECTED")
    return PermanentDeliveryError(detail, code=f"{prefix}_REJECTED")


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def error_for_exception(exc: Exception, where: str, *, prefix: str) -> DeliveryError:
    """The delivery error an ``httpx`` exception means (the exception text is not repeated: it may hold the URL).

    ``httpx`` is imported here, not at module level: only the HTTP channels need it (see the module docstring).
    """
    import httpx

    name = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return TransientDeliveryError(f"{where} did not answer in time ({name})", code=f"{prefix}_TIMEOUT")
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return PermanentDeliveryError(f"{where}: the URL cannot be used ({name})", code=f"{prefix}_TARGET_INVALID")
    if _caused_by(exc, ssl.SSLCertVerificationError):
        return PermanentDeliveryError(f"{where}: TLS certificate verification failed", code=f"{prefix}_TLS_FAILED")
    if isinstance(exc, httpx.TransportError):
        return TransientDeliveryError(f"{where}: connection failed ({name})", code=f"{prefix}_CONNECTION_FAILED")
    return TransientDeliveryError(f"{where}: request failed ({name})", code=f"{prefix}_CONNECTION_FAILED")


def read_attachment(attachment: Mapping[str, Any], *, max_bytes: int, prefix: str) -> tuple[str, str, bytes]:
    """``(name, mime_type, content)`` of one outbox attachment, its size and SHA-256 checked.

    The kernel stages attachments as ``{"name", "mime_type", "size_bytes", "sha256"}`` plus
    either ``content`` (bytes) or ``path`` (a file it controls). Anything missing, too large
    or not matching its digest is a permanent failure: retrying cannot repair it.
    """
    name = str(attachment.get("name") or "attachment")
    mime = str(attachment.get("mime_type") or "application/octet-stream")
    content = attachment.get("content")
    if content is None:
        path = attachment.get("path")
        if not path:
            raise PermanentDeliveryError(f"attachment {name!r} has neither content nor path", code=f"{prefix}_ATTACHMENT_INVALID")
        try:
            size = Path(path).stat().st_size
            if size > max_bytes:
                raise PermanentDeliveryError(f"attachment {name!r} is {size} bytes, over the channel's limit of {max_bytes}",
                                             code=f"{prefix}_ATTACHMENT_TOO_LARGE")
            data = Path(path).read_bytes()
        except OSError as exc:
            raise PermanentDeliveryError(f"attachment {name!r} cannot be read: {exc.strerror or type(exc).__name__}",
                                         code=f"{prefix}_ATTACHMENT_INVALID") from None
    elif isinstance(content, str):
        data = content.encode("utf-8")
    else:
        data = bytes(content)
    if len(data) > max_bytes:
        raise PermanentDeliveryError(f"attachment {name!r} is {len(data)} bytes, over the channel's limit of {max_bytes}",
                                     code=f"{prefix}_ATTACHMENT_TOO_LARGE")
    expected_size = attachment.get("size_bytes")
    if expected_size is not None and int(expected_size) != len(data):
        raise PermanentDeliveryError(f"attachment {name!r} is {len(data)} bytes, staged as {expected_size}",
                                     code=f"{prefix}_ATTACHMENT_INVALID")
    expected = attachment.get("sha256")
    if expected and hashlib.sha256(data).hexdigest() != str(expected).lower().removeprefix("sha256:"):
        raise PermanentDeliveryError(f"attachment {name!r} does not match its staged SHA-256", code=f"{prefix}_ATTACHMENT_INVALID")
    return name, mime, data


class PooledHttpClient:
    """One lazily made, shared ``httpx.Client`` for a channel: ``get()`` it per request, ``close()`` it on shutdown.

    Reusing one client keeps connections (and TLS sessions) alive across sends instead of
    reconnecting each time. It is made on the first ``get()``, under a lock so concurrent sends
    share one, because ``httpx`` is imported only then (see the module docstring). It never follows redirects (a redirect is a ``*_REDIRECTED`` refusal, see
    ``error_for_status``: following one could carry a token to another host) and sends
    ``user_agent``. After ``close()`` the next ``get()`` makes a fresh client. A channel whose
    settings change closes its pool and makes a new one with the new timeouts.
    """

    def __init__(self, user_agent: str, timeout_s: float, connect_timeout_s: float) -> None:
        self._user_agent = user_agent
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._client: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The pooled ``httpx.Client``, made now if there is none."""
        with self._lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(timeout=httpx.Timeout(self._timeout_s, connect=self._connect_timeout_s),
                                            follow_redirects=False, headers={"user-agent": self._user_agent})
            return self._client

    def close(self) -> None:
        """Close the pooled connections, if any (a later ``get()`` opens new ones)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


# -- a request another thread can stop at once --------------------------------------------------
#
# httpx has no way to interrupt a blocked read. ``AbortableRequest`` runs one streamed request in a
# helper thread and hands what happens over a queue (``events``): ``("head", response)``,
# ``("data", bytes)`` per chunk, then ``("end", None)`` or ``("fail", exc)``. The supervising thread
# (the executor's worker) waits on the queue while it watches cancellation and the run deadline;
# ``abort()`` shuts down the request's sockets (found through httpcore's ``trace`` extension), which
# wakes the helper out of its read and tells the server at once that the client went away.

#: httpcore trace events that carry a connected socket.
_CONNECTED = ("connection.connect_tcp.complete", "connection.start_tls.complete")


class AbortableRequest(threading.Thread):
    """One streamed ``POST`` of ``body`` (JSON) through ``client`` in a helper thread; ``start()`` it, read ``events``."""

    def __init__(self, client: Any, url: str, headers: dict[str, str], body: dict[str, Any], *, name: str = "http") -> None:
        super().__init__(name=name, daemon=True)
        self.client, self.url, self.headers, self.body = client, url, headers, body
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.aborted = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def _trace(self, name: str, info: dict[str, Any]) -> None:
        if name not in _CONNECTED:
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
        if self.aborted.is_set():  # aborted while connecting: this socket must not live either
            _shutdown(sock)

    def run(self) -> None:
        """The helper thread: the request, its chunks, its end or failure onto ``events`` (nothing once aborted)."""
        try:
            with self.client.stream("POST", self.url, headers=self.headers, json=self.body,
                                    extensions={"trace": self._trace}) as response:
                self.events.put(("head", response))
                for chunk in response.iter_bytes():
                    if self.aborted.is_set():
                        return
                    self.events.put(("data", chunk))
            self.events.put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the supervisor
            if not self.aborted.is_set():
                self.events.put(("fail", exc))

    def abort(self) -> None:
        """Stop now: the server sees the connection close, the helper's blocked read returns."""
        self.aborted.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


__all__ = [
    "AbortableRequest",
    "PooledHttpClient",
    "endpoint_label",
    "error_for_exception",
    "error_for_status",
    "read_attachment",
    "retry_after_seconds",
]
