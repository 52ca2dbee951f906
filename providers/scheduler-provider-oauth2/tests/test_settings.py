"""``[providers.oauth2]`` in a real settings file: one ``[providers.oauth2.clients.NAME]`` table per client, its checks, loading by entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from scheduler_provider_oauth2 import OAuth2CredentialProvider
from scheduler_provider_oauth2.schemes import OAUTH2_SCHEME, check_client, read_token
from scheduler_toolkit.types import KNOWN_CAPABILITIES

from scheduler.api import PLUGIN_API_VERSION, CredentialProvider, SchedulerError
from scheduler.testing import load_provider, run_cli


def settings_text(url: str, extra: str = "", *, client: str = "") -> str:
    """Client ``reports`` at ``url``; ``client`` adds keys to its table, ``extra`` appends tables."""
    return f"""
[providers.oauth2]
timeout_s = 2
trust_env = false

[providers.oauth2.clients.reports]
token_url = "{url}/token"
client_id = "reports-id"
client_secret = {{credential = "env:OAUTH2_TEST_SECRET"}}
scope = "read write"
{client}
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
    path = toml_file(settings_text(token_server.url))
    code, out, err = run_cli("--json", "plugins", "list")
    assert code == 0, err
    (row,) = [r for r in json.loads(out)["plugins"] if r["name"] == "oauth2" and r["group"] == "scheduler.credential_providers"]
    assert row["status"] == "ok" and row["distribution"] == "scheduler-provider-oauth2"
    code, out, err = run_cli("config")
    assert code == 0, err
    assert "<secret env:OAUTH2_TEST_SECRET>" in out and "providers.oauth2.clients.reports.client_secret" in out
    code, out, err = run_cli("--json", "config")
    assert code == 0, err
    shown = json.loads(out)
    key = "providers.oauth2.clients.reports.client_secret"
    assert shown["config"][key] == {"credential": "env:OAUTH2_TEST_SECRET"} and shown["sources"][key] == f"file:{path}"
    assert shown["config"]["providers.oauth2.clients.reports.auth_method"] == "client_secret_basic"
    assert shown["sources"]["providers.oauth2.clients.reports.auth_method"] == "default"
    assert shown["warnings"] == []


def test_two_clients_each_with_its_own_table(toml_file, token_server, client_secret, monkeypatch, binding, context) -> None:
    token_server.clients["reports-id"] = client_secret
    token_server.public.add("billing-id")
    toml_file(settings_text(token_server.url, f"""
[providers.oauth2.clients.billing-eu]
token_url = "{token_server.url}/token"
client_id = "billing-id"
auth_method = "none"
"""))
    provider = load_provider("credential", "oauth2")
    assert provider.resolve(binding("billing-eu"), context).value == token_server.issued[0]
    assert provider.resolve(binding("reports"), context).value == token_server.issued[1]
    assert [s.client_id for s in token_server.seen] == ["billing-id", "reports-id"]


@pytest.mark.parametrize(("client", "extra", "key", "fragment"), [
    ('grant = "password"', "", "providers.oauth2.clients.reports.grant", "must be one of client_credentials, refresh_token"),
    ('grant = "refresh_token"', "", "providers.oauth2.clients.reports", "the refresh_token grant needs refresh_token"),
    ('refresh_token = {credential = "env:RT"}', "", "providers.oauth2.clients.reports", "refresh_token is set but grant is"),
    ('auth_method = "private_key_jwt"', "", "providers.oauth2.clients.reports.auth_method", "must be one of"),
    ('revocation_url = "http://idp.example/revoke"', "", "providers.oauth2.clients.reports.revocation_url", "https"),
    ('revocation_url = "https://user:pw@idp.example/revoke"', "", "providers.oauth2.clients.reports.revocation_url",
     "must not carry credentials"),
    ("", ('[providers.oauth2.clients.billing]\ntoken_url = "https://idp.example/t"\nclient_id = "x"\nauth_method = "none"\n'
          'scope = "read \\\\ write"\n'), "providers.oauth2.clients.billing.scope", "scope tokens"),
    ('audience = " "', "", "providers.oauth2.clients.reports.audience", "must not be empty"),
    ('tokn_url = "https://idp.example/token"', "", "providers.oauth2.clients.reports.tokn_url", "unknown key 'tokn_url'"),
    ("", '[providers.oauth2.clients."Bad Name"]\ntoken_url = "https://idp.example/t"\nclient_id = "x"\n',
     "providers.oauth2.clients.Bad Name", "an entry name is"),
    ("", '[providers.oauth2.clients.billing]\nclient_id = "x"\nauth_method = "none"\n',
     "providers.oauth2.clients.billing.token_url", "is required"),
    ("", '[providers.oauth2.clients.billing]\ntoken_url = "https://idp.example/t"\nclient_id = "x"\n',
     "providers.oauth2.clients.billing", "client_secret is required"),
    ("", "[providers.oauth2.token_url]\nreports = \"https://idp.example/t\"\n", "providers.oauth2.token_url", "unknown key"),
])
def test_bad_settings_name_the_key(client, extra, key, fragment, toml_file, token_server) -> None:
    toml_file(settings_text(token_server.url, extra, client=client))
    with pytest.raises(SchedulerError) as info:
        load_provider("credential", "oauth2")
    assert info.value.code == "CONFIG_INVALID" and fragment in info.value.message
    assert key in [p["key"] for p in info.value.details]


def test_a_literal_secret_is_refused_without_being_quoted(toml_file, token_server) -> None:
    pasted = "9f8e7d6c5b4a-pasted-client-secret"
    text = settings_text(token_server.url).replace('{credential = "env:OAUTH2_TEST_SECRET"}', f'"{pasted}"')
    toml_file(text)
    with pytest.raises(SchedulerError) as info:
        load_provider("credential", "oauth2")
    assert info.value.code == "CONFIG_INVALID" and "providers.oauth2.clients.reports.client_secret" in info.value.message
    assert pasted not in info.value.message + json.dumps(info.value.details)
    code, out, err = run_cli("--json", "config", "--check")
    assert code == 1 and json.loads(out)["code"] == "CONFIG_INVALID" and pasted not in out + err


def test_plain_http_is_only_for_loopback(toml_file) -> None:
    toml_file(settings_text("http://idp.example"))
    with pytest.raises(SchedulerError, match="plain http only to a loopback"):
        load_provider("credential", "oauth2")


def test_environment_overrides_one_key_of_a_client(toml_file, token_server, client_secret, monkeypatch, binding, context) -> None:
    token_server.clients["reports-id"] = client_secret
    toml_file(settings_text(token_server.url))
    monkeypatch.setenv("OTHER_SECRET_VAR", client_secret)
    monkeypatch.setenv("SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_REPORTS_CLIENT_SECRET", "env:OTHER_SECRET_VAR")
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
            "from scheduler_toolkit.settings import SecretRef\n"
            "print(register_secret_schemes())\n"
            "print(SecretRef.parse('oauth2:reports').resolve())\n")
    env = {**os.environ, "SCHEDULER_CONFIG": str(path), "OAUTH2_TEST_SECRET": client_secret}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['oauth2']", token_server.issued[0]]
    assert "Deprecat" not in done.stderr
