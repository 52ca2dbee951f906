"""The one registry of plugin kinds, and the optional provider members as Protocols checked at load."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import attrs
import pytest

from scheduler.base.errors import SchedulerError
from scheduler.base.plugin_kinds import GROUPS, KINDS, PROVIDER_KIND_NAMES, declares_api, kind_named, kind_of_group
from scheduler.core.members import Configurable, DeclaresOptions, PolicyChecking, Recoverable, options_class_of
from scheduler.plugins.loader import apply_settings, check_members
from scheduler.plugins.protocols import PROVIDER_KINDS, protocol_of
from scheduler.settings import SETTINGS_SECTIONS

ROOT = Path(__file__).resolve().parents[1]


def test_every_kind_names_a_protocol_that_exists_and_the_derived_tables_agree() -> None:
    for kind in KINDS:
        protocol = protocol_of(kind.name)
        assert (protocol is None) == (kind.protocol is None), kind.name
        if protocol is not None:
            assert protocol.__name__ == kind.protocol
    assert list(PROVIDER_KINDS) == list(PROVIDER_KIND_NAMES)
    assert {k: g for k, (g, _p) in PROVIDER_KINDS.items()} == {k.name: k.group for k in KINDS if k.provider}
    assert {k.name: k.section for k in KINDS if k.section} == SETTINGS_SECTIONS
    assert len(set(GROUPS)) == len(GROUPS) == len(KINDS)


def test_every_entry_point_group_in_use_is_a_registered_kind() -> None:
    """No group string outside the registry: every ``"scheduler.<group>"`` literal in the kernel is one of GROUPS."""
    offenders = []
    for path in (ROOT / "scheduler").rglob("*.py"):
        if path.name == "plugin_kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in GROUPS:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert not offenders, "entry-point groups must be read from scheduler.base.plugin_kinds:\n" + "\n".join(offenders)


def test_unknown_kind_and_group_are_refused_with_a_code() -> None:
    with pytest.raises(SchedulerError) as exc:
        kind_named("exector")
    assert exc.value.code == "PLUGIN_KIND_UNKNOWN" and "executor" in exc.value.message
    with pytest.raises(SchedulerError) as exc:
        kind_of_group("scheduler.executor")
    assert exc.value.code == "PLUGIN_KIND_UNKNOWN"
    assert declares_api("scheduler.not-a-group")  # unknown: checked, fail closed
    assert not declares_api(kind_named("hook").group) and declares_api(kind_named("store").group)


@attrs.define
class _Settings:
    greeting: str = "hi"


@attrs.frozen
class _Options:
    loud: bool = False


class _Full:
    settings_class = _Settings
    options_class = _Options

    def __init__(self) -> None:
        self.configured: Any = None

    def configure(self, settings: _Settings) -> None:
        self.configured = settings

    def recover(self, request: Any) -> Any:
        return None

    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        return []


class _SettingsOnly:
    settings_class = _Settings


class _OptionsNotAttrs:
    options_class = dict


class _RecoverNotCallable:
    recover = "yes"


class _ConfigureOnly:
    def configure(self, settings: Any) -> None:
        pass


class _NoneMeansNone:
    options_class = None
    settings_class = None


def test_a_provider_implementing_every_optional_member_passes_and_is_configured() -> None:
    provider = _Full()
    check_members(provider, kind="channel", name="full", dist="test")
    for protocol in (Configurable, DeclaresOptions, Recoverable, PolicyChecking):
        assert isinstance(provider, protocol)
    assert options_class_of(provider) is _Options and options_class_of(object()) is None
    settings = apply_settings("channel", "full-test-kinds", provider)
    assert isinstance(settings, _Settings) and provider.configured is settings
    assert apply_settings("channel", "none", object()) is None


@pytest.mark.parametrize(("provider", "needle"), [
    (_SettingsOnly(), "declares settings_class but not configure"),
    (_OptionsNotAttrs(), "options_class must be an attrs class"),
    (_RecoverNotCallable(), "recover must be callable"),
    (_ConfigureOnly(), "declares configure but not settings_class"),
])
def test_half_an_optional_member_is_refused_at_load(provider: Any, needle: str) -> None:
    with pytest.raises(SchedulerError) as exc:
        check_members(provider, kind="executor", name="half", dist="test-dist")
    assert exc.value.code == "PLUGIN_INVALID"
    assert needle in exc.value.message and "test-dist" in exc.value.message


def test_none_declares_no_optional_member() -> None:
    check_members(_NoneMeansNone(), kind="channel", name="none", dist="test")
    assert options_class_of(_NoneMeansNone()) is None and apply_settings("channel", "none", _NoneMeansNone()) is None


def test_the_loader_and_kernel_ask_protocols_not_getattr_for_provider_members() -> None:
    """``grep getattr`` over the loader (and the kernel) finds no probe for an optional provider member."""
    members = ("options_class", "settings_class", "configure", "recover", "check_policy")
    offenders = []
    for path in (ROOT / "scheduler").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in members):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    assert not offenders, "\n".join(offenders)
    assert "getattr(" not in (ROOT / "scheduler" / "plugins" / "loader.py").read_text()


class _ClassOptions:
    options_class = _NoneMeansNone


class _InstanceOptions:
    def __init__(self, cls: type | None) -> None:
        if cls is not None:
            self.options_class = cls


class _Proxy:
    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_options_class_of_answers_per_instance_where_the_class_does_not_declare_it() -> None:
    """The class's answer is remembered; an instance's own attribute and a proxy's are still seen."""
    assert options_class_of(_ClassOptions()) is _NoneMeansNone and options_class_of(_ClassOptions()) is _NoneMeansNone
    assert options_class_of(_InstanceOptions(None)) is None
    assert options_class_of(_InstanceOptions(_ClassOptions)) is _ClassOptions  # after a negative answer for its class
    assert options_class_of(_Proxy(_ClassOptions())) is _NoneMeansNone
    assert options_class_of(_Proxy(object())) is None
