"""The one error type of these providers: a ``SchedulerError`` with a stable ``CREDENTIAL_*`` code.

Messages and details name the binding, the reference (a variable name, a path, a
command name) and what is wrong with it; they never carry a credential value, a
command's output or its standard error (which may echo a secret).
"""

from __future__ import annotations

from typing import Any

from scheduler.api import SchedulerError

#: Every code these providers raise, with whether retrying later may help (the README explains each).
CODES: dict[str, bool] = {
    "CREDENTIAL_REF_INVALID": False,
    "CREDENTIAL_REF_DENIED": False,
    "CREDENTIAL_NOT_FOUND": False,
    "CREDENTIAL_EMPTY": False,
    "CREDENTIAL_FILE_INSECURE": False,
    "CREDENTIAL_FILE_TOO_LARGE": False,
    "CREDENTIAL_FILE_UNREADABLE": False,
    "CREDENTIAL_COMMAND_FAILED": False,
    "CREDENTIAL_COMMAND_TIMEOUT": True,
    "CREDENTIAL_COMMAND_OUTPUT_TOO_LARGE": False,
}


class CredentialError(SchedulerError):
    """A credential could not be resolved. ``transient`` (and ``retryable``) say whether a later try may succeed."""

    def __init__(self, code: str, message: str, *, details: dict[str, Any] | None = None) -> None:
        self.transient = CODES.get(code, False)
        super().__init__(code, message, details={**(details or {}), "transient": self.transient})

    @property
    def retryable(self) -> bool:
        """True for failures worth retrying later (a command that timed out)."""
        return self.transient
