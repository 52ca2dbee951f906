"""scheduler_toolkit.http: HTTP answers and httpx failures as delivery errors, attachments, the pooled client, the abortable request.

Real parts: a loopback HTTP server (``scheduler.testing.http``), a raw loopback socket server that
streams and then waits, a port nobody listens on, files on disk.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest
from scheduler_toolkit.http import (
    AbortableRequest,
    PooledHttpClient,
    endpoint_label,
    error_for_exception,
    error_for_status,
    read_attachment,
    retry_after_seconds,
)

from scheduler.api import PermanentDeliveryError, TransientDeliveryError
from scheduler.testing.http import LoopbackHTTPServer


@pytest.fixture
def server() -> Iterator[LoopbackHTTPServer]:
    srv = LoopbackHTTPServer()
    yield srv
    srv.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_endpoint_label_keeps_only_scheme_host_and_port() -> None:
    assert endpoint_label("https://user:pw@hooks.example.com:8443/T0/B1/secret?token=x") == "https://hooks.example.com:8443"
    assert endpoint_label("http://127.0.0.1/path") == "http://127.0.0.1"
    assert endpoint_label("nonsense") == "://?"


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(" 2.5 ") == 2.5
    assert retry_after_seconds("-3") == 0.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None and retry_after_seconds("nan") is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    assert 50 <= retry_after_seconds(later) <= 61  # type: ignore[operator]


@pytest.mark.parametrize(("status", "kind", "code"), [
    (429, TransientDeliveryError, "HOOK_RATE_LIMITED"),
    (408, TransientDeliveryError, "HOOK_TIMEOUT"),
    (503, TransientDeliveryError, "HOOK_SERVER_ERROR"),
    (401, PermanentDeliveryError, "HOOK_AUTH_FAILED"),
    (403, PermanentDeliveryError, "HOOK_AUTH_FAILED"),
    (302, PermanentDeliveryError, "HOOK_REDIRECTED"),
    (400, PermanentDeliveryError, "HOOK_REJECTED"),
])
def test_an_http_answer_is_the_delivery_error_it_means(status: int, kind: type, code: str) -> None:
    error = error_for_status(status, {"retry-after": "3"}, b"nope\nnot today", "the hook", prefix="HOOK")
    assert type(error) is kind and error.code == code
    if kind is TransientDeliveryError:
        assert error.retry_after_s == 3.0
    if status != 302:
        assert error.message == f"the hook answered HTTP {status}: nope not today"


def test_a_2xx_is_no_error_and_a_long_body_is_cut() -> None:
    assert error_for_status(204, {}, b"", "the hook", prefix="HOOK") is None
    error = error_for_status(500, {}, b"x" * 5000, "the hook", prefix="HOOK")
    assert error is not None and error.message.endswith("x" * 200 + "...")


def test_httpx_failures_are_classified_without_the_url() -> None:
    secret_url = f"http://127.0.0.1:{_free_port()}/token-abc123"
    with httpx.Client(timeout=2) as client:
        try:
            client.get(secret_url)
        except httpx.HTTPError as exc:
            refused = error_for_exception(exc, "the hook", prefix="HOOK")
    assert isinstance(refused, TransientDeliveryError) and refused.code == "HOOK_CONNECTION_FAILED"
    assert "token-abc123" not in refused.message
    with httpx.Client() as client:
        try:
            client.get("ftp://127.0.0.1/x")
        except httpx.HTTPError as exc:
            invalid = error_for_exception(exc, "the hook", prefix="HOOK")
    assert isinstance(invalid, PermanentDeliveryError) and invalid.code == "HOOK_TARGET_INVALID"


def test_a_server_that_does_not_answer_in_time_is_a_timeout(server: LoopbackHTTPServer) -> None:
    server.queue("/slow", {"action": "hang", "seconds": 3})
    with httpx.Client(timeout=0.3) as client:
        try:
            client.post(server.url + "/slow", json={})
        except httpx.HTTPError as exc:
            error = error_for_exception(exc, "the hook", prefix="HOOK")
    assert isinstance(error, TransientDeliveryError) and error.code == "HOOK_TIMEOUT"


def test_read_attachment_checks_size_and_digest(tmp_path: Path) -> None:
    data = b"report body"
    digest = hashlib.sha256(data).hexdigest()
    assert read_attachment({"name": "r.txt", "mime_type": "text/plain", "content": data, "size_bytes": len(data),
                            "sha256": "sha256:" + digest}, max_bytes=100, prefix="X") == ("r.txt", "text/plain", data)
    staged = tmp_path / "staged.bin"
    staged.write_bytes(data)
    assert read_attachment({"path": str(staged), "sha256": digest}, max_bytes=100, prefix="X") == (
        "attachment", "application/octet-stream", data)
    assert read_attachment({"content": "text"}, max_bytes=10, prefix="X")[2] == b"text"
    cases = [
        ({"name": "a"}, 100, "X_ATTACHMENT_INVALID"),
        ({"path": str(tmp_path / "missing")}, 100, "X_ATTACHMENT_INVALID"),
        ({"path": str(staged)}, 4, "X_ATTACHMENT_TOO_LARGE"),
        ({"content": data}, 4, "X_ATTACHMENT_TOO_LARGE"),
        ({"content": data, "size_bytes": 3}, 100, "X_ATTACHMENT_INVALID"),
        ({"content": data, "sha256": "0" * 64}, 100, "X_ATTACHMENT_INVALID"),
    ]
    for attachment, limit, code in cases:
        with pytest.raises(PermanentDeliveryError) as raised:
            read_attachment(attachment, max_bytes=limit, prefix="X")
        assert raised.value.code == code, attachment


def test_the_pooled_client_is_one_client_that_never_follows_redirects(server: LoopbackHTTPServer) -> None:
    server.default("/moved", {"status": 302, "headers": {"location": server.url + "/elsewhere"}})
    server.default("/ok", {"status": 200, "json": {"ok": True}})
    pool = PooledHttpClient("toolkit-test/1", timeout_s=5, connect_timeout_s=2)
    first = pool.get()
    assert pool.get() is first
    assert first.get(server.url + "/moved").status_code == 302
    assert first.get(server.url + "/ok").json() == {"ok": True}
    assert not server.to("/elsewhere")
    assert server.to("/ok")[0].headers["user-agent"] == "toolkit-test/1"
    pool.close()
    assert first.is_closed
    second = pool.get()
    assert second is not first and second.get(server.url + "/ok").status_code == 200
    pool.close()


class _StreamingServer:
    """A raw loopback HTTP server that sends a response head and one chunk, then waits until the client goes away."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/stream"
        self.client_left = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n")
            conn.settimeout(10)
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            self.client_left.set()

    def close(self) -> None:
        self.sock.close()


def test_an_abortable_request_streams_and_stops_at_once() -> None:
    server = _StreamingServer()
    try:
        with httpx.Client(timeout=httpx.Timeout(30, connect=5)) as client:
            request = AbortableRequest(client, server.url, {"authorization": "Bearer x"}, {"q": 1}, name="test-http")
            request.start()
            kind, response = request.events.get(timeout=5)
            assert kind == "head" and response.status_code == 200
            assert request.events.get(timeout=5) == ("data", b"hello")
            started = time.monotonic()
            request.abort()
            assert server.client_left.wait(5), "the server never saw the client leave"
            request.join(5)
            assert not request.is_alive() and time.monotonic() - started < 5
            assert request.events.empty()  # nothing is reported once aborted
    finally:
        server.close()


def test_a_failed_request_is_reported_on_the_queue() -> None:
    with httpx.Client(timeout=2) as client:
        request = AbortableRequest(client, f"http://127.0.0.1:{_free_port()}/", {}, {})
        request.start()
        kind, exc = request.events.get(timeout=5)
        request.join(5)
    assert kind == "fail" and isinstance(exc, httpx.ConnectError)
