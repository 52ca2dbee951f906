"""Conformance setup adapter of the external provider (entry point ``scheduler.conformance_adapters:external``).

Per case it runs the reference attestor (``reference_attestor``, HMAC-SHA256 with keys
the provider never sees) either as a command (``python -m ...reference_attestor``, the
key passed through ``pass_env``) or behind a real HTTP server on loopback, and configures
the provider at it. ``ExternalSetup()`` (the entry point) picks the transport per case,
alternating by a hash of the case id so a full run exercises both;
``ExternalSetup(transport="command" | "http")`` fixes it. For ``untrusted_key`` the
verifier's attestor holds another key. Principals and namespaces are not the external
protocol's concepts: those cases are declined. Only the conformance engine imports this
module.
"""

from __future__ import annotations

import secrets
import sys
import zlib
from typing import Any

from scheduler.testing.http import LoopbackHTTPServer, Recorded, Reply
from scheduler_provider_external import reference_attestor


class _Setup:
    def __init__(self, settings: dict[str, Any], verify_settings: dict[str, Any] | None, env: dict[str, str],
                 keys: list[str], server: LoopbackHTTPServer | None) -> None:
        self.settings = settings
        self.verify_settings = verify_settings
        self.provider_config: dict[str, Any] = {}
        self.secrets = env
        self.signature_field = ("attestation", "mac")
        self._keys = keys
        self._server = server

    def secret_values(self) -> list[str]:
        """The attestor keys: never in an envelope, an error or a log record."""
        return list(self._keys)

    def close(self) -> None:
        """Stop the loopback attestor, if one was started."""
        if self._server is not None:
            self._server.close()


class ExternalSetup:
    """The setup adapter: the reference attestor as a command or over HTTP, per case."""

    def __init__(self, transport: str | None = None) -> None:
        if transport not in (None, "command", "http"):
            raise ValueError("transport must be command or http")
        self.transport = transport

    def conformance_setup(self, request: Any) -> _Setup:
        """The attestor for ``request.signer``: its key, and for ``untrusted_key`` a verifier holding another key."""
        if request.signer not in ("trusted", "untrusted_key"):
            raise NotImplementedError(f"the external protocol has no principal or namespace ({request.signer})")
        transport = self.transport or ("http" if zlib.crc32(request.case_id.encode()) % 2 else "command")
        key, other = "ra-" + secrets.token_hex(16), "ra-" + secrets.token_hex(16)
        verify_key = other if request.signer == "untrusted_key" else key
        common = {"methods": [reference_attestor.METHOD], "timeout_s": 20.0}
        if transport == "command":
            names = {key: f"CONFORMANCE_ATTESTOR_KEY_{secrets.token_hex(4).upper()}",
                     other: f"CONFORMANCE_ATTESTOR_KEY_{secrets.token_hex(4).upper()}"}

            def command(k: str) -> list[str]:
                return [sys.executable, "-m", "scheduler_provider_external.reference_attestor", "--key-env", names[k]]

            settings = {**common, "command": command(key), "pass_env": [names[key]]}
            verify = {**common, "command": command(key), "verify_command": command(verify_key),
                      "pass_env": [names[key], names[verify_key]]}
            return _Setup(settings, verify, {names[key]: key, names[other]: other}, [key, other], None)
        by_path = {"/a": key.encode(), "/b": other.encode()}

        def handle(recorded: Recorded) -> Reply:
            secret = by_path.get(recorded.path)
            if secret is None:
                return Reply(status=404, body=b"no such attestor")
            return Reply(status=200, body=reference_attestor.answer(recorded.body, secret),
                         headers={"content-type": "application/json"})

        server = LoopbackHTTPServer(catch_all=handle, thread_name="reference-attestor")
        base = server.url.rstrip("/")
        settings = {**common, "url": f"{base}/a"}
        verify = {**common, "url": f"{base}/a", "verify_url": f"{base}{'/b' if verify_key == other else '/a'}"}
        return _Setup(settings, verify, {}, [key, other], server)
