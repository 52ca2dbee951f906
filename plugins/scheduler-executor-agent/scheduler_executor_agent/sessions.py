"""``context_mode=session``: a job's conversation, kept by the kernel as this executor's state for the job.

The conversation travels with the run: the kernel hands the state the executor kept after
the job's last ``ok`` run as ``ExecutionRequest.state``, and a successful turn returns the
updated conversation as ``ExecutionResult.state``. The kernel keeps it in its own database
(``executor_state``), in the transaction that commits the run ``ok``, so only **finished**
turns are ever resumed: a failed run's half turn, a cancellation that won or a lost lease
commit no state, and the next run sees the conversation as it was. Being in the scheduler's
database, a session survives a crash and is shared by every dispatcher of that database
(PostgreSQL included).

The state is ``{"version": 1, "session_key": ..., "turns": n, "messages": [...]}``, bounded
by ``session_max_turns`` and ``session_max_bytes`` (oldest whole turns trimmed; the newest
always stays) and, whatever the settings, by the kernel's limit of a kept state
(``MAX_EXECUTOR_STATE_BYTES`` of JSON): a turn that alone would pass it is shortened.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Message = dict[str, str]

#: Version of the state this module writes (a state of another version starts afresh).
STATE_VERSION = 1
#: The kernel's limit of a kept state (``scheduler.core.execution.MAX_EXECUTOR_STATE_BYTES``, not exported by
#: ``scheduler.api`` or the toolkit): a larger state is refused and the previous one stays, so the session would stop advancing.
MAX_EXECUTOR_STATE_BYTES = 1024 * 1024
#: JSON bytes a kept conversation may use: the kernel's limit less room for the envelope.
STATE_BUDGET_BYTES = MAX_EXECUTOR_STATE_BYTES - 4096
_ROLES = frozenset({"user", "assistant"})
_CUT_MARK = "\n[shortened to fit the session state]"


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


def _json_size(value: Any) -> int:
    """Bytes of ``value`` as the kernel measures a kept state (``json.dumps``, ASCII escapes)."""
    return len(json.dumps(value, sort_keys=True).encode("utf-8"))


def trim(messages: list[Message], *, max_turns: int, max_bytes: int) -> list[Message]:
    """Keep the newest turns within ``max_turns`` and ``max_bytes`` (whole turns only; the newest always stays)."""
    turns = _turns(messages)[-max_turns:]
    while len(turns) > 1 and sum(_size(t) for t in turns) > max_bytes:
        turns.pop(0)
    return [m for t in turns for m in t]


def _shorten(turn: list[Message], budget: int) -> list[Message]:
    """One turn cut down (longest message first, marked) until its JSON fits ``budget`` bytes."""
    turn = [dict(m) for m in turn]
    while _json_size(turn) > budget:
        longest = max(turn, key=lambda m: len(m.get("content", "")))
        content = longest.get("content", "")
        if not content or content == _CUT_MARK:
            break
        excess = _json_size(turn) - budget
        body = content.removesuffix(_CUT_MARK)
        # a character is at most 12 JSON bytes (an escaped surrogate pair): cutting excess/12 + 64 always makes progress
        keep = max(0, len(body) - excess // 12 - 64)
        longest["content"] = body[:keep] + _CUT_MARK
    return turn


def fit(messages: list[Message], *, max_turns: int, max_bytes: int, budget: int = STATE_BUDGET_BYTES) -> list[Message]:
    """``trim``, then drop (or, for the newest alone, shorten) turns until the JSON fits the kernel's limit."""
    turns = _turns(trim(messages, max_turns=max_turns, max_bytes=max_bytes))
    while len(turns) > 1 and _json_size(turns) > budget:
        turns.pop(0)
    if turns and _json_size(turns) > budget:
        turns = [_shorten(turns[0], budget)]
    return [m for t in turns for m in t]


def from_state(state: Mapping[str, Any] | None, key: str) -> list[Message]:
    """The finished turns kept for ``key`` (oldest first); empty for no state, another key or an unusable state."""
    if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION or state.get("session_key") != key:
        return []
    messages = state.get("messages")
    if not isinstance(messages, list):
        return []
    return [{"role": m["role"], "content": m["content"]} for m in messages
            if isinstance(m, Mapping) and m.get("role") in _ROLES and isinstance(m.get("content"), str)]


def to_state(key: str, messages: list[Message], *, max_turns: int, max_bytes: int) -> dict[str, Any]:
    """The state to keep after a successful turn: the conversation bounded by the settings and the kernel's limit."""
    kept = fit(messages, max_turns=max_turns, max_bytes=max_bytes)
    return {"version": STATE_VERSION, "session_key": key, "turns": len(_turns(kept)), "messages": kept}


def session_key(agent_id: str, job_id: str) -> str:
    """The Gateway's session key of a job's turns: ``agent:<agent_id>:scheduler:<job_id>``."""
    return f"agent:{agent_id}:scheduler:{job_id}"


def describe(messages: list[Message]) -> dict[str, Any]:
    """Size of a resumed history, for the run's details."""
    return {"history_turns": len(_turns(messages)), "history_bytes": _size(messages)}
