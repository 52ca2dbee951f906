"""The evidence conformance kind: the corpus, the checksum, SSH and external providers passing it, broken providers failing it.

Real parts: the fixtures on disk, the providers loaded through their entry points with their
setup adapters (real ``ssh-keygen`` keys and allowed-signers files; the reference attestor as
a child process and behind a real HTTP server on loopback), the CLI and the CI runner in
child processes. The broken providers are in-process HMAC providers, each wrong in one way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
from scheduler_toolkit.evidence import (
    EvidenceFailure,
    check_bound_payload,
    check_keys,
    check_payload,
    check_requested_methods,
    envelope_parts,
)

from scheduler import PLUGIN_API_VERSION
from scheduler.api import EvidenceEnvelope, EvidenceVerification
from scheduler.conformance import ci
from scheduler.conformance.engine import FIXTURES_ENV, load_cases, load_corpus, run_kind
from scheduler.testing import EvidenceProviderConformance, EvidenceSetup, EvidenceSetupRequest

REPO = Path(__file__).resolve().parents[1]


def _outcomes(report: Any) -> dict[str, str]:
    return {r.id: r.outcome for r in report.results}


def test_the_corpus_covers_the_issue() -> None:
    cases = {c.id: c for c in load_cases("evidence")}
    assert all(c.source.startswith("v2/evidence/") for c in cases.values())
    tampers = {c.input.get("tamper", "none") for c in cases.values()}
    assert {"none", "payload", "payload_rebound", "transplant", "signature_truncated", "foreign_envelope",
            "provider_relabelled", "method_unknown", "envelope_not_object", "data_field_added", "data_field_removed",
            "digest_malformed", "data_not_object", "data_value_changed"} == tampers
    assert {c.input.get("signer", "trusted") for c in cases.values()} == {"trusted", "untrusted_key", "other_principal",
                                                                          "other_namespace"}
    assert cases["evidence.attest-verify"].polarity == "positive"
    assert cases["evidence.unknown-method-refused"].expect == {"outcome": "attest_refused",
                                                               "error_code": "EVIDENCE_METHOD_UNSUPPORTED"}
    signed_only = {i for i, c in cases.items() if "signed-evidence" in c.requires}
    assert signed_only == {"evidence.forged-envelope-rebound", "evidence.wrong-principal", "evidence.wrong-namespace",
                           "evidence.truncated-signature"}


@pytest.mark.parametrize(("name", "passed", "skipped"), [("checksum", 15, 7), ("ssh", 22, 0), ("external", 17, 5)])
def test_first_party_providers_pass(name: str, passed: int, skipped: int) -> None:
    report = run_kind("evidence", name)
    assert report.error is None, report.error
    failures = [(r.id, r.message) for r in report.results if r.outcome == "failed"]
    assert failures == [] and (report.passed, report.skipped) == (passed, skipped), _outcomes(report)
    skips = {r.id: r.message for r in report.results if r.outcome == "skipped"}
    if name == "checksum":  # no signer to distrust; no signature to forge
        assert "records no key or signer" in skips["evidence.untrusted-key"]
        assert "signed-evidence" in skips["evidence.forged-envelope-rebound"]
    if name == "external":
        assert _outcomes(report)["evidence.untrusted-key"] == "passed"


@pytest.mark.parametrize("transport", ["command", "http"])
def test_external_passes_over_each_transport(transport: str) -> None:
    from scheduler_provider_external.conformance import ExternalSetup

    report = run_kind("evidence", "external", service_adapter=ExternalSetup(transport=transport))
    assert report.error is None and report.failed == 0 and report.passed == 17, _outcomes(report)


# --------------------------------------------------------------------------- broken providers

SIGN_VAR, VERIFY_VAR = "BROKEN_EVIDENCE_SIGN_KEY", "BROKEN_EVIDENCE_VERIFY_KEY"
FORMAT = "test.evidence.hmac"
KEYS = ("schema", "version", "method", "payload_digest", "key_id", "mac")


class HmacSetup:
    """Keys in two variables (set by the engine while the case runs); another key for the untrusted-key case."""

    def conformance_setup(self, request: Any) -> Any:
        if request.signer not in ("trusted", "untrusted_key"):
            raise NotImplementedError("no principals or namespaces here")
        key = "bk-" + secrets.token_hex(16)
        verify_key = "bk-" + secrets.token_hex(16) if request.signer == "untrusted_key" else key

        class Setup:
            settings: ClassVar[dict[str, Any]] = {"verify_key_env": SIGN_VAR}
            verify_settings: ClassVar[dict[str, Any]] = {"verify_key_env": VERIFY_VAR}
            provider_config: ClassVar[dict[str, Any]] = {}
            secrets: ClassVar[dict[str, str]] = {SIGN_VAR: key, VERIFY_VAR: verify_key}
            signature_field = ("mac",)

            def secret_values(self) -> list[str]:
                return [key, verify_key]

            def close(self) -> None:
                pass

        return Setup()


def _key_id(var: str) -> str:
    return hashlib.sha256(os.environ[var].encode()).hexdigest()[:16]


def _mac(var: str, digest: str) -> str:
    return hmac.new(os.environ[var].encode(), digest.encode(), hashlib.sha256).hexdigest()


@attrs.frozen(kw_only=True)
class HmacSettings:
    """``[providers.broken]``: the variable holding the key verification uses."""

    verify_key_env: str | None = attrs.field(default=None, metadata={"doc": "variable with the verifying key (unset: no trust)"})


class HonestHmac:
    """Signs the payload digest with the sign key, verifies with the configured key; every check made."""

    plugin_api = PLUGIN_API_VERSION
    capabilities = frozenset({"attest", "verify-evidence", "signed-evidence"})
    methods = frozenset({"hmac"})
    settings_class = HmacSettings
    name = "broken"

    def __init__(self) -> None:
        self.verify_var: str | None = None

    def configure(self, settings: HmacSettings) -> None:
        self.verify_var = settings.verify_key_env

    def attest(self, payload: Any, declaration: Any) -> EvidenceEnvelope:
        try:
            checked = check_payload(payload)
            check_requested_methods(declaration, self.methods, self.name)
        except EvidenceFailure as failure:
            raise failure.error() from None
        data = {"schema": FORMAT, "version": 1, "method": "hmac", "payload_digest": checked.digest,
                "key_id": _key_id(SIGN_VAR), "mac": _mac(SIGN_VAR, checked.digest)}
        return EvidenceEnvelope(provider=self.name, format=FORMAT, payload_digest=checked.digest, data=data)

    def verify(self, envelope: Any, payload: Any, declaration: Any) -> EvidenceVerification:
        try:
            self._verify(envelope, payload, declaration)
        except EvidenceFailure as failure:
            return failure.verification(self.name)
        return EvidenceVerification(verified=True, provider=self.name)

    def _verify(self, envelope: Any, payload: Any, declaration: Any) -> None:
        digest, data = envelope_parts(envelope, self.name)
        if data.get("method") not in self.methods:
            raise EvidenceFailure("EVIDENCE_METHOD_MISMATCH", "not an hmac envelope")
        check_keys(data, KEYS)
        check_bound_payload(digest, check_payload(payload))
        if self.verify_var is None:
            raise EvidenceFailure("EVIDENCE_TRUST_NOT_CONFIGURED", "no verifying key is configured (verify_key_env)")
        if data["key_id"] != _key_id(self.verify_var):
            raise EvidenceFailure("EVIDENCE_SIGNER_UNTRUSTED", "made with a key this host does not trust")
        if not hmac.compare_digest(str(data["mac"]), _mac(self.verify_var, digest)):
            raise EvidenceFailure("EVIDENCE_SIGNATURE_INVALID", "the MAC does not match")


class AlwaysVerified(HonestHmac):
    """Says verified whatever it is given."""

    def verify(self, envelope: Any, payload: Any, declaration: Any) -> EvidenceVerification:
        return EvidenceVerification(verified=True, provider=self.name)


class IgnoresPayload(HonestHmac):
    """Checks the envelope and its MAC, never that the envelope is for the payload at hand."""

    def _verify(self, envelope: Any, payload: Any, declaration: Any) -> None:
        digest, data = envelope_parts(envelope, self.name)
        check_keys(data, KEYS)
        if not hmac.compare_digest(str(data["mac"]), _mac(self.verify_var, digest)):
            raise EvidenceFailure("EVIDENCE_SIGNATURE_INVALID", "the MAC does not match")


class RefusesEverything(HonestHmac):
    """Never verifies anything, so every negative case would pass on its own."""

    def verify(self, envelope: Any, payload: Any, declaration: Any) -> EvidenceVerification:
        return EvidenceVerification(verified=False, provider=self.name, code="EVIDENCE_SIGNATURE_INVALID", reason="no")


class Raising(HonestHmac):
    """Lets a malformed envelope escape as an exception."""

    def verify(self, envelope: Any, payload: Any, declaration: Any) -> EvidenceVerification:
        _ = envelope.data["mac"]  # AttributeError on a string, KeyError on a missing field
        return super().verify(envelope, payload, declaration)


class Downgrading(HonestHmac):
    """Attests whatever method the declaration asks for."""

    def attest(self, payload: Any, declaration: Any) -> EvidenceEnvelope:
        return super().attest(payload, type("D", (), {"methods": ()})())


class Leaky(HonestHmac):
    """Puts its key into the envelope and logs it."""

    def attest(self, payload: Any, declaration: Any) -> EvidenceEnvelope:
        envelope = super().attest(payload, declaration)
        logging.getLogger("leaky-evidence").debug("signed with %s", os.environ[SIGN_VAR])
        return envelope


class Impostor(HonestHmac):
    """Returns an envelope naming another provider."""

    def attest(self, payload: Any, declaration: Any) -> EvidenceEnvelope:
        envelope = super().attest(payload, declaration)
        return EvidenceEnvelope(provider="checksum", format=envelope.format, payload_digest=envelope.payload_digest,
                                data=envelope.data)


def _run(provider: Any, cases: list[str] | str) -> Any:
    return run_kind("evidence", "broken", provider, filter=cases, service_adapter=HmacSetup())


def test_an_honest_in_process_provider_passes_what_its_setup_can_give() -> None:
    report = _run(HonestHmac(), "evidence.*")
    assert report.failed == 0, [(r.id, r.message) for r in report.results if r.outcome == "failed"]
    assert (report.passed, report.skipped) == (19, 3), _outcomes(report)  # no principal, no namespace, no trust file


@pytest.mark.parametrize(("provider", "case", "fragment"), [
    (AlwaysVerified(), "evidence.tampered-payload", "the envelope verified, but it must be refused"),
    (AlwaysVerified(), "evidence.untrusted-key", "the envelope verified, but it must be refused"),
    (AlwaysVerified(), "evidence.malformed-envelope-digest", "the envelope verified, but it must be refused"),
    (IgnoresPayload(), "evidence.tampered-payload", "the envelope verified, but it must be refused"),
    (IgnoresPayload(), "evidence.transplanted-envelope", "the envelope verified, but it must be refused"),
    (RefusesEverything(), "evidence.attest-verify", "expected the envelope to verify"),
    (RefusesEverything(), "evidence.tampered-payload", "the untouched envelope does not verify"),
    (Raising(), "evidence.malformed-envelope-not-object", "verify raised AttributeError"),
    (Raising(), "evidence.malformed-envelope-missing-field", "verify raised KeyError"),
    (Downgrading(), "evidence.unknown-method-refused", "attest returned an envelope, but it must refuse"),
    (Leaky(), "evidence.attest-verify", "appears in a log record"),
    (Impostor(), "evidence.attest-verify", "not 'broken'"),
])
def test_a_broken_provider_is_reported_failing(provider: Any, case: str, fragment: str) -> None:
    report = _run(provider, case)
    (result,) = report.results
    assert result.outcome == "failed" and fragment in result.message, result.message
    assert not report.ok and report.to_json()["code"] == "CONFORMANCE_FAILED"
    assert "bk-" not in json.dumps(report.to_json())  # the report itself never quotes a key


def test_a_provider_without_a_setup_adapter_is_one_failure() -> None:
    report = run_kind("evidence", "broken", HonestHmac())
    assert report.error is not None and report.error["code"] == "CONFORMANCE_NO_SETUP_ADAPTER" and report.failed == 1


@pytest.mark.parametrize(("case", "message"), [
    ({"polarity": "negative", "input": {"tamper": "payload"}, "expect": {"outcome": "refused"}}, "error_code"),
    ({"polarity": "positive", "input": {"tamper": "payload"}, "expect": {"outcome": "refused", "error_code": "EVIDENCE_X"}},
     "positive evidence case expects outcome verified"),
    ({"polarity": "negative", "input": {"tamper": "sideways"}, "expect": {"outcome": "refused", "error_code": "EVIDENCE_X"}},
     "sideways"),
    ({"polarity": "negative", "input": {"payload_defect": "noncanonical"},
      "expect": {"outcome": "refused", "error_code": "EVIDENCE_X"}}, "attest_refused"),
])
def test_an_invalid_evidence_case_is_refused_when_loaded(tmp_path: Path, case: dict[str, Any], message: str) -> None:
    from scheduler.base.errors import SchedulerError

    (tmp_path / "evidence").mkdir()
    full = {"id": "mine.evidence-case", "description": "d", "kind": "evidence", **case}
    (tmp_path / "evidence" / "mine.json").write_text(json.dumps({"kind": "evidence", "cases": [full]}))
    with pytest.raises(SchedulerError) as caught:
        load_corpus(extra=[tmp_path])
    assert caught.value.code == "CONFORMANCE_FIXTURE_INVALID" and message in (caught.value.message + json.dumps(
        caught.value.details)), caught.value.message


def test_the_cli_and_the_ci_runner(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != FIXTURES_ENV}
    scheduler = str(Path(sys.executable).parent / "scheduler")
    proc = subprocess.run([scheduler, "conformance", "run", "evidence", "ssh", "--json"], capture_output=True, text=True,
                          env=env, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    document = json.loads(proc.stdout.strip().splitlines()[-1])
    assert document["ok"] is True and document["passed"] == 22 and document["failed"] == 0
    env[ci.PROVIDERS_ENV] = "evidence:checksum,evidence:ssh,evidence:external"
    proc = subprocess.run([sys.executable, "-m", "scheduler.conformance.ci"], capture_output=True, text=True, env=env,
                          timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "54 passed, 0 failed, 12 skipped"
    assert ("evidence", "ssh") in ci.FIRST_PARTY and ("evidence", "external") in ci.FIRST_PARTY


class _SignatureFieldAs:
    """HmacSetup, with the setup's signature_field replaced by ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def conformance_setup(self, request: Any) -> Any:
        setup = HmacSetup().conformance_setup(request)
        setup.signature_field = self.value
        return setup


@pytest.mark.parametrize("value", ["mac", ("mac",), ["mac"]])
def test_signature_field_may_be_one_key_or_a_path(value: Any) -> None:
    """Issue 27 item 2: ``"mac"`` is the key ``mac`` (it used to be split into ``('m', 'a', 'c')``), like ``("mac",)``."""
    report = run_kind("evidence", "broken", HonestHmac(), filter=["evidence.truncated-signature", "evidence.data-value-*"],
                      service_adapter=_SignatureFieldAs(value))
    assert report.ok and report.passed == 2, [(r.id, r.message) for r in report.results]


@pytest.mark.parametrize("value", [5, {"mac": True}, ("mac", 1), [""]])
def test_a_signature_field_of_another_type_is_refused_clearly(value: Any) -> None:
    report = run_kind("evidence", "broken", HonestHmac(), filter="evidence.truncated-signature",
                      service_adapter=_SignatureFieldAs(value))
    (result,) = report.results
    assert result.outcome == "failed" and "CONFORMANCE_ADAPTER_INVALID" in result.message, result.message
    assert "give one key of the envelope's data (a string" in result.message and repr(value) in result.message


class _Renamed(HonestHmac):
    """HonestHmac told its name: one class, any name (issue 27 item 4)."""

    def registered_as(self, name: str) -> None:
        self.name = name


def test_a_named_provider_is_told_the_name_it_runs_under() -> None:
    for name in ("hmac-a", "hmac-b"):
        report = run_kind("evidence", name, _Renamed(), filter=["evidence.attest-verify", "evidence.relabelled-envelope"],
                          service_adapter=HmacSetup())
        assert report.ok and report.passed == 2, [(r.id, r.message) for r in report.results]
    unnamed = run_kind("evidence", "hmac-a", HonestHmac(), filter="evidence.attest-verify", service_adapter=HmacSetup())
    assert not unnamed.ok and "not 'hmac-a'" in unnamed.results[0].message  # a hard-coded name fails under another


class HelperSetup:
    """HmacSetup written with scheduler.testing's EvidenceSetup (issue 27 item 3): what an outside author would write."""

    def conformance_setup(self, request: EvidenceSetupRequest) -> EvidenceSetup:
        if request.signer not in ("trusted", "untrusted_key"):
            raise NotImplementedError("no principals or namespaces here")
        key = "bk-" + secrets.token_hex(16)
        verify_key = "bk-" + secrets.token_hex(16) if request.signer == "untrusted_key" else key
        return EvidenceSetup({"verify_key_env": SIGN_VAR}, verify_settings={"verify_key_env": VERIFY_VAR},
                             secrets={SIGN_VAR: key, VERIFY_VAR: verify_key}, signature_field="mac",
                             secret_values=[key, verify_key])


def test_the_evidence_setup_helper_is_a_whole_setup() -> None:
    report = run_kind("evidence", "broken", HonestHmac(), adapter=HelperSetup())
    assert report.failed == 0, [(r.id, r.message) for r in report.results if r.outcome == "failed"]
    assert (report.passed, report.skipped) == (19, 3), _outcomes(report)


class TestHmacThroughThePytestClass(EvidenceProviderConformance):
    """Issue 27 item 7: the evidence class takes ``setup_adapter`` like the authorization and proof classes."""

    provider_name = "broken"
    setup_adapter = HelperSetup
    case_filter: ClassVar[list[str]] = ["evidence.attest-verify", "evidence.truncated-signature",
                                        "evidence.verify-without-trust-refused"]

    def make_provider(self) -> Any:
        return HonestHmac()
