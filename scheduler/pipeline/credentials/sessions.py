"""Provider sessions: the kernel's record of what credential providers cache across runs (table ``provider_sessions``).

A credential provider that keeps something between runs (the OAuth2 provider keeps an
access token in the dispatcher's memory until its refresh point) reports each such
*session* through the ``ProviderSessions`` object the kernel puts on
``CredentialContext.sessions``:

* ``record_session(provider, session_key, scopes=, expires_at_ms=, refresh_after_ms=)``
  when it obtained a new value (status ``active``);
* ``mark_session(provider, session_key, status)`` when the session expired, was revoked
  (``revoked``) or a revocation was not confirmed (``revoke_failed``).

Only what cannot carry a secret is stored: the ``session_key`` must be a hash
(``sha256:<64 hex>``, the provider hashes its cache key), scopes must be RFC 6749 scope
tokens, times are integers. Anything else is refused with ``PROVIDER_SESSION_INVALID``
and nothing is written, so a provider bug cannot put a token into the database.

A session is per provider, key and *runtime instance* (the dispatcher process whose
memory holds it): two dispatchers sharing a PostgreSQL database have a row each. The row
id is derived from those three, so recording again updates the row (one upsert, no read).

``StoreProviderSessions`` writes to a store; ``MemoryProviderSessions`` keeps the same
records in memory (the conformance engine and provider tests use it to see what a
provider reports without a database).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core.store.base import Store
from scheduler.plugins.protocols import SESSION_STATUSES

#: What a session key must look like: a SHA-256 digest, never the thing it stands for.
SESSION_KEY = re.compile(r"^sha256:[0-9a-f]{64}$")
#: A credential driver name (as in a binding's ``provider``).
PROVIDER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
#: One RFC 6749 scope token (section 3.3: %x21 / %x23-5B / %x5D-7E), bounded.
SCOPE_TOKEN = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]{1,200}$")
#: At most this many scopes per session, and this many characters in all.
MAX_SCOPES = 64
MAX_SCOPE_CHARS = 2048


@attrs.frozen(kw_only=True)
class SessionRecord:
    """One session as stored (no value, only its hashed key, scopes, times and status)."""

    provider: str
    session_key: str
    runtime_instance: str
    scopes: str
    status: str
    expires_at_ms: int | None
    refresh_after_ms: int | None
    revoked_at_ms: int | None = None


def default_runtime_instance() -> str:
    """This process: ``host:pid`` (a session lives in one process's memory)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def session_id(provider: str, session_key: str, runtime_instance: str) -> str:
    """The row id of a session: derived from provider, key and runtime instance, so recording again is one upsert."""
    digest = hashlib.sha256(f"{provider}\0{session_key}\0{runtime_instance}".encode()).hexdigest()
    return f"ps_{digest[:32]}"


def _invalid(message: str, **details: object) -> SchedulerError:
    return SchedulerError("PROVIDER_SESSION_INVALID", message, details=details or None)


def _check_provider(provider: object) -> str:
    if not isinstance(provider, str) or not PROVIDER_NAME.match(provider):
        raise _invalid("a provider session needs the credential driver's name ([a-z0-9][a-z0-9_.-]{0,63})")
    return provider


def _check_key(provider: str, session_key: object) -> str:
    # The key is never quoted back: a provider that passes a raw token here must not see it in an error either.
    if not isinstance(session_key, str) or not SESSION_KEY.match(session_key):
        raise _invalid(f"provider {provider!r}: a session key must be a hash 'sha256:<64 lowercase hex>' (the kernel "
                       "stores no cache key, token or secret in clear)", provider=provider)
    return session_key


def _check_scopes(provider: str, scopes: object) -> str:
    if scopes is None:
        return ""
    items = scopes.split() if isinstance(scopes, str) else list(scopes) if isinstance(scopes, Iterable) else None
    if items is None or not all(isinstance(s, str) and SCOPE_TOKEN.match(s) for s in items):
        raise _invalid(f"provider {provider!r}: scopes must be RFC 6749 scope tokens (a string or a list of strings)",
                       provider=provider)
    text = " ".join(sorted(set(items)))
    if len(items) > MAX_SCOPES or len(text) > MAX_SCOPE_CHARS:
        raise _invalid(f"provider {provider!r}: at most {MAX_SCOPES} scopes and {MAX_SCOPE_CHARS} characters",
                       provider=provider)
    return text


def _check_time(provider: str, what: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _invalid(f"provider {provider!r}: {what} must be epoch milliseconds (a non-negative integer) or None",
                       provider=provider)
    return value


def _check_status(provider: str, status: object) -> str:
    if not isinstance(status, str) or status not in SESSION_STATUSES:
        raise _invalid(f"provider {provider!r}: session status must be one of {', '.join(SESSION_STATUSES)}",
                       provider=provider, status=status if isinstance(status, str) and len(status) <= 32 else None)
    return status


def checked_record(provider: object, session_key: object, *, scopes: object, expires_at_ms: object,
                   refresh_after_ms: object, runtime_instance: str) -> SessionRecord:
    """Validate what a provider reports and return the record to store; ``PROVIDER_SESSION_INVALID`` otherwise."""
    name = _check_provider(provider)
    return SessionRecord(provider=name, session_key=_check_key(name, session_key), runtime_instance=runtime_instance,
                         scopes=_check_scopes(name, scopes), status="active",
                         expires_at_ms=_check_time(name, "expires_at_ms", expires_at_ms),
                         refresh_after_ms=_check_time(name, "refresh_after_ms", refresh_after_ms))


class StoreProviderSessions:
    """``ProviderSessions`` on a store: each call is one short write transaction of its own."""

    def __init__(self, store: Store, *, runtime_instance: str | None = None, clock: Callable[[], int] = now_ms) -> None:
        """``runtime_instance`` names the process whose memory holds the sessions (default ``host:pid``)."""
        self._store = store
        self.runtime_instance = runtime_instance or default_runtime_instance()
        self._clock = clock

    def record_session(self, provider: str, session_key: str, *, scopes: object = (), expires_at_ms: int | None = None,
                       refresh_after_ms: int | None = None) -> str:
        """Insert or renew the session row (status ``active``, new times and scopes); returns its id."""
        record = checked_record(provider, session_key, scopes=scopes, expires_at_ms=expires_at_ms,
                                refresh_after_ms=refresh_after_ms, runtime_instance=self.runtime_instance)
        row_id = session_id(record.provider, record.session_key, record.runtime_instance)
        at = self._clock()
        with self._store.transaction() as tx:
            tx.execute(
                "INSERT INTO provider_sessions (id, provider, session_key, runtime_instance, expires_at, created_at, updated_at,"
                " scopes, status, refresh_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active', ?)"
                " ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at, updated_at = excluded.updated_at,"
                " scopes = excluded.scopes, status = 'active', refresh_after = excluded.refresh_after, revoked_at = NULL",
                (row_id, record.provider, record.session_key, record.runtime_instance, record.expires_at_ms, at, at,
                 record.scopes, record.refresh_after_ms),
            )
        return row_id

    def mark_session(self, provider: str, session_key: str, status: str) -> bool:
        """Set the session's status (``revoked`` also stamps ``revoked_at``); False when this process has no such session."""
        name = _check_provider(provider)
        key = _check_key(name, session_key)
        status = _check_status(name, status)
        at = self._clock()
        with self._store.transaction() as tx:
            changed = tx.execute(
                "UPDATE provider_sessions SET status = ?, updated_at = ?,"
                " revoked_at = CASE WHEN ? = 'revoked' THEN ? ELSE revoked_at END WHERE id = ?",
                (status, at, status, at, session_id(name, key, self.runtime_instance)),
            )
        return bool(changed)


class MemoryProviderSessions:
    """``ProviderSessions`` in memory, with the same checks (conformance runs and provider tests)."""

    def __init__(self, *, runtime_instance: str = "memory") -> None:
        """An empty record; ``records`` maps ``(provider, session_key)`` to the current ``SessionRecord``."""
        self.runtime_instance = runtime_instance
        self.records: dict[tuple[str, str], SessionRecord] = {}
        self.calls: list[tuple[str, str, str]] = []  # (method, provider, status) in order
        self._lock = threading.Lock()

    def record_session(self, provider: str, session_key: str, *, scopes: object = (), expires_at_ms: int | None = None,
                       refresh_after_ms: int | None = None) -> str:
        """Keep the checked record (status ``active``); returns the id a store would use."""
        record = checked_record(provider, session_key, scopes=scopes, expires_at_ms=expires_at_ms,
                                refresh_after_ms=refresh_after_ms, runtime_instance=self.runtime_instance)
        with self._lock:
            self.records[(record.provider, record.session_key)] = record
            self.calls.append(("record", record.provider, "active"))
        return session_id(record.provider, record.session_key, record.runtime_instance)

    def mark_session(self, provider: str, session_key: str, status: str) -> bool:
        """Change the status of a recorded session; False when there is none."""
        name = _check_provider(provider)
        key = _check_key(name, session_key)
        status = _check_status(name, status)
        with self._lock:
            self.calls.append(("mark", name, status))
            old = self.records.get((name, key))
            if old is None:
                return False
            self.records[(name, key)] = attrs.evolve(old, status=status,
                                                     revoked_at_ms=now_ms() if status == "revoked" else old.revoked_at_ms)
        return True

    def statuses(self) -> list[str]:
        """The status of every recorded session."""
        with self._lock:
            return [r.status for r in self.records.values()]


__all__ = [
    "SESSION_KEY",
    "MemoryProviderSessions",
    "SessionRecord",
    "StoreProviderSessions",
    "checked_record",
    "default_runtime_instance",
    "session_id",
]
