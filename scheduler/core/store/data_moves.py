"""The data moves of particular schema versions: rows rewritten between a migration's column steps.

Each move runs on the store's ``SchemaConnection`` inside the upgrade's write transaction and
finds nothing left to do when run again. v4 binds every job to its native execution artifact,
computed by the live artifact code (``scheduler.core.artifact``), whose digests are pinned, so a
migrated job carries the digest the kernel would compute for it today.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

from scheduler.base.canonical import canonical_json
from scheduler.core.artifact import native_payload
from scheduler.core.spec import spec_from_row
from scheduler.core.store.schema_steps import SchemaConnection

__all__ = ["V3_AGENT_FIELDS", "V3_SHELL_FIELDS", "BindArtifacts", "MoveExecutorFields", "v3_executor_handle", "v3_executor_options"]


#: Executor-specific job columns that v3 moves into ``executor_options`` (old column -> option name).
V3_SHELL_FIELDS = {"shell_env_policy": "env_policy", "working_dir": "working_dir", "stdin_text": "stdin_text"}
V3_AGENT_FIELDS = {"context_mode": "context_mode", "heartbeat_file": "heartbeat_file"}
_V3_DEFAULTS = {"shell_env_policy": "minimal", "context_mode": "isolated"}
_DEFAULT_EXECUTORS = {"shell": "shell", "isolated": "agent", "main": "main-session"}


def v3_executor_options(row: dict[str, Any]) -> str:
    """The ``executor_options`` JSON a v2 job row becomes: its executor's non-default fields under their new names.

    Fields of another executor kind (``context_mode`` on a shell job) were never
    enforced by that executor, so they are not carried over: nothing changes behaviour.
    """
    executor = row.get("executor") or _DEFAULT_EXECUTORS.get(row.get("session_target") or "shell", "shell")
    fields = V3_SHELL_FIELDS if executor == "shell" else V3_AGENT_FIELDS
    options = {}
    for column, option in fields.items():
        value = row.get(column)
        if value is not None and value != _V3_DEFAULTS.get(column):
            options[option] = value
    return json.dumps(options, sort_keys=True)


def v3_executor_handle(row: dict[str, Any]) -> str | None:
    """The ``executor_handle`` JSON of a v2 run row that recorded a process identity."""
    if row.get("pid") is None:
        return None
    owner = row.get("dispatcher_owner")
    return json.dumps({
        "pid": row["pid"], "pgid": row.get("pgid"), "start_time": row.get("process_start_time"),
        "host": owner.split(":", 1)[0] if owner else None,
    }, sort_keys=True)


class MoveExecutorFields(NamedTuple):
    """v3 data move: executor-specific job columns into ``executor_options``, process identity into ``executor_handle``.

    Runs between adding the new columns and dropping the old ones; a second run finds
    the old columns gone and does nothing.
    """

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        if "shell_env_policy" in conn.columns("jobs"):
            cols = ", ".join(["id", "executor", "session_target", *V3_SHELL_FIELDS, *V3_AGENT_FIELDS])
            for row in conn.all(f"SELECT {cols} FROM jobs"):
                conn.execute("UPDATE jobs SET executor_options = ? WHERE id = ?", (v3_executor_options(row), row["id"]))
        if "pid" in conn.columns("runs"):
            for row in conn.all("SELECT id, pid, pgid, process_start_time, dispatcher_owner FROM runs WHERE pid IS NOT NULL"):
                conn.execute("UPDATE runs SET executor_handle = ? WHERE id = ?", (v3_executor_handle(row), row["id"]))


class BindArtifacts(NamedTuple):
    """v4 data move: give every job its native execution artifact, and bind its open work to it.

    Open dispatches and unfinished runs are bound to the job's artifact (they were queued
    for the job as it is); finished runs keep no binding (they predate artifacts).
    """

    def apply(self, conn: SchemaConnection) -> None:
        """Run the step on the caller's open transaction."""
        for job in conn.all("SELECT * FROM jobs WHERE artifact_digest IS NULL"):
            payload = native_payload(spec_from_row(job), job["id"])
            text = canonical_json(payload)
            digest = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
            conn.execute(
                "INSERT INTO execution_artifacts(digest, kind, job_id, payload, payload_bytes, created_at)"
                " VALUES (?, 'native', ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                (digest, job["id"], text, len(text.encode("utf-8")), job["updated_at"]),
            )
            conn.execute("UPDATE jobs SET artifact_digest = ? WHERE id = ?", (digest, job["id"]))
            conn.execute("UPDATE job_dispatch_queue SET artifact_digest = ? WHERE job_id = ? AND artifact_digest IS NULL"
                         " AND status IN ('pending', 'claimed')", (digest, job["id"]))
            conn.execute("UPDATE runs SET artifact_digest = ? WHERE job_id = ? AND artifact_digest IS NULL"
                         " AND status IN ('pending', 'running', 'awaiting_approval', 'approved', 'recovery_blocked')",
                         (digest, job["id"]))
