"""``ChecksumProvider``: a SHA-256 envelope over the canonical evidence payload.

The envelope records the digest of the payload's json-sort-v1 bytes and how it was
made; verification re-checks the payload's canonical form and recomputes the digest.
It proves the evidence was not changed by accident or by anyone who cannot also
rewrite the stored digest; it does not prove who made it (that is what the ``ssh``
and ``external`` providers are for).
"""

from __future__ import annotations

from typing import Any

import attrs
from scheduler_toolkit.canonical import CANONICALIZATION
from scheduler_toolkit.evidence import (
    PAYLOAD_FORMAT,
    EvidenceFailure,
    check_bound_payload,
    check_keys,
    check_payload,
    check_requested_methods,
    declared_options,
    envelope_parts,
)

from scheduler.api import EvidenceDeclaration, EvidenceEnvelope, EvidencePayload, EvidenceVerification

__version__ = "0.1.0"

PROVIDER = "checksum"
METHOD = "sha256"
SCHEMA = "scheduler.evidence.checksum"
VERSION = 1
ENVELOPE_KEYS = ("schema", "version", "method", "algorithm", "canonicalization", "payload_format", "payload_digest",
                 "payload_bytes")


@attrs.frozen(kw_only=True)
class ChecksumSettings:
    """``[providers.checksum]``: the checksum provider has no settings; a key in its table is a configuration error."""


class ChecksumProvider:
    """The ``checksum`` evidence provider (entry point ``scheduler.evidence_providers:checksum``)."""

    plugin_api = 3
    #: ``attest``: makes envelopes; ``verify-evidence``: re-checks them. No signature, no trust anchor.
    capabilities: frozenset[str] = frozenset({"attest", "verify-evidence"})
    #: The evidence methods this provider performs (a declaration naming another is refused).
    methods: frozenset[str] = frozenset({METHOD})
    settings_class = ChecksumSettings
    #: No per-job options: a non-empty ``provider_config`` is refused.
    options_class = None

    def configure(self, settings: ChecksumSettings) -> None:
        """Nothing to configure; accepted so the loader can validate the (empty) table."""

    def attest(self, payload: EvidencePayload | bytes, declaration: EvidenceDeclaration) -> EvidenceEnvelope:
        """The SHA-256 envelope of the payload's canonical bytes; ``SchedulerError`` (fail closed) when it cannot be made."""
        try:
            checked = check_payload(payload)
            declared_options(declaration, None, PROVIDER)
            check_requested_methods(declaration, self.methods, PROVIDER)
        except EvidenceFailure as failure:
            raise failure.error() from None
        data = {
            "schema": SCHEMA,
            "version": VERSION,
            "method": METHOD,
            "algorithm": "sha256",
            "canonicalization": CANONICALIZATION,
            "payload_format": PAYLOAD_FORMAT,
            "payload_digest": checked.digest,
            "payload_bytes": len(checked.canonical),
        }
        return EvidenceEnvelope(provider=PROVIDER, format=SCHEMA, payload_digest=checked.digest, data=data)

    def verify(self, envelope: EvidenceEnvelope | Any, payload: EvidencePayload | bytes,
               declaration: EvidenceDeclaration) -> EvidenceVerification:
        """Recompute the digest and compare every field of the envelope; any difference is ``verified=False`` with a code."""
        try:
            self._verify(envelope, payload, declaration)
        except EvidenceFailure as failure:
            return failure.verification(PROVIDER)
        except Exception as exc:  # noqa: BLE001 - fail closed: an unexpected error never passes and never escapes
            return EvidenceVerification(verified=False, provider=PROVIDER, code="EVIDENCE_VERIFICATION_FAILED",
                                        reason=f"verification failed unexpectedly: {type(exc).__name__}")
        return EvidenceVerification(verified=True, provider=PROVIDER)

    def _verify(self, envelope: Any, payload: Any, declaration: Any) -> None:
        digest, data = envelope_parts(envelope, PROVIDER)
        if data.get("schema") != SCHEMA:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"the envelope's schema is not {SCHEMA}")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version != VERSION:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"unsupported envelope version {version!r}")
        if data.get("method") not in self.methods:
            raise EvidenceFailure("EVIDENCE_METHOD_MISMATCH", f"the envelope's method {data.get('method')!r} is not one this provider performs")
        check_requested_methods(declaration, self.methods, PROVIDER)
        check_keys(data, ENVELOPE_KEYS)
        for key, expected in (("algorithm", "sha256"), ("canonicalization", CANONICALIZATION),
                              ("payload_format", PAYLOAD_FORMAT)):
            if data[key] != expected:
                raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"the envelope's {key} is {data[key]!r}, not {expected!r}")
        checked = check_payload(payload)
        check_bound_payload(digest, checked)
        size = data["payload_bytes"]
        if not isinstance(size, int) or isinstance(size, bool) or size != len(checked.canonical):
            raise EvidenceFailure("EVIDENCE_PAYLOAD_MISMATCH", "the envelope's payload_bytes is not the payload's size")
