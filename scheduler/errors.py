"""The one error type the kernel raises for anything a user or plugin can cause, and the code registry.

Every error carries a stable ``UPPER_SNAKE`` code; the CLI turns it into
``{"ok": false, "error": ..., "code": ...}`` and a non-zero exit. ``ErrorCode`` is
the registry of every code the kernel itself uses: docs/cli.md explains each one,
and a test fails when a documented code is not registered, a registered code is
not documented, or kernel code raises a literal code that is not registered.
Plugins raise their own codes (documented in their READMEs).
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(str, enum.Enum):
    """Every error code the kernel raises or records. ``kind`` says where users meet it."""

    # -- CLI errors: the ``code`` of an ``{"ok": false}`` object --------------------------------
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    INVALID_JSON = "INVALID_JSON"
    PAYLOAD_READ_FAILED = "PAYLOAD_READ_FAILED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    VALIDATION_FAILED = "VALIDATION_FAILED"
    NOT_FOUND = "NOT_FOUND"
    NAME_CONFLICT = "NAME_CONFLICT"
    CHAIN_CYCLE = "CHAIN_CYCLE"
    CHAIN_TOO_DEEP = "CHAIN_TOO_DEEP"
    CHAIN_FANOUT_EXCEEDED = "CHAIN_FANOUT_EXCEEDED"
    JOB_HAS_CHILDREN = "JOB_HAS_CHILDREN"
    JOB_ALREADY_RUNNING = "JOB_ALREADY_RUNNING"
    JOB_DISABLED = "JOB_DISABLED"
    RUN_ALREADY_FINISHED = "RUN_ALREADY_FINISHED"
    INVALID_CRON = "INVALID_CRON"
    INVALID_TIMEZONE = "INVALID_TIMEZONE"
    INVALID_DURATION = "INVALID_DURATION"
    INVALID_TIME = "INVALID_TIME"
    INVALID_SCHEDULE = "INVALID_SCHEDULE"
    INVALID_CONDITION = "INVALID_CONDITION"
    DB_INIT_FAILED = "DB_INIT_FAILED"
    DB_BUSY = "DB_BUSY"
    CONSTRAINT_VIOLATION = "CONSTRAINT_VIOLATION"
    DISPATCHER_ALREADY_RUNNING = "DISPATCHER_ALREADY_RUNNING"
    LEASE_LOST = "LEASE_LOST"
    STALE_FENCE = "STALE_FENCE"
    UNHEALTHY = "UNHEALTHY"
    PROCESS_GROUP_SURVIVED = "PROCESS_GROUP_SURVIVED"
    ARTIFACT_MISSING = "ARTIFACT_MISSING"
    ARTIFACT_TAMPERED = "ARTIFACT_TAMPERED"
    ARTIFACT_PATH_INVALID = "ARTIFACT_PATH_INVALID"
    OUTPUT_FORMAT_UNKNOWN = "OUTPUT_FORMAT_UNKNOWN"
    STRUCTURED_INPUT_INVALID = "STRUCTURED_INPUT_INVALID"
    CONFIG_INVALID = "CONFIG_INVALID"
    SECRET_UNRESOLVED = "SECRET_UNRESOLVED"
    PLUGIN_NOT_FOUND = "PLUGIN_NOT_FOUND"
    PLUGIN_LOAD_FAILED = "PLUGIN_LOAD_FAILED"
    PLUGIN_API_MISMATCH = "PLUGIN_API_MISMATCH"
    PLUGIN_INVALID = "PLUGIN_INVALID"
    EXECUTOR_NOT_AVAILABLE = "EXECUTOR_NOT_AVAILABLE"
    CHANNEL_NOT_AVAILABLE = "CHANNEL_NOT_AVAILABLE"
    EVIDENCE_NOT_AVAILABLE = "EVIDENCE_NOT_AVAILABLE"
    CREDENTIAL_NOT_AVAILABLE = "CREDENTIAL_NOT_AVAILABLE"
    AUTHORIZATION_NOT_AVAILABLE = "AUTHORIZATION_NOT_AVAILABLE"
    CONFORMANCE_KIND_UNKNOWN = "CONFORMANCE_KIND_UNKNOWN"
    CONFORMANCE_KIND_UNSUPPORTED = "CONFORMANCE_KIND_UNSUPPORTED"
    CONFORMANCE_NO_CASES = "CONFORMANCE_NO_CASES"
    CONFORMANCE_NO_PROVIDER = "CONFORMANCE_NO_PROVIDER"
    CONFORMANCE_FIXTURES_NOT_FOUND = "CONFORMANCE_FIXTURES_NOT_FOUND"
    CONFORMANCE_FIXTURE_INVALID = "CONFORMANCE_FIXTURE_INVALID"
    CONFORMANCE_NO_PAYLOAD_ADAPTER = "CONFORMANCE_NO_PAYLOAD_ADAPTER"
    CONFORMANCE_ADAPTER_INVALID = "CONFORMANCE_ADAPTER_INVALID"
    CONFORMANCE_FAILED = "CONFORMANCE_FAILED"
    CANONICAL_INTEGER_UNSAFE = "CANONICAL_INTEGER_UNSAFE"
    CANONICAL_NUMBER_INVALID = "CANONICAL_NUMBER_INVALID"
    CANONICAL_TYPE_UNSUPPORTED = "CANONICAL_TYPE_UNSUPPORTED"
    CANONICAL_TOO_DEEP = "CANONICAL_TOO_DEEP"
    CANONICAL_KEY_UNSUPPORTED = "CANONICAL_KEY_UNSUPPORTED"
    JOB_ID_CONFLICT = "JOB_ID_CONFLICT"
    APPROVAL_CONFLICT = "APPROVAL_CONFLICT"
    APPROVAL_SCOPE_MISMATCH = "APPROVAL_SCOPE_MISMATCH"
    APPROVAL_AMBIGUOUS = "APPROVAL_AMBIGUOUS"
    HANDOFF_ARTIFACT_INVALID = "HANDOFF_ARTIFACT_INVALID"
    HANDOFF_ARTIFACT_DIGEST_MISMATCH = "HANDOFF_ARTIFACT_DIGEST_MISMATCH"
    HANDOFF_ARTIFACT_BINDING_MISMATCH = "HANDOFF_ARTIFACT_BINDING_MISMATCH"
    HANDOFF_ARTIFACT_MISMATCH = "HANDOFF_ARTIFACT_MISMATCH"
    HANDOFF_ARTIFACT_DOWNGRADE_REFUSED = "HANDOFF_ARTIFACT_DOWNGRADE_REFUSED"
    HANDOFF_ARTIFACT_UNSUPPORTED = "HANDOFF_ARTIFACT_UNSUPPORTED"
    HANDOFF_ARTIFACT_MISSING = "HANDOFF_ARTIFACT_MISSING"
    HANDOFF_ARTIFACT_REQUIRED = "HANDOFF_ARTIFACT_REQUIRED"
    INTERRUPTED = "INTERRUPTED"
    INTERNAL_ERROR = "INTERNAL_ERROR"

    # -- field codes: ``details`` of ``VALIDATION_FAILED`` (one per field problem) ---------------
    REQUIRED = "REQUIRED"
    UNKNOWN_FIELD = "UNKNOWN_FIELD"
    FIELD_MOVED = "FIELD_MOVED"
    INVALID_TYPE = "INVALID_TYPE"
    INVALID_CHOICE = "INVALID_CHOICE"
    INVALID_VALUE = "INVALID_VALUE"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    TOO_LARGE = "TOO_LARGE"
    CONFLICT = "CONFLICT"
    AT_IN_PAST = "AT_IN_PAST"
    PATH_TRAVERSAL = "PATH_TRAVERSAL"
    INVALID_SCOPE = "INVALID_SCOPE"
    CONSTRAINT_UNENFORCEABLE = "CONSTRAINT_UNENFORCEABLE"
    RAW_CREDENTIAL = "RAW_CREDENTIAL"

    # -- run codes: ``error_code`` recorded on runs by the kernel --------------------------------
    EXECUTOR_CRASHED = "EXECUTOR_CRASHED"
    EXECUTOR_INVALID_RESULT = "EXECUTOR_INVALID_RESULT"
    EXECUTOR_DEADLINE_EXCEEDED = "EXECUTOR_DEADLINE_EXCEEDED"
    EXECUTOR_ABANDONED = "EXECUTOR_ABANDONED"
    DISPATCHER_LOST = "DISPATCHER_LOST"
    RECOVERY_BLOCKED = "RECOVERY_BLOCKED"
    COMPLETION_FAILED = "COMPLETION_FAILED"
    EXECUTOR_OPTIONS_INVALID = "EXECUTOR_OPTIONS_INVALID"
    EXECUTION_ARTIFACT_MISSING = "EXECUTION_ARTIFACT_MISSING"
    EXECUTION_ARTIFACT_TAMPERED = "EXECUTION_ARTIFACT_TAMPERED"
    EXECUTION_ARTIFACT_MISMATCH = "EXECUTION_ARTIFACT_MISMATCH"
    APPROVAL_REJECTED = "APPROVAL_REJECTED"
    APPROVAL_TIMED_OUT = "APPROVAL_TIMED_OUT"

    def __str__(self) -> str:
        return self.value


#: Where users meet each code: ``cli`` (an ``{"ok": false}`` object), ``field`` (a
#: ``VALIDATION_FAILED`` detail) or ``run`` (a run's ``error_code``). A code used in
#: several places is listed under the first.
_FIELD_CODES = frozenset({
    "REQUIRED", "UNKNOWN_FIELD", "FIELD_MOVED", "INVALID_TYPE", "INVALID_CHOICE", "INVALID_VALUE", "OUT_OF_RANGE",
    "TOO_LARGE", "CONFLICT", "AT_IN_PAST", "PATH_TRAVERSAL", "INVALID_SCOPE", "CONSTRAINT_UNENFORCEABLE", "RAW_CREDENTIAL",
})
_RUN_CODES = frozenset({
    "EXECUTOR_CRASHED", "EXECUTOR_INVALID_RESULT", "EXECUTOR_DEADLINE_EXCEEDED", "EXECUTOR_ABANDONED",
    "DISPATCHER_LOST", "RECOVERY_BLOCKED", "COMPLETION_FAILED", "EXECUTOR_OPTIONS_INVALID",
    "EXECUTION_ARTIFACT_MISSING", "EXECUTION_ARTIFACT_TAMPERED", "EXECUTION_ARTIFACT_MISMATCH", "APPROVAL_REJECTED",
    "APPROVAL_TIMED_OUT",
})


def code_kind(code: ErrorCode | str) -> str:
    """``cli``, ``field`` or ``run``: the table of docs/cli.md that explains ``code``."""
    value = str(code)
    return "field" if value in _FIELD_CODES else "run" if value in _RUN_CODES else "cli"


class SchedulerError(Exception):
    """An expected failure with a stable machine-readable code."""

    def __init__(self, code: ErrorCode | str, message: str, *, details: Any = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message
        self.details = details
        self.exit_code = exit_code

    @property
    def retryable(self) -> bool:
        """Whether trying the same thing again later may succeed (a busy database, not a broken one)."""
        return self.code == ErrorCode.DB_BUSY.value

    def to_json(self) -> dict[str, Any]:
        """The JSON error object the CLI prints on stdout."""
        out: dict[str, Any] = {"ok": False, "error": self.message, "code": self.code}
        if self.details is not None:
            out["details"] = self.details
        return out

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"SchedulerError({self.code!r}, {self.message!r})"
