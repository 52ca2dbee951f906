"""One chat-completions turn over HTTP: attempts, retries, the stream, limits and an abort that is immediate.

The executor's worker thread supervises; a helper thread per attempt does the blocking
httpx work and hands over what arrives (response head, body bytes, end, failure) through a
queue. The supervisor checks cancellation, the run deadline and the idle timeout every
50 ms, parses server-sent events, feeds the output recorders and enforces the output, token
and cost caps. Stopping a turn shuts the attempt's socket down (``shutdown(SHUT_RDWR)``,
recorded through httpcore's ``trace`` extension as soon as it connects), which wakes the
helper out of its read and tells the server at once; a plain ``close()`` from another
thread would not.

Retried: HTTP 408, 425, 429, 500, 502, 503, 504 and 529 and failures to connect, with
exponential backoff (0.5 s doubling, jittered, at most ``max_backoff_s``) or the server's
``Retry-After``, only while the wait fits before the run deadline. Never retried: anything
after a reply started streaming (its output is already recorded).
"""

from __future__ import annotations

import email.utils
import json
import math
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs
from scheduler_toolkit.http import AbortableRequest

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 529})
POLL_S = 0.05
#: Bytes of an error response quoted in the run's error message.
EXCERPT_BYTES = 600
#: Longest SSE line accepted (a line longer than the output cap plus this is malformed).
LINE_SLACK = 1024 * 1024


class Sink(Protocol):
    """Where one stream of the reply goes: ``write(bytes) -> bool`` (False once its cap is exceeded)."""

    def write(self, data: bytes) -> bool:
        """Take the next bytes; False once the stream's cap is exceeded."""
        ...


@attrs.define(kw_only=True)
class Limits:
    """What bounds a turn (monotonic deadline; caps as configured for the run)."""

    deadline: float
    idle_timeout_s: float
    connect_timeout_s: float
    max_attempts: int
    max_backoff_s: float
    max_output_bytes: int
    token_cap: int | None = None
    cost_cap: float | None = None
    #: USD per million (prompt, completion) tokens, when known.
    price: tuple[float, float] | None = None


@attrs.define(kw_only=True)
class Outcome:
    """How a turn ended. ``reason`` ``done`` is a complete reply; anything else says why not."""

    reason: str = "done"
    error_code: str | None = None
    error_message: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    estimated_completion: int = 0
    attempts: int = 0
    streamed: bool = False
    http_status: int | None = None
    #: True when the executor closed the connection while the reply was still coming.
    aborted: bool = False
    #: The assistant's text, kept up to ``keep_text_bytes`` (for a session's history).
    text: str = ""
    text_complete: bool = True

    def cost(self, price: tuple[float, float] | None) -> float | None:
        """USD of the turn from the exact usage (None without usage or price)."""
        if price is None or self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return (self.prompt_tokens * price[0] + self.completion_tokens * price[1]) / 1_000_000


class SSEParser:
    """Incremental ``text/event-stream`` parsing: ``feed(bytes)`` returns the ``data`` of each complete event."""

    def __init__(self, max_line: int) -> None:
        self._buf = bytearray()
        self._data: list[str] = []
        self._max_line = max_line

    def feed(self, chunk: bytes) -> list[str]:
        self._buf.extend(chunk)
        out: list[str] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self._max_line:
                    raise ValueError(f"an event line longer than {self._max_line} bytes")
                return out
            line = bytes(self._buf[:nl]).rstrip(b"\r")
            del self._buf[: nl + 1]
            self._line(line.decode("utf-8"), out)

    def close(self) -> list[str]:
        """Events still pending at the end of the body (a last event without its blank line)."""
        out: list[str] = []
        if self._buf:
            self._line(bytes(self._buf).rstrip(b"\r").decode("utf-8"), out)
            self._buf.clear()
        self._line("", out)
        return out

    def _line(self, line: str, out: list[str]) -> None:
        if not line:
            if self._data:
                out.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return  # a comment (keep-alive)
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value.removeprefix(" "))


class MalformedReply(Exception):
    """The reply does not follow the chat-completions format."""


_tls_lock = threading.Lock()
_tls: Any = None


def _tls_context() -> Any:
    """One verifying TLS context for every turn of the process.

    ``httpx.Client()`` builds a context and loads the CA bundle each time it is created
    (about 20-30 ms, even for an ``http://`` endpoint): the agent bench measured it as most
    of an agent run's overhead over the bare HTTP round trip. A context is safe to share.
    """
    global _tls
    if _tls is None:
        with _tls_lock:
            if _tls is None:
                import ssl

                try:
                    import certifi

                    _tls = ssl.create_default_context(cafile=certifi.where())
                except ImportError:  # httpx brings certifi; the system store otherwise
                    _tls = ssl.create_default_context()
    return _tls


def retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _text_of(content: Any) -> str:
    """A message's content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif not isinstance(part, dict):
                raise MalformedReply("a content part is not an object")
        return "".join(parts)
    raise MalformedReply(f"content is a {type(content).__name__}, not text")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class Turn:
    """Runs one turn; see the module docstring. Construct, then ``run()`` once."""

    def __init__(
        self,
        *,
        url: str,
        headers: dict[str, str],
        body: dict[str, Any],
        limits: Limits,
        stdout: Sink,
        stderr: Sink,
        is_cancelled: Callable[[], bool],
        wait_cancelled: Callable[[float], bool],
        on_event: Callable[[str, dict[str, Any]], None],
        secrets_to_hide: tuple[str, ...] = (),
        keep_text_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url, self.headers, self.body, self.limits = url, headers, body, limits
        self.stdout, self.stderr = stdout, stderr
        self.is_cancelled, self.wait_cancelled, self.on_event = is_cancelled, wait_cancelled, on_event
        self.hide = tuple(s for s in secrets_to_hide if s)
        self.keep_text_bytes = keep_text_bytes
        self.clock = clock
        self.out = Outcome(streamed=bool(body.get("stream")))
        self._text: list[str] = []
        self._text_bytes = 0
        self._chars = 0
        self._pieces = 0
        self._done = False

    # -- helpers -------------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        for secret in self.hide:
            text = text.replace(secret, "[redacted]")
        return text

    def _fail(self, reason: str, code: str, message: str) -> Outcome:
        self.out.reason, self.out.error_code, self.out.error_message = reason, code, self._redact(message)
        return self.out

    def _stop_reason(self, last_byte: float) -> tuple[str, str, str] | None:
        """Cancellation, the deadline or the idle timeout, whichever applies now."""
        if self.is_cancelled():
            return "cancelled", "RUN_CANCELLED", "cancelled while the turn was running"
        now = self.clock()
        if now >= self.limits.deadline:
            return "timeout", "RUN_TIMEOUT", "the turn exceeded the run deadline and was stopped"
        if now - last_byte >= self.limits.idle_timeout_s:
            return "idle", "AGENT_IDLE_TIMEOUT", f"no data from the endpoint for {self.limits.idle_timeout_s:g}s; the turn was stopped"
        return None

    # -- the attempts --------------------------------------------------------------------------

    def run(self) -> Outcome:
        import httpx

        timeout = httpx.Timeout(connect=self.limits.connect_timeout_s, read=self.limits.idle_timeout_s + 5.0,
                                write=self.limits.idle_timeout_s + 5.0, pool=self.limits.connect_timeout_s)
        with httpx.Client(timeout=timeout, follow_redirects=False, verify=_tls_context()) as client:
            while True:
                self.out.attempts += 1
                attempt = AbortableRequest(client, self.url, self.headers, self.body, name="agent-http")
                attempt.start()
                try:
                    retry_wait = self._one_attempt(attempt)
                finally:
                    attempt.abort()
                    attempt.join(1.0)
                if retry_wait is None:
                    return self.out
                if self.wait_cancelled(retry_wait):
                    return self._fail("cancelled", "RUN_CANCELLED", "cancelled while waiting to retry")

    def _retry_or_fail(self, code: str, message: str, wait_hint: float | None) -> float | None:
        """The wait before the next attempt, or None after recording the final failure."""
        backoff = min(self.limits.max_backoff_s, 0.5 * 2 ** (self.out.attempts - 1)) * random.uniform(0.8, 1.0)
        wait = backoff if wait_hint is None else wait_hint
        if self.out.attempts >= self.limits.max_attempts:
            self._fail("http_error", code, f"{message} (after {self.out.attempts} attempts)")
            return None
        if wait_hint is not None and wait_hint > self.limits.max_backoff_s:
            self._fail("http_error", code, f"{message}; Retry-After {wait_hint:g}s exceeds max_backoff_s")
            return None
        if self.clock() + wait >= self.limits.deadline:
            self._fail("http_error", code, f"{message}; waiting {wait:.2f}s to retry would pass the run deadline")
            return None
        self.on_event("agent.retry", {"attempt": self.out.attempts, "code": code, "wait_s": round(wait, 3),
                                      "status": self.out.http_status})
        return wait

    def _one_attempt(self, attempt: AbortableRequest) -> float | None:
        """Run one attempt to its end; the wait before a retry, or None when the turn is decided."""
        last_byte = self.clock()
        head = None
        while head is None:
            stop = self._stop_reason(last_byte)
            if stop:
                self._stopped(stop, aborted=True)
                return None
            try:
                kind, value = attempt.events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind == "fail":
                return self._retry_or_fail("AGENT_CONNECT_FAILED", f"cannot reach the endpoint: {_describe(value)}", None)
            if kind == "head":
                head = value
        self.out.http_status = status = head.status_code
        if status != 200:
            excerpt = self._excerpt(attempt)
            if isinstance(excerpt, tuple):
                self._stopped(excerpt, aborted=True)
                return None
            detail = f"HTTP {status} from the endpoint" + (f": {excerpt}" if excerpt else "")
            if status in RETRY_STATUSES:
                code = "AGENT_RATE_LIMITED" if status == 429 else "AGENT_SERVER_ERROR"
                return self._retry_or_fail(code, detail, retry_after_s(head.headers.get("retry-after")))
            if 300 <= status < 400:
                self._fail("http_error", "AGENT_REQUEST_REJECTED",
                           f"HTTP {status}: redirects are not followed (the API key stays with the configured URL)")
            elif status in (401, 403):
                self._fail("http_error", "AGENT_AUTH_FAILED", detail)
            else:
                self._fail("http_error", "AGENT_REQUEST_REJECTED", detail)
            return None
        content_type = head.headers.get("content-type", "").split(";")[0].strip().lower()
        self.out.streamed = content_type == "text/event-stream"
        if self.out.streamed:
            self._read_stream(attempt)
        else:
            self._read_json(attempt)
        return None

    def _stopped(self, stop: tuple[str, str, str], *, aborted: bool) -> None:
        reason, code, message = stop
        self.out.aborted = aborted
        self._fail(reason, code, message)
        return None

    def _excerpt(self, attempt: AbortableRequest) -> str | tuple[str, str, str]:
        """Up to ``EXCERPT_BYTES`` of an error response, as text with the key redacted (or why it stopped)."""
        data = bytearray()
        last_byte = self.clock()
        while len(data) < EXCERPT_BYTES:
            stop = self._stop_reason(last_byte)
            if stop:
                return stop
            try:
                kind, value = attempt.events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind != "data":
                break
            data.extend(value)
            last_byte = self.clock()
        text = bytes(data[:EXCERPT_BYTES]).decode("utf-8", errors="replace")
        text = " ".join(text.split())
        return self._redact(text[:300])

    # -- a 200 reply ---------------------------------------------------------------------------

    def _read_stream(self, attempt: AbortableRequest) -> None:
        parser = SSEParser(self.limits.max_output_bytes + LINE_SLACK)
        last_byte = self.clock()
        while True:
            stop = self._stop_reason(last_byte)
            if stop:
                return self._stopped(stop, aborted=True)
            try:
                kind, value = attempt.events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind == "data":
                last_byte = self.clock()
                try:
                    events = parser.feed(value)
                except (ValueError, UnicodeDecodeError) as exc:
                    return self._malformed(f"unreadable event stream: {exc}")
                for data in events:
                    self._event(data)
                    if self.out.reason != "done" or self._done:
                        return None
                continue
            if kind == "end":
                try:
                    for data in parser.close():
                        self._event(data)
                        if self.out.reason != "done" or self._done:
                            return None
                except UnicodeDecodeError as exc:
                    return self._malformed(f"unreadable event stream: {exc}")
            if self.out.finish_reason is not None:
                return None  # complete; some servers end without [DONE]
            cause = "the connection closed" if kind == "end" else _describe(value)
            self._fail("incomplete", "AGENT_STREAM_INCOMPLETE", f"the stream ended before the reply was complete ({cause})")
            return None

    def _malformed(self, message: str, code: str = "AGENT_STREAM_MALFORMED") -> None:
        self.out.aborted = not self._done
        self._fail("malformed", code, message)
        return None

    def _event(self, data: str) -> None:
        """Handle one SSE event; a failure is recorded on ``self.out`` (its ``reason`` is no longer ``done``)."""
        if data.strip() == "[DONE]":
            self._done = True
            return None
        try:
            chunk = json.loads(data)
        except ValueError:
            shown = " ".join(data[:120].split())
            return self._malformed(f"an event is not JSON: {self._redact(shown)!r}")
        if not isinstance(chunk, dict):
            return self._malformed("an event is not a JSON object")
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"]
            message = err.get("message") if isinstance(err, dict) else err
            self._fail("stream_error", "AGENT_STREAM_ERROR", f"the endpoint reported an error mid-stream: {str(message)[:300]}")
            self.out.aborted = True
            return None
        try:
            self._usage(chunk.get("usage"))
            choices = chunk.get("choices") or []
            if not isinstance(choices, list):
                raise MalformedReply("choices is not a list")
            for choice in choices:
                if not isinstance(choice, dict):
                    raise MalformedReply("a choice is not an object")
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                if not isinstance(delta, dict):
                    raise MalformedReply("delta is not an object")
                reasoning = delta.get("reasoning_content", delta.get("reasoning"))
                self._emit(_text_of(delta.get("content")), _text_of(reasoning))
                if self.out.reason != "done":
                    return None
                if choice.get("finish_reason"):
                    self.out.finish_reason = str(choice["finish_reason"])[:64]
        except MalformedReply as exc:
            return self._malformed(f"an event does not follow the chat-completions format: {exc}")
        return self._check_caps()

    def _read_json(self, attempt: AbortableRequest) -> None:
        body = bytearray()
        limit = self.limits.max_output_bytes * 2 + LINE_SLACK
        last_byte = self.clock()
        while True:
            stop = self._stop_reason(last_byte)
            if stop:
                return self._stopped(stop, aborted=True)
            try:
                kind, value = attempt.events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind == "data":
                last_byte = self.clock()
                body.extend(value)
                if len(body) > limit:
                    self.out.aborted = True
                    self._fail("limit", "OUTPUT_LIMIT_EXCEEDED", f"the response exceeded {limit} bytes; the turn was stopped")
                    return None
                continue
            if kind == "fail":
                self._fail("incomplete", "AGENT_STREAM_INCOMPLETE",
                           f"the response ended before it was complete ({_describe(value)})")
                return None
            break
        try:
            reply = json.loads(bytes(body).decode("utf-8"))
            if not isinstance(reply, dict):
                raise MalformedReply("the response is not a JSON object")
            if "error" in reply and not reply.get("choices"):
                err = reply["error"]
                message = err.get("message") if isinstance(err, dict) else err
                self._fail("stream_error", "AGENT_STREAM_ERROR", f"the endpoint reported an error: {str(message)[:300]}")
                return None
            choices = reply.get("choices")
            if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                raise MalformedReply("no choices")
            message = choices[0].get("message")
            if not isinstance(message, dict):
                raise MalformedReply("choices[0].message is not an object")
            self._usage(reply.get("usage"))
            reasoning = message.get("reasoning_content", message.get("reasoning"))
            self._emit(_text_of(message.get("content")), _text_of(reasoning))
            if self.out.reason != "done":
                return None
            self.out.finish_reason = str(choices[0].get("finish_reason") or "stop")[:64]
        except (ValueError, UnicodeDecodeError, MalformedReply) as exc:
            return self._malformed(f"the response does not follow the chat-completions format: {exc}",
                                   code="AGENT_RESPONSE_MALFORMED")
        self._done = True
        return self._check_caps()

    # -- output, usage, caps -------------------------------------------------------------------

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise MalformedReply("usage is not an object")
        prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        if prompt is not None:
            self.out.prompt_tokens = prompt
        if completion is not None:
            self.out.completion_tokens = completion

    def _emit(self, content: str, reasoning: str) -> None:
        if reasoning:
            self._pieces += 1
            self._chars += len(reasoning)
            if not self.stderr.write(reasoning.encode("utf-8")):
                self.out.aborted = not self._done
                self._fail("limit", "OUTPUT_LIMIT_EXCEEDED",
                           f"the reasoning stream exceeded the {self.limits.max_output_bytes}-byte limit; the turn was stopped")
                return None
        if content:
            self._pieces += 1
            self._chars += len(content)
            data = content.encode("utf-8")
            if self._text_bytes < self.keep_text_bytes:
                self._text.append(content)
                self._text_bytes += len(data)
            else:
                self.out.text_complete = False
            if not self.stdout.write(data):
                self.out.aborted = not self._done
                self._fail("limit", "OUTPUT_LIMIT_EXCEEDED",
                           f"the reply exceeded the {self.limits.max_output_bytes}-byte limit; the turn was stopped")
                return None
        self.out.estimated_completion = max(self._pieces, (self._chars + 3) // 4)
        return None

    def _tokens_now(self) -> tuple[int, int]:
        prompt = self.out.prompt_tokens or 0
        completion = self.out.completion_tokens if self.out.completion_tokens is not None else self.out.estimated_completion
        return prompt, max(completion, 0)

    def _check_caps(self) -> None:
        """Stop the reply as soon as the running count passes a cap (exact usage is checked again at the end)."""
        if self.out.reason != "done":
            return None
        prompt, completion = self._tokens_now()
        if self.limits.token_cap is not None and prompt + completion > self.limits.token_cap:
            self.out.aborted = not self._done
            self._fail("token_cap", "TOKEN_CAP_EXCEEDED",
                       f"the turn used {prompt + completion} tokens, more than max_tokens {self.limits.token_cap}; it was stopped")
            return None
        if self.limits.cost_cap is not None and self.limits.price is not None:
            cost = (prompt * self.limits.price[0] + completion * self.limits.price[1]) / 1_000_000
            if cost > self.limits.cost_cap:
                self.out.aborted = not self._done
                self._fail("cost_cap", "COST_CAP_EXCEEDED",
                           f"the turn cost {cost:.6f} USD, more than max_cost {self.limits.cost_cap}; it was stopped")
                return None
        return None

    def text(self) -> str:
        return "".join(self._text)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
