"""Conformance kind ``proof_verifier``: the corpus, the four shipped verifiers, and broken verifiers reported failing.

The shipped verifiers (``jwt``, ``detached-signature``, ``certificate`` of scheduler-provider-proofs,
``detached-signature-ssh`` of scheduler-provider-ssh) run through their entry points with their
setup adapters, as CI runs them. The broken ones are in-process variants of the real Ed25519
verifier, run with its setup adapter: each must be reported failing on the cases its defect
breaks, and the real one must pass, so a failure is the defect's and not the harness's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from scheduler_provider_proofs import DetachedSignatureVerifier
from scheduler_provider_proofs.conformance import Ed25519Proofs
from scheduler_toolkit.proofs import parse_document, verified_document

import scheduler.testing  # noqa: F401  (installs the run pipeline: the cases validate job specs)
from scheduler.base.errors import SchedulerError
from scheduler.conformance.engine import Report, load_cases, run_kind

BIN = Path(sys.executable).parent
SHIPPED = ["jwt", "detached-signature", "certificate", "detached-signature-ssh"]


# -- broken variants of the Ed25519 verifier ------------------------------------------------------------


class Lax(DetachedSignatureVerifier):
    """Believes every well-formed document: never checks the signature, never reads the key."""

    def verify_proof(self, request: Any) -> Any:
        return verified_document("detached-signature", parse_document("detached-signature", request.proof), "SHA256:lax")


class LongWindow(DetachedSignatureVerifier):
    """Reports a window an hour longer than the proof states."""

    def verify_proof(self, request: Any) -> Any:
        answer = super().verify_proof(request)
        return attrs.evolve(answer, expires_at_ms=answer.expires_at_ms + 3_600_000)


class Crashes(DetachedSignatureVerifier):
    """Parses with a bare ``json.loads``: text that is no proof is an exception, not a refusal."""

    def verify_proof(self, request: Any) -> Any:
        json.loads(request.proof)
        return super().verify_proof(request)


class RefusesAll(DetachedSignatureVerifier):
    def verify_proof(self, request: Any) -> Any:
        raise SchedulerError("PROOF_INVALID_SIGNATURE", "nothing is ever good enough")


class Leaky(DetachedSignatureVerifier):
    """Quotes the proof it refuses."""

    def verify_proof(self, request: Any) -> Any:
        try:
            return super().verify_proof(request)
        except SchedulerError as exc:
            raise SchedulerError(exc.code, f"{exc.message}: {request.proof}") from None


class Mutates(DetachedSignatureVerifier):
    def verify_proof(self, request: Any) -> Any:
        answer = super().verify_proof(request)
        request.declaration["public_key_file"] = "/elsewhere"
        return answer


class Counts(DetachedSignatureVerifier):
    """Answers right once, then with another key id."""

    def __init__(self) -> None:
        self.seen = 0

    def verify_proof(self, request: Any) -> Any:
        answer = super().verify_proof(request)
        self.seen += 1
        return answer if self.seen == 1 else attrs.evolve(answer, key_id=f"SHA256:changed-{self.seen}")


def run(provider: Any) -> Report:
    return run_kind("proof_verifier", "detached-signature", provider=provider, service_adapter=Ed25519Proofs())


def failed(report: Report) -> set[str]:
    return {r.id for r in report.results if r.outcome == "failed"}


# -- the corpus ---------------------------------------------------------------------------------------------


def test_the_corpus_covers_the_issue() -> None:
    cases = {c.id: c for c in load_cases("proof_verifier")}
    positive = [c for c in cases.values() if c.polarity == "positive"]
    assert [c.id for c in positive] == ["proof_verifier.valid"]
    for needed in ("wrong-key", "wrong-artifact", "expired", "not-yet-valid", "bad-signature", "malformed", "unbound",
                   "trust-missing", "trust-empty", "exception", "wrong-return-type", "wrong-method", "slow-verifier"):
        assert f"proof_verifier.{needed}" in cases, needed
    assert all(c.expect["outcome"] == "refused" and c.expect["error_code"] for c in cases.values() if c.polarity == "negative")


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c["expect"].update(outcome="refused", error_code="PROOF_EXPIRED"), "positive proof_verifier case"),
    (lambda c: c["expect"].update(error_code="PROOF_EXPIRED"), "has no error_code"),
    (lambda c: c["input"].update(proof="expired"), "only a valid proof"),
    (lambda c: c["input"].update(proof="nonsense"), "is not one of"),
    (lambda c: c["expect"].update(surprise=True), "Additional properties"),
])
def test_invalid_cases_are_refused_at_load(tmp_path: Path, change: Any, message: str) -> None:
    case = {"id": "proof_verifier.extra", "description": "d", "kind": "proof_verifier", "polarity": "positive",
            "input": {"proof": "valid"}, "expect": {"outcome": "verified"}}
    change(case)
    (tmp_path / "proof_verifier").mkdir()
    (tmp_path / "proof_verifier" / "extra.json").write_text(json.dumps({"kind": "proof_verifier", "cases": [case]}))
    with pytest.raises(SchedulerError) as info:
        load_cases("proof_verifier", extra=[tmp_path])
    assert info.value.code == "CONFORMANCE_FIXTURE_INVALID"
    assert message in info.value.message + json.dumps(info.value.details), info.value.message


# -- the shipped verifiers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_verifiers_pass(name: str) -> None:
    report = run_kind("proof_verifier", name)
    assert report.error is None, report.error
    not_passed = {r.id: r.message for r in report.results if r.outcome != "passed"}
    # Every first-party verifier's trust is the declaration's own: the empty-settings case has nothing to take away.
    assert report.ok and not_passed == {"proof_verifier.unconfigured-refuses": (
        "the setup configures nothing on the host (the verifier's trust is the declaration's own)")}, not_passed
    assert report.passed == len(load_cases("proof_verifier")) - 1


def test_the_ci_runner_and_the_cli_run_the_kind(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    out = subprocess.run([str(BIN / "scheduler"), "conformance", "run", "proof_verifier", "jwt", "--json"], env=env,
                         capture_output=True, text=True, timeout=180)
    body = json.loads(out.stdout)
    assert out.returncode == 0 and body["ok"] and body["failed"] == 0, out.stdout + out.stderr
    from scheduler.conformance.ci import FIRST_PARTY

    assert {name for kind, name in FIRST_PARTY if kind == "proof_verifier"} == set(SHIPPED)
    ci = subprocess.run([sys.executable, "-m", "scheduler.conformance.ci"], capture_output=True, text=True, timeout=300,
                        env={**env, "SCHEDULER_CONFORMANCE_PROVIDERS": "proof_verifier:certificate,proof_verifier:nosuch"})
    assert ci.returncode == 1 and "== conformance proof_verifier certificate" in ci.stdout, ci.stdout + ci.stderr
    assert "FAIL proof_verifier nosuch: PLUGIN_NOT_FOUND" in ci.stdout  # a verifier CI must install is one failure
    assert ci.stdout.strip().splitlines()[-1] == f"{len(load_cases('proof_verifier')) - 1} passed, 1 failed, 1 skipped"


# -- broken verifiers are reported failing --------------------------------------------------------------------


def test_the_real_verifier_passes_in_process() -> None:
    report = run(DetachedSignatureVerifier())
    assert report.ok, [r.to_json() for r in report.results if r.outcome == "failed"]


@pytest.mark.parametrize(("provider", "must_fail", "why"), [
    (Lax(), {"proof_verifier.wrong-key", "proof_verifier.bad-signature", "proof_verifier.trust-missing",
             "proof_verifier.trust-empty", "proof_verifier.valid"}, "outcome: expected refused"),
    (LongWindow(), {"proof_verifier.valid", "proof_verifier.expired"}, "expires_at_ms: expected"),
    (Crashes(), {"proof_verifier.malformed"}, "PROOF_VERIFICATION_FAILED"),
    (RefusesAll(), {"proof_verifier.valid", "proof_verifier.wrong-key", "proof_verifier.expired"}, "refuses everything"),
    (Leaky(), {"proof_verifier.malformed", "proof_verifier.bad-signature"}, "the proof text appears"),
    (Mutates(), {"proof_verifier.valid"}, "changed the declaration"),
    (Counts(), {"proof_verifier.valid"}, "asked again"),
], ids=lambda v: type(v).__name__ if not isinstance(v, (set, str)) else "")
def test_broken_verifiers_are_reported_failing(provider: Any, must_fail: set[str], why: str) -> None:
    report = run(provider)
    assert not report.ok and report.error is None
    assert must_fail <= failed(report), (must_fail - failed(report), [r.to_json() for r in report.results])
    messages = " ".join(r.message for r in report.results if r.outcome == "failed")
    assert why in messages, messages


def test_a_setup_for_another_verifier_is_a_failure_not_a_pass() -> None:
    """The jwt setup adapter handed to the Ed25519 verifier: its declarations name another verifier."""
    from scheduler_provider_proofs.conformance import JwtProofs

    report = run_kind("proof_verifier", "detached-signature", provider=DetachedSignatureVerifier(), service_adapter=JwtProofs(),
                      filter="proof_verifier.valid")
    assert failed(report) == {"proof_verifier.valid"}
    assert "is verified by 'jwt', not by the verifier under test 'detached-signature'" in report.results[0].message


# -- a verifier whose trust is a host setting (issue 27: the empty-settings case) ----------------------------


@attrs.frozen(kw_only=True)
class _TrustSettings:
    """``[providers.NAME]`` of a verifier that also needs a host-side trust directory."""

    trust_dir: str | None = None


class _TrustOnHost(DetachedSignatureVerifier):
    """Honest: without its trust_dir it verifies nothing (PROOF_KEY_UNAVAILABLE)."""

    settings_class = _TrustSettings
    trust_dir: str | None = None

    def configure(self, settings: _TrustSettings) -> None:
        self.trust_dir = settings.trust_dir

    def verify_proof(self, request: Any) -> Any:
        if self.trust_dir is None:
            raise SchedulerError("PROOF_KEY_UNAVAILABLE", "no trust_dir is configured in [providers.NAME]")
        return super().verify_proof(request)


class _VerifiesUnconfigured(_TrustOnHost):
    """Broken: an unconfigured instance verifies anyway."""

    def verify_proof(self, request: Any) -> Any:
        return DetachedSignatureVerifier.verify_proof(self, request)


class _TrustOnHostProofs(Ed25519Proofs):
    """The Ed25519 setups, each also configuring the verifier's trust_dir on the host."""

    def conformance_proof(self, request: Any) -> Any:
        setup = super().conformance_proof(request)
        setup.settings = {"trust_dir": str(request.workdir)}
        return setup


def test_the_empty_settings_case_fails_a_verifier_that_verifies_unconfigured() -> None:
    def report(provider: Any) -> Report:
        return run_kind("proof_verifier", "detached-signature", provider=provider, adapter=_TrustOnHostProofs(),
                        filter="proof_verifier.unconfigured-refuses")

    honest, broken = report(_TrustOnHost()), report(_VerifiesUnconfigured())
    assert honest.ok and honest.passed == 1, [r.to_json() for r in honest.results]
    assert failed(broken) == {"proof_verifier.unconfigured-refuses"}
    assert "outcome: expected refused, got verified" in broken.results[0].message, broken.results[0].message
