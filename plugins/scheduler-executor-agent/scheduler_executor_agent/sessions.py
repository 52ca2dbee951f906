"""``context_mode=session``: a job's conversation, kept per session key and bounded.

The kernel has no place yet where a plugin keeps per-job state inside the scheduler's
database (committed with the run); until it has, conversations live behind the small
``ConversationStore`` interface, implemented here by ``FileConversationStore`` (one JSON
file per session key under the state directory, 0600, replaced atomically under a lock).

Only **finished** turns are resumed. A run's turn is *staged* in memory when the executor
returns ``ok``; the hook module (``scheduler_executor_agent.hooks``) promotes it into the
conversation once the kernel has committed the run as ``ok`` and drops it for any other
final status (cancellation won, the lease was lost, a failed run's half turn). Staging
lives in the dispatcher process that ran the turn, which is the process that commits it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

Message = dict[str, str]


class ConversationStore(Protocol):
    """Where finished turns of a session live (swap in a kernel-backed store once the kernel has one)."""

    def load(self, key: str) -> list[Message]:
        """The messages of the finished turns of ``key``, oldest first (empty when none)."""

    def append(self, key: str, messages: list[Message]) -> None:
        """Add one finished turn (its user and assistant messages), trimming the oldest turns to the bounds."""


def _turns(messages: list[Message]) -> list[list[Message]]:
    """Messages grouped into turns: each starts at a user message."""
    turns: list[list[Message]] = []
    for message in messages:
        if message.get("role") == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def _size(messages: list[Message]) -> int:
    return sum(len(m.get("content", "").encode("utf-8")) for m in messages)


def trim(messages: list[Message], *, max_turns: int, max_bytes: int) -> list[Message]:
    """Keep the newest turns within ``max_turns`` and ``max_bytes`` (whole turns only; the newest always stays)."""
    turns = _turns(messages)[-max_turns:]
    while len(turns) > 1 and sum(_size(t) for t in turns) > max_bytes:
        turns.pop(0)
    return [m for t in turns for m in t]


class FileConversationStore:
    """Conversations as files: ``<dir>/sessions/<sha256(key)>.json``, private to the scheduler's user."""

    def __init__(self, directory: Path, *, max_turns: int, max_bytes: int) -> None:
        self.directory = Path(directory) / "sessions"
        self.max_turns = max_turns
        self.max_bytes = max_bytes

    def _path(self, key: str) -> Path:
        return self.directory / (hashlib.sha256(key.encode("utf-8")).hexdigest()[:40] + ".json")

    def load(self, key: str) -> list[Message]:
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            return []  # an unreadable conversation starts afresh rather than failing every run
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("messages"), list):
            return []
        return [m for m in data["messages"] if isinstance(m, dict) and isinstance(m.get("content"), str)]

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(str(self._path(key)) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def append(self, key: str, messages: list[Message]) -> None:
        with self._locked(key):
            current = self.load(key) + list(messages)
            kept = trim(current, max_turns=self.max_turns, max_bytes=self.max_bytes)
            path = self._path(key)
            tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"key": key, "updated_at": int(time.time() * 1000), "turns": len(_turns(kept)),
                           "messages": kept}, fh)
            os.replace(tmp, path)


# -- staging: turns waiting for their run's commit ----------------------------------------------

_STAGED: OrderedDict[str, tuple[ConversationStore, str, list[Message]]] = OrderedDict()
_STAGED_LOCK = threading.Lock()
#: Staged turns kept at most (a run whose end is never committed here must not hold memory forever).
MAX_STAGED = 1024


def stage(run_id: str, store: ConversationStore, key: str, messages: list[Message]) -> None:
    """Hold a finished turn until the kernel commits its run (``settle``)."""
    with _STAGED_LOCK:
        _STAGED[run_id] = (store, key, messages)
        while len(_STAGED) > MAX_STAGED:
            _STAGED.popitem(last=False)


def settle(run_id: str, status: str) -> bool:
    """The run's final status is committed: promote its staged turn when ``ok``, drop it otherwise.

    Returns True when a turn was appended to its conversation.
    """
    with _STAGED_LOCK:
        staged = _STAGED.pop(run_id, None)
    if staged is None or status != "ok":
        return False
    store, key, messages = staged
    store.append(key, messages)
    return True


def staged_run_ids() -> list[str]:
    """Runs whose turn waits for its commit (for tests and diagnostics)."""
    with _STAGED_LOCK:
        return list(_STAGED)


def session_key(agent_id: str, job_id: str) -> str:
    """The Gateway's session key of a job's turns: ``agent:<agent_id>:scheduler:<job_id>``."""
    return f"agent:{agent_id}:scheduler:{job_id}"


def describe(messages: list[Message]) -> dict[str, Any]:
    """Size of a resumed history, for the run's details."""
    return {"history_turns": len(_turns(messages)), "history_bytes": _size(messages)}
