"""Getting one answer from the attestor: a command (JSON on stdin, JSON on stdout) or an HTTP POST.

Both are bounded the same way: a hard deadline (the caller never waits longer than
``timeout_s``, whatever the attestor does) and a size cap on the answer. Every failure
becomes an ``EvidenceFailure`` with an ``EVIDENCE_EXTERNAL_*`` code. Messages name an
HTTP endpoint by scheme, host and port only (URLs often carry tokens).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from scheduler_toolkit.evidence import EvidenceFailure
from scheduler_toolkit.process import minimal_env, run_bounded, snippet


def endpoint_label(url: str) -> str:
    """``scheme://host[:port]`` of a URL: what messages and envelopes show instead of the URL."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}"


def run_command(argv: Sequence[str], body: bytes, *, timeout_s: float, max_bytes: int, env: Mapping[str, str],
                pass_env: Sequence[str]) -> bytes:
    """The attestor command's stdout, if it exited 0 in time with a small enough answer."""
    where = f"the attestor command {os.path.basename(argv[0])}"
    try:
        done = run_bounded(argv, body, timeout_s=timeout_s, max_stdout=max_bytes, env=minimal_env(env, pass_env))
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise EvidenceFailure("EVIDENCE_EXTERNAL_UNAVAILABLE", f"{where} cannot be started: {exc.strerror or exc}") from None
    except OSError as exc:
        raise EvidenceFailure("EVIDENCE_EXTERNAL_UNAVAILABLE", f"{where} cannot be started: {exc.strerror or exc}") from None
    if done.timed_out:
        raise EvidenceFailure("EVIDENCE_EXTERNAL_TIMEOUT", f"{where} did not answer within {timeout_s:g} s (its process group was killed)")
    if done.oversized:
        raise EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_TOO_LARGE", f"{where} wrote more than {max_bytes} bytes (it was killed)")
    if done.returncode != 0:
        said = snippet(done.stderr)
        raise EvidenceFailure("EVIDENCE_EXTERNAL_FAILED",
                              f"{where} exited with status {done.returncode}" + (f": {said}" if said else ""))
    return done.stdout


class HttpAttestor:
    """POSTs to the attestor endpoint with a pooled ``httpx`` client; thread-safe."""

    def __init__(self, user_agent: str) -> None:
        self._client: Any = None
        self._lock = threading.Lock()
        self._user_agent = user_agent

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _http(self) -> Any:
        with self._lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(follow_redirects=False, headers={"user-agent": self._user_agent})
            return self._client

    def post(self, url: str, body: bytes, *, headers: Mapping[str, str], timeout_s: float, max_bytes: int) -> bytes:
        """The body of a ``200`` answer, received completely within ``timeout_s``."""
        where = f"the attestor endpoint {endpoint_label(url)}"
        client = self._http()
        outcome: dict[str, Any] = {}

        def call() -> None:
            import httpx

            try:
                with client.stream("POST", url, content=body, timeout=httpx.Timeout(timeout_s),
                                   headers={"content-type": "application/json", "accept": "application/json", **headers}) as resp:
                    if resp.status_code != 200:
                        head = b""
                        for chunk in resp.iter_bytes():  # a few hundred bytes for the message, never the whole body
                            head += chunk
                            if len(head) >= 400:
                                break
                        outcome["failure"] = EvidenceFailure(
                            "EVIDENCE_EXTERNAL_FAILED",
                            f"{where} answered HTTP {resp.status_code}" + (f": {snippet(head)}" if snippet(head) else "")
                            + (" (redirects are not followed)" if 300 <= resp.status_code < 400 else ""))
                        return
                    declared = resp.headers.get("content-length")
                    if declared and declared.isdigit() and int(declared) > max_bytes:
                        outcome["failure"] = EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_TOO_LARGE",
                                                             f"{where} announced {declared} bytes, over {max_bytes}")
                        return
                    received = bytearray()
                    for chunk in resp.iter_bytes():
                        received.extend(chunk)
                        if len(received) > max_bytes:
                            outcome["failure"] = EvidenceFailure("EVIDENCE_EXTERNAL_ANSWER_TOO_LARGE",
                                                                 f"{where} sent more than {max_bytes} bytes")
                            return
                    outcome["body"] = bytes(received)
            except httpx.TimeoutException:
                outcome["failure"] = EvidenceFailure("EVIDENCE_EXTERNAL_TIMEOUT", f"{where} did not answer within {timeout_s:g} s")
            except (httpx.UnsupportedProtocol, httpx.InvalidURL):
                outcome["failure"] = EvidenceFailure("EVIDENCE_EXTERNAL_NOT_CONFIGURED", f"{where}: the URL cannot be used")
            except httpx.HTTPError as exc:  # the exception text may hold the URL: only its type is shown
                outcome["failure"] = EvidenceFailure("EVIDENCE_EXTERNAL_UNAVAILABLE", f"{where}: connection failed ({type(exc).__name__})")
            except Exception as exc:  # noqa: BLE001 - fail closed, never crash the caller's thread
                outcome["failure"] = EvidenceFailure("EVIDENCE_EXTERNAL_UNAVAILABLE", f"{where}: request failed ({type(exc).__name__})")

        worker = threading.Thread(target=call, name="scheduler-evidence-external", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():  # late: the answer, whenever it comes, is discarded (httpx's own timeout ends the thread)
            raise EvidenceFailure("EVIDENCE_EXTERNAL_TIMEOUT", f"{where} did not answer within {timeout_s:g} s")
        if "failure" in outcome:
            raise outcome["failure"]
        return outcome["body"]
