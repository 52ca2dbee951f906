"""The kernel's own settings tables: ``[dispatcher]`` and ``[storage]``.

``scheduler run`` takes its defaults from ``[dispatcher]`` (its flags still win);
the queue reads ``misfire_grace_ms`` and the SQLite store ``sqlite_synchronous``.
"""

from __future__ import annotations

from typing import Literal

import attrs


@attrs.frozen(kw_only=True)
class DispatcherSettings:
    """``[dispatcher]``: defaults of ``scheduler run`` and the misfire threshold of the queue."""

    concurrency: int = attrs.field(default=4, metadata={"minimum": 1, "maximum": 256, "doc": "Runs executed at once (--concurrency)."})
    lease_ttl_ms: int = attrs.field(default=15_000, metadata={
        "minimum": 100, "maximum": 3_600_000, "doc": "Dispatcher lease lifetime in ms, renewed every third of it (--lease-ttl)."})
    grace_s: float = attrs.field(default=10.0, metadata={
        "minimum": 0, "maximum": 86_400, "doc": "On SIGTERM/SIGINT, seconds running work may finish before it is cancelled (--grace)."})
    kill_grace_s: float = attrs.field(default=2.0, metadata={
        "minimum": 0, "maximum": 3600, "doc": "Seconds between SIGTERM and SIGKILL when recovery stops an orphaned process group."})
    misfire_grace_ms: int = attrs.field(default=60_000, metadata={
        "minimum": 0, "doc": "How late (ms) a slot may start before it counts as a misfire (the job's misfire_policy applies)."})


@attrs.frozen(kw_only=True)
class StorageSettings:
    """``[storage]``: how the stores open the database."""

    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = attrs.field(
        default="NORMAL", metadata={"doc": "SQLite `synchronous` pragma of every connection (WAL mode)."})
    sqlite_busy_timeout_ms: int = attrs.field(default=10_000, metadata={
        "minimum": 1, "maximum": 3_600_000, "doc": "How long a SQLite connection waits for another one's lock before DB_BUSY."})
    file_mode: Literal["private", "group"] = attrs.field(default="private", metadata={
        "doc": "Permissions of files and directories the scheduler creates: private 0600/0700, group 0660/2770 (setgid)."})


@attrs.frozen(kw_only=True)
class DeliverySettings:
    """``[delivery]``: how the dispatcher's outbox consumer sends parts through channel plugins."""

    claim_ttl_ms: int = attrs.field(default=60_000, metadata={
        "minimum": 100, "maximum": 3_600_000,
        "doc": "How long a claimed part belongs to one dispatcher; an expired claim (a dead dispatcher) is taken over."})
    retry_base_ms: int = attrs.field(default=2_000, metadata={
        "minimum": 1, "maximum": 86_400_000, "doc": "Backoff before the first retry of a transient failure; doubles per attempt (with jitter)."})
    retry_max_ms: int = attrs.field(default=900_000, metadata={
        "minimum": 1, "maximum": 86_400_000, "doc": "Longest backoff between two attempts (a channel's Retry-After is honoured above it)."})
    max_attempts: int = attrs.field(default=5, metadata={
        "minimum": 1, "maximum": 1000, "doc": "Attempts per part before it is `failed` (set on each new part)."})
    batch: int = attrs.field(default=20, metadata={"minimum": 1, "maximum": 1000, "doc": "Parts claimed per consumer pass."})


#: The kernel tables of the settings file, in display order.
KERNEL_TABLES: dict[str, type] = {"dispatcher": DispatcherSettings, "storage": StorageSettings, "delivery": DeliverySettings}

#: Environment variables read before the settings file existed, and the key that replaced each.
#: Setting one is ``CONFIG_INVALID`` naming the new variable, so an old value is never silently ignored.
RETIRED_ENV: dict[str, str] = {
    "SCHEDULER_MISFIRE_GRACE_MS": "dispatcher.misfire_grace_ms",
    "SCHEDULER_SQLITE_SYNCHRONOUS": "storage.sqlite_synchronous",
    "SCHEDULER_SHELL": "executors.shell.shell",
    "SCHEDULER_SHELL_MAX_OUTPUT_BYTES": "executors.shell.max_output_bytes",
    "SCHEDULER_SHELL_KILL_GRACE_S": "executors.shell.kill_grace_s",
}
