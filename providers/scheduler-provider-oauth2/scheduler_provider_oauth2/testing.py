"""A real OAuth 2.0 token endpoint on loopback, for this provider's tests and its conformance source adapter.

``TokenServer`` is the endpoint's state and behaviour; ``serve_token_endpoint()`` runs it
on a threaded ``http.server`` at 127.0.0.1 (port 0, so parallel workers never collide)
and returns ``(state, close)``. It implements what the provider talks to: the
client-credentials and refresh-token grants (RFC 6749 4.4 and 6) with
``client_secret_basic``, ``client_secret_post`` and public clients, refresh-token
rotation with reuse detection, and RFC 7009 revocation. It counts and records every
request and can be scripted (``token_script`` / ``revoke_script``) to answer errors,
garbage, redirects, slowly, or with tokens that are already expired.

Test support only: nothing in the provider imports it.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote


@dataclass
class Seen:
    """One request the endpoint received."""

    path: str
    form: dict[str, str]
    auth: str  # basic | post | none
    client_id: str | None
    headers: dict[str, str]


@dataclass
class TokenServer:
    """The endpoint's state; tests change it between requests."""

    clients: dict[str, str] = field(default_factory=dict)       # client_id -> secret
    public: set[str] = field(default_factory=set)               # client_ids that authenticate with none
    scopes: dict[str, set[str]] = field(default_factory=dict)   # client_id -> scopes it may get
    refresh_tokens: dict[str, str] = field(default_factory=dict)  # live refresh token -> client_id
    rotate: bool = False
    expires_in: Any = 3600                                      # None: the member is left out
    delay_s: float = 0.0
    token_script: deque = field(default_factory=deque)          # replies for the next /token requests
    revoke_script: deque = field(default_factory=deque)
    seen: list[Seen] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- what tests read ---------------------------------------------------------------------------

    def requests(self, path: str = "/token") -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path == path]

    @property
    def token_requests(self) -> int:
        return len(self.requests("/token"))

    def every_secret(self) -> list[str]:
        """Everything secret this endpoint knows: client secrets, refresh tokens ever issued, access tokens."""
        with self.lock:
            return [*self.clients.values(), *self._all_refresh, *self.issued]

    # -- the endpoint ------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        self._all_refresh: list[str] = list(self.refresh_tokens)

    def new_refresh_token(self, client_id: str) -> str:
        value = "rt-" + secrets.token_urlsafe(24)
        with self.lock:
            self.refresh_tokens[value] = client_id
            self._all_refresh.append(value)
        return value

    def _authenticate(self, headers: dict[str, str], form: dict[str, str]) -> tuple[str, str | None, bool]:
        header = headers.get("authorization", "")
        if header.lower().startswith("basic "):
            raw = base64.b64decode(header[6:]).decode()
            cid, _, secret = raw.partition(":")
            cid, secret = unquote(cid), unquote(secret)
            return "basic", cid, self.clients.get(cid) == secret
        if "client_secret" in form:
            cid = form.get("client_id", "")
            return "post", cid, self.clients.get(cid) == form["client_secret"]
        public_id = form.get("client_id")
        return "none", public_id, public_id in self.public

    def handle(self, path: str, headers: dict[str, str], form: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        auth, cid, ok = self._authenticate(headers, form)
        with self.lock:
            self.seen.append(Seen(path=path, form=form, auth=auth, client_id=cid, headers=headers))
            script = self.token_script if path == "/token" else self.revoke_script
            reply = script.popleft() if script else None
        if callable(reply):
            reply = reply(form)
        if reply is not None and "sleep" in reply:
            time.sleep(reply["sleep"])
            reply = {k: v for k, v in reply.items() if k != "sleep"} or None
        if reply is not None:
            body = reply.get("body", b"")
            if "json" in reply:
                body = json.dumps(reply["json"]).encode()
            return reply.get("status", 200), {"Content-Type": "application/json", **reply.get("headers", {})}, body
        if self.delay_s:
            time.sleep(self.delay_s)
        if not ok:
            return _json(401, {"error": "invalid_client", "error_description": "client authentication failed"})
        if path == "/revoke":
            with self.lock:
                self.revoked.append(form.get("token", ""))
            return 200, {}, b""
        grant = form.get("grant_type")
        asked = set(form.get("scope", "").split())
        allowed = self.scopes.get(cid or "")
        if allowed is not None and not asked <= allowed:
            return _json(400, {"error": "invalid_scope", "error_description": f"not allowed: {' '.join(sorted(asked - allowed))}"})
        answer: dict[str, Any] = {"token_type": "Bearer"}
        if grant == "refresh_token":
            presented = form.get("refresh_token", "")
            with self.lock:
                owner = self.refresh_tokens.get(presented)
            if owner != cid:
                return _json(400, {"error": "invalid_grant", "error_description": "refresh token unknown, expired or reused"})
            if self.rotate:
                with self.lock:
                    del self.refresh_tokens[presented]
                answer["refresh_token"] = self.new_refresh_token(cid or "")
        elif grant != "client_credentials":
            return _json(400, {"error": "unsupported_grant_type"})
        access = "at-" + secrets.token_urlsafe(24)
        with self.lock:
            self.issued.append(access)
        answer["access_token"] = access
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        if asked:
            answer["scope"] = " ".join(sorted(asked))
        return _json(200, answer)


def _json(status: int, document: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json", "Cache-Control": "no-store"}, json.dumps(document).encode()


def serve_token_endpoint(state: TokenServer | None = None) -> tuple[TokenServer, Callable[[], None]]:
    """Start ``state`` (a new ``TokenServer`` by default) on loopback; returns it (``url`` set) and a ``close()``."""
    served = state or TokenServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode()
            form = {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, reply_headers, body = served.handle(self.path, headers, form)
            try:
                self.send_response(status)
                for k, v in reply_headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{server.server_address[1]}"

    def close() -> None:
        server.shutdown()
        server.server_close()

    return served, close


def secret_forms(value: str) -> list[str]:
    """A secret as it could leak: raw, base64 (standard and URL-safe), hex."""
    raw = value.encode()
    return [value, base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="), raw.hex()]


__all__ = ["Seen", "TokenServer", "secret_forms", "serve_token_endpoint"]
