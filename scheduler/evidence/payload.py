"""Strict JSON and canonical evidence payloads: what the kernel and every evidence provider parse them with.

An evidence provider signs or attests the kernel's canonical evidence payload
(``EvidencePayload``: the document, its json-sort-v1 bytes and their ``sha256:`` digest);
re-verification and the in-toto export read stored payloads back. Both sides parse a payload
the same strict way, so these live in the kernel (``scheduler_toolkit.evidence`` re-exports
them beside the provider-side checks of payloads and envelopes):

* ``EvidenceFailure(code, message)``: a coded failure; ``attest`` raises ``.error()``,
  ``verify`` returns ``.verification(provider)``;
* ``parse_canonical(bytes)``: the JSON object the bytes hold, refused unless they are exactly
  its json-sort-v1 form (``EVIDENCE_JSON_INVALID``, ``EVIDENCE_PAYLOAD_INVALID``,
  ``EVIDENCE_PAYLOAD_NONCANONICAL``);
* ``strict_json(data)``: JSON refusing duplicate keys and NaN/Infinity (``StrictJSONError``).
"""

from __future__ import annotations

import json
from typing import Any

from scheduler.base.canonical import canonical_bytes
from scheduler.base.errors import SchedulerError
from scheduler.plugins.protocols import EvidenceVerification


class EvidenceFailure(Exception):
    """A coded failure inside an evidence provider; ``attest`` raises it as ``SchedulerError``, ``verify`` returns it.

    One exception type for both directions, so a check written once serves ``attest`` (which
    must raise) and ``verify`` (which must return an unverified ``EvidenceVerification``).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def error(self) -> SchedulerError:
        """This failure as the ``SchedulerError`` ``attest`` raises."""
        return SchedulerError(self.code, self.message)

    def verification(self, provider: str) -> EvidenceVerification:
        """This failure as the unverified outcome ``verify`` returns."""
        return EvidenceVerification(verified=False, provider=provider, code=self.code, reason=self.message)


class StrictJSONError(ValueError):
    """JSON that parses but says something twice (a duplicate key) or is not JSON at all (NaN, Infinity)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise StrictJSONError(f"duplicate key {key!a}")
        out[key] = value
    return out


def _refuse_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON")


def strict_json(data: bytes | str) -> Any:
    """Parse JSON refusing duplicate keys and NaN/Infinity (``StrictJSONError``; ``ValueError`` for bad syntax).

    A signed or attested document must mean one thing: Python's ``json`` keeps the last of
    two equal keys where another parser may keep the first.
    """
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)


def parse_canonical(canonical: bytes, what: str = "the payload") -> dict[str, Any]:
    """The JSON object ``canonical`` holds, refused unless it is exactly its own json-sort-v1 form."""
    try:
        text = bytes(canonical).decode("utf-8")
    except UnicodeDecodeError:
        raise EvidenceFailure("EVIDENCE_JSON_INVALID", f"{what} is not UTF-8") from None
    try:
        document = strict_json(text)
    except StrictJSONError as exc:
        raise EvidenceFailure("EVIDENCE_JSON_INVALID", f"{what} is not acceptable JSON: {exc}") from None
    except ValueError as exc:
        raise EvidenceFailure("EVIDENCE_JSON_INVALID", f"{what} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise EvidenceFailure("EVIDENCE_PAYLOAD_INVALID", f"{what} must be a JSON object, not {type(document).__name__}")
    try:
        again = canonical_bytes(document)
    except SchedulerError as exc:
        raise EvidenceFailure("EVIDENCE_PAYLOAD_NONCANONICAL", f"{what} has no json-sort-v1 form: {exc}") from None
    if again != bytes(canonical):
        raise EvidenceFailure("EVIDENCE_PAYLOAD_NONCANONICAL", f"{what} is not in json-sort-v1 canonical form")
    return document


__all__ = ["EvidenceFailure", "StrictJSONError", "parse_canonical", "strict_json"]
