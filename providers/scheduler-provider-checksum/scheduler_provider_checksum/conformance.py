"""Conformance setup adapter of the checksum provider (entry point ``scheduler.conformance_adapters:checksum``).

A checksum needs nothing set up: no key, no trust, no settings. Cases about who signed
(an untrusted key, another principal or namespace) cannot apply to an envelope that
records no signer, so they are declined (``NotImplementedError``) and skipped; cases that
need a signature ``require`` the ``signed-evidence`` capability, which this provider does
not declare. Only the conformance engine imports this module.
"""

from __future__ import annotations

from typing import Any


class _Setup:
    """No settings, no job options, no secrets, no signature."""

    verify_settings: dict[str, Any] | None = None
    signature_field: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}  # per instance: the engine may fill them in
        self.provider_config: dict[str, Any] = {}
        self.secrets: dict[str, str] = {}

    def secret_values(self) -> list[str]:
        """A checksum holds no secret."""
        return []

    def close(self) -> None:
        """Nothing to stop."""


class ChecksumSetup:
    """The setup adapter: only a ``trusted`` signer (there is no signer at all) can be set up."""

    def conformance_setup(self, request: Any) -> _Setup:
        """Nothing to prepare; a case about the signer is declined."""
        if request.signer != "trusted":
            raise NotImplementedError(f"a checksum envelope records no key or signer, so there is no {request.signer} to set up")
        return _Setup()
