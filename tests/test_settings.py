"""The settings file: location, precedence, override parsing, CONFIG_INVALID, secret references, ``scheduler config``.

Real files, real environment variables, real subprocesses; a sideloaded test plugin
(channel ``fakeslack`` with a settings class and a secret field, plus a hook module)
stands for a third-party plugin.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest
from kernel_testing import scheduler_cmd

from scheduler.base.errors import SchedulerError
from scheduler.plugins.loader import apply_settings
from scheduler.settings import (
    KERNEL_TABLES,
    RETIRED_ENV,
    SecretRef,
    current_settings,
    env_var,
    load_settings,
    plugin_settings,
    register_secret_scheme,
    reload_settings,
)
from scheduler.settings.load import resolve_table

SECRET_VALUE = "xoxb-this-must-never-be-printed"
_SETTING_PREFIXES = tuple(env_var(t) + "_" for t in (*KERNEL_TABLES, "executors", "channels", "providers"))


def _scrubbed(environ: dict[str, str]) -> dict[str, str]:
    """The environment without any settings-related variable from outside the test."""
    return {k: v for k, v in environ.items()
            if not k.startswith(_SETTING_PREFIXES) and k not in RETIRED_ENV and k != "SCHEDULER_CONFIG"}


@pytest.fixture(autouse=True)
def isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No settings variable or file from outside: XDG_CONFIG_HOME is a fresh directory; the cache is reset."""
    for name in set(os.environ) - set(_scrubbed(dict(os.environ))):
        monkeypatch.delenv(name)
    xdg = tmp_path / "xdg-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    reload_settings()
    yield xdg
    reload_settings()


def write(path: Path, text: str) -> Path:
    """Write a settings file (dedented) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def invalid(environ: dict[str, str] | None = None) -> SchedulerError:
    """The CONFIG_INVALID error loading the settings raises (fails the test when none is raised)."""
    with pytest.raises(SchedulerError) as info:
        load_settings(environ)
    assert info.value.code == "CONFIG_INVALID"
    return info.value


# -- location and precedence ------------------------------------------------------------------------


def test_location_scheduler_config_wins_over_xdg(isolated_settings: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xdg_file = write(isolated_settings / "scheduler" / "config.toml", "[dispatcher]\nconcurrency = 5\n")
    settings = load_settings()
    assert settings.file.path == xdg_file and settings.file.chosen_by == "default" and settings.file.exists
    assert settings.dispatcher.concurrency == 5
    named = write(tmp_path / "named.toml", "[dispatcher]\nconcurrency = 7\n")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(named))
    settings = load_settings()
    assert (settings.file.path, settings.file.chosen_by, settings.dispatcher.concurrency) == (named, "env:SCHEDULER_CONFIG", 7)


def test_missing_default_file_means_defaults_but_a_named_file_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert not settings.file.exists and settings.dispatcher == KERNEL_TABLES["dispatcher"]()
    assert settings.kernel["dispatcher"].sources == {}
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # not absolute: ignored, as the XDG spec says
    assert load_settings().file.path == Path("~/.config/scheduler/config.toml").expanduser()
    monkeypatch.setenv("SCHEDULER_CONFIG", str(tmp_path / "typo.toml"))
    err = invalid()
    assert "typo.toml" in err.message and err.details[0]["source"] == "env:SCHEDULER_CONFIG"


def test_file_value_then_env_override_then_default_with_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "s.toml", """
        [dispatcher]
        concurrency = 8
        grace_s = 3
        [storage]
        sqlite_synchronous = "FULL"
    """)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
    monkeypatch.setenv("SCHEDULER_DISPATCHER_CONCURRENCY", "12")
    monkeypatch.setenv("SCHEDULER_DISPATCHER_MISFIRE_GRACE_MS", "")  # empty counts as unset
    settings = load_settings()
    assert settings.dispatcher.concurrency == 12 and settings.dispatcher.grace_s == 3.0
    assert settings.dispatcher.misfire_grace_ms == 60_000 and settings.storage.sqlite_synchronous == "FULL"
    sources = {row["key"]: row["source"] for resolved in settings.kernel.values() for row in resolved.rows()}
    assert sources["dispatcher.concurrency"] == "env:SCHEDULER_DISPATCHER_CONCURRENCY"
    assert sources["dispatcher.grace_s"] == f"file:{path}"
    assert sources["dispatcher.misfire_grace_ms"] == "default"
    assert sources["storage.sqlite_synchronous"] == f"file:{path}"


def test_settings_are_cached_per_process_until_reloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    first = current_settings()
    assert current_settings() is first
    monkeypatch.setenv("SCHEDULER_DISPATCHER_MISFIRE_GRACE_MS", "1234")
    assert current_settings().dispatcher.misfire_grace_ms == 60_000
    reload_settings()
    assert current_settings().dispatcher.misfire_grace_ms == 1234


def test_kernel_defaults_agree_with_dispatcher_config() -> None:
    from scheduler.core.dispatcher import DispatcherConfig

    config, settings = DispatcherConfig(), KERNEL_TABLES["dispatcher"]()
    for name in ("concurrency", "lease_ttl_ms", "grace_s", "kill_grace_s"):
        assert getattr(config, name) == getattr(settings, name), name
    from scheduler.core.store.sqlite_statements import BUSY_TIMEOUT_MS

    assert KERNEL_TABLES["storage"]().sqlite_busy_timeout_ms == BUSY_TIMEOUT_MS


# -- the override rule and parsing per type -----------------------------------------------------------


def test_env_var_names_follow_one_rule() -> None:
    assert env_var("dispatcher.concurrency") == "SCHEDULER_DISPATCHER_CONCURRENCY"
    assert env_var("executors.shell.max_output_bytes") == "SCHEDULER_EXECUTORS_SHELL_MAX_OUTPUT_BYTES"
    assert env_var("channels.my-slack.token") == "SCHEDULER_CHANNELS_MY_SLACK_TOKEN"
    assert env_var("providers.oauth2.client.id") == "SCHEDULER_PROVIDERS_OAUTH2_CLIENT_ID"


@attrs.frozen(kw_only=True)
class Sample:
    """Every field type a settings class may use."""

    count: int = 1
    ratio: float = 0.5
    on: bool = False
    mode: Literal["fast", "safe"] = "safe"
    tags: tuple[str, ...] = ()
    names: list[str] = attrs.Factory(list)
    labels: dict[str, str] = attrs.Factory(dict)
    label: str | None = None
    token: SecretRef | None = attrs.field(default=None, metadata={"secret": True})


@pytest.mark.parametrize(("key", "text", "expected"), [
    ("count", "42", 42),
    ("count", " -3 ", -3),
    ("ratio", "2.5", 2.5),
    ("ratio", "3", 3.0),
    ("on", "true", True),
    ("on", "YES", True),
    ("on", "0", False),
    ("on", "off", False),
    ("mode", "fast", "fast"),
    ("tags", "a, b,,c", ("a", "b", "c")),
    ("tags", '["x,y", "z"]', ("x,y", "z")),
    ("names", "one,two", ["one", "two"]),
    ("labels", '{"team": "ops"}', {"team": "ops"}),
    ("label", "hello world", "hello world"),
    ("token", "env:SLACK_TOKEN", SecretRef("env", "SLACK_TOKEN")),
    ("token", "file:/run/secrets/slack", SecretRef("file", "/run/secrets/slack")),
])
def test_env_override_is_parsed_per_field_type(key: str, text: str, expected: Any) -> None:
    var = env_var(f"channels.sample.{key}")
    resolved, problems = resolve_table("channels.sample", Sample, {}, "file:/x", {var: text})
    assert problems == [] and resolved is not None
    assert getattr(resolved.value, key) == expected and resolved.sources[key] == f"env:{var}"


@pytest.mark.parametrize(("key", "text", "code", "error"), [
    ("count", "many", "INVALID_TYPE", "must be an integer"),
    ("count", "1.5", "INVALID_TYPE", "must be an integer"),
    ("ratio", "half", "INVALID_TYPE", "must be a number"),
    ("ratio", "nan", "INVALID_VALUE", "finite"),
    ("on", "maybe", "INVALID_TYPE", "true or false"),
    ("mode", "turbo", "INVALID_CHOICE", "fast, safe"),
    ("labels", "team=ops", "INVALID_TYPE", "JSON object"),
    ("token", SECRET_VALUE, "INVALID_TYPE", "secret values must be references"),
    ("token", "env:not a name", "INVALID_TYPE", "environment variable name"),
    ("token", "file:relative/path", "INVALID_TYPE", "absolute path"),
])
def test_bad_env_override_names_key_and_variable(key: str, text: str, code: str, error: str) -> None:
    var = env_var(f"channels.sample.{key}")
    resolved, problems = resolve_table("channels.sample", Sample, {}, "file:/x", {var: text})
    assert resolved is None and len(problems) == 1
    assert problems[0]["key"] == f"channels.sample.{key}" and problems[0]["source"] == f"env:{var}"
    assert problems[0]["code"] == code and error in problems[0]["error"]
    assert SECRET_VALUE not in json.dumps(problems)


# -- CONFIG_INVALID at load -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "key", "code", "needle"), [
    ("[dispatcher]\nconcurency = 2\n", "dispatcher.concurency", "UNKNOWN_FIELD", "known: concurrency"),
    ("[dispatcher]\nconcurrency = \"8\"\n", "dispatcher.concurrency", "INVALID_TYPE", "must be an integer"),
    ("[dispatcher]\nconcurrency = 0\n", "dispatcher.concurrency", "OUT_OF_RANGE", "between 1 and 256"),
    ("[dispatcher]\ngrace_s = inf\n", "dispatcher.grace_s", "OUT_OF_RANGE", "between"),
    ("[storage]\nsqlite_synchronous = \"fast\"\n", "storage.sqlite_synchronous", "INVALID_CHOICE", "NORMAL"),
    ("[dispatchr]\nconcurrency = 2\n", "dispatchr", "UNKNOWN_FIELD", "unknown table [dispatchr]"),
    ("dispatcher = 3\n", "dispatcher", "INVALID_TYPE", "must be a table"),
    ("[executors]\nshell = 3\n", "executors.shell", "INVALID_TYPE", "must be a table"),
])
def test_bad_file_value_names_key_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, key: str, code: str,
                                            needle: str) -> None:
    path = write(tmp_path / "s.toml", text)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
    err = invalid()
    first = err.details[0]
    assert (first["key"], first["source"], first["code"]) == (key, f"file:{path}", code)
    assert needle in first["error"]
    assert key in err.message and f"file:{path}" in err.message


def test_malformed_toml_reports_line_and_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "s.toml", "[dispatcher]\nconcurrency = 4\ngrace_s = = 2\n")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
    err = invalid()
    assert (err.details[0]["line"], err.details[0]["column"]) == (3, 11)
    assert str(path) in err.message and "line 3, column 11" in err.message


def test_every_problem_is_listed_in_details(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "s.toml", "[dispatcher]\nnope = 1\n[storage]\nsqlite_synchronous = 1\n")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
    monkeypatch.setenv("SCHEDULER_DISPATCHER_LEASE_TTL_MS", "soon")
    monkeypatch.setenv("SCHEDULER_STORAGE_SQLITE_SYNC", "FULL")  # a typo of a kernel override
    err = invalid()
    found = {(d["key"], d["source"]) for d in err.details}
    assert found == {
        ("dispatcher.nope", f"file:{path}"),
        ("dispatcher.lease_ttl_ms", "env:SCHEDULER_DISPATCHER_LEASE_TTL_MS"),
        ("storage.sqlite_synchronous", f"file:{path}"),
        (None, "env:SCHEDULER_STORAGE_SQLITE_SYNC"),
    }
    assert "and 3 more" in err.message


@pytest.mark.parametrize("old", sorted(RETIRED_ENV))
def test_a_retired_variable_is_refused_naming_its_replacement(monkeypatch: pytest.MonkeyPatch, old: str) -> None:
    monkeypatch.setenv(old, "1")
    err = invalid()
    assert err.details[0]["code"] == "FIELD_MOVED" and err.details[0]["source"] == f"env:{old}"
    assert env_var(RETIRED_ENV[old]) in err.message


# -- secrets ---------------------------------------------------------------------------------------------------


def test_a_literal_secret_in_the_file_is_refused_without_repeating_it(tmp_path: Path) -> None:
    resolved, problems = resolve_table("channels.sample", Sample, {"token": SECRET_VALUE}, "file:/etc/s.toml", {})
    assert resolved is None
    assert problems[0]["key"] == "channels.sample.token" and problems[0]["source"] == "file:/etc/s.toml"
    assert "secret values must be references" in problems[0]["error"] and SECRET_VALUE not in json.dumps(problems)
    _, problems = resolve_table("channels.sample", Sample, {"token": {"value": SECRET_VALUE}}, "file:/etc/s.toml", {})
    assert "credential" in problems[0]["error"] and SECRET_VALUE not in json.dumps(problems)
    _, problems = resolve_table("channels.sample", Sample, {"label": {"credential": "env:X"}}, "file:/etc/s.toml", {})
    assert problems[0]["code"] == "INVALID_TYPE"  # references belong in secret fields only


def test_secret_reference_resolves_at_use_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolved, problems = resolve_table("channels.sample", Sample, {"token": {"credential": "env:SAMPLE_TOKEN"}}, "file:/s", {})
    assert problems == [] and resolved is not None
    ref = resolved.value.token
    assert ref == SecretRef("env", "SAMPLE_TOKEN") and ref.to_json() == {"credential": "env:SAMPLE_TOKEN"}
    with pytest.raises(SchedulerError) as info:
        ref.resolve()
    assert info.value.code == "SECRET_UNRESOLVED" and "env:SAMPLE_TOKEN" in info.value.message
    monkeypatch.setenv("SAMPLE_TOKEN", SECRET_VALUE)
    assert ref.resolve() == SECRET_VALUE
    assert SECRET_VALUE not in repr(resolved.value) and SECRET_VALUE not in str(ref)
    monkeypatch.setenv("SAMPLE_TOKEN", "")
    with pytest.raises(SchedulerError, match="is empty"):
        ref.resolve()
    secret_file = tmp_path / "token"
    file_ref = SecretRef.parse(f"file:{secret_file}")
    with pytest.raises(SchedulerError) as info:
        file_ref.resolve()
    assert info.value.code == "SECRET_UNRESOLVED" and "does not exist" in info.value.message
    secret_file.write_text(SECRET_VALUE + "\n")
    assert file_ref.resolve() == SECRET_VALUE


def test_credential_providers_can_add_a_reference_scheme() -> None:
    with pytest.raises(ValueError, match="known schemes: env, file"):
        SecretRef.parse("vaultish:kv/slack")
    register_secret_scheme("vaultish", {"kv/slack": "from-the-vault"}.get)
    try:
        ref = SecretRef.parse("vaultish:kv/slack")
        assert ref.resolve() == "from-the-vault"
        with pytest.raises(SchedulerError, match=r"SECRET_UNRESOLVED|does not exist"):
            SecretRef.parse("vaultish:kv/other").resolve()
    finally:
        from scheduler.settings.secret import _SCHEMES

        _SCHEMES.pop("vaultish", None)


# -- plugin settings ----------------------------------------------------------------------------------------------

PLUGIN_MODULE = '''
from __future__ import annotations

import attrs

from scheduler_toolkit.settings import SecretRef
from scheduler_toolkit.types import ChannelLimits

from scheduler.api import PLUGIN_API_VERSION, DeliveryReceipt, hookimpl


@attrs.frozen(kw_only=True)
class FakeSlackSettings:
    """Settings of the fake Slack channel."""

    token: SecretRef | None = attrs.field(default=None, metadata={"secret": True, "doc": "Bot token reference."})
    channel: str = attrs.field(default="#general", metadata={"doc": "Default channel."})
    retries: int = attrs.field(default=3, metadata={"minimum": 0, "maximum": 10})
    timeout_s: float = 5.0


class FakeSlack:
    """A channel that only proves its settings arrived."""

    plugin_api = PLUGIN_API_VERSION
    capabilities = frozenset()
    limits = ChannelLimits()
    settings_class = FakeSlackSettings

    def __init__(self) -> None:
        self.settings = None

    def configure(self, settings: FakeSlackSettings) -> None:
        self.settings = settings

    def send(self, part, route):
        return DeliveryReceipt(receipt_id=f"{self.settings.channel}:{len(self.settings.token.resolve())}")


@hookimpl
def scheduler_config_defaults():
    return {"fakeslack.greeting": "hi", "dispatcher.concurrency": 99}
'''


@pytest.fixture
def plugin_site(tmp_path: Path) -> Path:
    """A directory with the ``fakeslack`` distribution (a channel and a hook module), for PYTHONPATH."""
    site = tmp_path / "site"
    (site / "fakeslack-0.1.dist-info").mkdir(parents=True)
    (site / "fakeslack_plugin.py").write_text(PLUGIN_MODULE)
    (site / "fakeslack-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeslack\nVersion: 0.1\n")
    (site / "fakeslack-0.1.dist-info" / "entry_points.txt").write_text(
        "[scheduler.channels]\nfakeslack = fakeslack_plugin:FakeSlack\n\n[scheduler.hooks]\nfakeslack = fakeslack_plugin\n")
    return site


def test_a_plugin_settings_class_is_validated_and_handed_to_configure(plugin_site: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(plugin_site))
    import fakeslack_plugin  # type: ignore[import-not-found]

    path = write(tmp_path / "s.toml", """
        [channels.fakeslack]
        token = {credential = "env:FAKESLACK_TOKEN"}
        retries = 5
    """)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
    monkeypatch.setenv("SCHEDULER_CHANNELS_FAKESLACK_CHANNEL", "#ops")
    monkeypatch.setenv("FAKESLACK_TOKEN", SECRET_VALUE)
    channel = fakeslack_plugin.FakeSlack()
    settings = apply_settings("channel", "fakeslack", channel)
    assert channel.settings is settings and settings.retries == 5 and settings.channel == "#ops"
    assert channel.send(None, None).receipt_id == f"#ops:{len(SECRET_VALUE)}"
    assert plugin_settings("channel", "fakeslack", fakeslack_plugin.FakeSlackSettings) is settings  # cached
    # an explicit environment is read afresh, the file still comes from the cache
    fresh = plugin_settings("channels", "fakeslack", fakeslack_plugin.FakeSlackSettings, environ={})
    assert (fresh.channel, fresh.retries) == ("#general", 5)
    with pytest.raises(SchedulerError) as info:
        plugin_settings("channel", "fakeslack", fakeslack_plugin.FakeSlackSettings,
                        environ={"SCHEDULER_CHANNELS_FAKESLACK_RETRIES": "11"})
    assert info.value.code == "CONFIG_INVALID"
    assert "channels.fakeslack.retries" in info.value.message and "env:SCHEDULER_CHANNELS_FAKESLACK_RETRIES" in info.value.message


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*scheduler_cmd(), *args], capture_output=True, text=True, env=env, timeout=60)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = _scrubbed(dict(os.environ))
    env.pop("SCHEDULER_DISABLE_PLUGINS", None)
    env.update({"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"), **extra})
    return env


def test_scheduler_config_shows_values_sources_and_masks_secrets(plugin_site: Path, tmp_path: Path) -> None:
    path = write(tmp_path / "settings.toml", """
        [dispatcher]
        concurrency = 6
        [executors.shell]
        max_output_bytes = 1000
        [channels.fakeslack]
        token = {credential = "env:FAKESLACK_TOKEN"}
        [channels.uninstalled]
        anything = 1
    """)
    env = _env(tmp_path, PYTHONPATH=str(plugin_site), SCHEDULER_CONFIG=str(path), FAKESLACK_TOKEN=SECRET_VALUE,
               SCHEDULER_CHANNELS_FAKESLACK_RETRIES="7", SCHEDULER_CHANNELS_NOSUCH_KEY="1")
    res = _cli("--json", "--db", str(tmp_path / "x.db"), "config", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert SECRET_VALUE not in res.stdout + res.stderr
    out = json.loads(res.stdout)
    config, sources = out["config"], out["sources"]
    assert (config["dispatcher.concurrency"], sources["dispatcher.concurrency"]) == (6, f"file:{path}")
    assert (config["dispatcher.grace_s"], sources["dispatcher.grace_s"]) == (10.0, "default")
    assert (config["executors.shell.max_output_bytes"], sources["executors.shell.max_output_bytes"]) == (1000, f"file:{path}")
    assert config["channels.fakeslack.token"] == {"credential": "env:FAKESLACK_TOKEN"}
    assert sources["channels.fakeslack.token"] == f"file:{path}"
    assert (config["channels.fakeslack.retries"], sources["channels.fakeslack.retries"]) == (7, "env:SCHEDULER_CHANNELS_FAKESLACK_RETRIES")
    assert next(r for r in out["settings"] if r["key"] == "channels.fakeslack.token")["secret"] is True
    assert (config["fakeslack.greeting"], sources["fakeslack.greeting"]) == ("hi", "plugin")  # hook defaults still shown
    assert (sources["config_file"], sources["db"]) == ("env:SCHEDULER_CONFIG", "option:--db")
    assert out["file"] == {"path": str(path), "exists": True, "chosen_by": "env:SCHEDULER_CONFIG"}
    assert any("[channels.uninstalled]" in w for w in out["warnings"])
    assert any("SCHEDULER_CHANNELS_NOSUCH_KEY" in w for w in out["warnings"])
    assert not (tmp_path / "x.db").exists()  # config never opens the database

    human = _cli("config", env=env)
    assert human.returncode == 0 and SECRET_VALUE not in human.stdout + human.stderr
    line = next(ln for ln in human.stdout.splitlines() if ln.startswith("channels.fakeslack.token"))
    assert "<secret env:FAKESLACK_TOKEN>" in line and line.rstrip().endswith(f"file:{path}")
    assert "warning: [channels.uninstalled]" in human.stderr


def test_scheduler_config_check_fails_on_a_bad_plugin_table_and_a_literal_secret(plugin_site: Path, tmp_path: Path) -> None:
    good = write(tmp_path / "good.toml", "[channels.fakeslack]\nretries = 2\n")
    env = _env(tmp_path, PYTHONPATH=str(plugin_site), SCHEDULER_CONFIG=str(good))
    res = _cli("--json", "config", "--check", env=env)
    assert res.returncode == 0 and json.loads(res.stdout)["valid"] is True
    bad = write(tmp_path / "bad.toml", f"""
        [channels.fakeslack]
        retries = "two"
        token = "{SECRET_VALUE}"
    """)
    env["SCHEDULER_CONFIG"] = str(bad)
    for args in (("--json", "config", "--check"), ("--json", "config")):
        res = _cli(*args, env=env)
        assert res.returncode == 1 and SECRET_VALUE not in res.stdout + res.stderr
        out = json.loads(res.stdout)
        assert out["code"] == "CONFIG_INVALID"
        problems = {d["key"]: d for d in out["details"]}
        assert problems["channels.fakeslack.retries"]["source"] == f"file:{bad}"
        assert "secret values must be references" in problems["channels.fakeslack.token"]["error"]
    human = _cli("config", "--check", env=env)
    assert human.returncode == 1 and "error [CONFIG_INVALID]" in human.stderr and "channels.fakeslack.retries" in human.stderr


def test_stateful_commands_refuse_an_invalid_settings_file(tmp_path: Path) -> None:
    path = write(tmp_path / "s.toml", "[storage]\nsqlite_synchronous = \"sometimes\"\n")
    res = _cli("--json", "--db", str(tmp_path / "x.db"), "status", env=_env(tmp_path, SCHEDULER_CONFIG=str(path)))
    out = json.loads(res.stdout)
    assert res.returncode == 1 and out["code"] == "CONFIG_INVALID" and "storage.sqlite_synchronous" in out["error"]


# -- the kernel reads its settings ---------------------------------------------------------------------------------


def test_sqlite_store_uses_the_synchronous_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.plugins.stores import open_store

    monkeypatch.delenv("SCHEDULER_STORAGE_SQLITE_SYNCHRONOUS", raising=False)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(write(tmp_path / "none.toml", "")))
    reload_settings()
    store = open_store(str(tmp_path / "default.db"))
    try:
        with store.transaction() as tx:
            assert tx.scalar("PRAGMA synchronous") == 2  # FULL by default: a power loss keeps every committed claim
    finally:
        store.close()
    monkeypatch.setenv("SCHEDULER_CONFIG", str(write(tmp_path / "s.toml", "[storage]\nsqlite_synchronous = \"NORMAL\"\n")))
    reload_settings()
    store = open_store(str(tmp_path / "a.db"))
    try:
        with store.transaction() as tx:
            assert tx.scalar("PRAGMA synchronous") == 1  # NORMAL
    finally:
        store.close()
    monkeypatch.setenv("SCHEDULER_STORAGE_SQLITE_SYNCHRONOUS", "OFF")
    reload_settings()
    store = open_store(str(tmp_path / "b.db"))
    try:
        with store.transaction() as tx:
            assert tx.scalar("PRAGMA synchronous") == 0  # OFF
    finally:
        store.close()


def test_sqlite_store_uses_the_cache_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[storage] sqlite_cache_mb`` is every connection's page cache (32 MiB by default, not SQLite's 2 MiB)."""
    from scheduler.plugins.stores import open_store

    monkeypatch.delenv("SCHEDULER_STORAGE_SQLITE_CACHE_MB", raising=False)
    for name, text, kib in (("default", "", 32 * 1024), ("set", "[storage]\nsqlite_cache_mb = 7\n", 7 * 1024)):
        monkeypatch.setenv("SCHEDULER_CONFIG", str(write(tmp_path / f"{name}.toml", text)))
        reload_settings()
        store = open_store(str(tmp_path / f"{name}.db"))
        try:
            with store.transaction() as tx:
                assert tx.scalar("PRAGMA cache_size") == -kib
        finally:
            store.close()
    assert "sqlite_cache_mb" in invalid({"SCHEDULER_CONFIG": str(write(tmp_path / "bad.toml", "[storage]\nsqlite_cache_mb = 0\n"))}).message


def _lease_ttl_of_running_dispatcher(tmp_path: Path, env: dict[str, str], *flags: str) -> int:
    """Start ``scheduler run``, read its lease row's lifetime from the database file, stop it."""
    db = tmp_path / f"d{len(flags)}.db"
    from scheduler.plugins.stores import open_store

    open_store(str(db)).close()  # `scheduler run` refuses a missing database (issue 30)
    proc = subprocess.Popen([*scheduler_cmd(), "--db", str(db), "run", "--duration", "30s", *flags], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
                    row = conn.execute("SELECT acquired_at, expires_at FROM dispatcher_leases WHERE name = 'dispatcher'").fetchone()
                if row and row[0]:
                    return int(row[1] - row[0])
            except sqlite3.OperationalError:
                pass  # not created yet
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        raise AssertionError("the dispatcher never took its lease")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_scheduler_run_takes_its_defaults_from_the_dispatcher_table_and_flags_win(tmp_path: Path) -> None:
    path = write(tmp_path / "s.toml", "[dispatcher]\nlease_ttl_ms = 47000\n")
    env = _env(tmp_path, SCHEDULER_CONFIG=str(path))
    assert _lease_ttl_of_running_dispatcher(tmp_path, env) == 47000
    assert _lease_ttl_of_running_dispatcher(tmp_path, env, "--lease-ttl", "21s") == 21000


def test_no_kernel_module_reads_a_retired_variable() -> None:
    root = Path(__file__).resolve().parents[1] / "scheduler"
    for source in root.rglob("*.py"):
        if source.parts[-2:] == ("settings", "kernel.py"):
            continue
        text = source.read_text(encoding="utf-8")
        for old in RETIRED_ENV:
            assert f'"{old}"' not in text, f"{source} still reads {old}"


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("POSIX only")
