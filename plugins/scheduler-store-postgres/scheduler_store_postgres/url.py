"""Parsing a ``postgresql://`` URL into what psycopg needs and what the store keeps for itself.

The store understands four query parameters of its own and strips them before the
URL reaches libpq (which would reject unknown keys):

* ``schema``: the PostgreSQL schema all scheduler objects live in (created if missing);
* ``pool_min`` / ``pool_max``: the connection pool size (default 1 and 8);
* ``prepare``: ``on`` (default) or ``off``: whether repeated statements become server-side
  prepared statements (``off`` behind a connection pooler that cannot keep them, such as
  PgBouncer before 1.21 in transaction mode).

Everything else (host lists, ``sslmode``, ``application_name``, ``connect_timeout``...)
is passed through untouched.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import attrs
from scheduler_toolkit.store import redact_url

from scheduler.api import SchedulerError

DEFAULT_POOL_MIN = 1
DEFAULT_POOL_MAX = 8
#: Seconds libpq waits for a server before ``initialize`` fails with phase ``open``.
DEFAULT_CONNECT_TIMEOUT_S = 10
_OWN_PARAMS = ("schema", "pool_min", "pool_max", "prepare")
_SECRET_PARAMS = ("password", "sslpassword")


@attrs.frozen
class ConnSpec:
    """A parsed store URL."""

    #: The URL handed to psycopg/libpq (store parameters removed).
    conninfo: str
    #: The schema named by ``?schema=``, or None to use the server's default ``search_path``.
    schema: str | None
    #: The URL with every password replaced by ``***``: safe for messages and ``doctor``.
    location: str
    pool_min: int = DEFAULT_POOL_MIN
    pool_max: int = DEFAULT_POOL_MAX
    #: ``?prepare=``: repeated statements become server-side prepared statements (``off``: always bound on the client).
    prepare: bool = True
    #: Query keys present in the URL (lets the store add defaults only where the user set none).
    keys: frozenset[str] = frozenset()


def _redact(url: str) -> str:
    """``redact_url`` plus secrets passed as query parameters."""
    parts = urlsplit(redact_url(url))
    if not parts.query:
        return urlunsplit(parts)
    query = [(k, "***" if k in _SECRET_PARAMS else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(query=urlencode(query, safe="*", quote_via=quote)))


def _bad(url: str, message: str) -> SchedulerError:
    location = _redact(url)
    return SchedulerError(
        "DB_INIT_FAILED",
        f"database initialisation failed during open of {location}: {message}",
        details={"phase": "open", "path": location},
    )


def parse_url(url: str) -> ConnSpec:
    """Split a store URL into libpq conninfo, schema name, pool size and a redacted location.

    Raises ``DB_INIT_FAILED`` (phase ``open``) for a URL the store cannot use: wrong
    scheme, an empty schema name, a non-integer or inconsistent pool size, a ``prepare`` other than on or off.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise _bad(url, f"not a PostgreSQL URL (scheme {parts.scheme!r}); use postgresql://")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in _OWN_PARAMS}
    passthrough = [(k, v) for k, v in query if k not in _OWN_PARAMS]
    schema = own.get("schema")
    if schema is not None:
        schema = schema.strip()
        if not schema:
            raise _bad(url, "the schema parameter is empty")
        if len(schema.encode("utf-8")) > 63:
            raise _bad(url, "the schema name is longer than PostgreSQL's 63-byte identifier limit")
    try:
        pool_min = int(own.get("pool_min", DEFAULT_POOL_MIN))
        pool_max = int(own.get("pool_max", max(DEFAULT_POOL_MAX, pool_min)))
    except ValueError:
        raise _bad(url, "pool_min and pool_max must be integers") from None
    if pool_min < 0 or pool_max < 1 or pool_max < pool_min:
        raise _bad(url, f"invalid pool size pool_min={pool_min} pool_max={pool_max}")
    prepare = own.get("prepare", "on").strip().lower()
    if prepare not in ("on", "off"):
        raise _bad(url, f"prepare must be on or off, not {own['prepare']!r}")
    conninfo = urlunsplit(parts._replace(query=urlencode(passthrough, quote_via=quote)))
    return ConnSpec(
        conninfo=conninfo,
        schema=schema,
        location=_redact(url),
        pool_min=pool_min,
        pool_max=pool_max,
        prepare=prepare == "on",
        keys=frozenset(k for k, _ in passthrough),
    )
