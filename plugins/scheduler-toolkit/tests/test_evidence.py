"""scheduler_toolkit.evidence: the checks an evidence provider makes of the payload it is handed and the envelopes it reads back.

Payloads come from ``scheduler.testing`` (canonicalised by an independent oracle).
"""

from __future__ import annotations

import attrs
import pytest
from scheduler_toolkit.evidence import (
    PAYLOAD_FORMAT,
    EvidenceFailure,
    check_bound_payload,
    check_keys,
    check_payload,
    check_requested_methods,
    declared_options,
    envelope_parts,
    parse_canonical,
    requested_methods,
    strict_json,
)

from scheduler.api import EvidenceDeclaration, EvidenceEnvelope, EvidencePayload, SchedulerError
from scheduler.testing import make_evidence_payload


def _code(call: object, *args: object) -> str:
    with pytest.raises(EvidenceFailure) as raised:
        call(*args)  # type: ignore[operator]
    return raised.value.code


def test_a_kernel_payload_passes_and_bare_bytes_too() -> None:
    payload = make_evidence_payload("run-7")
    checked = check_payload(payload)
    assert checked.digest == payload.digest and checked.document["run_id"] == "run-7" and checked.text.startswith("{")
    assert check_payload(payload.canonical).digest == payload.digest


def test_a_payload_that_is_not_what_it_claims_is_refused() -> None:
    payload = make_evidence_payload()
    spaced = payload.canonical.replace(b":", b": ", 1)
    assert _code(check_payload, attrs.evolve(payload, canonical=spaced)) == "EVIDENCE_PAYLOAD_NONCANONICAL"
    assert _code(check_payload, attrs.evolve(payload, digest="sha256:" + "0" * 64)) == "EVIDENCE_DIGEST_MISMATCH"
    assert _code(check_payload, attrs.evolve(payload, digest="md5:x")) == "EVIDENCE_DIGEST_INVALID"
    assert _code(check_payload, attrs.evolve(payload, document={**payload.document, "run_id": "other"})) == (
        "EVIDENCE_PAYLOAD_NONCANONICAL")
    assert _code(check_payload, EvidencePayload(document={}, canonical="{}", digest="x")) == "EVIDENCE_PAYLOAD_INVALID"  # type: ignore[arg-type]
    assert _code(check_payload, 42) == "EVIDENCE_PAYLOAD_INVALID"
    assert _code(parse_canonical, b'{"a":1,"a":2}') == "EVIDENCE_JSON_INVALID"
    assert _code(parse_canonical, b"[1]") == "EVIDENCE_PAYLOAD_INVALID"
    assert _code(parse_canonical, b"\xff") == "EVIDENCE_JSON_INVALID"


def test_strict_json_refuses_what_two_parsers_could_read_differently() -> None:
    assert strict_json(b'{"a": [1, 2]}') == {"a": [1, 2]}
    for text in ('{"a": 1, "a": 2}', '{"a": NaN}', '[Infinity]'):
        with pytest.raises(ValueError):
            strict_json(text)


def test_a_failure_is_raised_by_attest_and_returned_by_verify() -> None:
    failure = EvidenceFailure("EVIDENCE_PAYLOAD_MISMATCH", "moved")
    error = failure.error()
    assert isinstance(error, SchedulerError) and error.code == "EVIDENCE_PAYLOAD_MISMATCH"
    verification = failure.verification("checksum")
    assert (verification.verified, verification.provider, verification.code) == (False, "checksum", "EVIDENCE_PAYLOAD_MISMATCH")


def _envelope(payload: EvidencePayload, **data: object) -> EvidenceEnvelope:
    fields = {"schema": "test.v1", "payload_digest": payload.digest, "mac": "abc", **data}
    return EvidenceEnvelope(provider="hmac", format="test.v1", payload_digest=payload.digest, data=fields)


def test_envelope_checks() -> None:
    payload = make_evidence_payload()
    envelope = _envelope(payload)
    digest, data = envelope_parts(envelope, "hmac")
    assert digest == payload.digest and envelope_parts(attrs.asdict(envelope), "hmac")[0] == digest
    check_keys(data, ["schema", "payload_digest", "mac"])
    check_bound_payload(digest, check_payload(payload))
    assert _code(envelope_parts, envelope, "other") == "EVIDENCE_PROVIDER_MISMATCH"
    assert _code(envelope_parts, "x", "hmac") == "EVIDENCE_ENVELOPE_INVALID"
    assert _code(envelope_parts, _envelope(payload, schema="test.v2"), "hmac") == "EVIDENCE_ENVELOPE_INVALID"
    assert _code(envelope_parts, _envelope(payload, payload_digest="sha256:" + "1" * 64), "hmac") == "EVIDENCE_ENVELOPE_INVALID"
    assert _code(check_keys, data, ["schema", "payload_digest"]) == "EVIDENCE_ENVELOPE_INVALID"
    assert _code(check_bound_payload, "sha256:" + "2" * 64, check_payload(payload)) == "EVIDENCE_PAYLOAD_MISMATCH"


@attrs.frozen
class _Options:
    rounds: int = 1


def test_declarations_options_and_methods() -> None:
    declaration = EvidenceDeclaration(provider="hmac", options={"rounds": 3}, methods=("mac",))
    assert declared_options(declaration, _Options, "hmac") == _Options(rounds=3)
    assert declared_options(EvidenceDeclaration(provider="hmac"), None, "hmac") is None
    assert _code(declared_options, EvidenceDeclaration(provider="hmac", options={"x": 1}), None, "hmac") == "EVIDENCE_OPTIONS_INVALID"
    assert _code(declared_options, EvidenceDeclaration(provider="hmac", options={"rounds": "many"}), _Options, "hmac") == (
        "EVIDENCE_OPTIONS_INVALID")
    assert requested_methods(declaration) == ("mac",) and requested_methods(EvidenceDeclaration(provider="hmac")) == ()
    check_requested_methods(declaration, frozenset({"mac"}), "hmac")
    assert _code(check_requested_methods, declaration, frozenset({"sig"}), "hmac") == "EVIDENCE_METHOD_UNSUPPORTED"
    assert PAYLOAD_FORMAT == "canonical-json"
