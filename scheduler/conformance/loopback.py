"""A real HTTP server on loopback for tests: records every request and answers as each test scripts.

Channel, gateway and provider tests point their plugin at it (``server.url``) instead of
mocking HTTP: a scripted reply can answer with any status and headers, hang past the
client's timeout, or reset the connection mid-body. Given a ``catch_all`` function, the server
answers every request (any path, any method) with what that function returns instead of
the per-path script: the channel conformance stand-in (``HttpStandIn``) is built that way.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Recorded:
    """One request the server received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass
class Reply:
    """What the server does with one request: answer, hang past the client's timeout, or reset mid-body."""

    status: int = 200
    json: Any = None
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    action: str = "respond"  # respond | hang | reset
    seconds: float = 0.0


#: A reply, its keyword arguments as a dict, or a function of the request returning either.
Behaviour = Reply | dict[str, Any] | Callable[[Recorded], Any]


def _as_reply(value: Any) -> Reply:
    return Reply(**value) if isinstance(value, dict) else value


class LoopbackHTTPServer:
    """A threaded HTTP/1.1 server on 127.0.0.1 (port 0) with a per-path script of replies.

    ``catch_all(request) -> Behaviour``, when given, answers every request instead of the
    per-path script (``queue`` / ``default`` are then unused); ``request_queue_size`` is the
    listen backlog. A ``hang`` reply holds the connection for its ``seconds`` (released early
    by ``close``).
    """

    Reply = Reply

    def __init__(self, catch_all: Callable[[Recorded], Behaviour] | None = None, *, request_queue_size: int = 128,
                 thread_name: str | None = None) -> None:
        self.requests: list[Recorded] = []
        self._catch_all = catch_all
        self._queued: dict[str, deque[Behaviour]] = {}
        self._defaults: dict[str, Behaviour] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass  # request lines hold URL paths, which may hold secrets

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                split = urlsplit(self.path)
                request = Recorded(self.command, split.path, parse_qs(split.query),
                                   {k.lower(): v for k, v in self.headers.items()}, body)
                behaviour = owner._take(request)
                reply = _as_reply(behaviour(request) if callable(behaviour) else behaviour)
                if reply.action == "hang":
                    owner._stop.wait(reply.seconds)
                    self.close_connection = True
                    return
                payload = json.dumps(reply.json).encode() if reply.json is not None else reply.body
                self.send_response(reply.status)
                headers = {"content-type": "application/json" if reply.json is not None else "text/plain", **reply.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                if reply.action == "reset":
                    self.send_header("content-length", str(len(payload) + 1000))
                    self.end_headers()
                    self.wfile.write(payload[: max(1, len(payload) // 2)])
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # resets and client timeouts end connections abruptly on purpose

        Server.request_queue_size = request_queue_size  # the listen backlog

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=thread_name, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self._server.server_port}"  # bound to 127.0.0.1 above

    def queue(self, path: str, *behaviours: Behaviour) -> None:
        """Answer the next requests to ``path`` with these, in order (then the path's default)."""
        with self._lock:
            self._queued.setdefault(path, deque()).extend(behaviours)

    def default(self, path: str, behaviour: Behaviour) -> None:
        """Answer every request to ``path`` with this once its queue is empty."""
        with self._lock:
            self._defaults[path] = behaviour

    def _take(self, request: Recorded) -> Behaviour:
        if self._catch_all is not None:
            with self._lock:
                self.requests.append(request)
            return self._catch_all(request)  # outside the lock: it may take its time, or take its own locks
        with self._lock:
            self.requests.append(request)
            queued = self._queued.get(request.path)
            if queued:
                return queued.popleft()
            return self._defaults.get(request.path, Reply(json={"ok": True}))

    def to(self, path: str) -> list[Recorded]:
        """Requests received on ``path``."""
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def close(self) -> None:
        """Stop serving (a hanging reply is released)."""
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()


__all__ = ["Behaviour", "LoopbackHTTPServer", "Recorded", "Reply"]
