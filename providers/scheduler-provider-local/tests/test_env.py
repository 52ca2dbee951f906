"""The ``env`` driver: a variable of the dispatcher's environment, filtered by allow/deny patterns."""

from __future__ import annotations

import pytest
from scheduler_provider_local import EnvCredentialProvider, EnvSettings

from scheduler.api import SchedulerError


def test_resolves_a_variable_of_the_dispatcher_environment(monkeypatch, load, binding, context, secret) -> None:
    monkeypatch.setenv("APP_API_TOKEN", secret)
    provider = load("env")
    resolved = provider.resolve(binding("env", "APP_API_TOKEN"), context)
    assert resolved.value == secret and resolved.expires_at_ms is None
    assert resolved.metadata == {"provider": "env", "source": "env:APP_API_TOKEN"}
    assert secret not in repr(resolved)


def test_the_variable_is_read_at_each_resolve(monkeypatch, binding, context) -> None:
    provider = EnvCredentialProvider()
    provider.configure(EnvSettings())
    monkeypatch.setenv("ROTATING", "one")
    assert provider.resolve(binding("env", "ROTATING"), context).value == "one"
    monkeypatch.setenv("ROTATING", "two")
    assert provider.resolve(binding("env", "ROTATING"), context).value == "two"


@pytest.mark.parametrize(("ref", "environ", "code"), [
    ("MISSING_VAR", {}, "CREDENTIAL_NOT_FOUND"),
    ("EMPTY_VAR", {"EMPTY_VAR": ""}, "CREDENTIAL_EMPTY"),
    ("1BAD", {}, "CREDENTIAL_REF_INVALID"),
    ("BAD-NAME", {}, "CREDENTIAL_REF_INVALID"),
    ("$HOME", {}, "CREDENTIAL_REF_INVALID"),
    ("SCHEDULER_PROVIDERS_OAUTH2_CLIENT_SECRET", {"SCHEDULER_PROVIDERS_OAUTH2_CLIENT_SECRET": "x"}, "CREDENTIAL_REF_DENIED"),
])
def test_refusals_have_stable_codes(ref, environ, code, binding, context) -> None:
    provider = EnvCredentialProvider(environ=environ)
    provider.configure(EnvSettings())
    with pytest.raises(SchedulerError) as info:
        provider.resolve(binding("env", ref, name="db"), context)
    assert info.value.code == code
    assert "'db'" in info.value.message and info.value.details["binding"] == "db"
    assert info.value.details["transient"] is False and not info.value.retryable


def test_allow_and_deny_patterns_from_the_settings_file(monkeypatch, load, binding, context, secret, no_secret_in) -> None:
    monkeypatch.setenv("APP_TOKEN", secret)
    monkeypatch.setenv("APP_ADMIN_TOKEN", secret)
    monkeypatch.setenv("OTHER_TOKEN", secret)
    provider = load("env", allow=["APP_*"], deny=["*_ADMIN_*"])
    assert provider.resolve(binding("env", "APP_TOKEN"), context).value == secret
    for ref in ("APP_ADMIN_TOKEN", "OTHER_TOKEN"):
        with pytest.raises(SchedulerError) as info:
            provider.resolve(binding("env", ref), context)
        assert info.value.code == "CREDENTIAL_REF_DENIED" and ref in info.value.message
        no_secret_in(info.value, secret)


def test_patterns_are_case_sensitive(binding, context) -> None:
    provider = EnvCredentialProvider(environ={"app_token": "x"})
    provider.configure(EnvSettings(allow=["APP_*"], deny=[]))
    with pytest.raises(SchedulerError, match="not allowed"):
        provider.resolve(binding("env", "app_token"), context)


def test_a_bad_pattern_is_a_settings_error(load) -> None:
    with pytest.raises(SchedulerError) as info:
        load("env", allow=["APP TOKEN"])
    assert info.value.code == "CONFIG_INVALID" and "providers.env.allow" in info.value.message


def test_settings_overrides_from_the_environment(monkeypatch, write_settings, binding, context) -> None:
    from scheduler.testing import load_provider

    write_settings({})
    monkeypatch.setenv("SCHEDULER_PROVIDERS_ENV_ALLOW", "ONLY_THIS")
    monkeypatch.setenv("ONLY_THIS", "v1")
    monkeypatch.setenv("NOT_THIS", "v2")
    provider = load_provider("credential", "env")
    assert provider.resolve(binding("env", "ONLY_THIS"), context).value == "v1"
    with pytest.raises(SchedulerError, match=r"CREDENTIAL_REF_DENIED|not allowed"):
        provider.resolve(binding("env", "NOT_THIS"), context)
