"""A real attestor for the tests: HMAC-SHA256 over the payload digest and method, with a key the provider never sees.

Run as a command (``python attestor.py MODE``: request on stdin, answer on stdout) or
served over HTTP by the tests' loopback server (``answer(request, mode)``). ``MODE``
makes it misbehave on purpose; ``*-verify`` modes misbehave only when verifying.
``ATTESTOR_LOG``, when set, is a file each request (and the environment's variable
names) is appended to as one JSON line.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from typing import Any

ANSWER_SCHEMA = "scheduler.evidence.external-answer"


def _key() -> bytes:
    return os.environ.get("ATTESTOR_KEY", "test-attestor-key").encode()


def _mac(digest: str, method: str) -> str:
    return hmac.new(_key(), f"{digest}|{method}".encode(), hashlib.sha256).hexdigest()


def good(request: dict[str, Any]) -> dict[str, Any]:
    """What an honest attestor answers."""
    base = {"schema": ANSWER_SCHEMA, "version": 1, "request_id": request["request_id"], "operation": request["operation"]}
    payload_ok = "sha256:" + hashlib.sha256(request["payload"].encode()).hexdigest() == request["payload_digest"]
    method = request["method"] or "hmac-sha256"
    if request["operation"] == "attest":
        if not payload_ok:
            return {**base, "ok": False, "code": "DIGEST_MISMATCH", "error": "payload and digest disagree"}
        return {**base, "ok": True, "payload_digest": request["payload_digest"], "method": method,
                "attestation": {"key_id": "k1", "mac": _mac(request["payload_digest"], method)}}
    attestation = request.get("attestation") or {}
    answer = {**base, "ok": True, "payload_digest": request["payload_digest"], "method": method}
    if not payload_ok:
        return {**answer, "verified": False, "code": "DIGEST_MISMATCH", "reason": "payload and digest disagree"}
    if not hmac.compare_digest(str(attestation.get("mac")), _mac(request["payload_digest"], method)):
        return {**answer, "verified": False, "code": "BAD_MAC", "reason": "the attestation was not made for this payload"}
    return {**answer, "verified": True}


def answer(request: dict[str, Any], mode: str) -> bytes:
    """The bytes the attestor sends back for ``request`` in ``mode``."""
    operation = request["operation"]
    if mode.endswith("-verify"):
        mode = mode[: -len("-verify")] if operation == "verify" else "good"
    reply = good(request)
    if mode == "good":
        pass
    elif mode == "hang":
        time.sleep(30)
    elif mode == "garbage":
        return b"<html>not json</html>"
    elif mode == "empty":
        return b""
    elif mode == "not-object":
        return b'["ok"]'
    elif mode == "nan":
        return json.dumps({**reply, "version": float("nan")}).encode()
    elif mode == "two-answers":
        return (json.dumps(reply) + "\n" + json.dumps(reply)).encode()
    elif mode == "duplicate-keys":
        text = json.dumps(reply)
        return (text[:-1] + ', "ok": false}').encode()
    elif mode == "oversized":
        return json.dumps({**reply, "padding": "x" * (2 * 1024 * 1024)}).encode()
    elif mode == "wrong-request-id":
        reply["request_id"] = "0" * 32
    elif mode == "wrong-operation":
        reply["operation"] = "verify" if operation == "attest" else "attest"
    elif mode == "wrong-digest":
        reply["payload_digest"] = "sha256:" + "0" * 64
    elif mode == "wrong-method":
        reply["method"] = "sha1-rsa"
    elif mode == "wrong-schema":
        reply["schema"] = "something.else"
    elif mode == "refuse":
        reply = {k: reply[k] for k in ("schema", "version", "request_id", "operation")}
        reply.update(ok=False, code="KEY_UNAVAILABLE", error="the signing key is offline")
    elif mode == "extra-field":
        reply["note"] = "also this"
    elif mode == "missing-field":
        reply.pop("payload_digest")
    elif mode == "ok-string":
        reply["ok"] = "true"
    elif mode == "verified-and-code":
        reply.update(verified=True, code="BAD_MAC")
    elif mode == "verified-string":
        reply["verified"] = "true"
    elif mode == "verified-missing":
        reply.pop("verified", None)
    elif mode == "no-attestation":
        reply["attestation"] = {}
    else:
        raise SystemExit(f"unknown mode {mode}")
    return json.dumps(reply).encode()


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "good"
    request = json.loads(sys.stdin.buffer.read())
    if os.environ.get("ATTESTOR_LOG"):
        with open(os.environ["ATTESTOR_LOG"], "a") as log:
            log.write(json.dumps({"request": request, "env": sorted(os.environ)}) + "\n")
    if mode == "exit-1":
        sys.stdout.write(json.dumps(good(request)))
        sys.stderr.write("attestor: the HSM is unreachable\n")
        return 1
    if mode == "child-holds-pipe":  # answers, exits 0, but leaves a child holding stdout open
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        sys.stdout.write(json.dumps(good(request)))
        sys.stdout.flush()
        return 0
    if mode.startswith("oversized"):  # stream it: the provider must stop reading and kill us
        sys.stdout.buffer.write(b'{"padding": "' + b"x" * (8 * 1024 * 1024))
        sys.stdout.flush()
        time.sleep(30)
        return 0
    sys.stdout.buffer.write(answer(request, mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
