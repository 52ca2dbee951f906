"""Local credential providers: ``env``, ``file`` and ``command`` (group ``scheduler.credential_providers``).

Three drivers rather than one ``local`` driver with ref schemes: the binding's
``provider`` already selects the source, each source has its own settings table
(``[providers.env]``, ``[providers.file]``, ``[providers.command]``) and its own risk,
so an operator can switch one off (``SCHEDULER_DISABLE_PLUGINS=credential_providers:command``)
without the others, and the ``ref`` stays a plain name or path with no second
scheme syntax inside it. Importing this package is cheap and changes nothing.
"""

from __future__ import annotations

from scheduler_provider_local.command import CommandCredentialProvider, CommandSettings
from scheduler_provider_local.env import EnvCredentialProvider, EnvSettings
from scheduler_provider_local.errors import CODES, CredentialError
from scheduler_provider_local.file import FileCredentialProvider, FileSettings

__all__ = [
    "CODES",
    "CommandCredentialProvider",
    "CommandSettings",
    "CredentialError",
    "EnvCredentialProvider",
    "EnvSettings",
    "FileCredentialProvider",
    "FileSettings",
]
