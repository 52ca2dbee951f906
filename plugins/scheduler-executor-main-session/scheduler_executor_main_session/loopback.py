"""A small loopback chat-completions server (non-streamed JSON), for the tests and the conformance adapter.

``LoopbackChat`` binds ``127.0.0.1`` on a free port and answers ``POST /v1/chat/completions``
with the next queued ``Answer``, or, when none is queued and the last user message carries a
``conformance-script:`` line, that script acted out, else a short default reply. Every
request is recorded (``requests``), and so is the moment a client went away while the
server was still preparing its answer (``disconnects``): that is how a test sees that a
cancelled run really closed its connection. Only the loopback interface is used.

(The agent executor has a larger server of its own, with streaming; a plugin cannot
import it. The kernel's ``scheduler.testing.http.LoopbackHTTPServer`` cannot hold a
response open while watching for the client to leave, which is what this one adds.)
"""

from __future__ import annotations

import collections
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs

SCRIPT_MARKER = "conformance-script:"
RUN_VARIABLE_HEADERS = {"SCHEDULER_RUN_ID": "x-scheduler-run-id", "SCHEDULER_JOB_ID": "x-scheduler-job-id",
                        "SCHEDULER_ATTEMPT": "x-scheduler-attempt"}


@attrs.define(kw_only=True)
class Answer:
    """One scripted answer."""

    status: int = 200
    content: str = "Noted in the main session."
    reasoning: str = ""
    usage: dict[str, Any] | None = attrs.Factory(lambda: {"prompt_tokens": 21, "completion_tokens": 5})
    #: A raw body instead of a chat completion (errors, garbage).
    body: str | None = None
    headers: dict[str, str] = attrs.Factory(dict)
    #: Seconds before answering (the server watches for the client going away meanwhile).
    delay_s: float = 0.0


@attrs.frozen(kw_only=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float


def script_answer(body: Any, headers: dict[str, str]) -> Answer | None:
    """The answer a conformance script in the last user message asks for (None when there is none)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    last = next((m for m in reversed(messages or []) if isinstance(m, dict) and m.get("role") == "user"), None)
    content = last.get("content") if last else None
    if not isinstance(content, str) or SCRIPT_MARKER not in content:
        return None
    steps = json.loads(content[content.index(SCRIPT_MARKER) + len(SCRIPT_MARKER):].splitlines()[0])["steps"]
    out, reasoning, delay = [], [], 0.0
    for action, value in steps:
        if action == "stdout":
            out.append(value)
        elif action == "stderr":
            reasoning.append(value)
        elif action == "stdout_zeros":
            out.append("\x00" * value)
        elif action == "stdout_env":
            out.append(headers.get(RUN_VARIABLE_HEADERS.get(value, "\n"), "") + "\n")
        elif action == "sleep_ms":
            delay += value / 1000  # a reply is delivered whole: every pause comes before it
    return Answer(content="".join(out), reasoning="".join(reasoning), delay_s=delay,
                  usage={"prompt_tokens": len(content) // 4, "completion_tokens": len(out) + len(reasoning)})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _client_gone(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.02))
            if readable:
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        return True
                except OSError:
                    return True
        return False

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        chat = self.server.chat
        with chat.lock:
            chat.requests.append(Seen(method="POST", path=self.path, headers=headers, body=body, at=time.monotonic()))
        answer = chat.next_answer(body, headers)
        if answer.delay_s and self._client_gone(answer.delay_s):
            with chat.lock:
                chat.disconnects.append(time.monotonic())
            return
        if answer.body is not None:
            payload = answer.body.encode()
        elif answer.status != 200:
            payload = json.dumps({"error": {"message": "scripted failure"}}).encode()
        else:
            message: dict[str, Any] = {"role": "assistant", "content": answer.content}
            if answer.reasoning:
                message["reasoning_content"] = answer.reasoning
            doc: dict[str, Any] = {"id": "chatcmpl-loopback", "object": "chat.completion",
                                   "model": body.get("model") if isinstance(body, dict) else None,
                                   "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
            if answer.usage is not None:
                doc["usage"] = answer.usage
            payload = json.dumps(doc).encode()
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            for key, value in answer.headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            with chat.lock:
                chat.disconnects.append(time.monotonic())
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    chat: LoopbackChat


class LoopbackChat:
    """The server; ``start()`` it, ``stop()`` when done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: collections.deque[Answer] = collections.deque()
        self.requests: list[Seen] = []
        self.disconnects: list[float] = []
        self.default = Answer()
        self._server: _Server | None = None

    def start(self) -> LoopbackChat:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.chat = self
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="loopback-chat",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def enqueue(self, *answers: Answer) -> None:
        with self.lock:
            self.answers.extend(answers)

    def next_answer(self, body: Any, headers: dict[str, str]) -> Answer:
        with self.lock:
            if self.answers:
                return self.answers.popleft()
        return script_answer(body, headers) or self.default
