"""Authorization proofs (docs/proofs.md): declarations, the kernel's policy around a verifier, the replay ledger, revocations.

Verification tests call ``scheduler.pipeline.proofs.verify`` with keys generated in the test: the
kernel loads the ``proof_verifier`` plugin the declaration names (``scheduler-provider-proofs``,
``scheduler-provider-ssh``) and judges its answer, the window and the artifact. Each format's own
checks are tested with its distribution (``providers/*/tests``) and by the conformance cases. The
pipeline tests run a real dispatcher on SQLite and PostgreSQL with a shell job whose marker file
proves whether the payload started, for every first-party method.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from kernel_testing import add_job, run_rows, wait_for
from test_proofs_support import (
    AUDIENCE,
    ISSUER,
    certificate_proof,
    ed25519_proof,
    jwt_declaration,
    make_ca,
    make_leaf,
    mint_jwt,
    pem,
    rsa_key,
    ssh_fingerprint,
    ssh_keypair,
    ssh_proof,
    write_public_pem,
)

from scheduler import PLUGIN_API_VERSION
from scheduler.base.errors import SchedulerError
from scheduler.core.artifact import native_digest
from scheduler.core.queue import enqueue_manual
from scheduler.core.spec import validate_spec
from scheduler.pipeline.proofs.source import read_source
from scheduler.pipeline.proofs.verify import verifier, verify, verify_with
from scheduler.plugins.protocols import ProofRequest, VerifiedProof
from scheduler.plugins.stores import open_store

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")
DIGEST = "sha256:" + "ab" * 32


def decl(**kw: Any) -> dict[str, Any]:
    spec = validate_spec({"name": "p", "schedule_kind": "manual", "payload_message": "true", "authorization_proof": kw},
                         plugin_options=False)
    return spec.authorization_proof


def code_of(declaration: dict[str, Any], proof: str, digest: str = DIGEST, **kw: Any) -> str:
    with pytest.raises(SchedulerError) as err:
        verify(declaration, proof, artifact_digest=digest, **kw)
    return err.value.code


# --------------------------------------------------------------------------- declarations


def problems(value: Any) -> list[tuple[str, str]]:
    with pytest.raises(SchedulerError) as err:
        validate_spec({"name": "p", "schedule_kind": "manual", "payload_message": "true", "authorization_proof": value},
                      plugin_options=False)
    assert err.value.code == "VALIDATION_FAILED"
    return [(d["field"], d["code"]) for d in err.value.details]


def test_a_declaration_is_normalised_with_its_defaults(tmp_path: Path) -> None:
    got = decl(method="jwt", source={"env": "PROOF"}, issuer=ISSUER, audience=AUDIENCE, public_key_file="/etc/k.pem")
    assert got == {"method": "jwt", "source": {"env": "PROOF"}, "issuer": ISSUER, "audience": AUDIENCE,
                   "algorithms": ["ES256", "RS256"], "public_key_file": "/etc/k.pem", "clock_skew_s": 30}


@pytest.mark.parametrize(("value", "field"), [
    ({"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a", "public_key_file": "/k", "value": "eyJ"},
     "authorization_proof.value"),
    ({"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a", "public_key_file": "/k", "token": "eyJ"},
     "authorization_proof.token"),
    ({"method": "jwt", "source": {"inline": "eyJ"}, "issuer": "i", "audience": "a", "public_key_file": "/k"},
     "authorization_proof.source"),
    ({"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a", "public_key_file": "/k", "colour": 1},
     "authorization_proof.colour"),
    ({"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a"}, "authorization_proof"),
    ({"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a", "public_key_file": "/k", "algorithms": ["HS256"]},
     "authorization_proof.algorithms"),
    ({"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a", "jwks_url": "http://idp.example/jwks"},
     "authorization_proof.jwks_url"),
    ({"method": "jwt", "source": {"file": "relative/p"}, "issuer": "i", "audience": "a", "public_key_file": "/k"},
     "authorization_proof.source.file"),
    ({"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a", "public_key_file": "/k", "clock_skew_s": 3600},
     "authorization_proof.clock_skew_s"),
    ({"method": "none", "source": {"env": "P"}}, "authorization_proof.method"),
    ({"method": "detached-signature", "source": {"env": "P"}, "format": "ssh", "allowed_signers_file": "/s"},
     "authorization_proof.principal"),
    ({"method": "certificate", "source": {"env": "P"}}, "authorization_proof.ca_file"),
])
def test_a_bad_declaration_is_refused_with_a_stable_code(value: dict[str, Any], field: str) -> None:
    assert (field, "PROOF_DECLARATION_INVALID") in problems(value)


def test_a_bad_declaration_stores_nothing(store: Any) -> None:
    with pytest.raises(SchedulerError):
        add_job(store, name="bad", payload_message="ok", authorization_proof={"method": "jwt", "source": {"env": "P"}, "value": "x"})
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM jobs") == 0


def test_the_declaration_is_part_of_the_artifact_and_jobs_without_one_keep_their_digest() -> None:
    plain = validate_spec({"name": "p", "schedule_kind": "manual", "payload_message": "true"}, plugin_options=False)
    with_proof = validate_spec({"name": "p", "schedule_kind": "manual", "payload_message": "true", "authorization_proof": {
        "method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a", "public_key_file": "/k"}}, plugin_options=False)
    assert native_digest(plain, "j1") != native_digest(with_proof, "j1")
    from scheduler.core.artifact import native_payload

    assert native_payload(plain, "j1")["authorization_proof"] is None
    assert native_payload(with_proof, "j1")["authorization_proof"]["source"] == {"env": "P"}


# --------------------------------------------------------------------------- sources


def test_the_source_is_read_afresh_and_missing_is_refused(tmp_path: Path) -> None:
    d = {"source": {"file": str(tmp_path / "p")}}
    with pytest.raises(SchedulerError) as err:
        read_source(d)
    assert err.value.code == "PROOF_MISSING"
    (tmp_path / "p").write_text("one\n")
    assert read_source(d) == "one"
    (tmp_path / "p").write_text("two")
    assert read_source(d) == "two"
    with pytest.raises(SchedulerError) as err:
        read_source({"source": {"env": "PROOF_T"}}, env={"PROOF_T": "  "})
    assert err.value.code == "PROOF_MISSING"


# --------------------------------------------------------------------------- the kernel's policy around a verifier


@pytest.fixture
def rsa_decl(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    key = rsa_key()
    return key, decl(**jwt_declaration({"env": "P"}, public_key_file=str(write_public_pem(key, tmp_path / "rsa.pem"))))


def test_the_declared_verifier_verifies_through_its_entry_point(rsa_decl: Any) -> None:
    """``jwt`` is the scheduler-provider-proofs verifier, loaded by name; the kernel records the declared skew."""
    key, d = rsa_decl
    got = verify(d, mint_jwt(key, DIGEST, jti="rsa-1", kid="idp-2026"), artifact_digest=DIGEST)
    assert (got.method, got.proof_id, got.key_id, got.skew_ms) == ("jwt", "rsa-1", "idp-2026", 30_000)
    assert got.expires_at_ms - got.not_before_ms == 300_000
    assert type(verifier("jwt")).__module__.startswith("scheduler_provider_proofs")
    assert type(verifier("detached-signature-ssh")).__module__.startswith("scheduler_provider_ssh")


def test_the_window_and_the_artifact_are_the_kernels(rsa_decl: Any) -> None:
    """The verifier reports the window and the artifact; the kernel judges them (the codes are unchanged)."""
    key, d = rsa_decl
    assert code_of(d, mint_jwt(key, DIGEST, exp_in=-120)) == "PROOF_EXPIRED"
    assert code_of(d, mint_jwt(key, DIGEST, nbf_in=120)) == "PROOF_NOT_YET_VALID"
    assert code_of(d, mint_jwt(key, "sha256:" + "cd" * 32)) == "PROOF_ARTIFACT_MISMATCH"
    assert code_of(d, mint_jwt(key, DIGEST), digest=None) == "PROOF_ARTIFACT_MISMATCH"  # a job without an artifact
    assert code_of(d, mint_jwt(rsa_key(), DIGEST)) == "PROOF_INVALID_SIGNATURE"  # and the verifier's own codes pass through


def test_the_clock_skew_is_honoured_and_explicit(tmp_path: Path, rsa_decl: Any) -> None:
    key, d = rsa_decl
    late = mint_jwt(key, DIGEST, exp_in=-10, nbf_in=-100)
    assert verify(d, late, artifact_digest=DIGEST).skew_ms == 30_000  # 10 s late, inside the 30 s skew
    strict = {**d, "clock_skew_s": 5}
    assert code_of(strict, late) == "PROOF_EXPIRED"
    early = mint_jwt(key, DIGEST, nbf_in=20)
    assert verify(d, early, artifact_digest=DIGEST).not_before_ms > int(time.time() * 1000)
    assert code_of(strict, early) == "PROOF_NOT_YET_VALID"


class _Answers:
    """A verifier answering what the test gives it (a value, or an exception to raise): the kernel's side of the contract."""

    plugin_api = PLUGIN_API_VERSION
    capabilities: frozenset[str] = frozenset()

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.requests: list[ProofRequest] = []

    def verify_proof(self, request: ProofRequest) -> Any:
        self.requests.append(request)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def _answer(**fields: Any) -> VerifiedProof:
    now = int(time.time() * 1000)
    return VerifiedProof(**{"method": "jwt", "proof_id": "p-1", "key_id": "k-1", "artifact_digest": DIGEST,
                            "not_before_ms": now - 1000, "expires_at_ms": now + 3_600_000, **fields})


@pytest.mark.parametrize(("answer", "code"), [
    (_answer(), None),
    ({"proof_id": "p-1"}, "PROOF_VERIFICATION_FAILED"),                         # not a VerifiedProof
    (_answer(method="certificate"), "PROOF_VERIFICATION_FAILED"),                # another method than declared
    (_answer(key_id=""), "PROOF_VERIFICATION_FAILED"),                           # nothing to revoke by
    (_answer(expires_at_ms="soon"), "PROOF_VERIFICATION_FAILED"),                # not epoch milliseconds
    (_answer(proof_id="has spaces"), "PROOF_MALFORMED"),                          # not a ledger id
    (_answer(skew_ms=10**9, expires_at_ms=1000), "PROOF_EXPIRED"),               # the skew is the declaration's, not the answer's
    (RuntimeError("verifier bug"), "PROOF_VERIFICATION_FAILED"),
    (SchedulerError("JWT_LIBRARY_BROKE", "something"), "PROOF_VERIFICATION_FAILED"),  # only PROOF_* codes pass through
    (SchedulerError("PROOF_KEY_UNAVAILABLE", "no key"), "PROOF_KEY_UNAVAILABLE"),
], ids=["valid", "wrong-type", "wrong-method", "empty-key-id", "bad-window", "bad-proof-id", "own-skew", "raises",
        "foreign-code", "proof-code"])
def test_a_verifiers_answer_is_checked_and_every_failure_denies(rsa_decl: Any, answer: Any, code: str | None) -> None:
    _key, d = rsa_decl
    provider = _Answers(answer)
    if code is None:
        got = verify_with(provider, d, "the-proof-text", artifact_digest=DIGEST, now_ms=int(time.time() * 1000))
        assert got.skew_ms == 30_000 and got.proof_id == "p-1"
    else:
        with pytest.raises(SchedulerError) as err:
            verify_with(provider, d, "the-proof-text", artifact_digest=DIGEST, now_ms=int(time.time() * 1000))
        assert err.value.code == code
    (request,) = provider.requests
    assert (request.declaration, request.proof, request.artifact_digest) == (d, "the-proof-text", DIGEST)
    assert "the-proof-text" not in repr(request)


def test_a_verifier_that_does_not_answer_in_time_denies(rsa_decl: Any) -> None:
    import threading

    _key, d = rsa_decl
    release = threading.Event()

    class Hangs(_Answers):
        def verify_proof(self, request: ProofRequest) -> Any:
            release.wait(10)
            return _answer()

    started = time.monotonic()
    try:
        with pytest.raises(SchedulerError) as err:
            verify_with(Hangs(None), d, "x", artifact_digest=DIGEST, now_ms=int(time.time() * 1000), limit_s=0.3)
    finally:
        release.set()
    assert err.value.code == "PROOF_VERIFICATION_FAILED" and "did not answer" in err.value.message
    assert time.monotonic() - started < 3


# --------------------------------------------------------------------------- through a real dispatcher

# --------------------------------------------------------------------------- through a real dispatcher


def finished(store: Any, job_id: str, count: int = 1, timeout: float = 20) -> list[dict[str, Any]]:
    return wait_for(lambda: (rows := [r for r in run_rows(store, job_id) if r["status"] in TERMINAL])
                    and len(rows) >= count and rows, timeout=timeout, what=f"{count} finished run(s)")


def events(store: Any, **where: Any) -> list[dict[str, Any]]:
    (col, val), = where.items()
    with store.read() as tx:
        return tx.all(f"SELECT kind, data FROM runtime_events WHERE {col} = ? ORDER BY id", (val,))


def proof_job(store: Any, tmp_path: Path, key: Any, **spec: Any) -> tuple[dict[str, Any], Path, Path]:
    pub = write_public_pem(key, tmp_path / f"pub-{time.monotonic_ns()}.pem")
    source = tmp_path / f"proof-{time.monotonic_ns()}.jwt"
    marker = tmp_path / f"ran-{time.monotonic_ns()}"
    job = add_job(store, executor="shell", payload_message=f"echo ran >> {marker}",
                  authorization_proof=jwt_declaration({"file": str(source)}, public_key_file=str(pub)), **spec)
    return job, source, marker


def test_a_verified_proof_is_claimed_and_recorded(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    key = rsa_key()
    job, source, marker = proof_job(store, tmp_path, key)
    token = mint_jwt(key, job["artifact_digest"], jti="good-1")
    source.write_text(token)
    dispatcher()
    enqueue_manual(store, job["id"])
    (run,) = finished(store, job["id"])
    assert run["status"] == "ok" and marker.read_text() == "ran\n"
    record = json.loads(run["proof_json"])
    assert {k: record[k] for k in ("status", "method", "proof_id", "clock_skew_ms", "claim")} == {
        "status": "verified", "method": "jwt", "proof_id": "good-1", "clock_skew_ms": 30_000, "claim": "claimed"}
    assert record["expires_at"] > record["not_before"] and record["key_id"].startswith("sha256:")
    assert token not in run["proof_json"] and token.split(".")[2] not in json.dumps(events(store, run_id=run["id"]))
    with store.read() as tx:
        claim = tx.one("SELECT * FROM authorization_proof_replay WHERE proof_id = 'good-1'")
    assert (claim["run_id"], claim["dispatch_id"], claim["job_id"]) == (run["id"], run["dispatch_id"], job["id"])
    assert "proof.verified" in [e["kind"] for e in events(store, run_id=run["id"])]


def test_every_first_party_method_runs_through_the_dispatcher(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    """A detached Ed25519 signature, an ssh-keygen signature and a certificate proof: each verified by its plugin, claimed, run."""
    from cryptography.hazmat.primitives import serialization

    ed_key = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "ed.pub").write_bytes(ed_key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                       serialization.PublicFormat.OpenSSH))
    ssh_key, signers = ssh_keypair(tmp_path)
    ca_key, ca = make_ca()
    (tmp_path / "ca.pem").write_text(pem(ca))
    leaf_key, leaf = make_leaf(ca_key, ca)
    methods = {
        "ed25519": ({"method": "detached-signature", "format": "ed25519", "public_key_file": str(tmp_path / "ed.pub")},
                    lambda digest: ed25519_proof(ed_key, digest, proof_id="e2e-ed25519")),
        "ssh": ({"method": "detached-signature", "format": "ssh", "allowed_signers_file": str(signers),
                 "principal": "release@example.test"}, lambda digest: ssh_proof(ssh_key, digest, proof_id="e2e-ssh")),
        "certificate": ({"method": "certificate", "ca_file": str(tmp_path / "ca.pem"), "san": "deployer.example.test"},
                        lambda digest: certificate_proof(leaf_key, leaf, digest, proof_id="e2e-certificate")),
    }
    jobs = {}
    for label, (declaration, mint) in methods.items():
        source, marker = tmp_path / f"{label}.proof", tmp_path / f"{label}.ran"
        job = add_job(store, name=f"e2e-{label}", executor="shell", payload_message=f"echo ran >> {marker}",
                      authorization_proof={**declaration, "source": {"file": str(source)}})
        source.write_text(mint(job["artifact_digest"]))
        jobs[label] = (job, marker)
    dispatcher()
    for job, _marker in jobs.values():
        enqueue_manual(store, job["id"])
    for label, (job, marker) in jobs.items():
        (run,) = finished(store, job["id"])
        assert (run["status"], marker.read_text()) == ("ok", "ran\n"), (label, run["error_code"], run["error_message"])
        record = json.loads(run["proof_json"])
        assert (record["status"], record["proof_id"], record["claim"]) == ("verified", f"e2e-{label}", "claimed")
    assert json.loads(run_rows(store, jobs["ssh"][0]["id"])[0]["proof_json"])["key_id"] == ssh_fingerprint(ssh_key)


@pytest.mark.parametrize(("mint", "code"), [
    (lambda key, digest: mint_jwt(key, digest, exp_in=-120), "PROOF_EXPIRED"),
    (lambda key, digest: mint_jwt(key, digest, nbf_in=300), "PROOF_NOT_YET_VALID"),
    (lambda key, digest: mint_jwt(key, digest, aud="other"), "PROOF_AUDIENCE_MISMATCH"),
    (lambda key, digest: mint_jwt(key, digest, iss="https://other"), "PROOF_ISSUER_MISMATCH"),
    (lambda key, digest: mint_jwt(rsa_key(), digest), "PROOF_INVALID_SIGNATURE"),
    (lambda key, digest: mint_jwt(key, "sha256:" + "ef" * 32), "PROOF_ARTIFACT_MISMATCH"),
    (lambda key, digest: "", "PROOF_MISSING"),
])
def test_a_bad_proof_ends_the_run_before_the_payload(store: Any, dispatcher: Any, tmp_path: Path, mint: Any, code: str) -> None:
    key = rsa_key()
    job, source, marker = proof_job(store, tmp_path, key)
    source.write_text(mint(key, job["artifact_digest"]))
    dispatcher()
    enqueue_manual(store, job["id"])
    (run,) = finished(store, job["id"])
    assert (run["status"], run["error_code"]) == ("error", code)
    assert not marker.exists()
    assert json.loads(run["proof_json"])["status"] == "denied"
    assert "proof.failed" in [e["kind"] for e in events(store, run_id=run["id"])]
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM authorization_proof_replay") == 0  # nothing claimed by a failed proof
        assert tx.scalar("SELECT enabled FROM jobs WHERE id = ?", (job["id"],)) == 1


def test_revocation_by_proof_id_and_by_key_id(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    from scheduler.pipeline.proofs.step import revoke

    key = rsa_key()
    job, source, marker = proof_job(store, tmp_path, key)
    revoke(store, proof_id="leaked-1", key_id=None, reason="leaked in a log", revoked_by="test")
    source.write_text(mint_jwt(key, job["artifact_digest"], jti="leaked-1"))
    dispatcher()
    enqueue_manual(store, job["id"])
    (run,) = finished(store, job["id"])
    assert (run["status"], run["error_code"]) == ("error", "PROOF_REVOKED") and "leaked in a log" in run["error_message"]
    source.write_text(mint_jwt(key, job["artifact_digest"], jti="fresh-2", kid="idp-key-7"))
    revoke(store, proof_id=None, key_id="idp-key-7", reason="key rotated", revoked_by="test")
    enqueue_manual(store, job["id"])
    runs = finished(store, job["id"], 2)
    assert (runs[1]["status"], runs[1]["error_code"]) == ("error", "PROOF_REVOKED") and "key idp-key-7" in runs[1]["error_message"]
    assert not marker.exists()
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM authorization_proof_replay") == 0
    with pytest.raises(SchedulerError), store.transaction() as tx:  # append-only
        tx.execute("DELETE FROM proof_revocations")


def test_a_replayed_proof_is_denied_and_quarantines_the_job(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    key = rsa_key()
    job, source, marker = proof_job(store, tmp_path, key)
    source.write_text(mint_jwt(key, job["artifact_digest"], jti="once"))
    dispatcher()
    enqueue_manual(store, job["id"])
    finished(store, job["id"])
    enqueue_manual(store, job["id"])  # the same file again: a second dispatch presents the same proof id
    runs = finished(store, job["id"], 2)
    assert [r["status"] for r in runs] == ["ok", "error"] and runs[1]["error_code"] == "PROOF_REPLAYED"
    assert marker.read_text() == "ran\n"  # the payload ran once
    with store.read() as tx:
        row = tx.one("SELECT enabled, paused_reason FROM jobs WHERE id = ?", (job["id"],))
        claims = tx.all("SELECT run_id FROM authorization_proof_replay")
    assert row["enabled"] == 0 and "PROOF_REPLAYED" in row["paused_reason"] and "once" in row["paused_reason"]
    assert claims == [{"run_id": runs[0]["id"]}]  # the claim stays with the first dispatch
    kinds = [e["kind"] for e in events(store, job_id=job["id"])]
    assert "job.quarantined" in kinds


def test_a_retry_of_the_claiming_dispatch_reuses_the_claim(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    key = rsa_key()
    pub = write_public_pem(key, tmp_path / "pub.pem")
    source = tmp_path / "proof.jwt"
    job = add_job(store, executor="shell", payload_message="exit 3", max_retries=1, retry_backoff_ms=0,
                  authorization_proof=jwt_declaration({"file": str(source)}, public_key_file=str(pub)))
    source.write_text(mint_jwt(key, job["artifact_digest"], jti="retry-me"))
    dispatcher()
    enqueue_manual(store, job["id"])
    runs = finished(store, job["id"], 2)
    assert [r["error_code"] for r in runs] == ["EXIT_NONZERO", "EXIT_NONZERO"]  # both ran: the retry reused the claim
    assert runs[1]["retry_of_run_id"] == runs[0]["id"]
    assert json.loads(runs[1]["proof_json"])["claim"] == "reused"
    with store.read() as tx:
        assert tx.scalar("SELECT enabled FROM jobs WHERE id = ?", (job["id"],)) == 1


def test_a_job_without_a_proof_touches_no_proof_table(store: Any) -> None:
    from scheduler.core.outcomes import RunOutcomes
    from scheduler.pipeline.proofs import step as proofs

    class NoStore:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the proof step touched the store ({name})")

    spec = validate_spec({"name": "p", "schedule_kind": "manual", "payload_message": "true"}, plugin_options=False)
    outcomes = RunOutcomes()
    proofs.verify(NoStore(), object(), spec, outcomes)
    assert outcomes.columns == {} and outcomes.events == []


def test_after_an_approval_wait_the_recorded_window_and_revocations_are_rechecked(store: Any, dispatcher: Any,
                                                                                    tmp_path: Path) -> None:
    """A run resuming with a verified proof (its proof_json) is re-checked from the record: no source read, no new claim."""
    from test_proofs_race import Started

    from scheduler.core.outcomes import RunOutcomes
    from scheduler.core.spec import spec_from_row
    from scheduler.pipeline.proofs import step as proofs

    key = rsa_key()
    job, source, _marker = proof_job(store, tmp_path, key)
    source.write_text(mint_jwt(key, job["artifact_digest"], jti="gated", kid="gate-key"))
    dispatcher()
    enqueue_manual(store, job["id"])
    (run,) = finished(store, job["id"])
    source.unlink()  # the resumed run must not need its source again
    spec = spec_from_row(job)
    resumed = Started(run_id=run["id"], dispatch_id=run["dispatch_id"], job=job)
    outcomes = RunOutcomes()
    proofs.verify(store, resumed, spec, outcomes)
    record = json.loads(outcomes.columns["proof_json"])
    assert record["claim"] == "rechecked-after-approval" and record["proof_id"] == "gated"
    assert proofs.approval_columns(outcomes) == {"proof_not_before": record["not_before"],
                                                 "proof_expires_at": record["expires_at"], "proof_clock_skew_ms": 30_000}
    with pytest.raises(SchedulerError) as err:  # the claim belongs to another dispatch
        proofs.verify(store, Started(run_id=run["id"], dispatch_id="other:manual:x", job=job), spec, RunOutcomes())
    assert err.value.code == "PROOF_REPLAYED"
    proofs.revoke(store, proof_id=None, key_id="gate-key", reason="rotated while waiting", revoked_by="test")
    with pytest.raises(SchedulerError) as err:
        proofs.verify(store, resumed, spec, RunOutcomes())
    assert err.value.code == "PROOF_REVOKED"
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM authorization_proof_replay") == 1


def test_the_proofs_cli_and_the_validate_warning(tmp_path: Path) -> None:
    import subprocess

    from kernel_testing import scheduler_cmd

    db = str(tmp_path / "cli.db")
    open_store(db).close()  # proofs commands never create a database (issue 30): it exists first

    def cli(*args: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run([*scheduler_cmd(), "--db", db, *args, "--json"], capture_output=True, text=True)
        return done.returncode, json.loads(done.stdout)

    rc, out = cli("proofs", "revoke", "--proof-id", "p-1", "--reason", "leaked")
    assert rc == 0 and out["revocation"]["proof_id"] == "p-1" and out["revocation"]["reason"] == "leaked"
    rc, out = cli("proofs", "revoke", "--proof-id", "p-1", "--key-id", "k")
    assert rc != 0 and out["code"] == "INVALID_ARGUMENT"
    rc, out = cli("proofs", "revoke")
    assert rc != 0 and out["code"] == "INVALID_ARGUMENT"
    rc, out = cli("proofs", "list")
    assert rc == 0 and [r["proof_id"] for r in out["revocations"]] == ["p-1"] and out["claims"] == []
    proof = {"method": "jwt", "source": {"env": "P"}, "issuer": "i", "audience": "a", "public_key_file": "/k.pem"}
    rc, out = cli("jobs", "validate", json.dumps({"name": "r", "schedule_kind": "every", "schedule_every": "1h",
                                                  "payload_message": "true", "authorization_proof": proof}))
    assert rc == 0 and out["warnings"][0]["field"] == "authorization_proof.source" and "PROOF_REPLAYED" in out["warnings"][0]["warning"]
    rc, out = cli("jobs", "validate", json.dumps({"name": "m", "schedule_kind": "manual", "payload_message": "true",
                                                  "authorization_proof": proof}))
    assert rc == 0 and "warnings" not in out
