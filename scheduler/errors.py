"""The one error type the kernel raises for anything a user or plugin can cause.

Every error carries a stable ``UPPER_SNAKE`` code; the CLI turns it into
``{"ok": false, "error": ..., "code": ...}`` and a non-zero exit.
"""

from __future__ import annotations

from typing import Any


class SchedulerError(Exception):
    """An expected failure with a stable machine-readable code."""

    def __init__(self, code: str, message: str, *, details: Any = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
        self.exit_code = exit_code

    def to_json(self) -> dict[str, Any]:
        """The JSON error object the CLI prints on stdout."""
        out: dict[str, Any] = {"ok": False, "error": self.message, "code": self.code}
        if self.details is not None:
            out["details"] = self.details
        return out

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"SchedulerError({self.code!r}, {self.message!r})"
