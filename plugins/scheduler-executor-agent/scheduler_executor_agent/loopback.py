"""A loopback server speaking the OpenAI chat-completions protocol, for tests and the conformance adapter.

``LoopbackModel`` binds ``127.0.0.1`` on a free port and answers

* ``POST /v1/chat/completions``: the next scripted ``Reply`` (streamed as server-sent events
  with chunked transfer encoding, or one JSON body), or, when no reply is queued and the
  last user message carries a ``conformance-script:`` line, that script acted out
  (``script_reply``), else a short default reply;
* ``GET /v1/info`` and ``GET /health``: ``info`` / ``health`` as set (a dict is sent as JSON,
  a string as text, None is a 404).

Every request is recorded (``requests``: path, headers, JSON body) and so is the moment a
client went away in the middle of a reply (``disconnects``), which is how tests see that a
cancelled turn really closed its connection. Tests drive it per test with ``enqueue``.
It never listens on anything but the loopback interface.
"""

from __future__ import annotations

import collections
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import attrs

SCRIPT_MARKER = "conformance-script:"
#: What ``stdout_env`` of a conformance script prints: the request headers carrying the kernel's run variables.
RUN_VARIABLE_HEADERS = {"SCHEDULER_RUN_ID": "x-scheduler-run-id", "SCHEDULER_JOB_ID": "x-scheduler-job-id",
                        "SCHEDULER_ATTEMPT": "x-scheduler-attempt"}
PIECE = 64 * 1024


@attrs.define(kw_only=True)
class Reply:
    """One scripted answer to a chat-completions request."""

    status: int = 200
    #: Content deltas of the reply (streamed one event each).
    chunks: list[str] = attrs.Factory(lambda: ["Hello", " from the loopback model."])
    #: Reasoning deltas, sent before the content as ``reasoning_content``.
    reasoning: list[str] = attrs.Factory(list)
    #: None: stream when the request asks for it; True/False force it.
    stream: bool | None = None
    finish_reason: str | None = "stop"
    usage: dict[str, Any] | None = attrs.Factory(lambda: {"prompt_tokens": 12, "completion_tokens": 7})
    headers: dict[str, str] = attrs.Factory(dict)
    #: A raw body instead of a generated one (error statuses, broken JSON).
    body: str | None = None
    #: Seconds before the response head, and between streamed events.
    head_delay_s: float = 0.0
    delay_s: float = 0.0
    #: After this many content events: close the connection abruptly (no end of the chunked body).
    cut_after: int | None = None
    #: After this many content events: send an event that is not JSON.
    malformed_after: int | None = None
    #: After this many content events: send an error object, as servers do when generation fails mid-way.
    error_after: int | None = None
    #: After this many content events: send nothing more until the client goes away (at most ``hang_s``).
    hang_after: int | None = None
    hang_s: float = 60.0
    #: End the stream with ``data: [DONE]``.
    done: bool = True
    #: ``(sleep_ms, ...)`` steps of a conformance script, acted out between events.
    pauses: dict[int, float] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float


def script_reply(body: Any, headers: dict[str, str]) -> Reply | None:
    """The reply a conformance script in the last user message asks for (None when there is none)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    last = next((m for m in reversed(messages or []) if isinstance(m, dict) and m.get("role") == "user"), None)
    content = last.get("content") if last else None
    if not isinstance(content, str) or SCRIPT_MARKER not in content:
        return None
    line = content[content.index(SCRIPT_MARKER) + len(SCRIPT_MARKER):].splitlines()[0]
    steps = json.loads(line)["steps"]
    chunks: list[str] = []
    reasoning: list[str] = []
    pauses: dict[int, float] = {}
    for action, value in steps:
        if action == "stdout":
            chunks += [value[i:i + PIECE] for i in range(0, len(value), PIECE)] or [""]
        elif action == "stderr":
            reasoning.append(value)
        elif action == "stdout_zeros":
            chunks += ["\x00" * min(PIECE, value - i) for i in range(0, value, PIECE)]
        elif action == "stdout_env":
            chunks.append(headers.get(RUN_VARIABLE_HEADERS.get(value, "\n"), "") + "\n")
        elif action == "sleep_ms":
            pauses[len(chunks)] = pauses.get(len(chunks), 0.0) + value / 1000
        # stdin_to_stdout: an agent turn has no standard input, so it copies nothing; ignore_sigterm: no signals
    prompt_chars = sum(len(m.get("content", "")) for m in messages or [] if isinstance(m, dict))
    return Reply(chunks=chunks, reasoning=reasoning, pauses=pauses,
                 usage={"prompt_tokens": prompt_chars // 4, "completion_tokens": len(chunks) + len(reasoning)})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    # -- plumbing ------------------------------------------------------------------------------

    def _record(self, body: Any) -> None:
        seen = Seen(method=self.command, path=self.path, headers={k.lower(): v for k, v in self.headers.items()},
                    body=body, at=time.monotonic())
        with self.server.model.lock:
            self.server.model.requests.append(seen)

    def _send_head(self, status: int, content_type: str, extra: dict[str, str], *, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for key, value in extra.items():
            self.send_header(key, value)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _client_gone(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True as soon as the client has closed its side."""
        end = time.monotonic() + seconds
        sock = self.connection
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            readable, _, _ = select.select([sock], [], [], min(left, 0.02))
            if readable:
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        return True
                except OSError:
                    return True

    def _gone(self) -> None:
        with self.server.model.lock:
            self.server.model.disconnects.append(time.monotonic())

    # -- routes --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._record(None)
        model = self.server.model
        value = model.info if self.path == "/v1/info" else model.health if self.path == "/health" else None
        if value is None:
            body, ctype, status = b'{"error": "not found"}', "application/json", 404
        elif isinstance(value, str):
            body, ctype, status = value.encode(), "text/plain", 200
        else:
            body, ctype, status = json.dumps(value).encode(), "application/json", 200
        self._send_head(status, ctype, {}, length=len(body))
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        self._record(body)
        if self.path != "/v1/chat/completions":
            payload = b'{"error": {"message": "no such route"}}'
            self._send_head(404, "application/json", {}, length=len(payload))
            self.wfile.write(payload)
            return
        reply = self.server.model.next_reply(body, {k.lower(): v for k, v in self.headers.items()})
        try:
            self._answer(reply, body)
        except (BrokenPipeError, ConnectionResetError):
            self._gone()

    def _answer(self, reply: Reply, body: Any) -> None:
        if reply.head_delay_s and self._client_gone(reply.head_delay_s):
            self._gone()
            return
        if reply.body is not None or reply.status != 200:
            payload = (reply.body if reply.body is not None else json.dumps({"error": {"message": "scripted"}})).encode()
            self._send_head(reply.status, "application/json", reply.headers, length=len(payload))
            self.wfile.write(payload)
            return
        stream = reply.stream if reply.stream is not None else bool(isinstance(body, dict) and body.get("stream"))
        model = body.get("model", "loopback") if isinstance(body, dict) else "loopback"
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(reply.chunks)}
            if reply.reasoning:
                message["reasoning_content"] = "".join(reply.reasoning)
            doc: dict[str, Any] = {"id": "chatcmpl-loopback", "object": "chat.completion", "model": model,
                                   "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}]}
            if reply.usage is not None:
                doc["usage"] = reply.usage
            payload = json.dumps(doc).encode()
            self._send_head(200, "application/json", reply.headers, length=len(payload))
            self.wfile.write(payload)
            return
        self._send_head(200, "text/event-stream", reply.headers)

        def event(obj: Any) -> None:
            self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

        def delta(**fields: Any) -> dict[str, Any]:
            return {"id": "chatcmpl-loopback", "object": "chat.completion.chunk", "model": model,
                    "choices": [{"index": 0, "delta": fields, "finish_reason": None}]}

        event(delta(role="assistant", content=""))
        for text in reply.reasoning:
            event(delta(reasoning_content=text))
        for i, text in enumerate(reply.chunks):
            if reply.pauses.get(i) and self._client_gone(reply.pauses[i]):
                self._gone()
                return
            if reply.cut_after is not None and i >= reply.cut_after:
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if reply.malformed_after is not None and i == reply.malformed_after:
                event(b'{"choices": [ {"delta": broken')
            if reply.error_after is not None and i == reply.error_after:
                event({"error": {"message": "generation failed: context length exceeded", "code": 400}})
            if reply.hang_after is not None and i >= reply.hang_after:
                if self._client_gone(reply.hang_s):
                    self._gone()
                return
            if reply.delay_s and i and self._client_gone(reply.delay_s):
                self._gone()
                return
            event(delta(content=text))
        if reply.pauses.get(len(reply.chunks)) and self._client_gone(reply.pauses[len(reply.chunks)]):
            self._gone()
            return
        if reply.cut_after is not None and reply.cut_after >= len(reply.chunks):
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.hang_after is not None and reply.hang_after >= len(reply.chunks):
            if self._client_gone(reply.hang_s):
                self._gone()
            return
        final: dict[str, Any] = {"id": "chatcmpl-loopback", "object": "chat.completion.chunk", "model": model,
                                 "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]}
        event(final)
        if reply.usage is not None:
            event({"id": "chatcmpl-loopback", "object": "chat.completion.chunk", "model": model, "choices": [],
                   "usage": reply.usage})
        if reply.done:
            event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    model: LoopbackModel


class LoopbackModel:
    """The server; ``start()`` it (or use it as a context manager), ``stop()`` when done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replies: collections.deque[Reply] = collections.deque()
        self.requests: list[Seen] = []
        self.disconnects: list[float] = []
        self.info: dict[str, Any] | str | None = {"capabilities": []}
        self.health: dict[str, Any] | str | None = "ok"
        self.default = Reply()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.model = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="loopback-model", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """The base URL a client appends ``/chat/completions`` to."""
        return f"http://127.0.0.1:{self.port}/v1"

    def enqueue(self, *replies: Reply) -> None:
        """Answer the next chat requests with these replies, in order."""
        with self.lock:
            self.replies.extend(replies)

    def next_reply(self, body: Any, headers: dict[str, str]) -> Reply:
        with self.lock:
            if self.replies:
                return self.replies.popleft()
        scripted = script_reply(body, headers)
        return scripted if scripted is not None else self.default

    def chat_requests(self) -> list[Seen]:
        """The chat-completions requests received so far."""
        with self.lock:
            return [r for r in self.requests if r.path == "/v1/chat/completions"]
