"""The settings file: one TOML file for the kernel and every plugin.

Location: ``$SCHEDULER_CONFIG``, else ``$XDG_CONFIG_HOME/scheduler/config.toml``
(``~/.config`` when unset). A missing file at the default location means defaults;
a file named by ``$SCHEDULER_CONFIG`` must exist. Tables::

    [dispatcher]            # kernel: scheduler run defaults (its flags win), misfire threshold
    concurrency = 8
    [storage]               # kernel: how stores open the database
    sqlite_synchronous = "FULL"
    [executors.shell]       # one table per plugin: executors, channels, providers
    max_output_bytes = 1048576
    [channels.slack]
    token = {credential = "env:SLACK_TOKEN"}    # secrets only as references

One override rule, generated from the declared fields: ``SCHEDULER_`` + the key
upper-cased with ``.``/``-`` as ``_`` (``SCHEDULER_DISPATCHER_CONCURRENCY``,
``SCHEDULER_EXECUTORS_SHELL_MAX_OUTPUT_BYTES``); the value is parsed per the
field's type and an empty variable counts as unset. Precedence: override, file,
default. A plugin field typed ``dict[str, SomeAttrsClass]`` is a table of named tables
(``[providers.oauth2.clients.NAME]``, names ``[a-z0-9][a-z0-9_.-]{0,63}``), each entry
validated like a plugin table; one key of an entry declared in the file is overridden by
the same rule (``SCHEDULER_PROVIDERS_OAUTH2_CLIENTS_REPORTS_TOKEN_URL``), and a variable
under the field that sets no declared entry's key is refused. Validation happens at load: an unknown table or key, a wrong type, a bad
value or malformed TOML is ``CONFIG_INVALID`` naming the key and the source. Plugin
tables are validated against the plugin's ``settings_class`` when the plugin reads
them and by ``scheduler config``; a table of a plugin that is not installed is a
warning there (a plugin may be uninstalled for a while), not an error.

Settings are loaded once per process and cached (``current_settings``);
``reload_settings`` forgets them.
"""

from __future__ import annotations

from scheduler.settings.kernel import KERNEL_TABLES, RETIRED_ENV, DispatcherSettings, StorageSettings
from scheduler.settings.load import (
    CONFIG_ENV,
    PLUGIN_SECTIONS,
    SETTINGS_SECTIONS,
    Resolved,
    Settings,
    SettingsFile,
    current_settings,
    env_var,
    load_settings,
    plugin_settings,
    reload_settings,
    resolve_plugin,
    section_of,
    settings_path,
)
from scheduler.settings.secret import SecretRef, register_secret_scheme, secret_schemes

__all__ = [
    "CONFIG_ENV",
    "KERNEL_TABLES",
    "PLUGIN_SECTIONS",
    "RETIRED_ENV",
    "SETTINGS_SECTIONS",
    "DispatcherSettings",
    "Resolved",
    "SecretRef",
    "Settings",
    "SettingsFile",
    "StorageSettings",
    "current_settings",
    "env_var",
    "load_settings",
    "plugin_settings",
    "register_secret_scheme",
    "reload_settings",
    "resolve_plugin",
    "secret_schemes",
    "section_of",
    "settings_path",
]
