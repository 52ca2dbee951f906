"""``[providers.oauth2]`` in a real settings file: the flat per-property shape, its checks, loading by entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from scheduler_provider_oauth2 import OAuth2CredentialProvider
from scheduler_provider_oauth2.schemes import OAUTH2_SCHEME, check_client, read_token

from scheduler.api import KNOWN_CAPABILITIES, PLUGIN_API_VERSION, CredentialProvider, SchedulerError
from scheduler.testing import load_provider, run_cli


def settings_text(url: str, extra: str = "") -> str:
    return f"""
[providers.oauth2]
timeout_s = 2
trust_env = false

[providers.oauth2.token_url]
reports = "{url}/token"

[providers.oauth2.client_id]
reports = "reports-id"

[providers.oauth2.client_secret]
reports = "env:OAUTH2_TEST_SECRET"

[providers.oauth2.scope]
reports = "read write"
{extra}"""


def test_loaded_through_its_entry_point_from_the_settings_file(toml_file, token_server, client_secret, binding, context) -> None:
    token_server.clients["reports-id"] = client_secret
    toml_file(settings_text(token_server.url))
    provider = load_provider("credential", "oauth2")
    assert isinstance(provider, OAuth2CredentialProvider) and isinstance(provider, CredentialProvider)
    assert provider.plugin_api == PLUGIN_API_VERSION and provider.capabilities == {"refresh", "revoke"}
    assert set(provider.capabilities) <= KNOWN_CAPABILITIES
    token = provider.resolve(binding(), context)
    assert token.value == token_server.issued[0] and provider.resolve(binding(), context).value == token.value
    assert token_server.token_requests == 1


def test_listed_by_plugins_list_and_shown_by_config(toml_file, token_server) -> None:
    toml_file(settings_text(token_server.url))
    code, out, err = run_cli("--json", "plugins", "list")
    assert code == 0, err
    (row,) = [r for r in json.loads(out)["plugins"] if r["name"] == "oauth2"]
    assert row["status"] == "ok" and row["distribution"] == "scheduler-provider-oauth2"
    code, out, err = run_cli("config")
    assert code == 0, err
    assert "env:OAUTH2_TEST_SECRET" in out and "providers.oauth2.client_secret" in out


def test_nested_client_tables_are_refused_by_the_kernel_loader(toml_file, token_server) -> None:
    """Why the shape is flat: the loader takes only flat field types, so ``[providers.oauth2.clients.NAME]`` cannot work."""
    toml_file(f'[providers.oauth2.clients.reports]\ntoken_url = "{token_server.url}/token"\n')
    with pytest.raises(SchedulerError) as info:
        load_provider("credential", "oauth2")
    assert info.value.code == "CONFIG_INVALID" and "providers.oauth2.clients" in info.value.message


@pytest.mark.parametrize(("extra", "fragment"), [
    ('[providers.oauth2.client_secret]\nbilling = "env:X"\n', "client_secret names client(s) without a token_url: billing"),
    ('[providers.oauth2.grant]\nreports = "password"\n', "must be one of client_credentials, refresh_token"),
    ('[providers.oauth2.grant]\nreports = "refresh_token"\n', "has no refresh_token"),
    ('[providers.oauth2.auth_method]\nreports = "private_key_jwt"\n', "must be one of"),
    ('[providers.oauth2.revocation_url]\nreports = "http://idp.example/revoke"\n', "https"),
    ('[providers.oauth2.revocation_url]\nreports = "https://user:pw@idp.example/revoke"\n', "must not carry credentials"),
    ('[providers.oauth2.audience]\n"Bad Name" = "x"\n', "client name"),
])
def test_bad_settings_name_the_key(extra, fragment, toml_file, token_server) -> None:
    text = settings_text(token_server.url)
    if extra.split("\n")[0] in text:  # replace a table that is already there
        head = extra.split("\n")[0]
        start = text.index(head)
        end = text.index("\n\n", start) if "\n\n" in text[start:] else len(text)
        text = text[:start] + text[end:]
    toml_file(text + extra)
    with pytest.raises(SchedulerError) as info:
        load_provider("credential", "oauth2")
    assert info.value.code == "CONFIG_INVALID" and fragment in info.value.message


def test_a_literal_secret_is_refused_without_being_quoted(toml_file, token_server) -> None:
    pasted = "9f8e7d6c5b4a-pasted-client-secret"
    text = settings_text(token_server.url).replace('"env:OAUTH2_TEST_SECRET"', f'"{pasted}"')
    toml_file(text)
    with pytest.raises(SchedulerError) as info:
        load_provider("credential", "oauth2")
    assert info.value.code == "CONFIG_INVALID" and "providers.oauth2.client_secret" in info.value.message
    assert pasted not in info.value.message + json.dumps(info.value.details)
    code, out, _ = run_cli("config", "--check")
    assert pasted not in out


def test_plain_http_is_only_for_loopback(toml_file) -> None:
    toml_file(settings_text("http://idp.example"))
    with pytest.raises(SchedulerError, match="plain http only to a loopback"):
        load_provider("credential", "oauth2")


def test_environment_overrides_take_json_objects(toml_file, token_server, client_secret, monkeypatch, binding, context) -> None:
    token_server.clients["reports-id"] = client_secret
    toml_file(settings_text(token_server.url))
    monkeypatch.setenv("OTHER_SECRET_VAR", client_secret)
    monkeypatch.setenv("SCHEDULER_PROVIDERS_OAUTH2_CLIENT_SECRET", '{"reports": "env:OTHER_SECRET_VAR"}')
    monkeypatch.delenv("OAUTH2_TEST_SECRET")
    provider = load_provider("credential", "oauth2")
    assert provider.resolve(binding(), context).value == token_server.issued[0]


def test_the_settings_reference_scheme(toml_file, token_server, client_secret) -> None:
    token_server.clients["reports-id"] = client_secret
    toml_file(settings_text(token_server.url))
    assert read_token("reports") == token_server.issued[0]
    assert read_token("reports") == token_server.issued[0] and token_server.token_requests == 1  # the shared cache
    assert read_token("billing") is None
    assert check_client("reports") is None and check_client("../x")
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="scheduler.secret_schemes") if e.name == "oauth2"]
    assert ep.load() is OAUTH2_SCHEME and OAUTH2_SCHEME.read is read_token


def test_a_failing_reference_names_the_code_not_the_secret(toml_file, token_server, client_secret) -> None:
    token_server.clients["reports-id"] = client_secret
    toml_file(settings_text(token_server.url))
    token_server.token_script.append({"status": 400, "json": {"error": "invalid_client"}})
    with pytest.raises(OSError) as info:
        read_token("reports")
    assert info.value.strerror.startswith("CREDENTIAL_OAUTH_INVALID_CLIENT: ") and client_secret not in str(info.value)


def test_the_scheme_registers_in_a_fresh_interpreter(toml_file, token_server, client_secret) -> None:
    token_server.clients["reports-id"] = client_secret
    path = toml_file(settings_text(token_server.url))
    code = ("from scheduler_provider_oauth2.schemes import register_secret_schemes\n"
            "from scheduler.api import SecretRef\n"
            "print(register_secret_schemes())\n"
            "print(SecretRef.parse('oauth2:reports').resolve())\n")
    env = {**os.environ, "SCHEDULER_CONFIG": str(path), "OAUTH2_TEST_SECRET": client_secret}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['oauth2']", token_server.issued[0]]
    assert "Deprecat" not in done.stderr
