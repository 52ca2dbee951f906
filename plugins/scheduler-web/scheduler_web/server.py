"""Serving the web view: the bind rule, the access token, the socket, uvicorn.

Safe by default: the view binds 127.0.0.1; any address that is not loopback is refused
(``WEB_TOKEN_REQUIRED``) unless an access token is configured, which every request must then
carry. The token comes from ``--token-file`` (a file only its owner can read, else
``WEB_TOKEN_INVALID``) or ``$SCHEDULER_WEB_TOKEN``, never from a command-line value (``ps``
would show it). A port another process holds is ``WEB_PORT_UNAVAILABLE``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
import sys
from pathlib import Path

import click
import uvicorn
from scheduler_toolkit.cli import emit

from scheduler.api import SchedulerError
from scheduler.api.ops import open_store
from scheduler_web.app import WebConfig, create_app

#: The environment variable that may hold the access token itself.
TOKEN_ENV = "SCHEDULER_WEB_TOKEN"
#: The shortest access token accepted (a token is a bearer secret: guessing must be hopeless).
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The configured access token (``token_file`` first, then ``$SCHEDULER_WEB_TOKEN``), or None when there is none.

    A token file readable or writable by anyone but its owner, unreadable, or holding fewer than
    ``MIN_TOKEN_CHARS`` characters is ``WEB_TOKEN_INVALID``: a weak or exposed token fails closed.
    """
    env = os.environ if environ is None else environ
    if token_file is not None:
        path = Path(token_file)
        try:
            mode = path.stat().st_mode
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SchedulerError("WEB_TOKEN_INVALID", f"cannot read the token file {token_file}: {exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SchedulerError("WEB_TOKEN_INVALID", f"the token file {token_file} is open to other accounts"
                                                      f" (mode {stat.S_IMODE(mode):04o}); chmod 600 it")
    else:
        text = env.get(TOKEN_ENV, "").strip()
        if not text:
            return None
    if len(text) < MIN_TOKEN_CHARS:
        raise SchedulerError("WEB_TOKEN_INVALID", f"the access token has {len(text)} characters; at least {MIN_TOKEN_CHARS}"
                                                  " (e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return text


def check_bind(host: str, token: str | None) -> None:
    """Refuse a bind beyond loopback without an access token (``WEB_TOKEN_REQUIRED``): fail closed."""
    if token is None and not is_loopback(host):
        raise SchedulerError("WEB_TOKEN_REQUIRED", f"binding {host} exposes the scheduler beyond this machine: configure an"
                                                   f" access token (--token-file or ${TOKEN_ENV}) or bind 127.0.0.1 behind a"
                                                   " reverse proxy (docs/operations.md)")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (``WEB_PORT_UNAVAILABLE`` when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise SchedulerError("WEB_PORT_UNAVAILABLE", f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def serve(db: str | None, *, host: str, port: int, read_only: bool, token_file: str | None) -> None:
    """``scheduler web``: check the bind, open the store (never creating a database), listen, serve until stopped."""
    token = read_token(token_file)
    check_bind(host, token)
    store = open_store(db, readonly=read_only, create=False)
    try:
        sock = bind_socket(host, port)
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        url = f"http://{shown}:{bound[1]}/"
        app = create_app(store, WebConfig(read_only=read_only, access_token=token))
        emit({"url": url, "database": store.location, "read_only": read_only, "token_required": token is not None},
             lambda: click.echo(f"scheduler web: serving {store.location} on {url}"
                                + (" (read-only)" if read_only else "") + (" (access token required)" if token else "")
                                + "; Ctrl-C stops"))
        sys.stdout.flush()
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        server.run(sockets=[sock])
    finally:
        store.close()
