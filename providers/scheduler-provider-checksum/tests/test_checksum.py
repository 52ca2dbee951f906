"""The checksum provider: envelopes, recomputation, and every way a payload or envelope can be wrong."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import attrs
import pytest

from scheduler.api import (
    PLUGIN_API_VERSION,
    EvidenceDeclaration,
    EvidencePayload,
    EvidenceProvider,
    SchedulerError,
)

DECLARATION = EvidenceDeclaration(provider="checksum")


@dataclass(frozen=True)
class FutureDeclaration:
    """A declaration carrying ``methods``, as the evidence job field will."""

    provider: str = "checksum"
    methods: tuple[str, ...] = ()
    required: bool = False
    verify: bool = False
    options: Any = None


@pytest.fixture
def provider(load_evidence: Any) -> Any:
    return load_evidence("checksum")


def test_loads_through_its_entry_point(provider: Any) -> None:
    assert isinstance(provider, EvidenceProvider)
    assert provider.plugin_api == PLUGIN_API_VERSION
    assert provider.capabilities == frozenset({"attest", "verify-evidence"})
    assert provider.methods == frozenset({"sha256"})


def test_a_key_in_its_settings_table_is_a_configuration_error(load_evidence: Any) -> None:
    with pytest.raises(SchedulerError) as err:
        load_evidence("checksum", algorithm="md5")
    assert err.value.code == "CONFIG_INVALID"


def test_attest_then_verify(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = provider.attest(payload, DECLARATION)
    expected = "sha256:" + hashlib.sha256(payload.canonical).hexdigest()
    assert envelope.provider == "checksum" and envelope.format == "scheduler.evidence.checksum"
    assert envelope.payload_digest == expected == payload.digest
    assert dict(envelope.data) == {
        "schema": "scheduler.evidence.checksum", "version": 1, "method": "sha256", "algorithm": "sha256",
        "canonicalization": "json-sort-v1", "payload_format": "canonical-json", "payload_digest": expected,
        "payload_bytes": len(payload.canonical),
    }
    result = provider.verify(envelope, payload, DECLARATION)
    assert (result.verified, result.provider, result.code) == (True, "checksum", None)


def test_bare_canonical_bytes_are_a_payload_too(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = provider.attest(payload.canonical, DECLARATION)
    assert envelope.payload_digest == payload.digest
    assert provider.verify(envelope, payload.canonical, DECLARATION).verified
    assert provider.verify(envelope, payload, DECLARATION).verified


def test_the_stored_json_form_of_an_envelope_verifies(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = provider.attest(payload, DECLARATION)
    stored = json.loads(json.dumps(attrs.asdict(envelope)))
    assert provider.verify(stored, payload, DECLARATION).verified


def test_a_tampered_payload_fails(provider: Any, make_payload: Any) -> None:
    envelope = provider.attest(make_payload(), DECLARATION)
    tampered = make_payload(exit_code=1)
    result = provider.verify(envelope, tampered, DECLARATION)
    assert (result.verified, result.code) == (False, "EVIDENCE_PAYLOAD_MISMATCH")


def test_changed_bytes_under_the_old_digest_fail(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = provider.attest(payload, DECLARATION)
    other = make_payload(stdout_bytes=13)
    forged = EvidencePayload(document=other.document, canonical=other.canonical, digest=payload.digest)
    result = provider.verify(envelope, forged, DECLARATION)
    assert (result.verified, result.code) == (False, "EVIDENCE_DIGEST_MISMATCH")


def test_an_envelope_transplanted_from_another_run_fails(provider: Any, make_payload: Any) -> None:
    envelope = provider.attest(make_payload(run_id="run-1"), DECLARATION)
    result = provider.verify(envelope, make_payload(run_id="run-2"), DECLARATION)
    assert (result.verified, result.code) == (False, "EVIDENCE_PAYLOAD_MISMATCH")
    # ...and re-labelled with the other payload's digest, it no longer agrees with itself
    other = make_payload(run_id="run-2")
    relabelled = attrs.evolve(envelope, payload_digest=other.digest)
    assert provider.verify(relabelled, other, DECLARATION).code == "EVIDENCE_ENVELOPE_INVALID"


def test_non_canonical_payloads_are_refused(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    pretty = json.dumps(payload.document, indent=1, sort_keys=True).encode()
    with pytest.raises(SchedulerError) as err:
        provider.attest(pretty, DECLARATION)
    assert err.value.code == "EVIDENCE_PAYLOAD_NONCANONICAL"
    envelope = provider.attest(payload, DECLARATION)
    assert provider.verify(envelope, pretty, DECLARATION).code == "EVIDENCE_PAYLOAD_NONCANONICAL"
    # the document and its bytes must agree
    mismatched = EvidencePayload(document={**payload.document, "attempt": 2}, canonical=payload.canonical, digest=payload.digest)
    assert provider.verify(envelope, mismatched, DECLARATION).code == "EVIDENCE_PAYLOAD_NONCANONICAL"


@pytest.mark.parametrize(("raw", "code"), [
    (b'{"a":1,"a":2}', "EVIDENCE_JSON_INVALID"),
    (b"[1,2]", "EVIDENCE_PAYLOAD_INVALID"),
    (b"\xff\xfe", "EVIDENCE_JSON_INVALID"),
    (b'{"a":NaN}', "EVIDENCE_JSON_INVALID"),
    (b'{"a":1.0}', "EVIDENCE_PAYLOAD_NONCANONICAL"),
    (b'{"a":9007199254740993}', "EVIDENCE_PAYLOAD_NONCANONICAL"),
    (b'{"b":1,"a":2}', "EVIDENCE_PAYLOAD_NONCANONICAL"),
    (b'{"a":"\\u00e9"}', "EVIDENCE_PAYLOAD_NONCANONICAL"),
])
def test_malformed_payload_bytes_are_refused(provider: Any, raw: bytes, code: str) -> None:
    with pytest.raises(SchedulerError) as err:
        provider.attest(raw, DECLARATION)
    assert err.value.code == code


def test_an_invalid_payload_digest_is_refused(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    with pytest.raises(SchedulerError) as err:
        provider.attest(attrs.evolve(payload, digest="sha256:" + "A" * 64), DECLARATION)
    assert err.value.code == "EVIDENCE_DIGEST_INVALID"


def test_json_sort_v1_ordering_and_numbers(provider: Any) -> None:
    # JavaScript lists array-index keys first (numerically), then the rest in UTF-16 order; numbers as JS prints them
    canonical = '{"9":1,"10":2,"":3,"A":4,"a":[1e+21,1e-7,0.5,-3],"\U0001f600":5,"\uffff":6}'.encode()
    envelope = provider.attest(canonical, DECLARATION)
    assert envelope.payload_digest == "sha256:" + hashlib.sha256(canonical).hexdigest()
    # astral characters sort by their UTF-16 surrogates, i.e. before U+FFFF: the other order is not canonical
    swapped = '{"9":1,"10":2,"":3,"A":4,"a":[1e+21,1e-7,0.5,-3],"\uffff":6,"\U0001f600":5}'.encode()
    with pytest.raises(SchedulerError) as err:
        provider.attest(swapped, DECLARATION)
    assert err.value.code == "EVIDENCE_PAYLOAD_NONCANONICAL"


def test_an_unknown_method_fails(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = provider.attest(payload, DECLARATION)
    other = attrs.evolve(envelope, data={**envelope.data, "method": "sha512"})
    assert provider.verify(other, payload, DECLARATION).code == "EVIDENCE_METHOD_MISMATCH"
    with pytest.raises(SchedulerError) as err:
        provider.attest(payload, FutureDeclaration(methods=("ssh-signature",)))
    assert err.value.code == "EVIDENCE_METHOD_UNSUPPORTED"
    assert provider.attest(payload, FutureDeclaration(methods=("sha256",))).payload_digest == payload.digest


def test_provider_config_is_refused(provider: Any, make_payload: Any) -> None:
    with pytest.raises(SchedulerError) as err:
        provider.attest(make_payload(), EvidenceDeclaration(provider="checksum", options={"key": "x"}))
    assert err.value.code == "EVIDENCE_OPTIONS_INVALID"


def test_an_envelope_of_another_provider_fails(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = provider.attest(payload, DECLARATION)
    assert provider.verify(attrs.evolve(envelope, provider="ssh"), payload, DECLARATION).code == "EVIDENCE_PROVIDER_MISMATCH"


def _changed(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, str(value), True]
    if isinstance(value, str):
        return [value + "x", value[:-1], value.upper() if value != value.upper() else value.lower(), None]
    return [None]


def test_every_envelope_field_changed_is_detected(provider: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = provider.attest(payload, DECLARATION)
    checked = 0
    for key, value in envelope.data.items():
        for bad in _changed(value):
            result = provider.verify(attrs.evolve(envelope, data={**envelope.data, key: bad}), payload, DECLARATION)
            assert not result.verified and result.code, (key, bad)
            checked += 1
        missing = {k: v for k, v in envelope.data.items() if k != key}
        assert not provider.verify(attrs.evolve(envelope, data=missing), payload, DECLARATION).verified, key
    extra = attrs.evolve(envelope, data={**envelope.data, "note": "x"})
    assert provider.verify(extra, payload, DECLARATION).code == "EVIDENCE_ENVELOPE_INVALID"
    for field, bad in (("format", "x"), ("payload_digest", "sha256:" + "0" * 64), ("payload_digest", "nope")):
        assert not provider.verify(attrs.evolve(envelope, **{field: bad}), payload, DECLARATION).verified
    assert checked > 20


@pytest.mark.parametrize("envelope", [None, 42, "text", {}, {"provider": "checksum"},
                                      {"provider": "checksum", "format": 1, "payload_digest": None, "data": []}])
def test_garbage_envelopes_never_raise(provider: Any, make_payload: Any, envelope: Any) -> None:
    result = provider.verify(envelope, make_payload(), DECLARATION)
    assert result.verified is False and result.code and result.code.startswith("EVIDENCE_")


def test_garbage_payloads_never_raise_in_verify(provider: Any, make_payload: Any) -> None:
    envelope = provider.attest(make_payload(), DECLARATION)
    for payload in (None, "text", 42, b"", EvidencePayload(document={}, canonical="{}", digest="x")):  # type: ignore[arg-type]
        result = provider.verify(envelope, payload, DECLARATION)
        assert result.verified is False and result.code and result.code.startswith("EVIDENCE_")
