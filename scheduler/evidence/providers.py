"""The evidence providers as the kernel loads and talks to them: loading, the declaration they get, the envelope kept.

Both ends use it: attestation in a run (``scheduler.evidence.attest``) and re-verification
from history (``scheduler.evidence.verify``), so a provider sees the same declaration and its
envelope is stored in the same form whichever end calls it.
"""

from __future__ import annotations

from typing import Any

from scheduler.base.canonical import canonical_json
from scheduler.plugins.loaded import LoadedProviders
from scheduler.plugins.protocols import EvidenceDeclaration, EvidenceEnvelope

#: Evidence providers loaded once per settings (loading one through its entry point costs milliseconds per run).
PROVIDERS = LoadedProviders("evidence", unavailable_code="EVIDENCE_PROVIDER_NOT_LOADED", noun="evidence provider",
                            per_settings=True)


def to_provider_declaration(declaration: dict[str, Any]) -> EvidenceDeclaration:
    """The ``EvidenceDeclaration`` a provider receives for a stored declaration (its options still raw JSON)."""
    required = bool((declaration.get("verify") or {}).get("required"))
    return EvidenceDeclaration(provider=declaration.get("provider") or "checksum", required=required, verify=required,
                               options=dict(declaration.get("provider_config") or {}),
                               methods=tuple(declaration.get("methods") or ()))


def envelope_json(envelope: EvidenceEnvelope) -> str:
    """An envelope as stored: the canonical JSON of ``provider``, ``format``, ``payload_digest`` and ``data``."""
    return canonical_json({"provider": envelope.provider, "format": envelope.format, "payload_digest": envelope.payload_digest,
                           "data": dict(envelope.data)})


__all__ = ["PROVIDERS", "envelope_json", "to_provider_declaration"]
