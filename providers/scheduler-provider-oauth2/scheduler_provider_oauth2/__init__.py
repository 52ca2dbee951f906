"""OAuth 2.0 credential provider (driver ``oauth2``, group ``scheduler.credential_providers``).

Importing this package is cheap: Authlib and httpx are imported at the first token request.
"""

from __future__ import annotations

from scheduler_provider_oauth2.errors import CODES, REVOKE_CODES, CredentialError
from scheduler_provider_oauth2.provider import CachedToken, OAuth2CredentialProvider
from scheduler_provider_oauth2.settings import Client, ClientSettings, OAuth2Options, OAuth2Settings

__all__ = [
    "CODES",
    "REVOKE_CODES",
    "CachedToken",
    "Client",
    "ClientSettings",
    "CredentialError",
    "OAuth2CredentialProvider",
    "OAuth2Options",
    "OAuth2Settings",
]
