"""Reading the settings: file location, TOML, environment overrides, validation, the per-process cache.

Every problem becomes one ``SchedulerError("CONFIG_INVALID")`` whose message names
the first bad key and its source and whose ``details`` list every problem as
``{"key", "source", "code", "error"}`` (plus ``line``/``column`` for malformed TOML).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import tomllib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args, get_origin

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.options import option_problems
from scheduler.base.plugin_kinds import settings_sections
from scheduler.settings.kernel import (
    KERNEL_TABLES,
    RETIRED_ENV,
    DeliverySettings,
    DispatcherSettings,
    IdentitySettings,
    JobsSettings,
    NotificationSettings,
    StorageSettings,
)
from scheduler.settings.secret import SecretRef, not_a_reference

CONFIG_ENV = "SCHEDULER_CONFIG"
ENV_PREFIX = "SCHEDULER_"
#: Sections holding one table per plugin: ``[executors.NAME]``, ``[channels.NAME]``, ``[providers.NAME]``.
PLUGIN_SECTIONS: tuple[str, ...] = ("executors", "channels", "providers")
#: Settings-file section of each plugin kind (``[executors.shell]``, ``[providers.oauth2]``): from the kinds registry.
SETTINGS_SECTIONS: dict[str, str] = settings_sections()
_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def env_var(key: str) -> str:
    """The override variable of a setting: ``SCHEDULER_`` + the key upper-cased, ``.`` and ``-`` as ``_``.

    ``executors.shell.max_output_bytes`` -> ``SCHEDULER_EXECUTORS_SHELL_MAX_OUTPUT_BYTES``,
    ``dispatcher.concurrency`` -> ``SCHEDULER_DISPATCHER_CONCURRENCY``. Generated from
    the declared fields, never parsed back, so plugin and key names may contain ``_``.
    """
    return ENV_PREFIX + re.sub(r"[-.]", "_", key).upper()


def problem(key: str | None, source: str, code: str, error: str, **extra: Any) -> dict[str, Any]:
    """One entry of a ``CONFIG_INVALID`` error's ``details`` (``field`` repeats the key, or the source, for the CLI's listing)."""
    return {"key": key, "field": key or source, "source": source, "code": code, "error": error, **extra}


def raise_invalid(problems: list[dict[str, Any]]) -> NoReturn:
    """Raise ``CONFIG_INVALID`` for ``problems``, the message naming the first one's key and source."""
    first = problems[0]
    where = f"setting {first['key']}" if first.get("key") else "settings"
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    raise SchedulerError("CONFIG_INVALID", f"{where} from {first['source']}: {first['error']}{more}", details=problems)


# -- the file --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SettingsFile:
    """The settings file this process reads, and its parsed top-level tables (empty when missing)."""

    path: Path
    #: Why this path: ``env:SCHEDULER_CONFIG`` or ``default`` (the XDG location).
    chosen_by: str
    exists: bool
    tables: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def source(self) -> str:
        """The source label of values read from it: ``file:/abs/path``."""
        return f"file:{self.path}"


def settings_path(environ: Mapping[str, str]) -> tuple[Path, str]:
    """``$SCHEDULER_CONFIG``, else ``$XDG_CONFIG_HOME/scheduler/config.toml`` (``~/.config`` when unset or relative)."""
    explicit = environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser().absolute(), f"env:{CONFIG_ENV}"
    base = environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path("~/.config").expanduser()
    return root / "scheduler" / "config.toml", "default"


def read_settings_file(environ: Mapping[str, str]) -> SettingsFile:
    """Read and parse the settings file. The default location may be missing; a named one may not."""
    path, chosen_by = settings_path(environ)
    source = f"file:{path}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if chosen_by == "default":
            return SettingsFile(path=path, chosen_by=chosen_by, exists=False)
        raise_invalid([problem(None, f"env:{CONFIG_ENV}", "NOT_FOUND", f"the settings file {path} does not exist")])
    except OSError as exc:
        raise_invalid([problem(None, source, "INVALID_VALUE", f"cannot read the settings file: {exc.strerror or exc}")])
    try:
        tables = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise_invalid([problem(None, source, "INVALID_VALUE", f"the settings file is not UTF-8 (byte {exc.start})")])
    except tomllib.TOMLDecodeError as exc:
        at = _TOML_POSITION.search(str(exc))
        line, column = (int(at.group(1)), int(at.group(2))) if at else (None, None)
        raise_invalid([problem(None, source, "INVALID_VALUE", f"malformed TOML: {exc}", line=line, column=column)])
    return SettingsFile(path=path, chosen_by=chosen_by, exists=True, tables=tables)


# -- one table -------------------------------------------------------------------------------------


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else tp
    return tp


def is_secret(field: attrs.Attribute, tp: Any) -> bool:
    """Whether a settings field holds a secret: declared ``secret=True`` or typed ``SecretRef``."""
    return bool(field.metadata.get("secret")) or _strip_optional(tp) is SecretRef


def parse_env_value(tp: Any, text: str, *, secret: bool = False) -> Any:
    """The value of an override variable for a field of type ``tp``; ``ValueError`` saying what was expected.

    ``int``/``float`` as numbers, ``bool`` as ``true/false/1/0/yes/no/on/off``, a choice as
    one of its values, a list as a JSON array or comma-separated words, a mapping as a
    JSON object, a secret as its reference (``env:NAME``), anything else as the text.
    """
    if secret:
        return SecretRef.parse(text)
    tp = _strip_optional(tp)
    origin = get_origin(tp)
    if origin is Literal:
        return next((a for a in get_args(tp) if str(a) == text), text)  # a non-choice is reported by the validator
    if tp is bool:
        if text.strip().lower() in _TRUE | _FALSE:
            return text.strip().lower() in _TRUE
        raise ValueError("must be true or false (1/0, yes/no, on/off)")
    if tp is int:
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError("must be an integer") from None
    if tp is float:
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError("must be a number") from None
    if origin in (list, tuple, dict):
        if origin is dict or text.lstrip().startswith("["):
            try:
                return json.loads(text)
            except ValueError:
                raise ValueError(f"must be a JSON {'object' if origin is dict else 'array'}") from None
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def _from_file(value: Any) -> SecretRef:
    """A secret field's file value: only ``{credential = "SCHEME:TARGET"}`` is accepted."""
    if isinstance(value, dict) and set(value) == {"credential"} and isinstance(value["credential"], str):
        return SecretRef.parse(value["credential"])
    if isinstance(value, dict):
        raise ValueError('must be a reference table with the one key credential: {credential = "env:NAME"}')
    raise ValueError(not_a_reference())


@attrs.frozen(kw_only=True)
class Resolved:
    """One validated table: its instance and where each key's value came from (``default``, ``file:...``, ``env:...``).

    ``entries`` holds, per ``dict[str, SomeAttrsClass]`` field, each named sub-table's own
    ``Resolved`` (``[providers.oauth2.clients.reports]``), so its keys keep their sources.
    """

    key: str
    value: Any
    sources: Mapping[str, str]
    entries: Mapping[str, Mapping[str, Resolved]] = attrs.field(factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """One ``{"key", "value", "source", "secret"}`` row per field, secrets as their reference.

        A table of named sub-tables contributes the rows of each entry
        (``providers.oauth2.clients.reports.token_url``), or one row ``{}`` when it has none.
        """
        hints = typing.get_type_hints(type(self.value))
        out = []
        for f in attrs.fields(type(self.value)):
            if self.entries.get(f.name):
                for entry in self.entries[f.name].values():
                    out.extend(entry.rows())
                continue
            value = getattr(self.value, f.name)
            if isinstance(value, SecretRef):
                value = value.to_json()
            elif isinstance(value, tuple):
                value = list(value)
            out.append({"key": f"{self.key}.{f.name}", "value": value, "source": self.sources.get(f.name, "default"),
                        "secret": is_secret(f, hints[f.name])})
        return out


#: The names of the entries of a table of named sub-tables (``[providers.oauth2.clients.NAME]``).
ENTRY_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


def entry_class(tp: Any) -> type | None:
    """The attrs class of a ``dict[str, SomeAttrsClass]`` settings field (a table of named sub-tables), else None."""
    tp = _strip_optional(tp)
    if get_origin(tp) is dict:
        args = get_args(tp)
        if len(args) == 2 and args[0] is str and attrs.has(args[1]):
            return typing.cast(type, args[1])
    return None


def setting_vars(key: str, cls: type, table: Any) -> dict[str, list[str]]:
    """Every override variable a table of ``cls`` reads, with the key(s) it sets: ``{var: [dotted key, ...]}``.

    A table of named sub-tables contributes ``env_var(KEY.FIELD.ENTRY.SUBKEY)`` for each
    entry present in ``table`` (entries are declared in the file; a variable only
    overrides one). Two keys that map to one variable (``a-b`` and ``a_b``) are both listed.
    """
    out: dict[str, list[str]] = {}
    hints = typing.get_type_hints(cls)
    table = table if isinstance(table, dict) else {}
    for f in attrs.fields(cls):
        sub = entry_class(hints[f.name])
        if sub is None:
            out.setdefault(env_var(f"{key}.{f.name}"), []).append(f"{key}.{f.name}")
            continue
        entries = table.get(f.name)
        for entry, entry_table in (entries.items() if isinstance(entries, dict) else ()):
            if isinstance(entry, str) and ENTRY_NAME.match(entry):
                for var, keys in setting_vars(f"{key}.{f.name}.{entry}", sub, entry_table).items():
                    out.setdefault(var, []).extend(keys)
    return out


def _entry_var_problems(key: str, cls: type, table: Any, file_source: str, environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """Override variables of a table's named sub-tables that set nothing, or more than one key: refused, never ignored."""
    hints = typing.get_type_hints(cls)
    nested = [f.name for f in attrs.fields(cls) if entry_class(hints[f.name]) is not None]
    if not nested:
        return []
    claimed = setting_vars(key, cls, table)
    problems = []
    for name in nested:
        field_var = env_var(f"{key}.{name}")
        for var in sorted(environ):
            if not environ[var] or not (var == field_var or var.startswith(field_var + "_")):
                continue
            keys = claimed.get(var, [])
            if len(keys) > 1:
                problems.append(problem(keys[0], f"env:{var}", "INVALID_VALUE",
                                        f"{var} is ambiguous: it names {' and '.join(keys)} (rename one entry)"))
            elif not keys:
                problems.append(problem(f"{key}.{name}", f"env:{var}", "UNKNOWN_FIELD",
                                        f"{var} overrides no key of an entry of [{key}.{name}]: an override sets one key "
                                        f"of an entry declared in the settings file, "
                                        f"{field_var}_<ENTRY>_<KEY> (declare the entry as [{key}.{name}.NAME] first)"))
    return problems


def _resolve_entries(
    key: str, cls: type, entries: Any, file_source: str, environ: Mapping[str, str]
) -> tuple[dict[str, Resolved] | None, list[dict[str, Any]]]:
    """Validate a table of named sub-tables (``[KEY.NAME]``) entry by entry against ``cls``: (entries, problems)."""
    if not isinstance(entries, dict):
        return None, [problem(key, file_source, "INVALID_TYPE", f"[{key}] must hold named tables: [{key}.NAME]")]
    found: dict[str, Resolved] = {}
    problems: list[dict[str, Any]] = []
    for entry, table in entries.items():
        if not ENTRY_NAME.match(entry):
            problems.append(problem(f"{key}.{entry}", file_source, "INVALID_VALUE",
                                    "an entry name is 1-64 of a-z, 0-9, '_', '.', '-', starting with a letter or digit"))
            continue
        resolved, bad = resolve_table(f"{key}.{entry}", cls, table, file_source, environ, _top=False)
        problems.extend(bad)
        if resolved is not None:
            found[entry] = resolved
    return (None if problems else found), problems


def resolve_table(
    key: str, cls: type, table: Any, file_source: str, environ: Mapping[str, str], *, _top: bool = True
) -> tuple[Resolved | None, list[dict[str, Any]]]:
    """Validate one table (file values, then ``env_var`` overrides) against ``cls``: (result, problems).

    A ``dict[str, SomeAttrsClass]`` field is a table of named sub-tables, each validated
    against that class by the same rules (``[providers.oauth2.clients.reports]``, keys and
    overrides named ``providers.oauth2.clients.reports.token_url``,
    ``SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_REPORTS_TOKEN_URL``).
    """
    if not isinstance(table, dict):
        return None, [problem(key, file_source, "INVALID_TYPE", f"[{key}] must be a table")]
    fields = attrs.fields_dict(cls)
    hints = typing.get_type_hints(cls)
    nested = {name: sub for name in fields if (sub := entry_class(hints[name])) is not None}
    entries: dict[str, dict[str, Resolved]] = {}
    raw: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[dict[str, Any]] = []
    for name, value in table.items():
        if name not in fields:
            known = ", ".join(sorted(fields)) or "none: this plugin declares no settings"
            problems.append(problem(f"{key}.{name}", file_source, "UNKNOWN_FIELD", f"unknown key {name!r} (known: {known})"))
            continue
        sources[name] = file_source
        if name in nested:
            resolved_entries, found = _resolve_entries(f"{key}.{name}", nested[name], value, file_source, environ)
            problems.extend(found)
            if resolved_entries is not None:
                entries[name] = resolved_entries
            continue
        try:
            raw[name] = _from_file(value) if is_secret(fields[name], hints[name]) else value
        except ValueError as exc:
            problems.append(problem(f"{key}.{name}", file_source, "INVALID_VALUE", str(exc)))
    if _top:
        problems.extend(_entry_var_problems(key, cls, table, file_source, environ))
    for name, f in fields.items():
        if name in nested:  # overridden entry by entry (checked above)
            continue
        var = env_var(f"{key}.{name}")
        text = environ.get(var)
        if not text:  # unset or empty: not an override
            continue
        sources[name] = f"env:{var}"
        raw.pop(name, None)
        try:
            raw[name] = parse_env_value(hints[name], text, secret=is_secret(f, hints[name]))
        except ValueError as exc:
            problems.append(problem(f"{key}.{name}", sources[name], "INVALID_TYPE", str(exc)))
    kwargs, checked = option_problems(cls, raw, key)
    for p in checked:
        name = p["field"][len(key) + 1:].split(".")[0]
        if name in nested and p["code"] == "REQUIRED" and name in table:  # present: validated entry by entry
            continue
        missing_from = file_source if p["code"] == "REQUIRED" else "default"  # a required key is missing from the file
        problems.append(problem(p["field"], sources.get(name, missing_from), p["code"], p["error"]))
    for name, found_entries in entries.items():
        kwargs[name] = {entry: resolved.value for entry, resolved in found_entries.items()}
    for name, value in kwargs.items():
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(problem(f"{key}.{name}", sources.get(name, "default"), "INVALID_VALUE", "must be a finite number"))
    if problems:
        return None, problems
    try:
        instance = cls(**kwargs)
    except (TypeError, ValueError) as exc:  # the class's own attrs validators
        where = "; ".join(sorted(set(sources.values()))) or "default"
        return None, [problem(key, where, "INVALID_VALUE", str(exc))]
    return Resolved(key=key, value=instance, sources=sources, entries=entries), []


# -- the whole file --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Settings:
    """The validated kernel settings, the raw plugin tables (validated when a plugin asks) and the file."""

    file: SettingsFile
    kernel: Mapping[str, Resolved]

    @property
    def dispatcher(self) -> DispatcherSettings:
        """``[dispatcher]``."""
        return typing.cast(DispatcherSettings, self.kernel["dispatcher"].value)

    @property
    def storage(self) -> StorageSettings:
        """``[storage]``."""
        return typing.cast(StorageSettings, self.kernel["storage"].value)

    @property
    def notifications(self) -> NotificationSettings:
        """``[notifications]``."""
        return typing.cast(NotificationSettings, self.kernel["notifications"].value)

    @property
    def delivery(self) -> DeliverySettings:
        """``[delivery]``."""
        return typing.cast(DeliverySettings, self.kernel["delivery"].value)

    @property
    def jobs(self) -> JobsSettings:
        """``[jobs]``."""
        return typing.cast(JobsSettings, self.kernel["jobs"].value)

    @property
    def identity(self) -> IdentitySettings:
        """``[identity]``."""
        return typing.cast(IdentitySettings, self.kernel["identity"].value)

    def plugin_table(self, section: str, name: str) -> dict[str, Any]:
        """The file's ``[SECTION.NAME]`` table as written (empty when absent)."""
        return dict(self.file.tables.get(section, {}).get(name, {}))

    def plugin_tables(self) -> list[tuple[str, str]]:
        """Every ``(section, name)`` plugin table present in the file."""
        return [(s, n) for s in PLUGIN_SECTIONS for n in self.file.tables.get(s, {})]


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read, override and validate the settings now (uncached); ``CONFIG_INVALID`` listing every problem.

    Plugin tables are only checked for shape here (a table per plugin): their keys
    are validated against the plugin's ``settings_class`` when the plugin reads
    them (``plugin_settings``) and by ``scheduler config``, so loading the kernel's
    settings never imports a plugin.
    """
    env = os.environ if environ is None else environ
    file = read_settings_file(env)
    problems: list[dict[str, Any]] = []
    for var, key in RETIRED_ENV.items():
        if env.get(var):
            problems.append(problem(key, f"env:{var}", "FIELD_MOVED", f"{var} is no longer read: set {env_var(key)} or `{key}` in the settings file"))
    kernel_vars = {env_var(f"{t}.{f.name}") for t, cls in KERNEL_TABLES.items() for f in attrs.fields(cls)}
    for var in sorted(env):
        if any(var.startswith(env_var(t) + "_") for t in KERNEL_TABLES) and var not in kernel_vars:
            problems.append(problem(None, f"env:{var}", "UNKNOWN_FIELD", f"{var} matches no setting of the kernel tables"))
    for top, value in file.tables.items():
        if top in PLUGIN_SECTIONS:
            if not isinstance(value, dict):
                problems.append(problem(top, file.source, "INVALID_TYPE", f"{top} must hold one table per plugin: [{top}.NAME]"))
                continue
            problems.extend(problem(f"{top}.{name}", file.source, "INVALID_TYPE", f"[{top}.{name}] must be a table")
                            for name, table in value.items() if not isinstance(table, dict))
        elif top not in KERNEL_TABLES:
            known = ", ".join([*KERNEL_TABLES, *PLUGIN_SECTIONS])
            problems.append(problem(top, file.source, "UNKNOWN_FIELD", f"unknown table [{top}] (known: {known})"))
    kernel: dict[str, Resolved] = {}
    for name, cls in KERNEL_TABLES.items():
        resolved, found = resolve_table(name, cls, file.tables.get(name, {}), file.source, env)
        problems.extend(found)
        if resolved is not None:
            kernel[name] = resolved
    if problems:
        raise_invalid(problems)
    return Settings(file=file, kernel=kernel)


# -- the per-process cache and plugin settings -------------------------------------------------------

_lock = threading.Lock()
_current: Settings | None = None
_plugin_cache: dict[tuple[str, str, type], Any] = {}


def current_settings() -> Settings:
    """This process's settings, loaded from ``os.environ`` on first use and cached (cheap to call often)."""
    global _current
    settings = _current
    if settings is None:
        with _lock:
            if _current is None:
                _current = load_settings()
            settings = _current
    return settings


def reload_settings() -> None:
    """Forget the cached settings: the next read loads the file and environment again (tests, SIGHUP-style reloads)."""
    global _current
    with _lock:
        _current = None
        _plugin_cache.clear()


def replace_settings(check: Callable[[Settings], None] | None = None) -> Settings:
    """Load and validate the settings now and make them this process's settings (a SIGHUP reload).

    Unlike ``reload_settings`` nothing is forgotten before the new settings are known to
    be valid: ``CONFIG_INVALID`` leaves the previous settings (and plugin settings) in place,
    as does any ``SchedulerError`` from ``check``, which judges the new settings first (the
    dispatcher's: the channels' judgement of ``[notifications] routes``).
    """
    global _current
    fresh = load_settings()
    if check is not None:
        check(fresh)
    with _lock:
        _current = fresh
        _plugin_cache.clear()
    return fresh


def section_of(kind: str) -> str:
    """The settings section of a provider kind (``executor`` -> ``executors``); a section name is returned as is."""
    if kind in PLUGIN_SECTIONS:
        return kind
    try:
        return SETTINGS_SECTIONS[kind]
    except KeyError:
        raise ValueError(f"unknown plugin kind {kind!r} (known: {', '.join(SETTINGS_SECTIONS)})") from None


def resolve_plugin(kind: str, name: str, cls: type, *, environ: Mapping[str, str] | None = None,
                   settings: Settings | None = None) -> tuple[Resolved | None, list[dict[str, Any]]]:
    """Validate the ``[SECTION.NAME]`` table and its overrides against ``cls``: (result, problems)."""
    settings = settings or current_settings()
    section = section_of(kind)
    env = os.environ if environ is None else environ
    return resolve_table(f"{section}.{name}", cls, settings.plugin_table(section, name), settings.file.source, env)


def plugin_settings(kind: str, name: str, cls: type, *, environ: Mapping[str, str] | None = None) -> Any:
    """A plugin's validated settings: an instance of ``cls`` from ``[SECTION.NAME]`` plus ``SCHEDULER_...`` overrides.

    ``kind`` is the provider kind (``executor``, ``channel``, ``evidence``,
    ``credential``, ``authorization``) or its section (``executors``...). The file
    comes from the per-process cache; overrides are read from ``environ`` (default
    ``os.environ``, cached with the file until ``reload_settings``). Raises
    ``CONFIG_INVALID`` naming the key and its source.
    """
    cache_key = (section_of(kind), name, cls)
    if environ is None and cache_key in _plugin_cache:
        return _plugin_cache[cache_key]
    resolved, problems = resolve_plugin(kind, name, cls, environ=environ)
    if problems or resolved is None:
        raise_invalid(problems)
    if environ is None:
        _plugin_cache[cache_key] = resolved.value
    return resolved.value
