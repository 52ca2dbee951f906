"""The ``jwt`` verifier: PEM keys, JWKS files and JWKS over loopback HTTP, every refusal's code, the reported window."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from proof_support import (
    AUDIENCE,
    DIGEST,
    ISSUER,
    code_of,
    ec_key,
    jwks,
    jwt_declaration,
    mint_jwt,
    request,
    rsa_key,
    write_public_pem,
)
from scheduler_provider_proofs import JwtVerifier

from scheduler.testing.http import LoopbackHTTPServer


@pytest.fixture
def rsa_decl(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    key = rsa_key()
    return key, jwt_declaration(public_key_file=str(write_public_pem(key, tmp_path / "rsa.pem")))


def test_it_loads_through_its_entry_point(load: Any) -> None:
    assert isinstance(load("jwt"), JwtVerifier)


def test_rsa_and_ec_jwts_verify_and_report_their_window(tmp_path: Path, rsa_decl: Any) -> None:
    key, d = rsa_decl
    before = int(time.time()) * 1000
    got = JwtVerifier().verify_proof(request(d, mint_jwt(key, jti="rsa-1", kid="idp-2026", exp_in=300, nbf_in=-5)))
    assert (got.method, got.proof_id, got.key_id, got.artifact_digest) == ("jwt", "rsa-1", "idp-2026", DIGEST)
    assert (got.issuer, got.subject, got.skew_ms) == (ISSUER, "ci", 0)  # the skew is the kernel's to apply
    assert got.expires_at_ms - got.not_before_ms == 305_000 and got.not_before_ms <= before
    ec = ec_key()
    d2 = jwt_declaration(public_key_file=str(write_public_pem(ec, tmp_path / "ec.pem")))
    got = JwtVerifier().verify_proof(request(d2, mint_jwt(ec, alg="ES256", jti="ec-1", nbf_in=None)))
    assert got.proof_id == "ec-1" and got.key_id.startswith("sha256:") and got.not_before_ms is None  # no kid: the SPKI digest


def test_the_window_and_the_artifact_are_reported_not_judged(rsa_decl: Any) -> None:
    """An expired JWT, or one for another artifact, still verifies here: the kernel judges both (with the declared skew)."""
    key, d = rsa_decl
    got = JwtVerifier().verify_proof(request(d, mint_jwt(key, "sha256:" + "cd" * 32, exp_in=-3600)))
    assert got.expires_at_ms < time.time() * 1000 and got.artifact_digest == "sha256:" + "cd" * 32


def test_jwt_failures_have_their_codes(rsa_decl: Any) -> None:
    key, d = rsa_decl
    verifier = JwtVerifier()
    assert code_of(verifier, d, mint_jwt(key, aud="someone-else")) == "PROOF_AUDIENCE_MISMATCH"
    assert code_of(verifier, d, mint_jwt(key, iss="https://evil.test")) == "PROOF_ISSUER_MISMATCH"
    assert code_of(verifier, d, mint_jwt(rsa_key())) == "PROOF_INVALID_SIGNATURE"
    assert code_of(verifier, d, mint_jwt(ec_key(), alg="ES256")) == "PROOF_INVALID_SIGNATURE"  # wrong key type
    assert code_of(verifier, {**d, "algorithms": ["ES256"]}, mint_jwt(key)) == "PROOF_INVALID_SIGNATURE"  # alg not declared
    assert code_of(verifier, d, "not-a-jwt") == "PROOF_MALFORMED"
    assert code_of(verifier, d, mint_jwt(key, None)) == "PROOF_MALFORMED"  # bound to no artifact
    assert code_of(verifier, d, mint_jwt(key, jti="has spaces")) == "PROOF_MALFORMED"
    unsigned_exp = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "jti": "x", "artifact_digest": DIGEST}, key, algorithm="RS256")
    assert code_of(verifier, d, unsigned_exp) == "PROOF_MALFORMED"  # exp is required
    hs = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60, "jti": "x", "artifact_digest": DIGEST},
                    "secret" * 6, algorithm="HS256")
    assert code_of(verifier, d, hs) == "PROOF_INVALID_SIGNATURE"  # a symmetric algorithm is never accepted
    assert code_of(verifier, {**d, "public_key_file": "/nonexistent/k.pem"}, mint_jwt(key)) == "PROOF_KEY_UNAVAILABLE"


def test_jwks_file(tmp_path: Path) -> None:
    a, b = rsa_key(), ec_key()
    (tmp_path / "jwks.json").write_text(json.dumps(jwks(("a", a), ("b", b))))
    d = jwt_declaration(jwks_file=str(tmp_path / "jwks.json"))
    assert JwtVerifier().verify_proof(request(d, mint_jwt(b, alg="ES256", kid="b"))).key_id == "b"
    assert code_of(JwtVerifier(), d, mint_jwt(a, kid="zzz")) == "PROOF_KEY_UNAVAILABLE"
    assert code_of(JwtVerifier(), d, mint_jwt(a)) == "PROOF_MALFORMED"  # a JWKS needs the kid header
    (tmp_path / "jwks.json").write_text("{not json")
    assert code_of(JwtVerifier(), d, mint_jwt(a, kid="a")) == "PROOF_KEY_UNAVAILABLE"


def test_jwks_over_loopback_http_fetched_afresh_without_redirects(load: Any) -> None:
    a = rsa_key()
    body = json.dumps(jwks(("a", a))).encode()
    server = LoopbackHTTPServer()
    try:
        server.default("/jwks", LoopbackHTTPServer.Reply(body=body, headers={"content-type": "application/json"}))
        server.default("/missing", LoopbackHTTPServer.Reply(status=404, json={"error": "not found"}))
        server.default("/moved", LoopbackHTTPServer.Reply(status=302, headers={"location": f"{server.url}/jwks"}))
        verifier = load("jwt")
        d = jwt_declaration(jwks_url=f"{server.url}/jwks")
        assert verifier.verify_proof(request(d, mint_jwt(a, kid="a", jti="over-http"))).proof_id == "over-http"
        assert code_of(verifier, d, mint_jwt(rsa_key(), kid="a")) == "PROOF_INVALID_SIGNATURE"
        assert len(server.to("/jwks")) == 2  # fetched afresh for every verification
        assert code_of(verifier, jwt_declaration(jwks_url=f"{server.url}/missing"), mint_jwt(a, kid="a")) == "PROOF_KEY_UNAVAILABLE"
        assert code_of(verifier, jwt_declaration(jwks_url=f"{server.url}/moved"), mint_jwt(a, kid="a")) == "PROOF_KEY_UNAVAILABLE"
        assert len(server.to("/moved")) == 1 and len(server.to("/jwks")) == 2  # the redirect was not followed
    finally:
        server.close()


def test_the_jwks_timeout_is_a_host_setting(load: Any) -> None:
    """``[providers.jwt] jwks_timeout_s``: a JWKS server that does not answer is PROOF_KEY_UNAVAILABLE within it."""
    server = LoopbackHTTPServer()
    try:
        server.default("/slow", LoopbackHTTPServer.Reply(action="hang", seconds=10))
        verifier = load("jwt", jwks_timeout_s=0.3)
        started = time.monotonic()
        assert code_of(verifier, jwt_declaration(jwks_url=f"{server.url}/slow"), mint_jwt(rsa_key(), kid="a")) == "PROOF_KEY_UNAVAILABLE"
        assert time.monotonic() - started < 3
    finally:
        server.close()
    with pytest.raises(Exception) as err:
        load("jwt", jwks_timeout_s="soon")
    assert getattr(err.value, "code", None) == "CONFIG_INVALID"
