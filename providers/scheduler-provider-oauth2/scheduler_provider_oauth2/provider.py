"""``OAuth2CredentialProvider``: access tokens from an OAuth 2.0 token endpoint, cached until their refresh point.

The binding's ``ref`` names a client ``[providers.oauth2.clients.NAME]`` (see ``settings.py``).
Authlib's httpx ``OAuth2Client`` does the protocol work: the client-credentials and
refresh-token grants (RFC 6749 sections 4.4 and 6), client authentication
(``client_secret_basic``, ``client_secret_post``, ``none``) and token revocation (RFC 7009).
What this module adds:

* **Cache.** One token per *session key* (client, endpoint, client id, grant, scopes,
  audience; ``Client.cache_key``), kept in this provider's memory and handed to every
  run that asks until its ``refresh_after`` point, which is ``expires_at`` minus
  ``refresh_margin_s`` (at most half the lifetime). A token past that point is never
  presented again: the next resolve fetches a new one, and if that fails, the resolve
  fails. Resolves of one client are serialised, so concurrent runs cause one request.
* **Expiry.** ``expires_at`` counts from the moment the request was *sent*, so the
  request's latency never lengthens a token's life. A token that is already expired when
  it arrives is refused (``CREDENTIAL_EXPIRED``) and is neither cached nor presented.
* **Rotation.** A refresh-token grant whose answer carries a new refresh token keeps that
  one in memory and uses it next time. The configured reference is read again only
  after a restart.
* **Errors.** Answers are classified into stable ``CREDENTIAL_*`` codes, permanent or
  transient (``errors.py``). No secret, token or server text that contains one appears
  in a message, in ``details`` or in a log line.
* **Revocation.** ``revoke`` reports ``RevokeResult(revoked=True)`` only when the
  endpoint answered 200. Any other outcome is ``revoked=False`` with a reason code. The
  token leaves the cache either way, so a token whose revocation was attempted is never
  presented again.
"""

from __future__ import annotations

import functools
import hmac
import logging
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from scheduler_toolkit.options import build_options
from scheduler_toolkit.settings import plugin_settings
from scheduler_toolkit.types import RefreshResult, RevokeResult

from scheduler.api import CredentialBinding, CredentialContext, ResolvedCredential, SchedulerError
from scheduler_provider_oauth2.errors import CredentialError, oauth_error_code, scrub
from scheduler_provider_oauth2.settings import Client, OAuth2Options, OAuth2Settings, client_of, scope_tokens, shown_url

log = logging.getLogger("scheduler_provider_oauth2")

_TRANSIENT_STATUS = frozenset({408, 425, 429})
_PERMANENT_ERRORS = {
    "invalid_client": "CREDENTIAL_OAUTH_INVALID_CLIENT",
    "unauthorized_client": "CREDENTIAL_OAUTH_INVALID_CLIENT",
    "invalid_grant": "CREDENTIAL_OAUTH_INVALID_GRANT",
    "invalid_scope": "CREDENTIAL_OAUTH_INVALID_SCOPE",
}
_TRANSIENT_ERRORS = frozenset({"temporarily_unavailable", "server_error", "slow_down"})


@functools.cache
def _authlib() -> tuple[type, type[Exception], Any]:
    """Authlib's httpx ``OAuth2Client``, its ``OAuthError`` and the HTTP module the client is built on.

    Imported on first use (``scheduler plugins list`` must stay cheap). Authlib 1.9+
    prefers the ``httpx2`` fork and warns (``AuthlibDeprecationWarning``) when it falls
    back to ``httpx``; that warning is about Authlib's future, not about this run, so it
    is kept out of the dispatcher's output. The HTTP module is taken from the client's
    own base class so the transport exceptions caught here are the ones it raises.
    """
    import authlib.deprecate  # installs Authlib's own "always show" filter first, so ours below can override it

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=authlib.deprecate.AuthlibDeprecationWarning)
        from authlib.integrations.base_client import OAuthError
        from authlib.integrations.httpx_client import OAuth2Client
    http = next(sys.modules[c.__module__.split(".")[0]] for c in OAuth2Client.__mro__
                if c.__name__ == "Client" and c.__module__.split(".")[0] in ("httpx", "httpx2"))
    return OAuth2Client, OAuthError, http


@attrs.frozen(kw_only=True)
class CachedToken:
    """One access token in memory with its times (epoch ms). ``repr`` never shows the token."""

    access_token: str = attrs.field(repr=False)
    token_type: str
    scope: str
    cache_key: str
    issued_at_ms: int
    expires_at_ms: int
    refresh_after_ms: int
    expiry_assumed: bool


@attrs.frozen(kw_only=True)
class _Answer:
    """The HTTP status of the last token-endpoint answer (read by the error classifier)."""

    status: list[int] = attrs.field(factory=list)

    def hook(self, response: Any) -> Any:
        self.status.append(response.status_code)
        return response


class OAuth2CredentialProvider:
    """Credential driver ``oauth2`` (group ``scheduler.credential_providers``)."""

    plugin_api = 3
    capabilities = frozenset({"refresh", "revoke"})
    settings_class = OAuth2Settings
    options_class = OAuth2Options

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        """``clock`` returns epoch seconds (default ``time.time``); tests move it to cross refresh points."""
        self._clock = clock or time.time
        self._settings: OAuth2Settings | None = None
        self._lock = threading.Lock()
        self._client_locks: dict[str, threading.Lock] = {}
        self._cache: dict[str, CachedToken] = {}
        self._rotated: dict[str, tuple[str, str]] = {}  # client name -> (refresh_token_ref, latest refresh token)
        self._rotations: dict[str, int] = {}

    # -- configuration -----------------------------------------------------------------------------

    def configure(self, settings: OAuth2Settings) -> None:
        """The loader hands over the validated ``[providers.oauth2]`` table."""
        self._settings = settings

    def _current(self) -> OAuth2Settings:
        return self._settings if self._settings is not None else plugin_settings("credential", "oauth2", OAuth2Settings)

    def clear_cache(self) -> None:
        """Forget every cached token and rotated refresh token (shutdown, tests)."""
        with self._lock:
            self._cache.clear()
            self._rotated.clear()

    def _client(self, binding: CredentialBinding) -> tuple[OAuth2Settings, Client]:
        settings = self._current()
        client = client_of(settings, binding.ref)
        if client is None:
            known = ", ".join(sorted(settings.clients)) or "none configured"
            raise CredentialError("CREDENTIAL_NOT_FOUND", f"credential {binding.name!r}: no OAuth2 client "
                                  f"{binding.ref!r} in [providers.oauth2.clients] (known: {known})",
                                  details={"binding": binding.name, "provider": "oauth2", "ref": binding.ref})
        return settings, client

    def _scopes(self, binding: CredentialBinding, client: Client) -> tuple[str, ...]:
        """The scopes this binding gets: its ``options.scope`` (a subset of the client's) or all of the client's."""
        options = binding.options
        if isinstance(options, dict) or options is None:
            try:
                options = build_options(OAuth2Options, options or {}, "credentials.options")
            except SchedulerError as exc:
                raise CredentialError("CREDENTIAL_OPTIONS_INVALID", f"credential {binding.name!r}: {exc.message}",
                                      details={"binding": binding.name, "problems": exc.details}) from None
        if not isinstance(options, OAuth2Options):
            raise CredentialError("CREDENTIAL_OPTIONS_INVALID", f"credential {binding.name!r}: options must be an object",
                                  details={"binding": binding.name})
        if options.scope is None:
            return client.scopes
        try:
            wanted = scope_tokens(options.scope)
        except ValueError as exc:
            raise CredentialError("CREDENTIAL_OPTIONS_INVALID", f"credential {binding.name!r}: {exc}",
                                  details={"binding": binding.name}) from None
        extra = sorted(set(wanted) - set(client.scopes))
        if extra:
            raise CredentialError("CREDENTIAL_SCOPE_NOT_ALLOWED", f"credential {binding.name!r}: client {client.name!r} "
                                  f"is not configured for scope(s) {' '.join(extra)}",
                                  details={"binding": binding.name, "client": client.name, "scopes": extra})
        return wanted

    def _client_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._client_locks.setdefault(name, threading.Lock())

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- the Protocol ------------------------------------------------------------------------------

    def resolve(self, binding: CredentialBinding, context: CredentialContext) -> ResolvedCredential:
        """A valid access token for the binding's client: the cached one until its refresh point, else a new one."""
        settings, client = self._client(binding)
        scopes = self._scopes(binding, client)
        key = client.cache_key(scopes)
        with self._client_lock(client.name):
            cached = self._cache.get(key)
            if cached is not None and self._now_ms() < cached.refresh_after_ms:
                return self._credential(client, cached, binding, cached=True)
            token = self._fetch_into_cache(settings, client, scopes, key, binding, context)
            return self._credential(client, token, binding, cached=False)

    def refresh(self, credential: ResolvedCredential, binding: CredentialBinding, context: CredentialContext) -> RefreshResult:
        """A new token now, before the refresh point; a token another run already fetched is shared, not refetched."""
        try:
            settings, client = self._client(binding)
            scopes = self._scopes(binding, client)
            key = client.cache_key(scopes)
            with self._client_lock(client.name):
                cached = self._cache.get(key)
                if (cached is not None and self._now_ms() < cached.refresh_after_ms
                        and not _same(cached.access_token, credential.value)):
                    return RefreshResult(refreshed=True, credential=self._credential(client, cached, binding, cached=True))
                token = self._fetch_into_cache(settings, client, scopes, key, binding, context)
                return RefreshResult(refreshed=True, credential=self._credential(client, token, binding, cached=False))
        except CredentialError as exc:
            return RefreshResult(refreshed=False, reason=f"{exc.code}: {exc.message}")

    def revoke(self, credential: ResolvedCredential, binding: CredentialBinding, context: CredentialContext) -> RevokeResult:
        """RFC 7009 revocation of the access token; ``revoked=True`` only on an explicit 200 from the endpoint."""
        value = credential.value.decode("utf-8", "replace") if isinstance(credential.value, bytes) else credential.value
        dropped: list[str] = []
        with self._lock:  # whatever the endpoint says, this token is never presented again
            for key in [k for k, t in self._cache.items() if _same(t.access_token, value)]:
                dropped.append(key)
                del self._cache[key]
        session = credential.metadata.get("cache_key_hash") if isinstance(credential.metadata, Mapping) else None
        sessions = {k for k in [*dropped, session] if isinstance(k, str)}
        result = self._revoke(credential, binding, value)
        for key in sorted(sessions):  # the kernel's record says what became of each session the token stood for
            _mark(context, key, "revoked" if result.outcome == "revoked" else "revoke_failed")
        return result

    def _revoke(self, credential: ResolvedCredential, binding: CredentialBinding, value: str) -> RevokeResult:
        try:
            settings, client = self._client(binding)
        except CredentialError as exc:
            return RevokeResult(revoked=False, code="not_revoked", reason=f"{exc.code}: {exc.message}")
        if not client.revocation_url:
            return RevokeResult(revoked=False, code="unsupported", reason=f"CREDENTIAL_REVOKE_UNSUPPORTED: client "
                                f"{client.name!r} has no revocation_url")
        try:
            status = self._post_revocation(settings, client, value)
        except CredentialError as exc:
            return RevokeResult(revoked=False, code="not_revoked", reason=f"{exc.code}: {exc.message}")
        where = shown_url(client.revocation_url)
        if status == 200:
            log.debug("oauth2 client %s: token revoked at %s", client.name, where)
            return RevokeResult(revoked=True, code="revoked")
        if status >= 500 or status in _TRANSIENT_STATUS:
            code = "CREDENTIAL_REVOKE_UNAVAILABLE"
        elif 400 <= status < 500:
            code = "CREDENTIAL_REVOKE_REJECTED"
        else:
            code = "CREDENTIAL_REVOKE_INDETERMINATE"
        return RevokeResult(revoked=False, code="not_revoked",
                            reason=f"{code}: {where} answered HTTP {status}; the token is not known to be revoked")

    # -- the token endpoint ------------------------------------------------------------------------

    def _credential(self, client: Client, token: CachedToken, binding: CredentialBinding, *, cached: bool) -> ResolvedCredential:
        """The answer for ``binding`` (name, medium, key, file name and required echoed, as the kernel checks)."""
        return ResolvedCredential.for_binding(
            binding, token.access_token, expires_at_ms=token.expires_at_ms, refresh_after_ms=token.refresh_after_ms, metadata={
            "provider": "oauth2",
            "client": client.name,
            "grant": client.grant,
            "token_type": token.token_type,
            "scope": token.scope,
            "audience": client.audience,
            "cache_key_hash": token.cache_key,
            "issued_at_ms": token.issued_at_ms,
            "refresh_after_ms": token.refresh_after_ms,
            "expires_at_ms": token.expires_at_ms,
            "expiry_assumed": token.expiry_assumed,
            "cached": cached,
            "rotation": self._rotations.get(client.name, 0),
            })

    def _fetch_into_cache(self, settings: OAuth2Settings, client: Client, scopes: tuple[str, ...], key: str,
                          binding: CredentialBinding, context: CredentialContext) -> CachedToken:
        """Fetch a token (caller holds the client's lock), record its session, cache it; or drop an expired one and raise.

        The session is recorded (``context.sessions``) before the token is cached: if the
        kernel cannot record it, the token is neither cached nor presented.
        """
        try:
            token = self._fetch(settings, client, scopes, key, binding)
        except CredentialError:
            with self._lock:
                old = self._cache.get(key)
                expired = old is not None and self._now_ms() >= old.expires_at_ms
                if expired:
                    del self._cache[key]
            if expired:
                _mark(context, key, "expired")
            raise
        sessions = getattr(context, "sessions", None)
        if sessions is not None:
            sessions.record_session("oauth2", key, scopes=token.scope.split(), expires_at_ms=token.expires_at_ms,
                                    refresh_after_ms=token.refresh_after_ms)
        with self._lock:
            self._cache[key] = token
        return token

    def _resolve_ref(self, binding: CredentialBinding, client: Client, what: str, ref: Any) -> str:
        try:
            return ref.resolve()
        except SchedulerError as exc:  # SECRET_UNRESOLVED names the reference, never a value
            raise CredentialError("CREDENTIAL_SECRET_UNRESOLVED", f"credential {binding.name!r}: the {what} of OAuth2 "
                                  f"client {client.name!r} cannot be read: {exc.message}",
                                  details={"binding": binding.name, "client": client.name, "reference": ref.reference}) from None

    def _oauth_client(self, settings: OAuth2Settings, client: Client, secret: str | None, scopes: tuple[str, ...]) -> Any:
        OAuth2Client, _, _ = _authlib()
        return OAuth2Client(
            client_id=client.client_id,
            client_secret=secret,
            token_endpoint_auth_method=client.auth_method,
            revocation_endpoint_auth_method=client.auth_method,
            scope=" ".join(scopes) or None,
            timeout=settings.timeout_s,
            trust_env=settings.trust_env,
            verify=_tls_context(settings.ca_bundle),
            follow_redirects=False,
        )

    def _fetch(self, settings: OAuth2Settings, client: Client, scopes: tuple[str, ...], key: str,
               binding: CredentialBinding) -> CachedToken:
        """One token request (a new ``OAuth2Client`` per request: Authlib keeps the last token on the client object)."""
        _, OAuthError, http = _authlib()
        secret = self._resolve_ref(binding, client, "client secret", client.secret) if client.secret else None
        refresh_token = None
        if client.grant == "refresh_token":
            rotated = self._rotated.get(client.name)
            ref = client.refresh_token
            assert ref is not None
            refresh_token = rotated[1] if rotated and rotated[0] == ref.reference else \
                self._resolve_ref(binding, client, "refresh token", ref)
        secrets = [secret, refresh_token]
        extra = {"audience": client.audience} if client.audience else {}
        where = shown_url(client.token_url)
        facts = {"binding": binding.name, "client": client.name, "token_url": where, "grant": client.grant}
        answer = _Answer()
        sent_ms = self._now_ms()
        try:
            with self._oauth_client(settings, client, secret, scopes) as oauth:
                oauth.register_compliance_hook("access_token_response", answer.hook)
                oauth.register_compliance_hook("refresh_token_response", answer.hook)
                if client.grant == "refresh_token":
                    raw = oauth.refresh_token(client.token_url, refresh_token=refresh_token, **extra)
                else:
                    raw = oauth.fetch_token(client.token_url, grant_type="client_credentials", **extra)
                raw = dict(raw)
        except OAuthError as exc:
            raise self._oauth_failure(exc, answer, secrets, facts, binding) from None
        except http.TimeoutException:
            raise CredentialError("CREDENTIAL_OAUTH_UNAVAILABLE", f"credential {binding.name!r}: the token endpoint {where} "
                                  f"did not answer within {settings.timeout_s:g} s", details={**facts, "reason": "timeout"}) from None
        except http.HTTPStatusError as exc:
            raise self._status_failure(exc.response.status_code, facts, binding) from None
        except http.HTTPError as exc:  # connection refused, TLS, protocol errors
            raise CredentialError("CREDENTIAL_OAUTH_UNAVAILABLE", f"credential {binding.name!r}: the token endpoint {where} "
                                  f"cannot be reached ({type(exc).__name__})",
                                  details={**facts, "reason": type(exc).__name__}) from None
        except (ValueError, TypeError) as exc:  # not a JSON object, an unparseable expires_in
            status = answer.status[-1] if answer.status else None
            if status is not None and status >= 400:
                raise self._status_failure(status, facts, binding) from None
            raise CredentialError("CREDENTIAL_OAUTH_BAD_RESPONSE", f"credential {binding.name!r}: the token endpoint {where} "
                                  f"sent no usable token ({type(exc).__name__})", details={**facts, "status": status}) from None
        status = answer.status[-1] if answer.status else None
        return self._token_from(raw, settings, client, scopes, key, sent_ms, status, secrets, facts, binding)

    def _token_from(self, raw: dict[str, Any], settings: OAuth2Settings, client: Client, scopes: tuple[str, ...], key: str,
                    sent_ms: int, status: int | None, secrets: list[str | None], facts: dict[str, Any],
                    binding: CredentialBinding) -> CachedToken:
        where = facts["token_url"]
        access = raw.get("access_token")
        if status is not None and status >= 400:
            raise self._status_failure(status, facts, binding)
        if not isinstance(access, str) or not access:
            raise CredentialError("CREDENTIAL_OAUTH_BAD_RESPONSE", f"credential {binding.name!r}: the answer of {where} "
                                  "has no access_token", details={**facts, "status": status})
        given_type = raw.get("token_type")
        token_type = given_type if isinstance(given_type, str) else "Bearer"
        expires_in = raw.get("expires_in")
        assumed = False
        if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool):
            lifetime_ms = int(float(expires_in) * 1000)
        elif isinstance(expires_in, str) and expires_in.strip().lstrip("-").isdigit():
            lifetime_ms = int(expires_in.strip()) * 1000
        elif expires_in is None:
            lifetime_ms, assumed = int(settings.default_lifetime_s * 1000), True
        else:
            raise CredentialError("CREDENTIAL_OAUTH_BAD_RESPONSE", f"credential {binding.name!r}: the answer of {where} "
                                  "has an expires_in that is not a number", details={**facts, "status": status})
        expires_at_ms = sent_ms + lifetime_ms
        now_ms = self._now_ms()
        if expires_at_ms <= now_ms:
            raise CredentialError("CREDENTIAL_EXPIRED", f"credential {binding.name!r}: the token from {where} had "
                                  f"expired when it arrived (lifetime {lifetime_ms} ms); it was not presented",
                                  details={**facts, "expires_in_ms": lifetime_ms})
        margin_ms = min(int(settings.refresh_margin_s * 1000), lifetime_ms // 2)
        scope = " ".join(scopes)
        granted = raw.get("scope")
        if isinstance(granted, str) and granted.strip():  # the server may grant other scopes than asked (RFC 6749 5.1)
            try:
                scope = " ".join(scope_tokens(granted))
            except ValueError:
                pass
        new_refresh = raw.get("refresh_token")
        if client.grant == "refresh_token" and isinstance(new_refresh, str) and new_refresh and new_refresh not in secrets:
            assert client.refresh_token is not None
            with self._lock:
                self._rotated[client.name] = (client.refresh_token.reference, new_refresh)
                self._rotations[client.name] = self._rotations.get(client.name, 0) + 1
        log.debug("oauth2 client %s: new token from %s (grant %s, lifetime %d s%s)", client.name, where, client.grant,
                  lifetime_ms // 1000, ", assumed" if assumed else "")
        return CachedToken(access_token=access, token_type=token_type, scope=scope, cache_key=key, issued_at_ms=sent_ms,
                           expires_at_ms=expires_at_ms, refresh_after_ms=expires_at_ms - margin_ms, expiry_assumed=assumed)

    def _oauth_failure(self, exc: Any, answer: _Answer, secrets: list[str | None], facts: dict[str, Any],
                       binding: CredentialBinding) -> CredentialError:
        status = answer.status[-1] if answer.status else None
        error = oauth_error_code(getattr(exc, "error", None))
        description = scrub(getattr(exc, "description", None), secrets)
        if error in _PERMANENT_ERRORS:
            code = _PERMANENT_ERRORS[error]
        elif error in _TRANSIENT_ERRORS or (status is not None and (status >= 500 or status in _TRANSIENT_STATUS)):
            code = "CREDENTIAL_OAUTH_UNAVAILABLE"
        elif status == 401:
            code = "CREDENTIAL_OAUTH_INVALID_CLIENT"
        else:
            code = "CREDENTIAL_OAUTH_REJECTED"
        said = f"{error or 'an error'}" + (f" ({description})" if description else "")
        return CredentialError(code, f"credential {binding.name!r}: the token endpoint {facts['token_url']} answered "
                               f"{said}" + (f" with HTTP {status}" if status else ""),
                               details={**facts, "status": status, "error": error, "error_description": description})

    def _status_failure(self, status: int, facts: dict[str, Any], binding: CredentialBinding) -> CredentialError:
        if status >= 500 or status in _TRANSIENT_STATUS:
            code = "CREDENTIAL_OAUTH_UNAVAILABLE"
        elif status == 401:
            code = "CREDENTIAL_OAUTH_INVALID_CLIENT"
        elif 400 <= status < 500:
            code = "CREDENTIAL_OAUTH_REJECTED"
        else:
            code = "CREDENTIAL_OAUTH_BAD_RESPONSE"
        return CredentialError(code, f"credential {binding.name!r}: the token endpoint {facts['token_url']} answered HTTP "
                               f"{status}", details={**facts, "status": status})

    def _post_revocation(self, settings: OAuth2Settings, client: Client, token: str) -> int:
        """POST the RFC 7009 request; the HTTP status, or ``CredentialError`` when no answer came."""
        _, _, http = _authlib()
        binding_facts = {"client": client.name, "revocation_url": shown_url(client.revocation_url or "")}
        secret = None
        if client.secret:
            try:
                secret = client.secret.resolve()
            except SchedulerError as exc:
                raise CredentialError("CREDENTIAL_SECRET_UNRESOLVED", f"the client secret of OAuth2 client {client.name!r} "
                                      f"cannot be read: {exc.message}", details=binding_facts) from None
        try:
            with self._oauth_client(settings, client, secret, ()) as oauth:
                response = oauth.revoke_token(client.revocation_url, token=token, token_type_hint="access_token")
                return int(response.status_code)
        except http.TimeoutException:
            raise CredentialError("CREDENTIAL_REVOKE_UNAVAILABLE", f"{binding_facts['revocation_url']} did not answer within "
                                  f"{settings.timeout_s:g} s; the token is not known to be revoked", details=binding_facts) from None
        except http.HTTPError as exc:
            raise CredentialError("CREDENTIAL_REVOKE_UNAVAILABLE", f"{binding_facts['revocation_url']} cannot be reached "
                                  f"({type(exc).__name__}); the token is not known to be revoked", details=binding_facts) from None


@functools.lru_cache(maxsize=8)
def _tls_context(ca_bundle: str | None) -> Any:
    """The TLS verification of the endpoints: the system store, or the configured CA bundle."""
    if ca_bundle is None:
        return True
    import ssl

    return ssl.create_default_context(cafile=ca_bundle)


def _mark(context: CredentialContext, key: str, status: str) -> None:
    """Tell the kernel's session record (when there is one) what became of a session; a failure to record is logged."""
    sessions = getattr(context, "sessions", None)
    if sessions is None:
        return
    try:
        sessions.mark_session("oauth2", key, status)
    except SchedulerError as exc:
        log.warning("oauth2: could not mark session %s %s: %s", key[:19], status, exc.code)


def _same(a: str, b: str | bytes) -> bool:
    """Constant-time comparison of two token values."""
    b_bytes = b if isinstance(b, bytes) else b.encode("utf-8")
    return hmac.compare_digest(a.encode("utf-8"), b_bytes)
