"""``[providers.oauth2]``: provider-wide limits, and one table per OAuth 2.0 client.

Each client is a named table ``[providers.oauth2.clients.NAME]`` (the kernel's
``dict[str, ClientSettings]`` settings type); a binding's ``ref`` names it::

    [providers.oauth2]
    timeout_s = 10

    [providers.oauth2.clients.reports]
    token_url = "https://idp.example/oauth2/token"
    client_id = "scheduler-reports"
    client_secret = {credential = "env:REPORTS_CLIENT_SECRET"}   # references only: env:, file:, or a registered scheme
    scope = "reports.read reports.write"

The kernel validates every key of every client (types, choices, references, unknown
keys as ``providers.oauth2.clients.reports.KEY``); ``ClientSettings`` adds the URL,
scope and cross-key rules. A client secret or refresh token is a ``SecretRef``: literal
text is refused at load without being quoted. One key of a client is overridden by
``SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_<CLIENT>_<KEY>`` (``-`` and ``.`` of the name as ``_``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from typing import Literal
from urllib.parse import urlsplit

import attrs
from scheduler_toolkit.settings import SecretRef

CLIENT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# RFC 6749 section 3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E )
_SCOPE_TOKEN = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]+$")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable endpoint: https (http only on loopback), a host, no credentials in it."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("https", "http") or not host:
        return "must be an https:// URL"
    if parts.scheme == "http" and not _loopback(host):
        return "must use https:// (plain http only to a loopback address)"
    if parts.username or parts.password:
        return "must not carry credentials (user:password@): use client_id and client_secret"
    if parts.fragment:
        return "must not have a #fragment"
    return None


def shown_url(url: str) -> str:
    """An endpoint as messages show it: scheme, host, port and path; never the query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def scope_tokens(text: str) -> tuple[str, ...]:
    """The scope tokens of a space-separated scope string, sorted and de-duplicated; ``ValueError`` for a bad one."""
    tokens = sorted(set(text.split()))
    if any(not _SCOPE_TOKEN.match(t) for t in tokens):
        raise ValueError("scope tokens are printable ASCII without spaces, quotes or backslashes")
    return tuple(tokens)


def _url_check(value: str) -> str | None:
    return url_problem(value)


def _scope_check(value: str) -> str | None:
    try:
        scope_tokens(value)
    except ValueError as exc:
        return str(exc)
    return None


def _nonempty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


@attrs.frozen(kw_only=True)
class ClientSettings:
    """``[providers.oauth2.clients.NAME]``: one OAuth 2.0 client. Messages name the key, never a value."""

    token_url: str = attrs.field(metadata={"doc": "Token endpoint (https; http only on loopback).", "check": _url_check})
    client_id: str = attrs.field(metadata={"doc": "The client_id.", "check": _nonempty})
    client_secret: SecretRef | None = attrs.field(default=None, metadata={
        "doc": "Reference to the client secret (env:NAME, file:/path, ...); required unless auth_method is none."})
    auth_method: Literal["client_secret_basic", "client_secret_post", "none"] = attrs.field(
        default="client_secret_basic", metadata={"doc": "Token endpoint authentication."})
    grant: Literal["client_credentials", "refresh_token"] = attrs.field(
        default="client_credentials", metadata={"doc": "The grant used to get tokens."})
    refresh_token: SecretRef | None = attrs.field(default=None, metadata={
        "doc": "Reference to the refresh token (refresh_token grant only)."})
    scope: str = attrs.field(default="", metadata={
        "doc": "Space-separated scopes requested; a binding may ask for a subset.", "check": _scope_check})
    audience: str | None = attrs.field(default=None, metadata={
        "doc": "Audience parameter sent with the token request.", "check": _nonempty})
    revocation_url: str | None = attrs.field(default=None, metadata={
        "doc": "RFC 7009 revocation endpoint (https); unset: revoke is unsupported.", "check": _url_check})

    def __attrs_post_init__(self) -> None:
        """Cross-key rules; the message names the key, never a value."""
        if self.auth_method != "none" and self.client_secret is None:
            raise ValueError(f"client_secret is required (auth_method {self.auth_method}); "
                             "auth_method = \"none\" for a public client")
        if self.grant == "refresh_token" and self.refresh_token is None:
            raise ValueError("the refresh_token grant needs refresh_token")
        if self.grant != "refresh_token" and self.refresh_token is not None:
            raise ValueError(f"refresh_token is set but grant is {self.grant}")


@attrs.frozen(kw_only=True)
class OAuth2Settings:
    """``[providers.oauth2]``: the clients by name, then provider-wide limits."""

    clients: dict[str, ClientSettings] = attrs.field(factory=dict, metadata={
        "doc": "One table per client, [providers.oauth2.clients.NAME]; a binding's ref names one."})
    timeout_s: float = attrs.field(default=10.0, metadata={
        "minimum": 0.1, "maximum": 300, "doc": "Seconds one token or revocation request may take (connect, write, read)."})
    refresh_margin_s: float = attrs.field(default=60.0, metadata={
        "minimum": 0, "maximum": 86_400, "doc": "A cached token is replaced this long before it expires (at most half its lifetime)."})
    default_lifetime_s: float = attrs.field(default=300.0, metadata={
        "minimum": 1, "maximum": 86_400, "doc": "Lifetime assumed for a token whose response has no expires_in."})
    trust_env: bool = attrs.field(default=True, metadata={
        "doc": "Honour HTTPS_PROXY / NO_PROXY / SSL_CERT_FILE from the dispatcher's environment."})
    ca_bundle: str | None = attrs.field(default=None, metadata={
        "doc": "CA bundle (PEM path) to verify the endpoints with instead of the system store."})


@attrs.frozen(kw_only=True)
class Client:
    """One configured client, normalised (what the provider works with)."""

    name: str
    token_url: str
    client_id: str
    secret: SecretRef | None
    auth_method: Literal["client_secret_basic", "client_secret_post", "none"]
    grant: Literal["client_credentials", "refresh_token"]
    refresh_token: SecretRef | None
    scopes: tuple[str, ...]
    audience: str | None
    revocation_url: str | None

    def cache_key(self, scopes: tuple[str, ...]) -> str:
        """``sha256:<hex>`` of everything that makes a token different (never a secret value): the session key."""
        material = {"v": 1, "client": self.name, "token_url": self.token_url, "client_id": self.client_id,
                    "auth_method": self.auth_method, "grant": self.grant, "scope": list(scopes), "audience": self.audience,
                    "secret_ref": self.secret.reference if self.secret else None,
                    "refresh_token_ref": self.refresh_token.reference if self.refresh_token else None}
        digest = hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        return f"sha256:{digest}"


def client_of(settings: OAuth2Settings, name: str) -> Client | None:
    """The normalised client ``name``, or None when it is not configured."""
    found = settings.clients.get(name)
    if found is None:
        return None
    return Client(
        name=name,
        token_url=found.token_url,
        client_id=found.client_id,
        secret=found.client_secret,
        auth_method=found.auth_method,
        grant=found.grant,
        refresh_token=found.refresh_token,
        scopes=scope_tokens(found.scope),
        audience=found.audience,
        revocation_url=found.revocation_url,
    )


@attrs.frozen(kw_only=True)
class OAuth2Options:
    """A binding's ``options`` for ``oauth2``: narrow the client's scopes for this job."""

    scope: str | None = attrs.field(default=None, metadata={
        "doc": "Space-separated scopes, a subset of the client's configured scope (default: all of them)."})
