"""A reference attestor speaking the provider's protocol: HMAC-SHA256 over the payload digest and the method.

Honest and minimal, for the conformance cases and for attestor authors to read: it checks
that the payload hashes to its digest, attests with a key only it holds, and verifies by
recomputing the MAC. Run as a command (request on stdin, answer on stdout)::

    python -m scheduler_provider_external.reference_attestor --key-env NAME

(the key is read from the variable ``NAME``; pass it through ``[providers.external]
pass_env``), or call ``answer(request_bytes, key)`` from an HTTP handler.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
from typing import Any

ANSWER_SCHEMA = "scheduler.evidence.external-answer"
METHOD = "hmac-sha256"


def _mac(key: bytes, digest: str, method: str) -> str:
    return hmac.new(key, f"{digest}|{method}".encode(), hashlib.sha256).hexdigest()


def reply(request: dict[str, Any], key: bytes) -> dict[str, Any]:
    """The answer to one parsed request."""
    base = {"schema": ANSWER_SCHEMA, "version": 1, "request_id": request["request_id"], "operation": request["operation"]}
    payload_ok = "sha256:" + hashlib.sha256(request["payload"].encode()).hexdigest() == request["payload_digest"]
    method = request.get("method") or METHOD
    if method != METHOD:
        return {**base, "ok": False, "code": "METHOD_UNSUPPORTED", "error": f"this attestor performs only {METHOD}"}
    if request["operation"] == "attest":
        if not payload_ok:
            return {**base, "ok": False, "code": "DIGEST_MISMATCH", "error": "payload and digest disagree"}
        return {**base, "ok": True, "payload_digest": request["payload_digest"], "method": method,
                "attestation": {"key_id": hashlib.sha256(key).hexdigest()[:16],
                                "mac": _mac(key, request["payload_digest"], method)}}
    answer = {**base, "ok": True, "payload_digest": request["payload_digest"], "method": method}
    if not payload_ok:
        return {**answer, "verified": False, "code": "DIGEST_MISMATCH", "reason": "payload and digest disagree"}
    mac = (request.get("attestation") or {}).get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, request["payload_digest"], method)):
        return {**answer, "verified": False, "code": "BAD_MAC", "reason": "the attestation was not made with this key for this payload"}
    return {**answer, "verified": True}


def answer(body: bytes, key: bytes) -> bytes:
    """The answer bytes to one request body."""
    return json.dumps(reply(json.loads(body), key)).encode()


def main(argv: list[str] | None = None) -> int:
    """Answer the one request on stdin."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key-env", required=True, help="variable holding the HMAC key")
    args = parser.parse_args(argv)
    key = os.environ.get(args.key_env, "")
    if not key:
        sys.stderr.write(f"reference attestor: {args.key_env} is not set\n")
        return 2
    sys.stdout.buffer.write(answer(sys.stdin.buffer.read(), key.encode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
