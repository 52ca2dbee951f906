"""``[providers.oauth2]``: OAuth 2.0 clients, in a flat shape today's settings loader validates.

The loader accepts only flat field types (``str``, numbers, ``bool``, lists of
strings, ``dict[str, str]``), so a nested ``[providers.oauth2.clients.NAME]`` table is
refused (``CONFIG_INVALID``: "must be an object of strings"). The clients are
therefore written *per property*: every per-client key is a table from client name to
value, and the keys of ``token_url`` define the clients::

    [providers.oauth2]
    timeout_s = 10

    [providers.oauth2.token_url]
    reports = "https://idp.example/oauth2/token"
    [providers.oauth2.client_id]
    reports = "scheduler-reports"
    [providers.oauth2.client_secret]          # references only: env:, file:, or any registered scheme
    reports = "env:REPORTS_CLIENT_SECRET"
    [providers.oauth2.scope]
    reports = "reports.read reports.write"

A client secret or refresh token is a *reference* (``env:NAME``, ``file:/path``),
checked with ``SecretRef.parse`` at load, like the kernel's ``{credential = ...}``
fields; literal text is refused without being quoted.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from typing import Literal
from urllib.parse import urlsplit

import attrs

from scheduler.api import SecretRef

CLIENT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
GRANTS = ("client_credentials", "refresh_token")
AUTH_METHODS = ("client_secret_basic", "client_secret_post", "none")
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


def _each(check):  # type: ignore[no-untyped-def]
    """A field check applying ``check(name, value)`` to every entry of a client-name table."""

    def run(table: dict[str, str]) -> str | None:
        for name, value in table.items():
            if not CLIENT_NAME.match(name):
                return f"client name {name!r} must match [a-z0-9][a-z0-9_.-]{{0,63}}"
            problem = check(name, value)
            if problem:
                return problem
        return None

    return run


def _url_check(name: str, value: str) -> str | None:
    problem = url_problem(value)
    return f"{name}: {problem}" if problem else None


def _reference_check(name: str, value: str) -> str | None:
    try:
        SecretRef.parse(value)
    except ValueError as exc:  # the message never quotes the value: it may be a pasted secret
        return f"{name}: {exc}"
    return None


def _choice(choices: tuple[str, ...]):  # type: ignore[no-untyped-def]
    def check(name: str, value: str) -> str | None:
        return None if value in choices else f"{name}: must be one of {', '.join(choices)}"

    return check


def _scope_check(name: str, value: str) -> str | None:
    try:
        scope_tokens(value)
    except ValueError as exc:
        return f"{name}: {exc}"
    return None


def _nonempty(name: str, value: str) -> str | None:
    return None if value.strip() else f"{name}: must not be empty"


def _table(doc: str, check) -> attrs.Attribute:  # type: ignore[no-untyped-def, type-arg]
    return attrs.field(factory=dict, metadata={"doc": doc, "check": _each(check)})


@attrs.frozen(kw_only=True)
class OAuth2Settings:
    """``[providers.oauth2]``: per-client tables keyed by client name, then provider-wide limits."""

    token_url: dict[str, str] = _table("Client -> token endpoint (https; http only on loopback). Its keys define the clients.", _url_check)
    client_id: dict[str, str] = _table("Client -> client_id (required for every client).", _nonempty)
    client_secret: dict[str, str] = _table(
        "Client -> reference to the client secret (env:NAME, file:/path, ...); required unless auth_method is none.",
        _reference_check)
    auth_method: dict[str, str] = _table(
        "Client -> token endpoint authentication: client_secret_basic (default), client_secret_post or none.",
        _choice(AUTH_METHODS))
    grant: dict[str, str] = _table("Client -> grant: client_credentials (default) or refresh_token.", _choice(GRANTS))
    refresh_token: dict[str, str] = _table("Client -> reference to the refresh token (refresh_token grant only).",
                                           _reference_check)
    scope: dict[str, str] = _table("Client -> space-separated scopes requested; a binding may ask for a subset.", _scope_check)
    audience: dict[str, str] = _table("Client -> audience parameter sent with the token request.", _nonempty)
    revocation_url: dict[str, str] = _table("Client -> RFC 7009 revocation endpoint (https); none: revoke is unsupported.",
                                            _url_check)
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

    def __attrs_post_init__(self) -> None:
        """Cross-key rules; the message names client and key, never a value."""
        clients = set(self.token_url)
        for key in ("client_id", "client_secret", "auth_method", "grant", "refresh_token", "scope", "audience", "revocation_url"):
            unknown = sorted(set(getattr(self, key)) - clients)
            if unknown:
                raise ValueError(f"{key} names client(s) without a token_url: {', '.join(unknown)}")
        for name in sorted(clients):
            if name not in self.client_id:
                raise ValueError(f"client {name!r} has no client_id")
            method = self.auth_method.get(name, "client_secret_basic")
            if method != "none" and name not in self.client_secret:
                raise ValueError(f"client {name!r} has no client_secret (auth_method {method})")
            grant = self.grant.get(name, "client_credentials")
            if grant == "refresh_token" and name not in self.refresh_token:
                raise ValueError(f"client {name!r} uses the refresh_token grant but has no refresh_token")
            if grant != "refresh_token" and name in self.refresh_token:
                raise ValueError(f"client {name!r} has a refresh_token but its grant is {grant}")


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
    if name not in settings.token_url:
        return None
    secret = settings.client_secret.get(name)
    refresh = settings.refresh_token.get(name)
    return Client(
        name=name,
        token_url=settings.token_url[name],
        client_id=settings.client_id[name],
        secret=SecretRef.parse(secret) if secret else None,
        auth_method=settings.auth_method.get(name, "client_secret_basic"),  # type: ignore[arg-type]
        grant=settings.grant.get(name, "client_credentials"),  # type: ignore[arg-type]
        refresh_token=SecretRef.parse(refresh) if refresh else None,
        scopes=scope_tokens(settings.scope.get(name, "")),
        audience=settings.audience.get(name),
        revocation_url=settings.revocation_url.get(name),
    )


@attrs.frozen(kw_only=True)
class OAuth2Options:
    """A binding's ``options`` for ``oauth2``: narrow the client's scopes for this job."""

    scope: str | None = attrs.field(default=None, metadata={
        "doc": "Space-separated scopes, a subset of the client's configured scope (default: all of them)."})
