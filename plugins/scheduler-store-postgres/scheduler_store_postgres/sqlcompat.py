"""Making the kernel's portable SQL behave on PostgreSQL as it does on SQLite.

Kernel SQL is written once with ``?`` placeholders and tested on SQLite. Here:

* ``?`` outside quotes and comments becomes psycopg's ``%s`` (every literal ``%``
  doubled first, since psycopg scans the whole string);
* parameters are adapted: ``bool`` becomes ``0``/``1`` (booleans are INTEGER columns);
* ``numeric`` results (``SUM``/``AVG`` of integers) load as ``int`` when integral and
  ``float`` otherwise, as SQLite returns them, instead of ``Decimal``;
* database errors become the kernel's codes: integrity errors (unique, check, foreign
  key and the guard triggers, which raise SQLSTATE 23000) ``CONSTRAINT_VIOLATION``;
  serialization failures and deadlocks ``DB_CONFLICT``; lost connections and pool
  time-outs ``DB_UNAVAILABLE``. Anything else (a syntax error) is a bug and propagates.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.adapt import Loader
from psycopg.types.numeric import Int8BinaryDumper

from scheduler.api import SchedulerError


@lru_cache(maxsize=2048)
def translate_placeholders(sql: str) -> tuple[str, int]:
    """``?`` → ``%s`` outside string literals, quoted identifiers, comments and dollar quotes.

    Every ``%`` is doubled, wherever it is, because psycopg interprets ``%`` in the
    whole query string once parameters are passed. Returns the query and the number
    of placeholders found. Cached: the kernel reuses a small set of statements.
    """
    out: list[str] = []
    count = 0
    i = 0
    n = len(sql)
    while i < n:
        ch = sql[i]
        if ch == "%":
            out.append("%%")
            i += 1
        elif ch == "?":
            out.append("%s")
            count += 1
            i += 1
        elif ch in ("'", '"'):
            end = i + 1
            while end < n:
                if sql[end] == ch:
                    if end + 1 < n and sql[end + 1] == ch:  # doubled quote escapes itself
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i : end + 1].replace("%", "%%"))
            i = end + 1
        elif ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "$":
            tag_end = sql.find("$", i + 1)
            tag = sql[i : tag_end + 1] if tag_end > 0 else ""
            if tag and (tag == "$$" or tag[1:-1].replace("_", "a").isalnum()) and not tag[1].isdigit():
                close = sql.find(tag, tag_end + 1)
                end = n if close < 0 else close + len(tag)
                out.append(sql[i:end].replace("%", "%%"))
                i = end
            else:
                out.append(ch)
                i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out), count


def adapt_params(params: Sequence[Any]) -> list[Any]:
    """Parameters as PostgreSQL should see them: ``True``/``False`` become ``1``/``0``."""
    return [int(p) if isinstance(p, bool) else p for p in params]


def prepare(sql: str, params: Sequence[Any] | None) -> tuple[str, list[Any] | None]:
    """The (query, params) pair to hand to psycopg for kernel SQL and its parameters.

    Without parameters the query goes through untouched (psycopg does not interpret
    ``%`` then), so a parameterless statement is byte-for-byte what the kernel wrote.
    """
    if not params:
        return sql, None
    query, _count = translate_placeholders(sql)
    return query, adapt_params(params)


#: Parameter type OIDs sent with server-side binding, by Python type (``register_loaders`` dumps every ``int`` as
#: ``int8``): ``str`` and ``None`` go untyped (0), so the server infers their types from the context, as it does for
#: the quoted literals of client-side binding.
_SERVER_OIDS: dict[type, int] = {str: 0, type(None): 0, int: 20, bytes: 17}
_INT8_MIN, _INT8_MAX = -(2**63), 2**63 - 1
_NUMBERED = re.compile(r"%([%s])")


def server_signature(args: Sequence[Any] | None) -> tuple[int, ...] | None:
    """The parameter type OIDs server-side binding would send for ``args``, or None when it should not be used.

    Only ``str``, ``None``, ``int`` (within ``int8``) and ``bytes`` values qualify: for them a parameter is typed as
    the literal client-side binding would write (a float would be ``float8`` instead of the literal's ``numeric``).
    """
    if not args:
        return ()
    oids = []
    for value in args:
        oid = _SERVER_OIDS.get(type(value))
        if oid is None or (oid == 20 and not _INT8_MIN <= value <= _INT8_MAX):
            return None
        oids.append(oid)
    return tuple(oids)


@lru_cache(maxsize=2048)
def numbered_placeholders(query: str, has_params: bool) -> str:
    """A ``prepare``d query as the server parses it: ``%s`` becomes ``$1``, ``$2``... and ``%%`` becomes ``%``."""
    if not has_params:
        return query
    count = 0

    def sub(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(1) == "%":
            return "%"
        count += 1
        return f"${count}"

    return _NUMBERED.sub(sub, query)


class IntOrFloatNumericLoader(Loader):
    """Load ``numeric`` text as ``int`` when integral, else ``float`` (SQLite's result types)."""

    def load(self, data: Any) -> int | float | None:
        """Parse one ``numeric`` value from its text form."""
        text = bytes(data).decode("ascii")
        if text.lstrip("-").isdigit():
            return int(text)
        return float(text)


def register_loaders(conn: psycopg.Connection[Any]) -> None:
    """Install the SQLite-compatible loaders on a connection (called for every pooled connection).

    Integers bound on the server go as ``int8`` (client-side literals are unaffected): one prepared statement per
    query whatever the values' sizes, and ``? + ?`` cannot overflow a ``smallint``.
    """
    conn.adapters.register_loader("numeric", IntOrFloatNumericLoader)
    conn.adapters.register_dumper(int, Int8BinaryDumper)


def error_message(exc: psycopg.Error) -> str:
    """The server's primary message (without CONTEXT lines), or the exception text."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    detail = getattr(diag, "message_detail", None) if diag is not None else None
    message = primary or str(exc).strip()
    return f"{message} ({detail})" if detail else message


def translate_error(exc: BaseException) -> SchedulerError | None:
    """The kernel error for a psycopg error, or None when it should propagate unchanged."""
    if isinstance(exc, SchedulerError) or not isinstance(exc, psycopg.Error):
        return None
    if isinstance(exc, (psycopg.IntegrityError, pg_errors.RaiseException)):
        return SchedulerError("CONSTRAINT_VIOLATION", error_message(exc), details={"sqlstate": exc.sqlstate})
    if isinstance(exc, (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.LockNotAvailable)):
        return SchedulerError("DB_CONFLICT", error_message(exc), details={"sqlstate": exc.sqlstate})
    if isinstance(exc, psycopg.OperationalError):
        return SchedulerError(
            "DB_UNAVAILABLE", f"PostgreSQL unavailable: {error_message(exc)}", details={"sqlstate": exc.sqlstate}
        )
    return None
