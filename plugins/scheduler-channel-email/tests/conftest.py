"""Fixtures: real SMTP servers on loopback (aiosmtpd in a background event loop, port 0), TLS certificates made
with openssl, and the channel loaded through its entry point with a real settings file, as the kernel loads it."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scheduler.testing import provider_loader

USER, PASSWORD = "mailer", "s3cret-Pa55word-value"


@dataclass
class Received:
    """One message the server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    data: bytes


class SmtpServer:
    """An aiosmtpd server on 127.0.0.1:0 in its own event-loop thread, with scripted RCPT and DATA answers.

    ``tls``: ``None`` (plain), ``"starttls"`` (offered and required) or ``"implicit"``; ``rcpt_replies`` maps an
    address to the reply that refuses it; ``data_script`` holds, per message, a reply (``"451 later"``),
    ``("hang", seconds)`` or ``"drop"`` (the connection is aborted in the middle of DATA).
    """

    def __init__(self, *, tls: str | None = None, certs: tuple[Path, Path] | None = None, auth: bool = False) -> None:
        self.messages: list[Received] = []
        self.logins: list[tuple[str, str]] = []
        self.rcpt_replies: dict[str, str] = {}
        self.data_script: deque[Any] = deque()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        context = None
        if tls is not None:
            assert certs is not None
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(certs[0]), str(certs[1]))
        owner = self

        class Handler:
            async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any) -> str:
                refusal = owner.rcpt_replies.get(address)
                if refusal:
                    return refusal
                envelope.rcpt_tos.append(address)
                return "250 OK"

            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                action = owner.data_script.popleft() if owner.data_script else None
                if action == "drop":
                    server.transport.abort()
                    return "250 never seen"
                if isinstance(action, tuple) and action[0] == "hang":
                    await asyncio.sleep(action[1])
                    return "250 too late"
                if isinstance(action, str):
                    return action
                owner.messages.append(Received(envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
                return "250 OK queued"

        def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> Any:
            from aiosmtpd.smtp import AuthResult

            login = auth_data.login.decode() if isinstance(auth_data.login, bytes) else auth_data.login
            password = auth_data.password.decode() if isinstance(auth_data.password, bytes) else auth_data.password
            owner.logins.append((login, password))
            return AuthResult(success=(login, password) == (USER, PASSWORD), handled=False)

        from aiosmtpd.smtp import SMTP

        def factory() -> Any:
            return SMTP(
                Handler(), hostname="localhost", loop=self.loop,
                tls_context=context if tls == "starttls" else None, require_starttls=tls == "starttls",
                authenticator=authenticator if auth else None, auth_require_tls=tls == "starttls",
            )

        create = self.loop.create_server(factory, "127.0.0.1", 0, ssl=context if tls == "implicit" else None)
        self._server = asyncio.run_coroutine_threadsafe(create, self.loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
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


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost / 127.0.0.1 and its key (the certificate doubles as the CA file)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    root = tmp_path_factory.mktemp("certs")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture
def smtp_server(certs: tuple[Path, Path]) -> Iterator[Callable[..., SmtpServer]]:
    """``smtp_server(tls=None|"starttls"|"implicit", auth=False)``: a started server, closed after the test."""
    pytest.importorskip("aiosmtpd", reason="aiosmtpd is in the test extra: pip install -e 'plugins/scheduler-channel-email[test]'")
    started: list[SmtpServer] = []

    def start(**kwargs: Any) -> SmtpServer:
        server = SmtpServer(certs=certs, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel queues them) but never says anything: no SMTP greeting."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@pytest.fixture
def load_channel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``load_channel(name, **settings)``: write ``[channels.NAME]`` to a real settings file and load the driver
    through its entry point (API, Protocol and settings checks, ``configure``), as the kernel does."""
    with provider_loader(monkeypatch, tmp_path, "channel") as load:
        yield load
