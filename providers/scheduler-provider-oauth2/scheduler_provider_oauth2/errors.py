"""Stable ``CREDENTIAL_*`` codes of the OAuth 2.0 provider, each permanent or transient, and the error type.

Nothing secret ever reaches a message or ``details``: messages are built from this
package's own text, the client name, the token endpoint without its query, the HTTP
status and the server's ``error`` code. The server's ``error_description`` is shown only
after every known secret has been cut out of it, and it is trimmed to printable ASCII and
200 characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from scheduler.api import SchedulerError

#: code -> transient (a later try may succeed). The README explains each.
CODES: dict[str, bool] = {
    "CREDENTIAL_NOT_FOUND": False,            # the binding names no configured client
    "CREDENTIAL_OPTIONS_INVALID": False,      # the binding's options do not validate
    "CREDENTIAL_SCOPE_NOT_ALLOWED": False,    # the binding asks for a scope the client is not configured for
    "CREDENTIAL_SECRET_UNRESOLVED": False,    # the client secret / refresh token reference cannot be read
    "CREDENTIAL_OAUTH_INVALID_CLIENT": False,  # invalid_client, unauthorized_client, HTTP 401
    "CREDENTIAL_OAUTH_INVALID_GRANT": False,   # invalid_grant (refresh token expired, revoked, reused)
    "CREDENTIAL_OAUTH_INVALID_SCOPE": False,   # invalid_scope
    "CREDENTIAL_OAUTH_REJECTED": False,        # any other error answer (invalid_request, unsupported_grant_type, 4xx)
    "CREDENTIAL_OAUTH_BAD_RESPONSE": False,    # 2xx that is not a usable token (not JSON, no access_token, bad expires_in)
    "CREDENTIAL_OAUTH_UNAVAILABLE": True,      # 5xx, 429, 408, temporarily_unavailable, timeout, connection failure
    "CREDENTIAL_EXPIRED": False,               # the token was already expired when it arrived (never presented)
}

#: ``RevokeResult.reason`` codes (a revocation never raises).
REVOKE_CODES: dict[str, bool] = {
    "CREDENTIAL_REVOKE_UNSUPPORTED": False,    # the client has no revocation_url
    "CREDENTIAL_REVOKE_REJECTED": False,       # 4xx: invalid_client, unsupported_token_type, ...
    "CREDENTIAL_REVOKE_UNAVAILABLE": True,     # 5xx, 429, timeout, connection failure
    "CREDENTIAL_REVOKE_INDETERMINATE": False,  # anything else (a redirect, 1xx): not known to be revoked
    "CREDENTIAL_NOT_FOUND": False,
    "CREDENTIAL_SECRET_UNRESOLVED": False,
}

_ERROR_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class CredentialError(SchedulerError):
    """A token could not be had. ``transient`` (and ``retryable``) say whether trying later may help."""

    def __init__(self, code: str, message: str, *, details: dict[str, Any] | None = None) -> None:
        self.transient = CODES.get(code, REVOKE_CODES.get(code, False))
        super().__init__(code, message, details={**(details or {}), "transient": self.transient})

    @property
    def retryable(self) -> bool:
        """True for failures worth retrying later (the endpoint was unavailable)."""
        return self.transient


def oauth_error_code(value: Any) -> str | None:
    """The server's ``error`` member when it looks like an RFC 6749 error code, else None."""
    return value if isinstance(value, str) and _ERROR_CODE.match(value) else None


def scrub(text: Any, secrets: Iterable[str | None], limit: int = 200) -> str | None:
    """Server-supplied text made safe to show: known secrets cut out, printable ASCII, at most ``limit`` characters."""
    if not isinstance(text, str) or not text:
        return None
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "[REDACTED]")
    text = "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
