"""The credential conformance kind: the corpus, the local and OAuth2 providers passing it, broken providers failing it.

Real parts: the fixtures on disk, the providers loaded through their entry points with
their source adapters (real variables, 0600 files, ``/bin/sh`` commands, a loopback OAuth2
token endpoint), the CLI and the CI runner in child processes.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from scheduler import PLUGIN_API_VERSION
from scheduler.base.errors import SchedulerError
from scheduler.conformance import ci
from scheduler.conformance.engine import FIXTURES_ENV, load_cases, run_kind
from scheduler.plugins.protocols import ResolvedCredential, RevokeResult

REPO = Path(__file__).resolve().parents[1]


def _outcomes(report: Any) -> dict[str, str]:
    return {r.id: r.outcome for r in report.results}


def test_the_corpus_covers_the_issue() -> None:
    cases = {c.id: c for c in load_cases("credential")}
    assert all(c.source.startswith("v2/credential/") for c in cases.values())
    sources = {c.input.get("source", "value") for c in cases.values()}
    assert sources == {"value", "missing", "empty", "refused", "failure", "malformed", "expired", "slow"}
    media = {c.input.get("binding", {}).get("present", {}).get("medium") for c in cases.values()}
    assert {"env", "file", "stdin"} <= media
    assert {c.input.get("revoke_answer") for c in cases.values()} >= {"accept", "unavailable", "reject"}
    assert cases["credential.expired-value-never-presented"].expect["error_code"] == "CREDENTIAL_EXPIRED"
    assert "refresh" in cases["credential.refresh-returns-a-checked-value"].input["steps"]


@pytest.mark.parametrize(("name", "passed", "skipped"), [("env", 6, 9), ("file", 7, 8), ("command", 8, 7), ("oauth2", 15, 0)])
def test_first_party_providers_pass(name: str, passed: int, skipped: int) -> None:
    report = run_kind("credential", name)
    assert report.error is None, report.error
    failures = [(r.id, r.message) for r in report.results if r.outcome == "failed"]
    assert failures == [] and (report.passed, report.skipped) == (passed, skipped), _outcomes(report)
    if name == "oauth2":  # every case ran against the loopback token endpoint, none skipped
        assert _outcomes(report)["credential.slow-source-times-out"] == "passed"


# --------------------------------------------------------------------------- broken providers


class EnvLikeSource:
    """A stand-in source for the in-process providers below: one variable (value / missing / expired)."""

    def conformance_source(self, request: Any) -> Any:
        value = "bk-" + secrets.token_urlsafe(20)

        class StandIn:
            settings: ClassVar[dict[str, Any]] = {}
            ref = f"BROKEN_CRED_{secrets.token_hex(4).upper()}"
            secrets: ClassVar[dict[str, str]] = {ref: value} if request.source in ("value", "expired", "slow") else {}

            def values(self) -> list[str]:
                return [value]

            def revoked(self) -> list[str]:
                return []

            def close(self) -> None:
                pass

        if request.source not in ("value", "missing", "expired", "slow"):
            raise NotImplementedError(request.source)
        stand_in = StandIn()
        stand_in.secrets = {**stand_in.secrets, "BROKEN_MODE": f"{request.source}-{secrets.token_hex(6)}"}  # a mode, not a word
        return stand_in


class HonestEnv:
    """Reads the variable, answers for the binding, refuses missing with CREDENTIAL_NOT_FOUND."""

    plugin_api = PLUGIN_API_VERSION
    capabilities = frozenset({"revoke"})

    def resolve(self, binding: Any, context: Any) -> ResolvedCredential:
        value = os.environ.get(binding.ref)
        if not value:
            raise SchedulerError("CREDENTIAL_NOT_FOUND", f"credential {binding.name!r}: variable not set")
        if os.environ.get("BROKEN_MODE", "").startswith("slow-"):
            time.sleep(1.0)
            raise SchedulerError("CREDENTIAL_SOURCE_TIMEOUT", "the source did not answer within 1 s")
        expires = int(time.time() * 1000) - 1000 if os.environ.get("BROKEN_MODE", "").startswith("expired-") else None
        return ResolvedCredential.for_binding(binding, value, expires_at_ms=expires)

    def revoke(self, credential: Any, binding: Any, context: Any) -> RevokeResult:
        return RevokeResult(revoked=False, code="unsupported", reason="CREDENTIAL_REVOKE_UNSUPPORTED: a variable")


class Mismatching(HonestEnv):
    """Answers without saying for which binding (no for_binding)."""

    def resolve(self, binding: Any, context: Any) -> ResolvedCredential:
        answer = super().resolve(binding, context)
        return ResolvedCredential(value=answer.value)


class Leaky(HonestEnv):
    """Puts the value into metadata, a log record and the session bookkeeping key."""

    def resolve(self, binding: Any, context: Any) -> ResolvedCredential:
        answer = super().resolve(binding, context)
        logging.getLogger("leaky").debug("resolved %s", answer.value)
        return ResolvedCredential.for_binding(binding, answer.value, metadata={"debug": answer.value})


class Crashing(HonestEnv):
    """A missing value escapes as KeyError instead of a coded refusal."""

    def resolve(self, binding: Any, context: Any) -> ResolvedCredential:
        return ResolvedCredential.for_binding(binding, os.environ[binding.ref] if os.environ.get(binding.ref) else
                                              {}[binding.ref])


class Hanging(HonestEnv):
    """Never gives up on a slow source."""

    def resolve(self, binding: Any, context: Any) -> ResolvedCredential:
        if os.environ.get("BROKEN_MODE", "").startswith("slow-"):
            time.sleep(30)
        return super().resolve(binding, context)


class Boasting(HonestEnv):
    """Claims every revocation succeeded, though the source confirmed none."""

    def revoke(self, credential: Any, binding: Any, context: Any) -> RevokeResult:
        return RevokeResult(revoked=True, code="revoked")


def _run(provider: Any, cases: list[str] | str) -> Any:
    return run_kind("credential", "broken", provider, filter=cases, service_adapter=EnvLikeSource())


def test_an_honest_in_process_provider_passes_what_its_source_can_give() -> None:
    report = _run(HonestEnv(), ["credential.resolve-*", "credential.missing-value", "credential.expired-*",
                                "credential.slow-*"])
    assert report.failed == 0 and report.passed == 6, [(r.id, r.message) for r in report.results]


@pytest.mark.parametrize(("provider", "case", "fragment"), [
    (Mismatching(), "credential.resolve-env-binding", "CREDENTIAL_BINDING_MISMATCH"),
    (Leaky(), "credential.resolve-env-binding", "appears in the resolve answer's metadata"),
    (Leaky(), "credential.resolve-env-binding", "appears in a log record"),
    (Crashing(), "credential.missing-value", "resolve raised KeyError"),
    (Boasting(), "credential.revoke-confirmed", "the source never confirmed a revocation"),
])
def test_a_broken_provider_is_reported_failing(provider: Any, case: str, fragment: str) -> None:
    report = _run(provider, case)
    (result,) = report.results
    assert result.outcome == "failed" and fragment in result.message, result.message
    assert not report.ok and report.to_json()["code"] == "CONFORMANCE_FAILED"
    assert "bk-" not in json.dumps(report.to_json())  # the report itself never quotes the value


def test_a_provider_that_hangs_is_cut_by_the_kernels_bound_and_fails() -> None:
    begin = time.monotonic()
    report = _run(Hanging(), "credential.slow-source-times-out")
    (result,) = report.results
    assert result.outcome == "failed" and "the kernel's bound ended it" in result.message
    assert time.monotonic() - begin < 15


def test_a_provider_without_a_source_adapter_is_one_failure() -> None:
    report = run_kind("credential", "broken", HonestEnv())
    assert report.error is not None and report.error["code"] == "CONFORMANCE_NO_SOURCE_ADAPTER" and report.failed == 1


def test_the_cli_and_the_ci_runner(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != FIXTURES_ENV}
    proc = subprocess.run([sys.executable, "-m", "scheduler", "conformance", "run", "credential", "oauth2", "--json"],
                          capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
    if proc.returncode != 0 and "No module named scheduler.__main__" in proc.stderr:
        proc = subprocess.run([str(Path(sys.executable).parent / "scheduler"), "conformance", "run", "credential", "oauth2",
                               "--json"], capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    document = json.loads(proc.stdout.strip().splitlines()[-1])
    assert document["ok"] is True and document["passed"] == 15 and document["failed"] == 0
    env[ci.PROVIDERS_ENV] = "credential:env,credential:file,credential:command"
    proc = subprocess.run([sys.executable, "-m", "scheduler.conformance.ci"], capture_output=True, text=True, env=env,
                          timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "21 passed, 0 failed, 24 skipped"
