"""The attestor protocol: one JSON request, one JSON answer, read strictly.

Request (on the command's stdin, or as the HTTP POST body)::

    {"schema": "scheduler.evidence.external-request", "version": 1, "operation": "attest" | "verify",
     "request_id": "<32 hex>", "provider": "external", "payload_format": "canonical-json",
     "canonicalization": "json-sort-v1", "payload_digest": "sha256:<hex>", "payload": "<canonical text>",
     "method": "<method>" | null, "options": {...provider_config params...},
     "attestation": {...}}                       # verify only: what attest returned

Answers (on stdout, or as the HTTP 200 body), exactly these keys::

    attest ok:     {"schema": "scheduler.evidence.external-answer", "version": 1, "request_id", "operation",
                    "ok": true, "payload_digest", "method", "attestation": {...}}
    verify ok:     {..., "ok": true, "payload_digest", "method", "verified": true}
                   {..., "ok": true, "payload_digest", "method", "verified": false, "code": "UPPER_SNAKE"[, "reason"]}
    either failed: {..., "ok": false, "code": "UPPER_SNAKE", "error": "text"}

Anything else is refused: not one JSON object, duplicate keys, missing or unexpected
keys, wrong types, another request id, operation, digest or method than asked, a
verification that both passes and carries a failure code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from scheduler_toolkit.canonical import CANONICALIZATION, canonical_bytes
from scheduler_toolkit.evidence import PAYLOAD_FORMAT, CheckedPayload, EvidenceFailure, StrictJSONError, strict_json

from scheduler.api import SchedulerError

REQUEST_SCHEMA = "scheduler.evidence.external-request"
ANSWER_SCHEMA = "scheduler.evidence.external-answer"
VERSION = 1
_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_METHOD = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_COMMON = ("schema", "version", "request_id", "operation", "ok")
_TEXT_LIMIT = 500


def request(operation: str, request_id: str, payload: CheckedPayload, method: str | None, params: Mapping[str, str],
            attestation: Mapping[str, Any] | None = None) -> bytes:
    """The request body for ``operation``."""
    body: dict[str, Any] = {
        "schema": REQUEST_SCHEMA,
        "version": VERSION,
        "operation": operation,
        "request_id": request_id,
        "provider": "external",
        "payload_format": PAYLOAD_FORMAT,
        "canonicalization": CANONICALIZATION,
        "payload_digest": payload.digest,
        "payload": payload.text,
        "method": method,
        "options": dict(params),
    }
    if operation == "verify":
        body["attestation"] = attestation
    return canonical_bytes(body)


def _invalid(message: str) -> EvidenceFailure:
    return EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_INVALID", f"the attestor's answer {message}")


def _ambiguous(message: str) -> EvidenceFailure:
    return EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS", f"the attestor's answer {message}")


def _text(value: Any) -> str:
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", str(value)).strip()
    return text[:_TEXT_LIMIT] + ("..." if len(text) > _TEXT_LIMIT else "")


def parse_answer(raw: bytes) -> dict[str, Any]:
    """One JSON object, no duplicate keys, nothing after it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("is not UTF-8") from None
    stripped = text.strip()
    if not stripped:
        raise _invalid("is empty")
    try:
        value = strict_json(stripped)
    except StrictJSONError as exc:  # duplicate keys say two things at once; NaN/Infinity are not JSON
        if str(exc).startswith("duplicate key"):
            raise _ambiguous(f"repeats a field ({exc})") from None
        raise _invalid(f"is not plain JSON ({exc})") from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            raise _ambiguous("holds more than one JSON value") from None
        raise _invalid(f"is not JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(value, dict):
        raise _invalid("is not a JSON object")
    return value


def _keys(answer: Mapping[str, Any], expected: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    keys = set(answer)
    missing = sorted(set(expected) - keys)
    extra = sorted(keys - set(expected) - set(optional))
    if missing:
        raise _invalid(f"lacks {', '.join(missing)}")
    if extra:
        raise _ambiguous(f"has unexpected fields {', '.join(extra)}")


def _common(answer: Mapping[str, Any], operation: str, request_id: str) -> None:
    for key in _COMMON:
        if key not in answer:
            raise _invalid(f"lacks {key}")
    if answer["schema"] != ANSWER_SCHEMA:
        raise _invalid(f"has schema {_text(answer['schema'])!r}, not {ANSWER_SCHEMA}")
    if type(answer["version"]) is not int or answer["version"] != VERSION:
        raise _invalid(f"has unsupported version {_text(answer['version'])!r}")
    if answer["request_id"] != request_id:
        raise EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_MISMATCH", "the attestor answered another request (request_id differs)")
    if answer["operation"] != operation:
        raise EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_MISMATCH", f"the attestor answered {_text(answer['operation'])!r}, not {operation!r}")
    if type(answer["ok"]) is not bool:
        raise _invalid("has an ok that is not true or false")


def _refusal(answer: Mapping[str, Any]) -> tuple[str, str]:
    _keys(answer, (*_COMMON, "code", "error"))
    code, error = answer["code"], answer["error"]
    if not isinstance(code, str) or not _CODE.fullmatch(code) or not isinstance(error, str):
        raise _invalid("has a malformed code or error")
    return code, _text(error)


def _bound(answer: Mapping[str, Any], payload: CheckedPayload, methods: frozenset[str], requested: str | None) -> str:
    if answer["payload_digest"] != payload.digest:
        raise EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_MISMATCH", "the attestor answered for another payload (payload_digest differs)")
    method = answer["method"]
    if not isinstance(method, str) or not _METHOD.fullmatch(method):
        raise _invalid("has a malformed method")
    if method not in methods:
        raise EvidenceFailure("EVIDENCE_METHOD_MISMATCH",
                              f"the attestor used method {method!r}, which is not in [providers.external] methods")
    if requested is not None and method != requested:
        raise EvidenceFailure("EVIDENCE_METHOD_MISMATCH", f"the attestor used method {method!r}, not the requested {requested!r}")
    return method


def attest_answer(raw: bytes, request_id: str, payload: CheckedPayload, methods: frozenset[str],
                  requested: str | None, max_attestation: int) -> tuple[str, dict[str, Any]]:
    """``(method, attestation)`` from an attest answer; a coded ``EvidenceFailure`` otherwise."""
    answer = parse_answer(raw)
    _common(answer, "attest", request_id)
    if answer["ok"] is False:
        code, error = _refusal(answer)
        raise EvidenceFailure("EVIDENCE_EXTERNAL_REFUSED", f"the attestor refused: {code}: {error}")
    _keys(answer, (*_COMMON, "payload_digest", "method", "attestation"))
    method = _bound(answer, payload, methods, requested)
    attestation = answer["attestation"]
    if not isinstance(attestation, dict) or not attestation:
        raise _invalid("has no attestation object")
    try:
        size = len(canonical_bytes(attestation))
    except SchedulerError as exc:
        raise _invalid(f"has an attestation with no canonical form ({exc})") from None
    if size > max_attestation:
        raise EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_TOO_LARGE", f"the attestation is {size} bytes, over {max_attestation}")
    return method, attestation


def verify_answer(raw: bytes, request_id: str, payload: CheckedPayload, methods: frozenset[str], requested: str) -> tuple[bool, str | None, str | None]:
    """``(verified, code, reason)`` from a verify answer; a coded ``EvidenceFailure`` when the answer itself is bad."""
    answer = parse_answer(raw)
    _common(answer, "verify", request_id)
    if answer["ok"] is False:
        code, error = _refusal(answer)
        raise EvidenceFailure("EVIDENCE_EXTERNAL_FAILED", f"the attestor could not verify: {code}: {error}")
    if "verified" not in answer:
        raise _invalid("lacks verified")
    verified = answer["verified"]
    if type(verified) is not bool:
        raise _ambiguous("has a verified that is not true or false")
    if verified:
        if "code" in answer or "reason" in answer:
            raise _ambiguous("says verified and also gives a failure code or reason")
        _keys(answer, (*_COMMON, "payload_digest", "method", "verified"))
    else:
        _keys(answer, (*_COMMON, "payload_digest", "method", "verified", "code"), ("reason",))
        if not isinstance(answer["code"], str) or not _CODE.fullmatch(answer["code"]):
            raise _invalid("has a malformed code")
        if "reason" in answer and not isinstance(answer["reason"], str):
            raise _invalid("has a reason that is not text")
    _bound(answer, payload, methods, requested)
    if verified:
        return True, None, None
    return False, answer["code"], _text(answer.get("reason", ""))
