"""Tables of named sub-tables in the settings file: ``dict[str, SomeAttrsClass]`` fields (``[providers.NAME.FIELD.ENTRY]``).

Real settings files, real environment variables; the loader's own entry points
(``plugin_settings``, ``resolve_table``) for a plugin-shaped class, and the real CLI
(``scheduler config``) with the installed OAuth2 provider, whose clients are such a table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest

from scheduler.base.errors import SchedulerError
from scheduler.settings import SecretRef, env_var, plugin_settings, reload_settings
from scheduler.settings.load import entry_class, resolve_table, setting_vars
from scheduler.testing import isolate_settings, run_cli

PASTED = "s3cr3t-pasted-into-the-file-9c2e"


def _check_host(value: str) -> str | None:
    return None if "." in value else "must be a host name with a domain"


@attrs.frozen(kw_only=True)
class Endpoint:
    """One named entry: every kind of field a plugin's top-level settings may have."""

    host: str = attrs.field(metadata={"check": _check_host})
    port: int = attrs.field(default=443, metadata={"minimum": 1, "maximum": 65535})
    mode: Literal["fast", "safe"] = "safe"
    tags: list[str] = attrs.field(factory=list)
    verify: bool = True
    token: SecretRef | None = None
    password: SecretRef | None = attrs.field(default=None, metadata={"secret": True})

    def __attrs_post_init__(self) -> None:
        if self.mode == "fast" and self.token is None:
            raise ValueError("mode fast needs a token")


@attrs.frozen(kw_only=True)
class ToySettings:
    """``[providers.toy]``: named endpoints plus a flat key."""

    endpoints: dict[str, Endpoint] = attrs.field(factory=dict)
    timeout_s: float = 5.0


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    isolate_settings(monkeypatch, tmp_path / "xdg")
    yield
    reload_settings()


@pytest.fixture
def settings_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``settings_file(text)``: a real settings file named by ``SCHEDULER_CONFIG``."""

    def write(text: str) -> Path:
        path = tmp_path / "scheduler.toml"
        path.write_text(text)
        monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
        reload_settings()
        return path

    return write


GOOD = """
[providers.toy]
timeout_s = 2

[providers.toy.endpoints."eu-west.v2"]   # a name with a dot is quoted
host = "eu.example.org"
mode = "fast"
token = {credential = "env:TOY_EU_TOKEN"}
tags = ["a", "b"]

[providers.toy.endpoints.us]
host = "us.example.org"
port = 8443
password = {credential = "file:/run/secrets/toy-us"}
"""


def _invalid(**kwargs: Any) -> SchedulerError:
    with pytest.raises(SchedulerError) as info:
        plugin_settings("credential", "toy", ToySettings, **kwargs)
    assert info.value.code == "CONFIG_INVALID"
    return info.value


def test_the_field_type_is_recognised() -> None:
    assert entry_class(dict[str, Endpoint]) is Endpoint and entry_class(dict[str, Endpoint] | None) is Endpoint
    assert entry_class(dict[str, str]) is None and entry_class(list[str]) is None and entry_class(Endpoint) is None


def test_a_good_file_gives_one_instance_per_entry_with_sources(settings_file: Any) -> None:
    path = settings_file(GOOD)
    settings = plugin_settings("credential", "toy", ToySettings)
    assert settings.timeout_s == 2.0 and set(settings.endpoints) == {"eu-west.v2", "us"}
    eu, us = settings.endpoints["eu-west.v2"], settings.endpoints["us"]
    assert eu == Endpoint(host="eu.example.org", mode="fast", token=SecretRef("env", "TOY_EU_TOKEN"), tags=["a", "b"])
    assert us.port == 8443 and us.password == SecretRef("file", "/run/secrets/toy-us") and us.mode == "safe"
    resolved, problems = resolve_table("providers.toy", ToySettings, {"endpoints": {"us": {"host": "us.example.org"}}},
                                       f"file:{path}", {})
    assert problems == [] and resolved is not None
    rows = {r["key"]: r for r in resolved.rows()}
    assert rows["providers.toy.endpoints.us.host"] == {"key": "providers.toy.endpoints.us.host", "value": "us.example.org",
                                                       "source": f"file:{path}", "secret": False}
    assert rows["providers.toy.endpoints.us.port"]["source"] == "default"
    assert rows["providers.toy.endpoints.us.token"]["secret"] and rows["providers.toy.endpoints.us.password"]["secret"]
    assert "providers.toy.endpoints" not in rows


def test_no_entries_is_the_default_and_shows_as_one_empty_row() -> None:
    resolved, problems = resolve_table("providers.toy", ToySettings, {}, "file:/x", {})
    assert problems == [] and resolved is not None and resolved.value.endpoints == {}
    rows = {r["key"]: r for r in resolved.rows()}
    assert rows["providers.toy.endpoints"] == {"key": "providers.toy.endpoints", "value": {}, "source": "default", "secret": False}


def test_an_entry_secret_resolves_at_use_time(settings_file: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_file(GOOD)
    token = plugin_settings("credential", "toy", ToySettings).endpoints["eu-west.v2"].token
    with pytest.raises(SchedulerError) as info:
        token.resolve()
    assert info.value.code == "SECRET_UNRESOLVED"
    monkeypatch.setenv("TOY_EU_TOKEN", "tok-123")
    assert token.resolve() == "tok-123"


@pytest.mark.parametrize(("entry", "key", "code", "fragment"), [
    ('host = "a.example"\nprot = 1', "providers.toy.endpoints.e1.prot", "UNKNOWN_FIELD", "unknown key 'prot' (known: host, mode,"),
    ('host = "a.example"\nport = "443"', "providers.toy.endpoints.e1.port", "INVALID_TYPE", "must be an integer"),
    ('host = "a.example"\nport = 0', "providers.toy.endpoints.e1.port", "OUT_OF_RANGE", "between 1 and 65535"),
    ('host = "a.example"\nmode = "slow"', "providers.toy.endpoints.e1.mode", "INVALID_CHOICE", "must be one of fast, safe"),
    ('host = "a.example"\ntags = [1]', "providers.toy.endpoints.e1.tags", "INVALID_TYPE", "list of strings"),
    ('host = "a.example"\nverify = "yes"', "providers.toy.endpoints.e1.verify", "INVALID_TYPE", "true or false"),
    ('host = "localhost"', "providers.toy.endpoints.e1.host", "INVALID_VALUE", "must be a host name with a domain"),
    ("port = 80", "providers.toy.endpoints.e1.host", "REQUIRED", "is required"),
    ('host = "a.example"\nmode = "fast"', "providers.toy.endpoints.e1", "INVALID_VALUE", "mode fast needs a token"),
    ('host = "a.example"\ntoken = {credential = "nope:x"}', "providers.toy.endpoints.e1.token", "INVALID_VALUE",
     "must be references"),
    ('host = "a.example"\ntoken = {credential = "env:x y"}', "providers.toy.endpoints.e1.token", "INVALID_VALUE",
     "environment variable name"),
    ('host = "a.example"\ntoken = {ref = "env:X"}', "providers.toy.endpoints.e1.token", "INVALID_VALUE", "one key credential"),
])
def test_a_bad_entry_names_its_full_dotted_key(settings_file: Any, entry: str, key: str, code: str, fragment: str) -> None:
    path = settings_file(f"[providers.toy.endpoints.ok]\nhost = \"ok.example\"\n\n[providers.toy.endpoints.e1]\n{entry}\n")
    error = _invalid()
    assert [(p["key"], p["code"], p["source"]) for p in error.details] == [(key, code, f"file:{path}")]
    assert fragment in error.details[0]["error"] and error.message.startswith(f"setting {key} from file:{path}: ")


@pytest.mark.parametrize(("text", "key", "code", "fragment"), [
    ('[providers.toy]\nendpoints = "eu.example"\n', "providers.toy.endpoints", "INVALID_TYPE",
     "[providers.toy.endpoints] must hold named tables: [providers.toy.endpoints.NAME]"),
    ('[providers.toy.endpoints]\neu = "eu.example"\n', "providers.toy.endpoints.eu", "INVALID_TYPE", "must be a table"),
    ('[providers.toy.endpoints.EU]\nhost = "eu.example"\n', "providers.toy.endpoints.EU", "INVALID_VALUE", "an entry name is"),
    ('[providers.toy.endpoints."-eu"]\nhost = "eu.example"\n', "providers.toy.endpoints.-eu", "INVALID_VALUE", "starting with"),
    (f'[providers.toy.endpoints.{"e" * 65}]\nhost = "eu.example"\n', f"providers.toy.endpoints.{'e' * 65}", "INVALID_VALUE",
     "1-64"),
])
def test_a_bad_table_or_entry_name_is_refused(settings_file: Any, text: str, key: str, code: str, fragment: str) -> None:
    settings_file(text)
    error = _invalid()
    assert [(p["key"], p["code"]) for p in error.details] == [(key, code)] and fragment in error.details[0]["error"]


def test_every_bad_entry_is_listed(settings_file: Any) -> None:
    settings_file('[providers.toy]\ntimeout_s = "x"\n[providers.toy.endpoints.a]\nport = 1\n[providers.toy.endpoints.b]\n'
                  'host = "b.example"\nzzz = 1\n')
    error = _invalid()
    assert sorted(p["key"] for p in error.details) == ["providers.toy.endpoints.a.host", "providers.toy.endpoints.b.zzz",
                                                       "providers.toy.timeout_s"]


def test_a_literal_secret_in_an_entry_is_refused_and_never_repeated(settings_file: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_file(f'[providers.toy.endpoints.e1]\nhost = "a.example"\ntoken = "{PASTED}"\npassword = "{PASTED}"\n')
    error = _invalid()
    assert {p["key"] for p in error.details} == {"providers.toy.endpoints.e1.token", "providers.toy.endpoints.e1.password"}
    assert PASTED not in error.message + json.dumps(error.details) + repr(error)
    settings_file('[providers.toy.endpoints.e1]\nhost = "a.example"\n')
    monkeypatch.setenv("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_E1_TOKEN", PASTED)
    error = _invalid()
    assert error.details[0]["source"] == "env:SCHEDULER_PROVIDERS_TOY_ENDPOINTS_E1_TOKEN"
    assert PASTED not in error.message + json.dumps(error.details)


def test_variable_names_of_entries() -> None:
    assert env_var("providers.toy.endpoints.eu-west.v2.host") == "SCHEDULER_PROVIDERS_TOY_ENDPOINTS_EU_WEST_V2_HOST"
    found = setting_vars("providers.toy", ToySettings, {"endpoints": {"eu-west.v2": {}, "Bad": {}}})
    assert found["SCHEDULER_PROVIDERS_TOY_TIMEOUT_S"] == ["providers.toy.timeout_s"]
    assert found["SCHEDULER_PROVIDERS_TOY_ENDPOINTS_EU_WEST_V2_PORT"] == ["providers.toy.endpoints.eu-west.v2.port"]
    assert not any("BAD" in var for var in found) and "SCHEDULER_PROVIDERS_TOY_ENDPOINTS" not in found


def test_an_override_sets_one_key_of_a_declared_entry(settings_file: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_file(GOOD)
    monkeypatch.setenv("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_EU_WEST_V2_PORT", "9443")
    monkeypatch.setenv("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_EU_WEST_V2_TOKEN", "env:OTHER_TOKEN")
    monkeypatch.setenv("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_US_TAGS", "x, y")
    monkeypatch.setenv("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_US_HOST", "")  # empty: unset
    settings = plugin_settings("credential", "toy", ToySettings, environ=dict(os.environ))
    eu, us = settings.endpoints["eu-west.v2"], settings.endpoints["us"]
    assert eu.port == 9443 and eu.token == SecretRef("env", "OTHER_TOKEN") and eu.host == "eu.example.org"
    assert us.tags == ["x", "y"] and us.host == "us.example.org"


@pytest.mark.parametrize(("var", "text", "key", "code", "fragment"), [
    ("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_US_PORT", "many", "providers.toy.endpoints.us.port", "INVALID_TYPE", "an integer"),
    ("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_US_MODE", "slow", "providers.toy.endpoints.us.mode", "INVALID_CHOICE", "fast, safe"),
    ("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_ASIA_HOST", "asia.example", "providers.toy.endpoints", "UNKNOWN_FIELD",
     "declare the entry as [providers.toy.endpoints.NAME] first"),
    ("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_US_HOSTNAME", "asia.example", "providers.toy.endpoints", "UNKNOWN_FIELD",
     "overrides no key"),
    ("SCHEDULER_PROVIDERS_TOY_ENDPOINTS", '{"asia": {"host": "asia.example"}}', "providers.toy.endpoints", "UNKNOWN_FIELD",
     "SCHEDULER_PROVIDERS_TOY_ENDPOINTS_<ENTRY>_<KEY>"),
])
def test_a_bad_override_names_the_variable(settings_file: Any, monkeypatch: pytest.MonkeyPatch, var: str, text: str, key: str,
                                           code: str, fragment: str) -> None:
    settings_file(GOOD)
    monkeypatch.setenv(var, text)
    error = _invalid(environ=dict(os.environ))
    assert [(p["key"], p["code"], p["source"]) for p in error.details] == [(key, code, f"env:{var}")]
    assert fragment in error.details[0]["error"] and text not in error.message


def test_two_entries_sharing_a_variable_make_that_variable_an_error(settings_file: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_file('[providers.toy.endpoints.eu-1]\nhost = "a.example"\n[providers.toy.endpoints.eu_1]\nhost = "b.example"\n')
    assert set(plugin_settings("credential", "toy", ToySettings).endpoints) == {"eu-1", "eu_1"}  # unset: no conflict
    monkeypatch.setenv("SCHEDULER_PROVIDERS_TOY_ENDPOINTS_EU_1_PORT", "8080")
    error = _invalid(environ=dict(os.environ))
    assert error.details[0]["code"] == "INVALID_VALUE" and "ambiguous" in error.details[0]["error"]
    assert "providers.toy.endpoints.eu-1.port and providers.toy.endpoints.eu_1.port" in error.details[0]["error"]


# -- scheduler config, with the installed OAuth2 provider (its clients are a table of named sub-tables) --------------

OAUTH2 = """
[providers.oauth2]
trust_env = false

[providers.oauth2.clients.reports-eu]
token_url = "https://idp.example/oauth2/token"
client_id = "reports"
client_secret = {credential = "env:REPORTS_SECRET"}
scope = "read"
"""


def _config(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduler", "--json", "config", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_scheduler_config_shows_each_entry_key_with_its_source(settings_file: Any) -> None:
    path = settings_file(OAUTH2)
    env = {**os.environ, "REPORTS_SECRET": PASTED, "SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_REPORTS_EU_SCOPE": "read write",
           "SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_REPORTS_EU_CLIENT_SECRET": "file:/run/secrets/reports"}
    done = _config(env=env)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    rows = {r["key"]: r for r in shown["settings"] if r["key"].startswith("providers.oauth2.clients.")}
    prefix = "providers.oauth2.clients.reports-eu."
    assert set(rows) == {prefix + k for k in ("token_url", "client_id", "client_secret", "auth_method", "grant",
                                              "refresh_token", "scope", "audience", "revocation_url")}
    assert rows[prefix + "token_url"]["value"] == "https://idp.example/oauth2/token"
    assert rows[prefix + "token_url"]["source"] == f"file:{path}"
    assert rows[prefix + "scope"]["value"] == "read write"
    assert rows[prefix + "scope"]["source"] == "env:SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_REPORTS_EU_SCOPE"
    assert rows[prefix + "client_secret"] == {"key": prefix + "client_secret", "value": {"credential": "file:/run/secrets/reports"},
                                              "source": "env:SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_REPORTS_EU_CLIENT_SECRET",
                                              "secret": True}
    assert rows[prefix + "grant"]["source"] == "default" and shown["config"][prefix + "client_id"] == "reports"
    assert shown["warnings"] == [] and PASTED not in done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-m", "scheduler", "config"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "<secret file:/run/secrets/reports>" in done.stdout and PASTED not in done.stdout


def test_scheduler_config_check_refuses_a_stray_entry_variable(settings_file: Any) -> None:
    settings_file(OAUTH2)
    env = {**os.environ, "SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_BILLING_TOKEN_URL": "https://idp.example/t"}
    done = _config("--check", env=env)
    assert done.returncode == 1
    answer = json.loads(done.stdout)
    assert answer["code"] == "CONFIG_INVALID" and "SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_BILLING_TOKEN_URL" in answer["error"]


def test_scheduler_config_names_a_bad_entry_key_in_process(settings_file: Any) -> None:
    settings_file(OAUTH2 + 'tokn_url = "x"\n')
    code, out, _ = run_cli("--json", "config", "--check")
    answer = json.loads(out)
    assert code == 1 and answer["code"] == "CONFIG_INVALID"
    assert "providers.oauth2.clients.reports-eu.tokn_url" in answer["error"]
