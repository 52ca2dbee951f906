"""``scheduler config``: every effective setting with its source; ``--check`` validates the settings file.

Sources: ``default``, ``file:/path`` (the settings file), ``env:NAME`` (an override or
one of the kernel's environment switches), ``option:--db`` and ``plugin`` (a default a
hook plugin contributes through ``scheduler_config_defaults``). Secret settings are
shown as their reference (``{"credential": "env:SLACK_TOKEN"}``), never resolved. The
tables of installed plugins that declare ``settings_class`` are validated and shown
too; a table of a plugin that is not installed (or disabled) is a warning, not an error.
Never opens the database.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import click

from scheduler.cli.output import emit, table


@attrs.frozen(kw_only=True)
class PluginSettingsClass:
    """An installed plugin of a settings-bearing kind, with its ``settings_class`` (None when it declares none)."""

    kind: str
    name: str
    settings_class: type | None


def _from_env(var: str, default: Any) -> dict[str, Any]:
    value = os.environ.get(var)
    return {"value": value, "source": f"env:{var}"} if value else {"value": default, "source": "default"}


def kernel_switches(ctx: click.Context) -> list[dict[str, Any]]:
    """The kernel's values that are not settings-file keys: database, artifact directory, plugin switches, the file itself."""
    from scheduler.core.store import default_artifacts_root, default_db_path, local_path_of, redact_url
    from scheduler.settings import settings_path

    root = ctx.find_root()
    db = root.obj.get("db")
    how = root.get_parameter_source("db")
    db_source = {click.core.ParameterSource.COMMANDLINE: "option:--db",
                 click.core.ParameterSource.ENVIRONMENT: "env:SCHEDULER_DB"}.get(how, "default")  # type: ignore[arg-type]
    target = db or str(default_db_path())
    path, chosen_by = settings_path(os.environ)
    rows = [
        {"key": "config_file", "value": str(path), "source": chosen_by},
        {"key": "db", "value": redact_url(target), "source": db_source if db else "default"},
        {"key": "artifacts_dir", "value": str(default_artifacts_root(local_path_of(target))),
         "source": "env:SCHEDULER_ARTIFACTS_DIR" if os.environ.get("SCHEDULER_ARTIFACTS_DIR") else "default"},
        {"key": "plugins.disabled", **_from_env("SCHEDULER_DISABLE_PLUGINS", "")},
        {"key": "plugins.strict", **_from_env("SCHEDULER_STRICT_PLUGINS", "")},
    ]
    return [{**row, "secret": False} for row in rows]


def installed_settings_classes() -> tuple[list[PluginSettingsClass], list[str]]:
    """Every enabled executor, channel and provider with its ``settings_class``; warnings for those that did not load."""
    from scheduler.base.plugin_kinds import KINDS
    from scheduler.core.members import Configurable
    from scheduler.plugins.loader import load_group

    found: list[PluginSettingsClass] = []
    warnings: list[str] = []
    for kind in (k for k in KINDS if k.section is not None):
        for loaded in load_group(kind.group):
            if loaded.error is not None:
                warnings.append(f"{kind.name} {loaded.name!r} from {loaded.distribution} did not load, so its settings were not "
                                f"checked: {type(loaded.error).__name__}: {loaded.error}")
                continue
            settings_class = loaded.obj.settings_class if isinstance(loaded.obj, Configurable) else None
            found.append(PluginSettingsClass(kind=kind.name, name=loaded.name, settings_class=settings_class))
    return found, warnings


@attrs.frozen
class NoSettings:
    """Stands for the settings class of a plugin that declares none: every key in its table is unknown."""


def effective_settings() -> dict[str, Any]:
    """Validate the whole settings file (kernel and installed plugins): rows, warnings and the file; ``CONFIG_INVALID`` when bad."""
    from scheduler.plugins.options import route_problems
    from scheduler.settings import PLUGIN_SECTIONS, env_var, load_settings, resolve_plugin, section_of
    from scheduler.settings.load import raise_invalid, setting_vars

    settings = load_settings()
    rows = [row for resolved in settings.kernel.values() for row in resolved.rows()]
    plugins, warnings = installed_settings_classes()
    problems: list[dict[str, Any]] = []
    known: dict[tuple[str, str], list[PluginSettingsClass]] = {}
    for plugin in plugins:
        known.setdefault((section_of(plugin.kind), plugin.name), []).append(plugin)
    known_vars: set[str] = set()
    for (section, name), group in sorted(known.items()):
        for plugin in group:
            cls = plugin.settings_class or NoSettings
            known_vars.update(setting_vars(f"{section}.{name}", cls, settings.plugin_table(section, name)))
            resolved, found = resolve_plugin(plugin.kind, plugin.name, cls, settings=settings)
            problems.extend(found)
            if resolved is not None and plugin is group[0]:  # providers of several kinds may share [providers.NAME]
                rows.extend(resolved.rows())
    routes_source = next((row["source"] for row in rows if row["key"] == "notifications.routes"), "default")
    problems.extend({"key": p["field"], "source": routes_source, "error": p["error"], "code": p["code"]}
                    for p in route_problems(settings.notifications.routes))
    for section, name in settings.plugin_tables():
        if (section, name) not in known:
            warnings.append(f"[{section}.{name}] in {settings.file.path}: no {section[:-1]} named {name!r} is installed "
                            "(or it is disabled); the table is not checked or used")
    prefixes = tuple(env_var(section) + "_" for section in PLUGIN_SECTIONS)
    for var in sorted(os.environ):
        if var.startswith(prefixes) and var not in known_vars:
            warnings.append(f"{var} matches no setting of an installed plugin; it is ignored")
    if problems:
        raise_invalid(problems)
    return {"file": settings.file, "rows": rows, "warnings": warnings}


def _shown(row: dict[str, Any]) -> str:
    """A value for the human table: secrets as their masked reference."""
    value = row["value"]
    if row.get("secret") and isinstance(value, dict):
        return f"<secret {value.get('credential')}>"
    return "-" if value is None else str(value)


@click.command("config")
@click.option("--check", is_flag=True, help="Only validate the settings file and overrides; exit 1 with CONFIG_INVALID when bad.")
@click.pass_context
def config_cmd(ctx: click.Context, check: bool) -> None:
    """Show every effective setting and its source (file, env, default, plugin); secrets as references only."""
    from scheduler.plugins.hooks import Hooks

    effective = effective_settings()
    file = effective["file"]
    file_info = {"path": str(file.path), "exists": file.exists, "chosen_by": file.chosen_by}
    warnings: list[str] = effective["warnings"]
    if check:
        def human_check() -> None:
            for warning in warnings:
                click.echo(f"warning: {warning}", err=True)
            state = "" if file.exists else " (not found: defaults apply)"
            click.echo(f"settings valid: {file.path}{state}, {len(warnings)} warning(s)")

        emit({"valid": True, "file": file_info, "warnings": warnings}, human_check)
        return
    rows = kernel_switches(ctx) + effective["rows"]
    taken = {r["key"] for r in rows}
    for key, value in sorted(Hooks().config_defaults().items()):
        if key not in taken:  # a hook plugin never overrides a kernel or settings key
            rows.append({"key": key, "value": value, "source": "plugin", "secret": False})

    def human() -> None:
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        table([(r["key"], _shown(r), r["source"]) for r in rows], ["key", "value", "source"])

    emit({"config": {r["key"]: r["value"] for r in rows}, "sources": {r["key"]: r["source"] for r in rows},
          "settings": rows, "file": file_info, "warnings": warnings}, human)


__all__ = ["NoSettings", "PluginSettingsClass", "config_cmd", "effective_settings", "installed_settings_classes", "kernel_switches"]
