"""``cedar``: authorization_ref decisions by Cedar policies evaluated in-process with cedarpy (see README.md)."""

from __future__ import annotations

from scheduler_provider_cedar.provider import CedarOptions, CedarProvider, CedarSettings, cedar_request

__all__ = ["CedarOptions", "CedarProvider", "CedarSettings", "cedar_request"]
