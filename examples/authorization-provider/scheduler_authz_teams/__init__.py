"""``teams``: an example authorization_ref provider, written as a third party would (only ``scheduler.api``).

``authorization_ref: "teams:<team>"`` with ``authorization.provider_config``::

    {"members": ["service:backup", "user:alice"], "others": "escalate"}

A run whose identity principal is a member of the team is permitted; anyone else is denied,
or escalated to an approval when ``others`` is ``escalate``. A run without an identity in its
request (``authorization.request.include`` left it out) is denied: never guess.
``[providers.teams] teams_file`` may name a TOML file of ``team = [principals]`` that is
added to ``members`` (read at every decision).
"""

from __future__ import annotations

import tomllib
from typing import Any, Literal

import attrs

from scheduler.api import AuthorizationDecision, AuthorizationRequest, SchedulerError

__version__ = "0.1.0"


@attrs.frozen(kw_only=True)
class TeamsOptions:
    """Per job (``authorization.provider_config``): who is in the team, and what happens to everyone else."""

    members: list[str] = attrs.field(factory=list, metadata={"doc": "Principals (KIND:NAME) of the team."})
    others: Literal["deny", "escalate"] = attrs.field(default="deny", metadata={"doc": "What a non-member gets."})


@attrs.frozen(kw_only=True)
class TeamsSettings:
    """Per host (``[providers.teams]``)."""

    teams_file: str | None = attrs.field(default=None, metadata={"doc": "TOML file of `team = [principals]`."})


class TeamsProvider:
    """The provider object the entry point names; the scheduler makes one per process."""

    plugin_api = 3
    capabilities = frozenset({"escalate"})
    options_class = TeamsOptions
    settings_class = TeamsSettings

    def __init__(self) -> None:
        self.teams_file: str | None = None

    def configure(self, settings: TeamsSettings) -> None:
        """Called once with the validated ``[providers.teams]`` table."""
        self.teams_file = settings.teams_file

    def _team_file_members(self, team: str) -> list[str]:
        if not self.teams_file:
            return []
        try:
            with open(self.teams_file, "rb") as fh:
                teams = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SchedulerError("TEAMS_FILE_INVALID", f"cannot use {self.teams_file}: {exc}") from None
        members = teams.get(team, [])
        if not isinstance(members, list):
            raise SchedulerError("TEAMS_FILE_INVALID", f"{self.teams_file}: {team} must be a list of principals")
        return [str(m) for m in members]

    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        """Optional hook: ``jobs validate`` and ``doctor`` show these problems (an empty team, an unreadable file)."""
        try:
            members = list(getattr(options, "members", []) or []) + self._team_file_members(policy_ref)
        except SchedulerError as exc:
            return [exc.message]
        return [] if members else [f"team {policy_ref!r} has no members: every run would be refused"]

    def resolve_authorization(self, request: AuthorizationRequest) -> AuthorizationDecision:
        """Permit members; deny (or escalate) everyone else. Raising is fine: the scheduler turns it into a deny."""
        team = request.policy_ref
        options = request.options or TeamsOptions()
        if request.identity is None:
            return AuthorizationDecision(decision="deny", reason="the request carries no identity")
        principal = str(request.identity.get("principal"))
        members = set(options.members) | set(self._team_file_members(team))
        if principal in members:
            return AuthorizationDecision(decision="permit", reason=f"{principal} is in team {team}")
        return AuthorizationDecision(decision=options.others, reason=f"{principal} is not in team {team}")
