"""The JSON proof document of a detached-signature proof, and the exact bytes its signature covers (docs/proofs.md).

::

    {"proof_id": "4f1c...", "artifact_digest": "sha256:...", "not_before": 1767225600, "expires_at": 1767226200,
     "signature": "-----BEGIN SSH SIGNATURE-----..."}          (times in epoch seconds)

The signed message is the canonical JSON (json-sort-v1, UTF-8) of ``signed_message_fields``. The
same format as ``scheduler-provider-proofs``' documents (its ``detached-signature`` and
``certificate`` verifiers); kept here so this distribution needs neither PyJWT nor httpx.
"""

from __future__ import annotations

import json
import re
from typing import Any

from scheduler_toolkit.canonical import canonical_json

from scheduler.api import SchedulerError

MESSAGE_SCHEMA = "scheduler.authorization-proof"
PROOF_ID_RE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,256}")
DOCUMENT_KEYS = frozenset({"proof_id", "artifact_digest", "not_before", "expires_at", "signature", "certificate_chain"})


def fail(code: str, message: str, **details: Any) -> SchedulerError:
    """A ``PROOF_*`` error (details never hold the proof)."""
    return SchedulerError(code, message, details=details or None)


def signed_message(method: str, proof_id: str, artifact_digest: str, not_before: int, expires_at: int) -> bytes:
    """The exact bytes a detached-signature proof signs: json-sort-v1 of the method, id, artifact and window."""
    return canonical_json({"schema": MESSAGE_SCHEMA, "version": 1, "method": method, "proof_id": proof_id,
                           "artifact_digest": artifact_digest, "not_before": not_before, "expires_at": expires_at}).encode("utf-8")


def parse_document(method: str, proof: str) -> dict[str, Any]:
    """The proof document, its keys and types checked (``PROOF_MALFORMED`` otherwise)."""
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
    if not isinstance(document.get("artifact_digest"), str):
        raise fail("PROOF_MALFORMED", f"the {method} proof carries no artifact_digest (a proof must be bound to the artifact)")
    if not isinstance(document.get("proof_id"), str) or not PROOF_ID_RE.fullmatch(document["proof_id"]):
        raise fail("PROOF_MALFORMED", f"the {method} proof's proof_id must be 1-256 characters of [A-Za-z0-9._:@/+=-]")
    return document


def message_of(method: str, document: dict[str, Any]) -> bytes:
    """The bytes a parsed proof document's signature must cover."""
    return signed_message(method, document["proof_id"], document["artifact_digest"], document["not_before"], document["expires_at"])


__all__ = ["MESSAGE_SCHEMA", "fail", "message_of", "parse_document", "signed_message"]
