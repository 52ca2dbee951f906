"""Reply mode: one non-streamed chat-completions request to the main session, abortable at once.

The worker thread supervises; a helper thread does the blocking httpx work and hands the
response head, body bytes, the end or a failure over through a queue. Every 50 ms the
supervisor checks cancellation and the run deadline. Stopping shuts the request's socket
down (``shutdown(SHUT_RDWR)`` on the socket httpcore reports through its ``trace``
extension), which wakes the helper out of its read and tells the server at once.

The helper thread is the toolkit's ``scheduler_toolkit.http.AbortableRequest``, shared with the agent executor.

Nothing is retried: the main session is a conversation, and a request that may have
reached it must not be delivered twice (the job's ``max_retries`` is the retry policy).
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable
from typing import Any

import attrs
from scheduler_toolkit.http import AbortableRequest

POLL_S = 0.05
EXCERPT_CHARS = 300


@attrs.define(kw_only=True)
class Reply:
    """How the request ended: ``reason`` ``done`` with the reply, else why not."""

    reason: str = "done"
    error_code: str | None = None
    error_message: str | None = None
    http_status: int | None = None
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: The connection was shut down by us while the request was in flight.
    aborted: bool = False


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(p["text"] for p in content if isinstance(p.get("text"), str))
    raise ValueError(f"content is a {type(content).__name__}, not text")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def send(*, url: str, headers: dict[str, str], body: dict[str, Any], deadline: float, connect_timeout_s: float,
         max_bytes: int, is_cancelled: Callable[[], bool], secrets_to_hide: tuple[str, ...] = ()) -> Reply:
    """POST ``body`` and wait for the whole reply (or cancellation, or ``deadline`` on the monotonic clock)."""
    import httpx

    hide = tuple(s for s in secrets_to_hide if s)

    def redact(text: str) -> str:
        for secret in hide:
            text = text.replace(secret, "[redacted]")
        return text

    out = Reply()

    def fail(reason: str, code: str, message: str, *, aborted: bool = False) -> Reply:
        out.reason, out.error_code, out.error_message, out.aborted = reason, code, redact(message), aborted
        return out

    remaining = max(0.05, deadline - time.monotonic())
    timeout = httpx.Timeout(connect=min(connect_timeout_s, remaining), read=remaining + 5, write=remaining + 5,
                            pool=connect_timeout_s)
    with httpx.Client(timeout=timeout, follow_redirects=False) as client:
        request = AbortableRequest(client, url, headers, body, name="main-session-http")
        request.start()
        try:
            head = None
            data = bytearray()
            while True:
                if is_cancelled():
                    return fail("cancelled", "RUN_CANCELLED", "cancelled while waiting for the main session's reply",
                                aborted=True)
                if time.monotonic() >= deadline:
                    return fail("timeout", "RUN_TIMEOUT", "the run deadline passed while waiting for the main session's "
                                "reply; the request was closed", aborted=True)
                try:
                    kind, value = request.events.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if kind == "head":
                    head = value
                    out.http_status = head.status_code
                elif kind == "data":
                    data.extend(value)
                    if len(data) > max_bytes:
                        return fail("limit", "MAIN_SESSION_REPLY_TOO_LARGE",
                                    f"the response exceeded max_reply_bytes ({max_bytes}); the request was closed",
                                    aborted=True)
                    if head is not None and head.status_code != 200 and len(data) > 2000:
                        break
                elif kind == "fail":
                    if head is None:
                        return fail("http_error", "MAIN_SESSION_CONNECT_FAILED",
                                    f"cannot reach the chat endpoint: {_describe(value)}")
                    return fail("incomplete", "MAIN_SESSION_REPLY_INCOMPLETE",
                                f"the response ended before it was complete ({_describe(value)})")
                else:  # end
                    break
        finally:
            request.abort()
            request.join(1.0)
    status = out.http_status
    if status != 200:
        excerpt = " ".join(bytes(data[:2000]).decode("utf-8", "replace").split())[:EXCERPT_CHARS]
        detail = f"HTTP {status} from the chat endpoint" + (f": {excerpt}" if excerpt else "")
        if status is not None and 300 <= status < 400:
            return fail("http_error", "MAIN_SESSION_REQUEST_REJECTED",
                        f"HTTP {status}: redirects are not followed (the key stays with the configured URL)")
        if status in (401, 403):
            return fail("http_error", "MAIN_SESSION_AUTH_FAILED", detail)
        if status == 429:
            return fail("http_error", "MAIN_SESSION_RATE_LIMITED", detail)
        if status is not None and status >= 500:
            return fail("http_error", "MAIN_SESSION_SERVER_ERROR", detail)
        return fail("http_error", "MAIN_SESSION_REQUEST_REJECTED", detail)
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("the response is not a JSON object")
        if "error" in doc and not doc.get("choices"):
            err = doc["error"]
            message = err.get("message") if isinstance(err, dict) else err
            return fail("http_error", "MAIN_SESSION_REPLY_ERROR", f"the endpoint reported an error: {str(message)[:300]}")
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ValueError("no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ValueError("choices[0].message is not an object")
        out.content = _text_of(message.get("content"))
        out.reasoning = _text_of(message.get("reasoning_content", message.get("reasoning")))
        out.finish_reason = str(choices[0].get("finish_reason") or "stop")[:64]
        usage = doc.get("usage")
        if usage is not None and not isinstance(usage, dict):
            raise ValueError("usage is not an object")
        if usage:
            out.prompt_tokens, out.completion_tokens = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    except (ValueError, UnicodeDecodeError) as exc:
        return fail("malformed", "MAIN_SESSION_REPLY_MALFORMED",
                    f"the response does not follow the chat-completions format: {exc}")
    return out


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
