"""The JSON proof document of ``detached-signature`` and ``certificate`` proofs, and the exact bytes it signs.

A proof document (docs/proofs.md; times in epoch seconds, ``certificate_chain`` for certificate
proofs only)::

    {"proof_id": "4f1c...", "artifact_digest": "sha256:...", "not_before": 1767225600, "expires_at": 1767226200,
     "signature": "...", "certificate_chain": "-----BEGIN CERTIFICATE-----..."}

The signed message is the canonical JSON (json-sort-v1, UTF-8) of ``signed_message_fields``, so
the method, the proof id, the artifact and the whole window are covered by the signature. One
format for every proof verifier that takes a document (``scheduler-provider-proofs``'
``detached-signature`` and ``certificate``, ``scheduler-provider-ssh``'s ``detached-signature-ssh``),
with what they share: the error helper, the proof-id rule, reading a trust file within a size bound.
"""

from __future__ import annotations

import json
import re
from typing import Any

from scheduler.api import SchedulerError, VerifiedProof
from scheduler_toolkit.canonical import canonical_json
from scheduler_toolkit.files import read_capped

#: ``schema`` of the signed message.
MESSAGE_SCHEMA = "scheduler.authorization-proof"
#: Largest key, JWKS or CA file read.
MAX_TRUST_FILE_BYTES = 1024 * 1024
PROOF_ID_RE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,256}")
DOCUMENT_KEYS = frozenset({"proof_id", "artifact_digest", "not_before", "expires_at", "signature", "certificate_chain"})


def fail(code: str, message: str, **details: Any) -> SchedulerError:
    """A ``PROOF_*`` error (details never hold the proof)."""
    return SchedulerError(code, message, details=details or None)


def proof_id(method: str, value: Any, name: str) -> str:
    """The proof's id (``name``: ``jti``, ``proof_id``): 1-256 characters of ``[A-Za-z0-9._:@/+=-]``, else ``PROOF_MALFORMED``."""
    if not isinstance(value, str) or not PROOF_ID_RE.fullmatch(value):
        raise fail("PROOF_MALFORMED", f"the {method} proof's {name} must be 1-256 characters of [A-Za-z0-9._:@/+=-]")
    return value


def artifact_claim(method: str, claimed: Any) -> str:
    """The artifact digest a proof names (``PROOF_MALFORMED`` when it names none: every proof is bound to an artifact)."""
    if not isinstance(claimed, str):
        raise fail("PROOF_MALFORMED", f"the {method} proof carries no artifact_digest (a proof must be bound to the artifact)")
    return claimed


def read_trust_file(path: str, what: str) -> bytes:
    """A key, JWKS or CA file the declaration names (``PROOF_KEY_UNAVAILABLE`` when unreadable or over 1 MiB)."""
    return read_capped(path, MAX_TRUST_FILE_BYTES, what=what, unreadable="PROOF_KEY_UNAVAILABLE", too_large="PROOF_KEY_UNAVAILABLE")


def signed_message_fields(method: str, proof_id: str, artifact_digest: str, not_before: int, expires_at: int) -> dict[str, Any]:
    """The object whose canonical JSON (json-sort-v1, UTF-8) a detached-signature or certificate proof signs."""
    return {"schema": MESSAGE_SCHEMA, "version": 1, "method": method, "proof_id": proof_id,
            "artifact_digest": artifact_digest, "not_before": not_before, "expires_at": expires_at}


def signed_message(method: str, proof_id: str, artifact_digest: str, not_before: int, expires_at: int) -> bytes:
    """The exact bytes a detached-signature or certificate proof signs."""
    return canonical_json(signed_message_fields(method, proof_id, artifact_digest, not_before, expires_at)).encode("utf-8")


def parse_document(method: str, proof: str) -> dict[str, Any]:
    """The proof document of a ``method`` proof, its keys and types checked (``PROOF_MALFORMED`` otherwise)."""
    try:
        document = json.loads(proof)
    except ValueError:
        raise fail("PROOF_MALFORMED", f"a {method} proof must be a JSON proof document (docs/proofs.md)") from None
    if not isinstance(document, dict):
        raise fail("PROOF_MALFORMED", f"a {method} proof must be a JSON object")
    unknown = sorted(str(k) for k in document if k not in DOCUMENT_KEYS)
    if unknown:
        raise fail("PROOF_MALFORMED", f"the proof document has unknown keys: {', '.join(unknown)[:200]}")
    for key in ("not_before", "expires_at"):
        if isinstance(document.get(key), bool) or not isinstance(document.get(key), int):
            raise fail("PROOF_MALFORMED", f"the proof document's {key} must be an integer (epoch seconds)")
    if not isinstance(document.get("signature"), str) or not document["signature"]:
        raise fail("PROOF_MALFORMED", "the proof document carries no signature")
    artifact_claim(method, document.get("artifact_digest"))
    proof_id(method, document.get("proof_id"), "proof_id")
    return document


def message_of(method: str, document: dict[str, Any]) -> bytes:
    """The bytes a parsed proof document's signature must cover."""
    return signed_message(method, document["proof_id"], document["artifact_digest"], document["not_before"], document["expires_at"])


def verified_document(method: str, document: dict[str, Any], key_id: str, *, subject: str | None = None,
                      not_before_ms: int | None = None, expires_at_ms: int | None = None) -> VerifiedProof:
    """What a document whose signature verified states: its id, artifact and window (or the narrower one given)."""
    return VerifiedProof(method=method, proof_id=document["proof_id"], key_id=key_id, artifact_digest=document["artifact_digest"],
                         not_before_ms=document["not_before"] * 1000 if not_before_ms is None else not_before_ms,
                         expires_at_ms=document["expires_at"] * 1000 if expires_at_ms is None else expires_at_ms,
                         subject=subject)


__all__ = ["DOCUMENT_KEYS", "MAX_TRUST_FILE_BYTES", "MESSAGE_SCHEMA", "PROOF_ID_RE", "artifact_claim", "fail", "message_of",
           "parse_document", "proof_id", "read_trust_file", "signed_message", "signed_message_fields", "verified_document"]
