"""Fixtures: evidence payloads built the way the kernel builds them, and the provider loaded through its entry
point with a real settings file (API, Protocol and settings checks, ``configure``), as the kernel loads it
(``make_payload`` and ``load_evidence`` come from ``scheduler.testing.evidence``)."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scheduler.testing.evidence import load_evidence, make_payload  # noqa: F401 - fixtures

ATTESTOR_PATH = Path(__file__).resolve().parent / "attestor.py"


def _attestor_module() -> Any:
    spec = importlib.util.spec_from_file_location("external_test_attestor", ATTESTOR_PATH)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class AttestorServer:
    """The test attestor behind a real HTTP/1.1 server on 127.0.0.1 (port 0). The URL path picks the mode
    (``/good``, ``/hang``, ...); a few modes exist only over HTTP (status codes, a slow drip, chunked bodies)."""

    def __init__(self) -> None:
        attestor = _attestor_module()
        self.requests: list[dict[str, Any]] = []
        self._stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                request = json.loads(body)
                mode = self.path.strip("/").split("?")[0]
                owner.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                       "request": request})
                if mode == "status-500":
                    return self._send(500, b"attestor broke")
                if mode == "redirect":
                    self.send_response(302)
                    self.send_header("location", "/good")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return None
                if mode == "hang-headers" or (mode == "hang-verify-headers" and request["operation"] == "verify"):
                    owner._stop.wait(30)
                    return None
                if mode == "hang-verify-headers":
                    mode = "good"
                if mode == "slow-drip":  # each byte well within any read timeout, the whole far past the deadline
                    payload = attestor.answer(request, "good")
                    self.send_response(200)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    for i in range(len(payload)):
                        if owner._stop.wait(0.2):
                            return None
                        self.wfile.write(payload[i:i + 1])
                        self.wfile.flush()
                    return None
                if mode == "chunked-oversized":
                    self.send_response(200)
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    chunk = b"x" * 65536
                    for _ in range(64):
                        if owner._stop.is_set():
                            return None
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.write(b"0\r\n\r\n")
                    return None
                return self._send(200, attestor.answer(request, mode))

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except OSError:
                    pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients that time out close connections abruptly on purpose

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, mode: str = "good") -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/{mode}"

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def http_attestor() -> Iterator[AttestorServer]:
    server = AttestorServer()
    yield server
    server.close()


@pytest.fixture
def command_for() -> Callable[[str], list[str]]:
    """``command_for(mode)``: the argv of the test attestor as a real subprocess."""
    return lambda mode="good": [sys.executable, str(ATTESTOR_PATH), mode]
