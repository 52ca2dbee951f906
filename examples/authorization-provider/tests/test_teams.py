"""The teams provider on its own: loaded through its entry point as the scheduler loads it, then asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from scheduler_authz_teams import TeamsOptions, TeamsProvider, TeamsSettings

from scheduler.api import AuthorizationDecision, AuthorizationProvider, AuthorizationRequest


def ask(provider: TeamsProvider, principal: str | None, **options: object) -> AuthorizationDecision:
    identity = {"principal": principal, "trust_level": "user"} if principal else None
    return provider.resolve_authorization(AuthorizationRequest(policy_ref="ops", job={"name": "j"}, trigger={},
                                                               identity=identity, options=TeamsOptions(**options)))


def test_is_an_authorization_provider() -> None:
    assert isinstance(TeamsProvider(), AuthorizationProvider)


def test_members_permitted_others_denied_or_escalated() -> None:
    p = TeamsProvider()
    assert ask(p, "user:alice", members=["user:alice"]).decision == "permit"
    assert ask(p, "user:mallory", members=["user:alice"]).decision == "deny"
    assert ask(p, "user:mallory", members=["user:alice"], others="escalate").decision == "escalate"
    assert ask(p, None, members=["user:alice"]).decision == "deny"


def test_teams_file_and_check_policy(tmp_path: Path) -> None:
    p = TeamsProvider()
    p.configure(TeamsSettings(teams_file=str(tmp_path / "teams.toml")))
    assert p.check_policy("ops", TeamsOptions()) != []  # the file does not exist yet
    (tmp_path / "teams.toml").write_text('ops = ["service:backup"]\n')
    assert p.check_policy("ops", TeamsOptions()) == []
    assert ask(p, "service:backup").decision == "permit"
    assert p.check_policy("empty", TeamsOptions()) == ["team 'empty' has no members: every run would be refused"]


def test_loaded_through_its_entry_point() -> None:
    from scheduler.testing import load_provider

    try:
        provider = load_provider("authorization", "teams")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"not installed in this environment: {exc}")
    assert type(provider).__name__ == "TeamsProvider"
