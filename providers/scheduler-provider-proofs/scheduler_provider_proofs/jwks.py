"""Fetching a JWKS from the declared ``jwks_url``: bounded in time and size, no redirects, no proxy from the environment.

The declared URL is the trust anchor, so a redirect is refused (``PROOF_KEY_UNAVAILABLE``) instead
of followed, and ``HTTP(S)_PROXY`` variables are ignored. The document is fetched afresh for every
verification: a key removed from the set stops verifying at once.
"""

from __future__ import annotations

import httpx
from scheduler_toolkit.proofs import MAX_TRUST_FILE_BYTES, fail


def fetch_jwks(url: str, *, timeout_s: float, max_bytes: int = MAX_TRUST_FILE_BYTES) -> bytes:
    """The body of ``GET url`` (HTTP 200 only, at most ``max_bytes``); ``PROOF_KEY_UNAVAILABLE`` for anything else."""
    try:
        with (httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client,
              client.stream("GET", url, headers={"accept": "application/json"}) as response):
            if response.status_code != 200:
                raise fail("PROOF_KEY_UNAVAILABLE", f"the JWKS at {url} answered HTTP {response.status_code}")
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise fail("PROOF_KEY_UNAVAILABLE", f"the JWKS at {url} is larger than {max_bytes} bytes")
            return body
    except httpx.HTTPError as exc:
        raise fail("PROOF_KEY_UNAVAILABLE", f"cannot fetch the JWKS at {url}: {type(exc).__name__}: {exc}") from None


__all__ = ["fetch_jwks"]
