"""A plugin's settings: its table of the settings file, secret references, and secret schemes.

``plugin_settings(kind, name, cls)`` reads and validates a plugin's table
(``[executors.shell]``, ``[channels.slack]``, ``[providers.NAME]``) with its
``SCHEDULER_<SECTION>_<NAME>_<KEY>`` overrides; ``SecretRef`` is a settings value that names a
secret (``{credential = "env:TOKEN"}``) instead of holding it; ``register_secret_scheme``
adds a scheme such references may use; ``reload_settings`` forgets the cached file (tests).
The kernel's own code (``scheduler.settings``), re-exported.
"""

from __future__ import annotations

from scheduler.settings import SecretRef, plugin_settings, register_secret_scheme, reload_settings

__all__ = ["SecretRef", "plugin_settings", "register_secret_scheme", "reload_settings"]
