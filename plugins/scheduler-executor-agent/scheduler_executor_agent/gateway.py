"""Gateway capability discovery: explicit JSON declarations from ``GET /v1/info`` or ``GET /health``.

Only an explicit ``"capabilities"`` member of a JSON object counts, either a list of
names or an object of ``name: true``; plain-text health answers, JSON without that
member, errors and timeouts all mean *no capabilities*. ``/health`` is read only for an
endpoint declared a gateway (``gateway_endpoints``): on other OpenAI-compatible servers
(LiteLLM's proxy) it health-checks every upstream model and can hang for a minute.
Results are bounded (256 names of at most 128 characters, 64 KiB read) and cached per
base URL for ``discovery_ttl_s``, a failed probe as long as a declaration (so an endpoint
that does not answer costs one timeout per TTL, not one per turn). A cached answer that
declares the needed capability is asked again (a gateway restarted into an older version
cannot ride on a stale positive answer); one that does not declare it is reused.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

#: The capability a gateway must declare before the executor sends it a materialised environment.
ENV_INJECT_CAPABILITY = "chat-completions-env-inject-v1"
MAX_BODY_BYTES = 64 * 1024
MAX_NAMES = 256
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


@attrs.frozen(kw_only=True)
class Discovery:
    """What a gateway declared: capability names and where they came from (``/v1/info``, ``/health``, ``none``)."""

    capabilities: frozenset[str]
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "capabilities": sorted(self.capabilities)}


def root_of(base_url: str) -> str:
    """The gateway root: the base URL without a trailing ``/v1`` (``http://h:1/v1`` -> ``http://h:1``)."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


def parse_declaration(body: bytes) -> frozenset[str] | None:
    """The capability names a JSON body declares explicitly, or None when it declares nothing."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or "capabilities" not in data:
        return None
    declared = data["capabilities"]
    if isinstance(declared, dict):
        names = [k for k, v in declared.items() if v is True]
    elif isinstance(declared, list):
        names = [v for v in declared if isinstance(v, str)]
    else:
        return None
    return frozenset(n for n in names[:MAX_NAMES] if _NAME.match(n))


class CapabilityCache:
    """Per base URL: the last discovery and until when it holds (thread-safe; one instance per executor)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Discovery]] = {}
        #: How many discoveries went to the network (tests read it).
        self.fetches = 0

    def get(self, base_url: str, *, headers: Mapping[str, str], ttl_s: float, timeout_s: float,
            need: str | None = None, health: bool = False) -> Discovery:
        """The discovery of ``base_url``: the cached one while fresh unless it declares ``need`` (then asked again).

        ``health`` allows ``GET /health`` after ``/v1/info`` (an endpoint declared a gateway only).
        A failed probe is cached for ``ttl_s`` like a declaration.
        """
        now = self._clock()
        cache_key = f"{base_url} health={health}"
        with self._lock:
            entry = self._entries.get(cache_key)
        if entry is not None and entry[0] > now and (need is None or need not in entry[1].capabilities):
            return entry[1]
        found = self._fetch(base_url, headers, timeout_s, health=health)
        with self._lock:
            self.fetches += 1
            self._entries[cache_key] = (self._clock() + ttl_s, found)
        return found

    def _fetch(self, base_url: str, headers: Mapping[str, str], timeout_s: float, *, health: bool) -> Discovery:
        import httpx

        root = root_of(base_url)
        timeout = httpx.Timeout(max(0.05, timeout_s))
        probes = [("/v1/info", f"{root}/v1/info")] + ([("/health", f"{root}/health")] if health else [])
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            for source, url in probes:
                try:
                    with client.stream("GET", url, headers=dict(headers)) as response:
                        if response.status_code != 200:
                            continue
                        body = bytearray()
                        for chunk in response.iter_bytes():
                            body.extend(chunk)
                            if len(body) > MAX_BODY_BYTES:
                                break
                except httpx.HTTPError:
                    continue
                names = parse_declaration(bytes(body)) if len(body) <= MAX_BODY_BYTES else None
                if names is not None:
                    return Discovery(capabilities=names, source=source)
        return Discovery(capabilities=frozenset(), source="none")
