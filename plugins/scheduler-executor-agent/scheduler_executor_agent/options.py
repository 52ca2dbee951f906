"""``AgentOptions``: the agent executor's per-job options (``executor_options`` of an agent job).

There is deliberately no URL option: a job picks a configured endpoint by name and may
choose its model, so the endpoint's API key is only ever sent where the operator put it.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Literal

import attrs

_ENDPOINT = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_AGENT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _endpoint(_i: object, _a: attrs.Attribute, value: str | None) -> None:
    if value is not None and not _ENDPOINT.match(value):
        raise ValueError(f"endpoint must be an endpoint name matching {_ENDPOINT.pattern}")


def _model(_i: object, _a: attrs.Attribute, value: str | None) -> None:
    if value is not None and (not value.strip() or len(value) > 256 or _CONTROL.search(value)):
        raise ValueError("model must be 1-256 characters without control characters")


def _agent_id(_i: object, _a: attrs.Attribute, value: str) -> None:
    if not _AGENT_ID.match(value):
        raise ValueError(f"agent_id must match {_AGENT_ID.pattern}")


def heartbeat_path_problem(value: str) -> str | None:
    """Why a heartbeat path can never be inside the workspace (checked when the job is added and at every run)."""
    if not value or "\x00" in value:
        return "heartbeat_file must be a non-empty path without NUL characters"
    if value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", value):
        return "heartbeat_file must be relative to the configured workspace, not absolute"
    if ".." in PurePosixPath(value.replace("\\", "/")).parts:
        return "heartbeat_file must not contain '..' components"
    return None


def _heartbeat(_i: object, _a: attrs.Attribute, value: str | None) -> None:
    problem = heartbeat_path_problem(value) if value is not None else None
    if problem:
        raise ValueError(problem)


@attrs.frozen(kw_only=True)
class AgentOptions:
    """What an agent job may set in ``executor_options``; the kernel validates and stores it."""

    endpoint: str | None = attrs.field(default=None, validator=_endpoint, metadata={
        "doc": "Name of a configured endpoint ([executors.agent] endpoint_urls, or `default` from SCHEDULER_AGENT_BASE_URL);"
               " default: the settings' default_endpoint."})
    model: str | None = attrs.field(default=None, validator=_model, metadata={
        "doc": "Model to ask for; default: the endpoint's model. The URL can never be chosen per job."})
    thinking: Literal["minimal", "low", "medium", "high"] | None = attrs.field(default=None, metadata={
        "doc": "Reasoning effort, sent as `reasoning_effort`; reasoning text the endpoint streams goes to stderr."})
    agent_id: str = attrs.field(default="main", validator=_agent_id, metadata={
        "doc": "Agent whose session the turn belongs to: session key `agent:<agent_id>:scheduler:<job_id>`."})
    context_mode: Literal["isolated", "session"] = attrs.field(default="isolated", metadata={
        "doc": "`isolated`: no history is sent; `session`: the job's earlier finished turns are sent first (bounded)."})
    heartbeat_file: str | None = attrs.field(default=None, validator=_heartbeat, metadata={
        "doc": "File relative to the configured workspace put in the prompt as untrusted content; refused if it"
               " resolves outside the workspace after symlinks."})
    stream: bool = attrs.field(default=True, metadata={
        "doc": "Ask for server-sent events (output recorded as it arrives); false: one JSON response."})
