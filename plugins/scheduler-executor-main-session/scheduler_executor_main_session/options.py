"""``MainSessionOptions``: the per-job options of a ``session_target: main`` job (``executor_options``).

There is deliberately no URL and no command option: a job may choose the mode, the agent
and a model, never where the text goes or which program runs. Those are host settings.
"""

from __future__ import annotations

import re
from typing import Literal

import attrs

_AGENT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _agent_id(_i: object, _a: attrs.Attribute, value: str) -> None:
    if not _AGENT_ID.match(value):
        raise ValueError(f"agent_id must match {_AGENT_ID.pattern}")


def _model(_i: object, _a: attrs.Attribute, value: str | None) -> None:
    if value is not None and (not value.strip() or len(value) > 256 or _CONTROL.search(value)):
        raise ValueError("model must be 1-256 characters without control characters")


@attrs.frozen(kw_only=True)
class MainSessionOptions:
    """What a main-session job may set in ``executor_options``; the kernel validates and stores it."""

    mode: Literal["reply", "event"] | None = attrs.field(default=None, metadata={
        "doc": "`reply`: a synchronous chat turn in the main session, its reply is the run's stdout; `event`: "
               "fire-and-forget through `openclaw system event`. Default: the settings' default_mode."})
    event_mode: Literal["now", "queue"] = attrs.field(default="now", metadata={
        "doc": "mode=event only: `now` wakes the main session at once, `queue` leaves the event for its next turn."})
    agent_id: str = attrs.field(default="main", validator=_agent_id, metadata={
        "doc": "Agent whose main session receives the text (session key `agent:<agent_id>:main`)."})
    model: str | None = attrs.field(default=None, validator=_model, metadata={
        "doc": "mode=reply only: model to ask for; default: the configured model. The URL can never be chosen per job."})
