"""Checks every evidence provider makes of what the kernel hands it, and of the envelopes it reads back.

An evidence provider signs or attests the kernel's canonical evidence payload
(``EvidencePayload``: the document, its json-sort-v1 bytes and their ``sha256:`` digest)
and later verifies the envelope it produced. Whatever the provider does, it must first
make sure the payload is what it claims (bytes exactly in json-sort-v1 form, the document
canonicalising to them, the digest theirs) and, when verifying, that the envelope is its
own, for this payload, with exactly its fields. These checks were repeated word for word
in every first-party provider, so they live here:

* ``EvidenceFailure(code, message)``: a coded failure; ``attest`` raises ``.error()``,
  ``verify`` returns ``.verification(provider)``;
* ``check_payload(payload) -> CheckedPayload``: the payload checked (``EVIDENCE_JSON_INVALID``,
  ``EVIDENCE_PAYLOAD_INVALID``, ``EVIDENCE_PAYLOAD_NONCANONICAL``, ``EVIDENCE_DIGEST_INVALID``,
  ``EVIDENCE_DIGEST_MISMATCH``); ``parse_canonical(bytes)`` the same for bare bytes;
* ``strict_json(data)``: JSON refusing duplicate keys and NaN/Infinity (``StrictJSONError``);
* ``declared_options``, ``requested_methods``, ``check_requested_methods``: a job's
  ``evidence`` block read and refused when it asks for what the provider does not do;
* ``envelope_parts``, ``check_keys``, ``check_bound_payload``: an envelope checked for its
  provider, format, fields and payload.

``EvidenceFailure``, ``parse_canonical``, ``strict_json`` and ``StrictJSONError`` are the
kernel's own (``scheduler.evidence.payload``: re-verification parses stored payloads with them),
re-exported here; the rest only providers use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from scheduler.api import EvidenceEnvelope, SchedulerError
from scheduler.base.canonical import canonical_bytes, hash_bytes, is_digest
from scheduler.base.options import build_options
from scheduler.evidence.payload import EvidenceFailure, StrictJSONError, parse_canonical, strict_json

#: The ``payload_format`` an envelope records for the kernel's canonical-JSON payload.
PAYLOAD_FORMAT = "canonical-json"


# -- payloads -------------------------------------------------------------------------------------


@attrs.frozen
class CheckedPayload:
    """A checked evidence payload: its canonical bytes, their digest and the parsed document."""

    canonical: bytes
    digest: str
    document: Mapping[str, Any]

    @property
    def text(self) -> str:
        """The canonical bytes as text."""
        return self.canonical.decode("utf-8")


def check_payload(payload: Any) -> CheckedPayload:
    """Check what the kernel handed over: an ``EvidencePayload`` (document, canonical bytes, digest) or bare bytes.

    The canonical bytes must be a JSON object in exactly json-sort-v1 form, the document
    (when given) must canonicalise to those bytes, and the digest (when given) must be
    their SHA-256. Anything else is refused with an ``EVIDENCE_*`` code.
    """
    if isinstance(payload, (bytes, bytearray, memoryview)):
        canonical, document, digest = bytes(payload), None, None
    elif hasattr(payload, "canonical"):
        canonical = payload.canonical
        document = getattr(payload, "document", None)
        digest = getattr(payload, "digest", None)
        if not isinstance(canonical, (bytes, bytearray, memoryview)):
            raise EvidenceFailure("EVIDENCE_PAYLOAD_INVALID", "the payload's canonical form must be bytes")
        canonical = bytes(canonical)
    else:
        raise EvidenceFailure("EVIDENCE_PAYLOAD_INVALID", f"an evidence payload must be bytes or an EvidencePayload, not {type(payload).__name__}")
    parsed = parse_canonical(canonical)
    if document is not None:
        try:
            from_document = canonical_bytes(document)
        except SchedulerError as exc:
            raise EvidenceFailure("EVIDENCE_PAYLOAD_INVALID", f"the payload document has no json-sort-v1 form: {exc}") from None
        if from_document != canonical:
            raise EvidenceFailure("EVIDENCE_PAYLOAD_NONCANONICAL", "the payload document does not canonicalise to the payload bytes")
    actual = hash_bytes(canonical)
    if digest is not None:
        if not is_digest(digest):
            raise EvidenceFailure("EVIDENCE_DIGEST_INVALID", "the payload digest is not sha256: and 64 lowercase hex digits")
        if digest != actual:
            raise EvidenceFailure("EVIDENCE_DIGEST_MISMATCH", "the payload digest is not the SHA-256 of the payload bytes")
    return CheckedPayload(canonical=canonical, digest=actual, document=parsed)


# -- declarations and envelopes -------------------------------------------------------------------


def declared_options(declaration: Any, cls: type | None, provider: str) -> Any:
    """The declaration's validated ``provider_config`` (an instance of ``cls``); ``EVIDENCE_OPTIONS_INVALID`` otherwise."""
    raw = getattr(declaration, "options", None)
    if raw is None:
        raw = getattr(declaration, "provider_config", None)
    if cls is None:
        if raw:
            raise EvidenceFailure("EVIDENCE_OPTIONS_INVALID", f"the {provider} evidence provider takes no provider_config")
        return None
    if isinstance(raw, cls):
        return raw
    try:
        return build_options(cls, dict(raw) if isinstance(raw, Mapping) else raw, "evidence.provider_config")
    except SchedulerError as exc:
        raise EvidenceFailure("EVIDENCE_OPTIONS_INVALID", exc.message) from None


def requested_methods(declaration: Any) -> tuple[str, ...]:
    """The methods the declaration asks for (empty when it names none)."""
    methods = getattr(declaration, "methods", None)
    if not methods:
        return ()
    if isinstance(methods, str):
        return (methods,)
    return tuple(str(m) for m in methods)


def check_requested_methods(declaration: Any, supported: frozenset[str], provider: str) -> None:
    """Refuse a declaration asking for a method this provider does not perform (never a silent downgrade)."""
    unsupported = [m for m in requested_methods(declaration) if m not in supported]
    if unsupported:
        raise EvidenceFailure(
            "EVIDENCE_METHOD_UNSUPPORTED",
            f"the {provider} evidence provider does not perform {', '.join(map(repr, unsupported))}"
            f" (it performs {', '.join(sorted(supported))})",
        )


def envelope_parts(envelope: Any, provider: str) -> tuple[str, Mapping[str, Any]]:
    """``(payload_digest, data)`` of an envelope (``EvidenceEnvelope`` or its stored JSON), checked for its provider and format."""
    name: object
    fmt: object
    digest: object
    data: object
    if isinstance(envelope, EvidenceEnvelope):
        name, fmt, digest, data = envelope.provider, envelope.format, envelope.payload_digest, envelope.data
    elif isinstance(envelope, Mapping):
        name, fmt, digest, data = (envelope.get(k) for k in ("provider", "format", "payload_digest", "data"))
    else:
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"an envelope must be an EvidenceEnvelope, not {type(envelope).__name__}")
    if name != provider:
        raise EvidenceFailure("EVIDENCE_PROVIDER_MISMATCH", f"the envelope was made by provider {name!r}, not {provider!r}")
    if not isinstance(data, Mapping):
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's data must be an object")
    if not is_digest(digest):
        raise EvidenceFailure("EVIDENCE_DIGEST_INVALID", "the envelope's payload_digest is not sha256: and 64 lowercase hex digits")
    if data.get("payload_digest") != digest:
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's payload_digest disagrees with its data")
    if fmt != data.get("schema"):
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's format disagrees with its data's schema")
    return digest, data


def check_keys(data: Mapping[str, Any], expected: Sequence[str], what: str = "the envelope") -> None:
    """Exactly these keys, no more, no fewer."""
    keys = set(data)
    missing, extra = sorted(set(expected) - keys), sorted(keys - set(expected))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unexpected {', '.join(extra)}"] if extra else [])
        raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"{what} has the wrong fields ({'; '.join(parts)})")


def check_bound_payload(envelope_digest: str, payload: CheckedPayload) -> None:
    """The envelope must be for this payload: an envelope moved from another payload is refused."""
    if envelope_digest != payload.digest:
        raise EvidenceFailure("EVIDENCE_PAYLOAD_MISMATCH", "the envelope was made for a different payload (its payload_digest differs)")


__all__ = [
    "PAYLOAD_FORMAT",
    "CheckedPayload",
    "EvidenceFailure",
    "StrictJSONError",
    "check_bound_payload",
    "check_keys",
    "check_payload",
    "check_requested_methods",
    "declared_options",
    "envelope_parts",
    "parse_canonical",
    "requested_methods",
    "strict_json",
]
