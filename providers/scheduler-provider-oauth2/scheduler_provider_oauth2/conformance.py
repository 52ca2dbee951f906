"""The OAuth2 provider's conformance source adapter (entry point ``scheduler.conformance_adapters:oauth2``).

For each credential case it starts the loopback token endpoint of
``scheduler_provider_oauth2.testing`` with one client, and scripts it to give the case's
source answer: a token (``value``), no such client (``missing``: the ref names a client
that is not configured), ``refused`` (HTTP 401 invalid_client), ``failure`` (HTTP 500),
``malformed`` (a 200 that is not JSON), ``expired`` (``expires_in: 0``), ``slow`` (no
answer within the provider's timeout), ``empty`` (an empty ``access_token``).
Revocations are answered 200 (``accept``), 503 (``unavailable``) or 400 (``reject``).
Only the conformance engine imports this module.
"""

from __future__ import annotations

import secrets
from typing import Any

from scheduler_provider_oauth2.testing import TokenServer, serve_token_endpoint

SECRET_VAR = "SCHEDULER_CONFORMANCE_OAUTH2_SECRET"
_REVOKE = {"accept": None, "unavailable": {"status": 503, "body": b""},
           "reject": {"status": 400, "json": {"error": "unsupported_token_type"}}}


class OAuth2Source:
    """A stand-in token endpoint per case."""

    def conformance_source(self, request: Any) -> _StandIn:
        """Start the endpoint scripted for ``request.source`` / ``request.revoke_answer``."""
        return _StandIn(request)


class _StandIn:
    def __init__(self, request: Any) -> None:
        self.server, self._close = serve_token_endpoint(TokenServer())
        secret = "cs-" + secrets.token_urlsafe(24)
        self.server.clients["conformance-id"] = secret
        self.secrets = {SECRET_VAR: secret}
        self.ref = "absent" if request.source == "missing" else "conformance"
        url = self.server.url
        self.settings = {
            "clients": {"conformance": {
                "token_url": f"{url}/token",
                "client_id": "conformance-id",
                "client_secret": {"credential": f"env:{SECRET_VAR}"},
                "scope": "read",
                "revocation_url": f"{url}/revoke",
            }},
            "timeout_s": request.timeout_s,
            "trust_env": False,
        }
        script = {
            "refused": {"status": 401, "json": {"error": "invalid_client"}},
            "failure": {"status": 500, "json": {"error": "server_error"}},
            "malformed": {"status": 200, "body": b"<html>not a token</html>"},
            "empty": {"status": 200, "json": {"access_token": "", "token_type": "Bearer", "expires_in": 60}},
            "slow": {"sleep": request.timeout_s + 2.0},
        }
        if request.source == "expired":
            self.server.expires_in = 0
        elif request.source in script:
            self.server.token_script.append(script[request.source])
        if request.revoke_answer is not None:
            reply = _REVOKE[request.revoke_answer]
            if reply is not None:
                self.server.revoke_script.append(reply)

    def values(self) -> list[str]:
        """Every access token the endpoint issued."""
        with self.server.lock:
            return list(self.server.issued)

    def revoked(self) -> list[str]:
        """Every token the endpoint confirmed revoked (answered 200)."""
        with self.server.lock:
            return list(self.server.revoked)

    def close(self) -> None:
        self._close()


__all__ = ["OAuth2Source"]
