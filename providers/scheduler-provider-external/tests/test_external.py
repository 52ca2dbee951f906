"""The external provider against a real attestor: a subprocess speaking JSON, and the same attestor over loopback HTTP."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs
import pytest
from scheduler_toolkit.options import catalogue

from scheduler.api import PLUGIN_API_VERSION, EvidenceDeclaration, EvidenceProvider, SchedulerError

ENVELOPE_KEYS = ["schema", "version", "method", "attestor", "payload_format", "payload_digest", "attestation"]
METHODS = ["hmac-sha256", "hmac-sha512"]


def declaration(**options: Any) -> EvidenceDeclaration:
    return EvidenceDeclaration(provider="external", options=options or None)


@dataclass(frozen=True)
class FutureDeclaration:
    """A declaration carrying ``methods``, as the evidence job field will."""

    provider: str = "external"
    methods: tuple[str, ...] = ()
    options: Any = None


def with_data(envelope: Any, **changes: Any) -> Any:
    return attrs.evolve(envelope, data={**envelope.data, **changes})


@pytest.fixture
def external(load_evidence: Any) -> Any:
    """``external(**settings)``: the provider loaded through its entry point with ``[providers.external]``."""
    loaded: list[Any] = []

    def load(**settings: Any) -> Any:
        provider = load_evidence("external", **{"methods": METHODS, **settings})
        loaded.append(provider)
        return provider

    yield load
    for provider in loaded:
        provider.close()


def _attest_fails(provider: Any, payload: Any, code: str, **options: Any) -> SchedulerError:
    with pytest.raises(SchedulerError) as err:
        provider.attest(payload, declaration(**options))
    assert err.value.code == code, err.value.message
    return err.value


# -- loading and settings -------------------------------------------------------------------------


def test_loads_through_its_entry_point(external: Any, command_for: Any) -> None:
    provider = external(command=command_for())
    assert isinstance(provider, EvidenceProvider)
    assert provider.plugin_api == PLUGIN_API_VERSION
    assert provider.capabilities == frozenset({"attest", "verify-evidence"})
    assert provider.methods == frozenset(METHODS)
    assert {row["name"] for row in catalogue(provider.options_class)} == {"method", "params"}


@pytest.mark.parametrize("settings", [
    {"command": ["attestor"], "url": "http://127.0.0.1:1/x"},   # which attestor answers: ambiguous
    {"url": "ftp://example.org/attest"},
    {"url": "http://127.0.0.1:1/x", "verify_command": ["v"]},
    {"methods": []},
    {"methods": ["Not A Method"]},
    {"timeout_s": 0},
    {"headers": {"Authorization": "Bearer x"}},
    {"token": "literal-secret"},
    {"env": {"1BAD": "x"}},
])
def test_bad_settings_are_a_configuration_error(load_evidence: Any, settings: dict[str, Any]) -> None:
    with pytest.raises(SchedulerError) as err:
        load_evidence("external", **settings)
    assert err.value.code == "CONFIG_INVALID"


def test_nothing_configured_fails_closed(external: Any, make_payload: Any) -> None:
    provider = external()
    _attest_fails(provider, make_payload(), "EVIDENCE_EXTERNAL_NOT_CONFIGURED")


@pytest.mark.parametrize("options", [{"method": "Bad Method"}, {"colour": "red"}, {"params": {"a": 1}}])
def test_bad_provider_config_is_refused(external: Any, command_for: Any, make_payload: Any, options: dict[str, Any]) -> None:
    provider = external(command=command_for())
    _attest_fails(provider, make_payload(), "EVIDENCE_OPTIONS_INVALID", **options)


# -- the command attestor -------------------------------------------------------------------------


def test_attest_then_verify_with_a_command(external: Any, command_for: Any, make_payload: Any, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "attestor.log"
    monkeypatch.setenv("SCHEDULER_INTERNAL_SECRET", "do-not-leak")
    monkeypatch.setenv("ATTESTOR_REGION", "eu")
    provider = external(command=command_for(), env={"ATTESTOR_LOG": str(log), "ATTESTOR_KEY": "k-123"},
                        pass_env=["ATTESTOR_REGION"])
    payload = make_payload()
    envelope = provider.attest(payload, declaration(method="hmac-sha256", params={"tenant": "ops"}))
    assert envelope.provider == "external" and envelope.format == "scheduler.evidence.external"
    assert envelope.payload_digest == payload.digest
    assert list(envelope.data) == ENVELOPE_KEYS
    assert envelope.data["method"] == "hmac-sha256"
    assert envelope.data["attestor"] == "command:python3" or envelope.data["attestor"].startswith("command:python")
    assert envelope.data["attestation"]["key_id"] == "k1"
    result = provider.verify(envelope, payload, declaration(method="hmac-sha256"))
    assert (result.verified, result.provider, result.code) == (True, "external", None)
    # the stored JSON form verifies too
    assert provider.verify(json.loads(json.dumps(attrs.asdict(envelope))), payload, declaration()).verified
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    attest, verify = seen[0]["request"], seen[1]["request"]
    assert attest["operation"] == "attest" and verify["operation"] == "verify"
    assert attest["payload"].encode() == payload.canonical and attest["payload_digest"] == payload.digest
    assert attest["options"] == {"tenant": "ops"} and attest["method"] == "hmac-sha256"
    assert verify["attestation"] == envelope.data["attestation"]
    assert attest["request_id"] != verify["request_id"]
    env = seen[0]["env"]
    assert "ATTESTOR_REGION" in env and "SCHEDULER_INTERNAL_SECRET" not in env


def test_a_tampered_payload_fails(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for())
    payload = make_payload()
    envelope = provider.attest(payload, declaration())
    tampered = make_payload(exit_code=1)
    assert provider.verify(envelope, tampered, declaration()).code == "EVIDENCE_PAYLOAD_MISMATCH"


def test_an_envelope_transplanted_from_another_payload_fails(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for())
    envelope = provider.attest(make_payload(run_id="run-1"), declaration())
    other = make_payload(run_id="run-2")
    assert provider.verify(envelope, other, declaration()).code == "EVIDENCE_PAYLOAD_MISMATCH"
    # relabelled for the other payload, the attestor itself refuses the attestation
    relabelled = attrs.evolve(with_data(envelope, payload_digest=other.digest), payload_digest=other.digest)
    result = provider.verify(relabelled, other, declaration())
    assert (result.verified, result.code) == (False, "EVIDENCE_EXTERNAL_REJECTED")
    assert "BAD_MAC" in (result.reason or "")


def test_a_forged_attestation_is_rejected_by_the_attestor(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for())
    payload = make_payload()
    envelope = provider.attest(payload, declaration())
    forged = with_data(envelope, attestation={"key_id": "k1", "mac": "0" * 64})
    assert provider.verify(forged, payload, declaration()).code == "EVIDENCE_EXTERNAL_REJECTED"
    # ...and an attestor with another key does not recognise it either
    other_key = external(command=command_for(), env={"ATTESTOR_KEY": "another"})
    assert other_key.verify(envelope, payload, declaration()).code == "EVIDENCE_EXTERNAL_REJECTED"


def test_methods_are_checked_both_ways(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for())
    payload = make_payload()
    envelope = provider.attest(payload, declaration())
    assert envelope.data["method"] == "hmac-sha256"
    # an envelope claiming a method the host does not accept
    assert provider.verify(with_data(envelope, method="rot13"), payload, declaration()).code == "EVIDENCE_METHOD_MISMATCH"
    # a declaration for a method the host does not accept
    _attest_fails(provider, payload, "EVIDENCE_METHOD_UNSUPPORTED", method="rot13")
    with pytest.raises(SchedulerError) as err:
        provider.attest(payload, FutureDeclaration(methods=("ssh-signature",)))
    assert err.value.code == "EVIDENCE_METHOD_UNSUPPORTED"
    # an attestor answering with a method other than the one asked for
    assert provider.attest(payload, declaration(method="hmac-sha512")).data["method"] == "hmac-sha512"
    wrong = external(command=command_for("wrong-method"))
    _attest_fails(wrong, payload, "EVIDENCE_METHOD_MISMATCH")
    # verification with a declared method the envelope does not carry
    assert provider.verify(envelope, payload, declaration(method="hmac-sha512")).code == "EVIDENCE_METHOD_MISMATCH"


BROKEN = [
    ("garbage", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("empty", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("not-object", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("nan", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("two-answers", "EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS"),
    ("duplicate-keys", "EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS"),
    ("extra-field", "EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS"),
    ("missing-field", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("ok-string", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("wrong-schema", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("wrong-request-id", "EVIDENCE_EXTERNAL_ANSWER_MISMATCH"),
    ("wrong-operation", "EVIDENCE_EXTERNAL_ANSWER_MISMATCH"),
    ("wrong-digest", "EVIDENCE_EXTERNAL_ANSWER_MISMATCH"),
    ("exit-1", "EVIDENCE_EXTERNAL_FAILED"),
]


@pytest.mark.parametrize(("mode", "code"), BROKEN + [("refuse", "EVIDENCE_EXTERNAL_REFUSED"),
                                                     ("no-attestation", "EVIDENCE_EXTERNAL_ANSWER_INVALID")])
def test_a_broken_attest_answer_fails_closed(external: Any, command_for: Any, make_payload: Any, mode: str, code: str) -> None:
    provider = external(command=command_for(mode))
    _attest_fails(provider, make_payload(), code)


@pytest.mark.parametrize(("mode", "code"), BROKEN + [
    ("refuse", "EVIDENCE_EXTERNAL_FAILED"),
    ("verified-and-code", "EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS"),
    ("verified-string", "EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS"),
    ("verified-missing", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
])
def test_a_broken_verify_answer_fails_closed(external: Any, command_for: Any, make_payload: Any, mode: str, code: str) -> None:
    payload = make_payload()
    envelope = external(command=command_for()).attest(payload, declaration())
    provider = external(command=command_for(), verify_command=command_for(mode))
    result = provider.verify(envelope, payload, declaration())
    assert (result.verified, result.code) == (False, code), result.reason


def test_a_verify_that_hangs_past_its_timeout_fails(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for("hang-verify"), timeout_s=20, verify_timeout_s=0.5)
    payload = make_payload()
    envelope = provider.attest(payload, declaration())  # attest is not affected by the verify mode
    started = time.monotonic()
    result = provider.verify(envelope, payload, declaration())
    elapsed = time.monotonic() - started
    assert (result.verified, result.code) == (False, "EVIDENCE_EXTERNAL_TIMEOUT")
    assert 0.4 < elapsed < 3


def test_a_hanging_attest_fails(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for("hang"), timeout_s=0.5)
    started = time.monotonic()
    _attest_fails(provider, make_payload(), "EVIDENCE_EXTERNAL_TIMEOUT")
    assert time.monotonic() - started < 3


def test_an_answer_left_open_by_a_child_is_late(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for("child-holds-pipe"), timeout_s=1)
    started = time.monotonic()
    _attest_fails(provider, make_payload(), "EVIDENCE_EXTERNAL_TIMEOUT")
    assert time.monotonic() - started < 4


def test_an_oversized_answer_is_cut_off(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for("oversized"), timeout_s=20, max_answer_bytes=4096)
    started = time.monotonic()
    _attest_fails(provider, make_payload(), "EVIDENCE_EXTERNAL_ANSWER_TOO_LARGE")
    assert time.monotonic() - started < 5  # the attestor sleeps 30 s after writing: it was killed, not waited for


def test_a_missing_command_is_unavailable(external: Any, make_payload: Any, tmp_path: Path) -> None:
    provider = external(command=[str(tmp_path / "no-such-attestor")])
    _attest_fails(provider, make_payload(), "EVIDENCE_EXTERNAL_UNAVAILABLE")


def test_every_envelope_field_changed_is_detected(external: Any, command_for: Any, make_payload: Any) -> None:
    provider = external(command=command_for())
    payload = make_payload()
    envelope = provider.attest(payload, declaration())
    changes = {
        "schema": ["scheduler.evidence.checksum"], "version": [2, "1", True], "method": ["hmac-sha512", "x"],
        "attestor": [None, 7], "payload_format": ["json"], "payload_digest": [make_payload(run_id="x").digest],
        "attestation": [{}, None, {"key_id": "k1", "mac": envelope.data["attestation"]["mac"][::-1]}],
    }
    for key, values in changes.items():
        for value in values:
            result = provider.verify(with_data(envelope, **{key: value}), payload, declaration())
            assert not result.verified and (result.code or "").startswith("EVIDENCE_"), (key, value)
        missing = {k: v for k, v in envelope.data.items() if k != key}
        assert not provider.verify(attrs.evolve(envelope, data=missing), payload, declaration()).verified, key
    assert provider.verify(with_data(envelope, extra=1), payload, declaration()).code == "EVIDENCE_ENVELOPE_INVALID"
    assert provider.verify(attrs.evolve(envelope, provider="ssh"), payload, declaration()).code == "EVIDENCE_PROVIDER_MISMATCH"


@pytest.mark.parametrize("envelope", [None, 3, {}, {"provider": "external", "data": {}}])
def test_garbage_envelopes_never_raise(external: Any, command_for: Any, make_payload: Any, envelope: Any) -> None:
    result = external(command=command_for()).verify(envelope, make_payload(), declaration())
    assert result.verified is False and (result.code or "").startswith("EVIDENCE_")


# -- the HTTP attestor ----------------------------------------------------------------------------


def test_attest_then_verify_over_http(external: Any, http_attestor: Any, make_payload: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTESTOR_TOKEN", "tok-123")
    url = http_attestor.url("good") + "?api_key=hidden"
    provider = external(url=url, token={"credential": "env:ATTESTOR_TOKEN"}, headers={"X-Tenant": "ops"})
    payload = make_payload()
    envelope = provider.attest(payload, declaration(params={"tenant": "ops"}))
    assert envelope.data["attestor"] == "http:" + url.split("/good")[0]  # origin only: no path, no query
    assert "hidden" not in json.dumps(dict(envelope.data))
    assert provider.verify(envelope, payload, declaration()).verified
    first = http_attestor.requests[0]
    assert first["headers"]["authorization"] == "Bearer tok-123"
    assert first["headers"]["x-tenant"] == "ops" and first["headers"]["content-type"] == "application/json"
    assert first["request"]["payload_digest"] == payload.digest
    assert [r["request"]["operation"] for r in http_attestor.requests] == ["attest", "verify"]


def test_a_separate_verify_endpoint(external: Any, http_attestor: Any, make_payload: Any) -> None:
    provider = external(url=http_attestor.url("good"), verify_url=http_attestor.url("verified-and-code"))
    payload = make_payload()
    envelope = provider.attest(payload, declaration())
    assert provider.verify(envelope, payload, declaration()).code == "EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS"
    assert [r["path"] for r in http_attestor.requests] == ["/good", "/verified-and-code"]


def test_an_unresolvable_token_fails_closed(external: Any, http_attestor: Any, make_payload: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    provider = external(url=http_attestor.url(), token={"credential": "env:NO_SUCH_TOKEN"})
    err = _attest_fails(provider, make_payload(), "EVIDENCE_EXTERNAL_NOT_CONFIGURED")
    assert "NO_SUCH_TOKEN" in err.message and http_attestor.requests == []


@pytest.mark.parametrize(("mode", "code"), [
    ("status-500", "EVIDENCE_EXTERNAL_FAILED"),
    ("redirect", "EVIDENCE_EXTERNAL_FAILED"),
    ("oversized", "EVIDENCE_EXTERNAL_ANSWER_TOO_LARGE"),
    ("chunked-oversized", "EVIDENCE_EXTERNAL_ANSWER_TOO_LARGE"),
    ("garbage", "EVIDENCE_EXTERNAL_ANSWER_INVALID"),
    ("duplicate-keys", "EVIDENCE_EXTERNAL_ANSWER_AMBIGUOUS"),
    ("wrong-request-id", "EVIDENCE_EXTERNAL_ANSWER_MISMATCH"),
    ("refuse", "EVIDENCE_EXTERNAL_REFUSED"),
])
def test_a_broken_http_answer_fails_closed(external: Any, http_attestor: Any, make_payload: Any, mode: str, code: str) -> None:
    provider = external(url=http_attestor.url(mode), max_answer_bytes=64 * 1024)
    _attest_fails(provider, make_payload(), code)
    assert len(http_attestor.requests) == 1  # a redirect is not followed


@pytest.mark.parametrize("mode", ["hang-headers", "slow-drip"])
def test_a_late_http_answer_fails_within_the_timeout(external: Any, http_attestor: Any, make_payload: Any, mode: str) -> None:
    provider = external(url=http_attestor.url(mode), timeout_s=0.6)
    started = time.monotonic()
    _attest_fails(provider, make_payload(), "EVIDENCE_EXTERNAL_TIMEOUT")
    assert time.monotonic() - started < 1.5  # a hard deadline, not a per-read timeout


def test_an_http_verify_that_hangs_past_its_timeout_fails(external: Any, http_attestor: Any, make_payload: Any) -> None:
    payload = make_payload()
    provider = external(url=http_attestor.url("hang-verify-headers"), verify_timeout_s=0.5)
    envelope = provider.attest(payload, declaration())
    started = time.monotonic()
    result = provider.verify(envelope, payload, declaration())
    assert (result.verified, result.code) == (False, "EVIDENCE_EXTERNAL_TIMEOUT")
    assert time.monotonic() - started < 1.5


def test_a_refused_connection_is_unavailable(external: Any, make_payload: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = external(url=f"http://127.0.0.1:{port}/attest")
    err = _attest_fails(provider, make_payload(), "EVIDENCE_EXTERNAL_UNAVAILABLE")
    assert f"127.0.0.1:{port}" in err.message and "/attest" not in err.message
