"""Authorization proofs (docs/proofs.md): declarations, every method with real keys, the replay ledger, revocations.

Verification tests call ``scheduler.pipeline.proofs.verify`` with keys generated in the test; the pipeline
tests run a real dispatcher on SQLite and PostgreSQL with a shell job whose marker file proves
whether the payload started.
"""

from __future__ import annotations

import base64
import datetime
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
    ec_key,
    ed25519_proof,
    jwks,
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

from scheduler.base.errors import SchedulerError
from scheduler.core.artifact import native_digest
from scheduler.pipeline.proofs.verify import read_source, verify
from scheduler.core.queue import enqueue_manual
from scheduler.core.spec import validate_spec

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


# --------------------------------------------------------------------------- jwt


@pytest.fixture
def rsa_decl(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    key = rsa_key()
    return key, decl(**jwt_declaration({"env": "P"}, public_key_file=str(write_public_pem(key, tmp_path / "rsa.pem"))))


def test_rsa_and_ec_jwts_verify_and_record_their_window(tmp_path: Path, rsa_decl: Any) -> None:
    key, d = rsa_decl
    got = verify(d, mint_jwt(key, DIGEST, jti="rsa-1", kid="idp-2026"), artifact_digest=DIGEST)
    assert (got.method, got.proof_id, got.key_id, got.skew_ms) == ("jwt", "rsa-1", "idp-2026", 30_000)
    assert got.expires_at_ms - got.not_before_ms == 300_000
    ec = ec_key()
    d2 = decl(**jwt_declaration({"env": "P"}, public_key_file=str(write_public_pem(ec, tmp_path / "ec.pem"))))
    got = verify(d2, mint_jwt(ec, DIGEST, alg="ES256", jti="ec-1"), artifact_digest=DIGEST)
    assert got.proof_id == "ec-1" and got.key_id.startswith("sha256:")  # no kid: the SPKI digest


def test_jwt_failures_have_their_codes(rsa_decl: Any) -> None:
    key, d = rsa_decl
    assert code_of(d, mint_jwt(key, DIGEST, exp_in=-120)) == "PROOF_EXPIRED"
    assert code_of(d, mint_jwt(key, DIGEST, nbf_in=120)) == "PROOF_NOT_YET_VALID"
    assert code_of(d, mint_jwt(key, DIGEST, aud="someone-else")) == "PROOF_AUDIENCE_MISMATCH"
    assert code_of(d, mint_jwt(key, DIGEST, iss="https://evil.test")) == "PROOF_ISSUER_MISMATCH"
    assert code_of(d, mint_jwt(rsa_key(), DIGEST)) == "PROOF_INVALID_SIGNATURE"
    assert code_of(d, mint_jwt(key, "sha256:" + "cd" * 32)) == "PROOF_ARTIFACT_MISMATCH"
    assert code_of(d, mint_jwt(ec_key(), DIGEST, alg="ES256")) == "PROOF_INVALID_SIGNATURE"  # wrong key type
    assert code_of(d, "not-a-jwt") == "PROOF_MALFORMED"
    import jwt

    unbound = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60, "jti": "x"}, key, algorithm="RS256")
    assert code_of(d, unbound) == "PROOF_MALFORMED"
    hs = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60, "jti": "x", "artifact_digest": DIGEST},
                    "secret" * 6, algorithm="HS256")
    assert code_of(d, hs) == "PROOF_INVALID_SIGNATURE"  # a symmetric algorithm is never accepted


def test_the_clock_skew_is_honoured_and_explicit(tmp_path: Path, rsa_decl: Any) -> None:
    key, d = rsa_decl
    late = mint_jwt(key, DIGEST, exp_in=-10, nbf_in=-100)
    assert verify(d, late, artifact_digest=DIGEST).skew_ms == 30_000  # 10 s late, inside the 30 s skew
    strict = {**d, "clock_skew_s": 5}
    assert code_of(strict, late) == "PROOF_EXPIRED"
    early = mint_jwt(key, DIGEST, nbf_in=20)
    assert verify(d, early, artifact_digest=DIGEST).not_before_ms > int(time.time() * 1000)
    assert code_of(strict, early) == "PROOF_NOT_YET_VALID"


def test_jwks_file_and_jwks_over_loopback_http(tmp_path: Path) -> None:
    from scheduler.testing.http import LoopbackHTTPServer

    a, b = rsa_key(), ec_key()
    (tmp_path / "jwks.json").write_text(json.dumps(jwks(("a", a), ("b", b))))
    d = decl(**jwt_declaration({"env": "P"}, jwks_file=str(tmp_path / "jwks.json")))
    assert verify(d, mint_jwt(b, DIGEST, alg="ES256", kid="b"), artifact_digest=DIGEST).key_id == "b"
    assert code_of(d, mint_jwt(a, DIGEST, kid="zzz")) == "PROOF_KEY_UNAVAILABLE"
    assert code_of(d, mint_jwt(a, DIGEST)) == "PROOF_MALFORMED"  # a JWKS needs the kid header
    body = json.dumps(jwks(("a", a))).encode()
    server = LoopbackHTTPServer()
    try:
        server.default("/jwks", LoopbackHTTPServer.Reply(body=body, headers={"content-type": "application/json"}))
        server.default("/missing", LoopbackHTTPServer.Reply(status=404, json={"error": "not found"}))
        d = decl(**jwt_declaration({"env": "P"}, jwks_url=f"{server.url}/jwks"))
        assert verify(d, mint_jwt(a, DIGEST, kid="a", jti="over-http"), artifact_digest=DIGEST).proof_id == "over-http"
        assert code_of(d, mint_jwt(rsa_key(), DIGEST, kid="a")) == "PROOF_INVALID_SIGNATURE"
        d404 = decl(**jwt_declaration({"env": "P"}, jwks_url=f"{server.url}/missing"))
        assert code_of(d404, mint_jwt(a, DIGEST, kid="a")) == "PROOF_KEY_UNAVAILABLE"
        assert len(server.to("/jwks")) == 2  # fetched afresh for every verification
    finally:
        server.close()


# --------------------------------------------------------------------------- detached signatures


def test_ssh_detached_signature_with_real_ssh_keygen(tmp_path: Path) -> None:
    key, signers = ssh_keypair(tmp_path)
    d = decl(method="detached-signature", source={"env": "P"}, format="ssh", allowed_signers_file=str(signers),
             principal="release@example.test")
    got = verify(d, ssh_proof(key, DIGEST, proof_id="ssh-1"), artifact_digest=DIGEST)
    assert (got.proof_id, got.key_id, got.subject) == ("ssh-1", ssh_fingerprint(key), "release@example.test")
    assert code_of(d, ssh_proof(key, DIGEST, namespace="other")) == "PROOF_INVALID_SIGNATURE"
    other, _ = ssh_keypair(tmp_path)
    assert code_of(d, ssh_proof(other, DIGEST)) == "PROOF_INVALID_SIGNATURE"
    assert code_of({**d, "principal": "someone@else"}, ssh_proof(key, DIGEST)) == "PROOF_INVALID_SIGNATURE"
    assert code_of(d, ssh_proof(key, DIGEST, exp_in=-100)) == "PROOF_EXPIRED"
    assert code_of(d, ssh_proof(key, "sha256:" + "00" * 32)) == "PROOF_ARTIFACT_MISMATCH"
    tampered = json.loads(ssh_proof(key, DIGEST))
    tampered["expires_at"] += 3600  # a longer window than was signed
    assert code_of(d, json.dumps(tampered)) == "PROOF_INVALID_SIGNATURE"


def test_ed25519_detached_signature_via_cryptography(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    key = ed25519.Ed25519PrivateKey.generate()
    pub = tmp_path / "ed.pub"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    d = decl(method="detached-signature", source={"env": "P"}, format="ed25519", public_key_file=str(pub))
    got = verify(d, ed25519_proof(key, DIGEST, proof_id="ed-1"), artifact_digest=DIGEST)
    import subprocess

    listed = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]
    assert got.proof_id == "ed-1" and got.key_id == listed  # the same fingerprint ssh-keygen shows
    assert code_of(d, ed25519_proof(ed25519.Ed25519PrivateKey.generate(), DIGEST)) == "PROOF_INVALID_SIGNATURE"
    assert code_of(d, ed25519_proof(key, DIGEST, nbf_in=600)) == "PROOF_NOT_YET_VALID"
    assert code_of(d, json.dumps({"proof_id": "x"})) == "PROOF_MALFORMED"


# --------------------------------------------------------------------------- certificates


def test_certificate_chain_to_the_configured_ca(tmp_path: Path) -> None:
    ca_key, ca = make_ca()
    (tmp_path / "ca.pem").write_text(pem(ca))
    leaf_key, leaf = make_leaf(ca_key, ca)
    d = decl(method="certificate", source={"env": "P"}, ca_file=str(tmp_path / "ca.pem"), san="deployer.example.test")
    got = verify(d, certificate_proof(leaf_key, leaf, DIGEST, proof_id="cert-1"), artifact_digest=DIGEST)
    assert got.proof_id == "cert-1" and got.subject == "CN=deployer" and got.key_id.startswith("sha256:")
    other_key, other_ca = make_ca()
    rogue_key, rogue = make_leaf(other_key, other_ca)
    assert code_of(d, certificate_proof(rogue_key, rogue, DIGEST)) == "PROOF_CERTIFICATE_INVALID"
    expired_key, expired = make_leaf(ca_key, ca, start=datetime.timedelta(days=-3), end=datetime.timedelta(days=-1))
    assert code_of(d, certificate_proof(expired_key, expired, DIGEST)) == "PROOF_CERTIFICATE_INVALID"
    assert code_of({**d, "san": "other.example.test"}, certificate_proof(leaf_key, leaf, DIGEST)) == "PROOF_CERTIFICATE_INVALID"
    assert code_of({**d, "subject": "CN=someone"}, certificate_proof(leaf_key, leaf, DIGEST)) == "PROOF_CERTIFICATE_INVALID"
    forged = json.loads(certificate_proof(leaf_key, leaf, DIGEST))
    forged["signature"] = base64.b64encode(ec_key().sign(b"x", __import__("cryptography.hazmat.primitives.asymmetric.ec",
                                                                            fromlist=["ECDSA"]).ECDSA(
        __import__("cryptography.hazmat.primitives.hashes", fromlist=["SHA256"]).SHA256()))).decode()
    assert code_of(d, json.dumps(forged)) == "PROOF_INVALID_SIGNATURE"
    # the verified window is narrowed to the certificate's validity
    short_key, short = make_leaf(ca_key, ca, end=datetime.timedelta(seconds=60))
    got = verify(d, certificate_proof(short_key, short, DIGEST, exp_in=3600), artifact_digest=DIGEST)
    assert got.expires_at_ms <= int(time.time() * 1000) + 61_000


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
    from scheduler.pipeline.proofs import step as proofs
    from scheduler.core.outcomes import RunOutcomes

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

    from scheduler.pipeline.proofs import step as proofs
    from scheduler.core.outcomes import RunOutcomes
    from scheduler.core.spec import spec_from_row

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
