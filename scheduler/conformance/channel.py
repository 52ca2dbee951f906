"""The engine's adapter for kind ``channel``: send a case's part through a channel to a stand-in of its service.

Per case: the channel's **service adapter** (``scheduler.conformance.service``) starts a
loopback stand-in of the service and says how to point the channel at it (its
``[channels.NAME]`` settings, the secrets they reference, the route's target and
``delivery_options``). The engine validates those settings with the channel's
``settings_class`` and hands them to ``configure`` exactly as the loader does, builds the
``DeliveryPart`` the outbox consumer would build (body, ``index``/``count``, a
``<group>:part:i/N`` idempotency key, attachments staged with size and SHA-256, as
bytes) and the ``DeliveryRoute`` (options validated with ``options_class``), and calls
``send`` once per answer the case lists, with the stand-in answering each attempt as
told. Then it compares:

* the outcome of the last attempt: a ``DeliveryReceipt`` (``delivered``), a
  ``TransientDeliveryError`` or a ``PermanentDeliveryError``; every earlier attempt must
  have been transient (that is what makes the outbox retry); ``retry_after_s`` when the
  service gave a ``Retry-After``;
* what the service saw: how many messages it accepted, the body whole in one message,
  the part's idempotency key on every attempt, each attachment's name and bytes;
* always: one ``send`` of a part without files is one message the service sees (a channel that
  retries inside ``send`` sends the part twice); error codes are ``UPPER_SNAKE`` and messages non-empty; a receipt is never
  returned for a message the service did not accept; ``limits`` is a sane
  ``ChannelLimits`` that agrees with the ``attachments`` capability when files are sent;
  and no secret value of the stand-in appears in an error (message, code, args), a
  receipt, or a log record the channel emitted while sending.

``send`` runs in a worker thread: one that does not return within its limit fails the
case (the stand-in is then closed, which releases whatever it holds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.conformance.engine import (
    _DRIVER_NAME,
    Case,
    CaseCheck,
    KindAdapter,
    _patched_environ,
    register_adapter,
)
from scheduler.conformance.service import ReceivedMessage, ServiceAnswer, ServiceRequest, resolve_service_adapter
from scheduler.core.members import Configurable, settings_class_of
from scheduler.plugins.options import channel_options_for
from scheduler.plugins.protocols import (
    ChannelLimits,
    DeliveryError,
    DeliveryPart,
    DeliveryReceipt,
    DeliveryRoute,
    PermanentDeliveryError,
    TransientDeliveryError,
)
from scheduler.settings.load import resolve_table

#: How long one ``send`` may take before the engine gives up on it (``expect.max_duration_ms`` lowers it).
SEND_LIMIT_MS = 30_000
#: After giving up (and closing the stand-in), how much longer the engine waits for ``send`` to return.
SEND_GRACE_MS = 5_000
#: Extra time past ``max_duration_ms`` before the engine gives up on a ``send``.
MAX_DURATION_GRACE_MS = 2_000
#: How far ``retry_after_s`` may be from the ``Retry-After`` the service gave (an HTTP date is rounded to seconds).
RETRY_AFTER_TOLERANCE_S = 1.0
#: The answer timeout the engine asks service adapters to configure (``ServiceRequest.timeout_s``).
CHANNEL_TIMEOUT_S = 2.0
#: Driver name of the route when the channel under test came without a usable name.
ANONYMOUS_CHANNEL = "conformance-channel"
#: The answers of a case that lists none.
DEFAULT_ANSWERS: tuple[dict[str, Any], ...] = ({"answer": "accept"},)
#: Answers after which a channel must raise ``TransientDeliveryError`` (so a case may list them before its last one).
TRANSIENT_ANSWERS = frozenset({"rate_limit", "server_error", "timeout", "reset"})
#: The last characters of a ``{"fill": "max_chars"}`` body, so a cut at the end shows.
FILL_END = "<end>"
#: A secret shorter than this is not searched for (it would match by accident).
MIN_SECRET_CHARS = 4

_ERROR_CODE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
_OUTCOME_TEXT = {"delivered": "a receipt", "transient": "a TransientDeliveryError", "permanent": "a PermanentDeliveryError"}


# --------------------------------------------------------------------------- parts


def fill_body(chars: int) -> str:
    """A body of exactly ``chars`` characters: numbered lines with non-ASCII text (all in the BMP), ending ``<end>``."""
    lines: list[str] = []
    total = 0
    i = 0
    while total < chars:
        line = f"conformance line {i:05d}: grüße, € 5, ✓ naïve café\n"
        lines.append(line)
        total += len(line)
        i += 1
    text = "".join(lines)
    if chars <= len(FILL_END):
        return FILL_END[:chars]
    return text[: chars - len(FILL_END)] + FILL_END


def _attachment_bytes(data: Mapping[str, Any]) -> bytes:
    if "text" in data:
        return str(data["text"]).encode("utf-8")
    return bytes.fromhex(data["hex"])


def _staged(data: Mapping[str, Any]) -> dict[str, Any]:
    """An attachment as the outbox consumer hands it to ``send``: name, type, size, SHA-256 and the bytes."""
    content = _attachment_bytes(data)
    return {"name": data["name"], "mime_type": data.get("mime_type", "application/octet-stream"),
            "size_bytes": len(content), "sha256": hashlib.sha256(content).hexdigest(), "content": content}


def build_part(case: Case, limits: Any) -> Any:
    """The ``DeliveryPart`` of a case (body filled to ``limits.max_chars`` when it asks for that)."""
    spec = case.input.get("part") or {}
    body = spec.get("body", f"conformance delivery for {case.id}\nsecond line")
    if isinstance(body, dict):
        body = fill_body(int(limits.max_chars))
    index, count = int(spec.get("index", 1)), int(spec.get("count", 1))
    key = spec.get("idempotency_key") or f"conformance-{uuid.uuid4().hex[:16]}:part:{index}/{count}"
    return DeliveryPart(idempotency_key=key, index=index, count=count, body=body, run_id=str(uuid.uuid4()),
                        job_id=str(uuid.uuid4()), attachments=tuple(_staged(a) for a in spec.get("attachments", ())))


# --------------------------------------------------------------------------- load-time checks


def _check_channel_case(case: Case) -> None:
    """What the schema cannot say: index within count, earlier answers transient, expectations that fit the answers."""
    spec = case.input.get("part") or {}
    if int(spec.get("index", 1)) > int(spec.get("count", 1)):
        raise ValueError(f"part index {spec.get('index')} is past its count {spec.get('count', 1)}")
    answers = [ServiceAnswer.from_case(a) for a in case.input.get("answers", DEFAULT_ANSWERS)]
    for answer in answers[:-1]:
        if answer.kind not in TRANSIENT_ANSWERS:
            raise ValueError(f"only the last answer may be {answer.kind!r}: an earlier attempt must fail transiently "
                             f"({', '.join(sorted(TRANSIENT_ANSWERS))}) for the part to be sent again")
    expect = case.expect
    outcome = expect["outcome"]
    last = answers[-1]
    if outcome == "delivered" and not last.accepts:
        raise ValueError(f"expect.outcome is delivered but the last answer is {last.kind!r}, not accept")
    if "retry_after_s" in expect and (outcome != "transient" or last.kind != "rate_limit" or last.retry_after_s is None):
        raise ValueError("expect.retry_after_s needs outcome transient and a last answer rate_limit with retry_after_s")
    if expect.get("attachments_delivered") and (outcome != "delivered" or not spec.get("attachments")):
        raise ValueError("expect.attachments_delivered needs outcome delivered and part.attachments")
    if expect.get("body_whole") and outcome != "delivered":
        raise ValueError("expect.body_whole needs outcome delivered")


# --------------------------------------------------------------------------- per provider


@attrs.frozen(kw_only=True)
class _ChannelContext:
    """What every case of one channel run shares: the route's driver name and the service adapter."""

    name: str
    adapter: Any


def _prepare_channel(name: str | None, provider: Any, service_adapter: Any) -> _ChannelContext:
    """Find the channel's service adapter once per run (``CONFORMANCE_NO_SERVICE_ADAPTER`` when there is none)."""
    adapter = resolve_service_adapter(name, provider, service_adapter)
    return _ChannelContext(name=name if name and _DRIVER_NAME.match(name) else ANONYMOUS_CHANNEL, adapter=adapter)


def _label(adapter: Any) -> str:
    return adapter.__name__ if isinstance(adapter, type) else type(adapter).__name__


def _declared(provider: Any) -> set[str]:
    return set(getattr(provider, "capabilities", ()) or ())


# --------------------------------------------------------------------------- running one case


#: What a stand-in must have (see ``scheduler.conformance.service``).
STAND_IN_MEMBERS = ("settings", "secrets", "target", "options", "respond_with", "received", "close")


def _run_channel_case(provider: Any, case: Case, workdir: Path, context: Any) -> CaseCheck:
    """Run one channel case: a stand-in from the service adapter, the channel configured at it, the sends, the checks."""
    unless = sorted(c for c in case.input.get("unless_declared", ()) if c in _declared(provider))
    if unless:
        return CaseCheck(skipped=f"the channel declares {', '.join(unless)}; this case is for channels that do not")
    adapter = context.adapter
    label = _label(adapter)
    answers = tuple(ServiceAnswer.from_case(a) for a in case.input.get("answers", DEFAULT_ANSWERS))
    request = ServiceRequest(case_id=case.id, channel=context.name, answers=answers, workdir=workdir,
                             timeout_s=CHANNEL_TIMEOUT_S)
    try:
        stand_in = adapter.conformance_service(request)
    except NotImplementedError as exc:
        return CaseCheck(skipped=f"service adapter {label} cannot give this case's answers: {exc or 'no reason given'}")
    except Exception as exc:  # noqa: BLE001 - an adapter bug fails the case, never the run
        return CaseCheck(problems=(f"service adapter {label} raised {type(exc).__name__}: {exc}",))
    try:
        missing = [m for m in STAND_IN_MEMBERS if not hasattr(stand_in, m)]
        if missing:
            without = ", ".join(missing)
            return CaseCheck(problems=(f"service adapter {label} returned {type(stand_in).__name__}, a stand-in without {without}",))
        return _run_with_stand_in(provider, case, context, stand_in, answers)
    finally:
        with contextlib.suppress(Exception):
            stand_in.close()


def _configure(provider: Any, name: str, settings: Any) -> str | None:
    """Validate the stand-in's settings table like the loader does and hand it to ``configure``; the problem, or None."""
    table = dict(settings or {})
    cls = settings_class_of(provider)
    if cls is None:
        if table:
            return f"the service adapter gives settings ({', '.join(sorted(table))}) but the channel declares no settings_class"
        return None
    resolved, problems = resolve_table(f"channels.{name}", cls, table, "the conformance service adapter", {})
    if problems or resolved is None:
        listed = "; ".join(f"{p.get('key') or p.get('field')}: {p['error']}" for p in problems)
        return f"the service adapter's settings do not validate against {cls.__name__}: {listed}"
    if isinstance(provider, Configurable):
        try:
            provider.configure(resolved.value)
        except Exception as exc:  # noqa: BLE001 - reported as the case's failure
            code = f" [{exc.code}]" if isinstance(exc, SchedulerError) else ""
            return f"configure() refused the service adapter's settings: {type(exc).__name__}{code}: {exc}"
    return None


def _limits_problem(limits: Any) -> str | None:
    if not isinstance(limits, ChannelLimits):
        return f"limits is {type(limits).__name__}, not a ChannelLimits"
    wrong = []
    for field, least in (("max_chars", 1), ("max_parts", 1), ("max_attachment_bytes", 0)):
        value = getattr(limits, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            wrong.append(f"{field}={value!r}")
    if not isinstance(limits.supports_attachments, bool):
        wrong.append(f"supports_attachments={limits.supports_attachments!r}")
    if isinstance(limits.max_chars, int) and limits.max_chars > 10_000_000:
        wrong.append(f"max_chars={limits.max_chars} (more than 10,000,000)")
    return f"limits are not usable: {', '.join(wrong)}" if wrong else None


@attrs.frozen(kw_only=True)
class _Attempt:
    """One ``send``: what the stand-in was told to answer, what ``send`` did, what the service saw."""

    answer: ServiceAnswer
    result: Any = None
    error: BaseException | None = None
    hung: bool = False
    duration_ms: int = 0
    seen: tuple[ReceivedMessage, ...] = ()
    logs: tuple[str, ...] = ()

    @property
    def outcome(self) -> str | None:
        """``delivered`` / ``transient`` / ``permanent``, or None when ``send`` did something else."""
        if self.hung:
            return None
        if self.error is None:
            return "delivered" if isinstance(self.result, DeliveryReceipt) else None
        if isinstance(self.error, TransientDeliveryError):
            return "transient"
        if isinstance(self.error, PermanentDeliveryError):
            return "permanent"
        return None

    def describe(self) -> str:
        """What ``send`` did, in one line."""
        if self.hung:
            return f"send() did not return within {self.duration_ms} ms"
        if self.error is not None:
            code = getattr(self.error, "code", None)
            extra = ""
            if hasattr(self.error, "retry_after_s"):
                extra = f" retry_after_s={self.error.retry_after_s!r}"
            return f"{type(self.error).__name__}{f' [{code}]' if code else ''}{extra}: {self.error}"
        if isinstance(self.result, DeliveryReceipt):
            details = json.dumps(dict(self.result.details or {}), default=str, ensure_ascii=False)
            return f"DeliveryReceipt receipt_id={self.result.receipt_id!r} details={details}"
        return f"returned {type(self.result).__name__}: {self.result!r}"[:300]


class _Capture(logging.Handler):
    """Keeps the messages of the records the worker thread emits (the channel's own logs, and its HTTP library's)."""

    def __init__(self, forward_at: int | None) -> None:
        super().__init__(logging.NOTSET)
        self.thread: int | None = None
        self.messages: list[str] = []
        self._forward_at = forward_at

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            try:
                text = record.getMessage()
            except Exception:  # noqa: BLE001 - a record that cannot be formatted is kept as its template
                text = str(record.msg)
            if record.exc_info and record.exc_info[1] is not None:
                text += f"\n{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
            self.messages.append(text)
        last_resort = logging.lastResort
        if self._forward_at is not None and record.levelno >= self._forward_at and last_resort is not None:
            last_resort.handle(record)  # nothing else handles it: what would have been printed still is


class _AtLeast(logging.Filter):
    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


@contextlib.contextmanager
def _capturing_logs(capture: _Capture) -> Iterator[None]:
    """Let INFO records through the root logger into ``capture`` while ``send`` runs; other handlers see what they did."""
    root = logging.getLogger()
    old_level = root.level
    handlers = list(root.handlers)
    guard = _AtLeast(old_level) if old_level > logging.INFO else None
    if guard is not None:
        for handler in handlers:
            handler.addFilter(guard)
        root.setLevel(logging.INFO)
    root.addHandler(capture)
    try:
        yield
    finally:
        root.removeHandler(capture)
        if guard is not None:
            root.setLevel(old_level)
            for handler in handlers:
                handler.removeFilter(guard)


def _send(provider: Any, part: Any, route: Any, answer: ServiceAnswer, stand_in: Any, limit_ms: int) -> _Attempt:
    """One ``send`` in a worker thread, its log records captured; closes the stand-in when it does not return in time."""
    outcome: dict[str, Any] = {}
    root = logging.getLogger()
    forward_at = max(root.level, logging.lastResort.level) if logging.lastResort and not root.handlers else None
    capture = _Capture(forward_at)

    def target() -> None:
        capture.thread = threading.get_ident()
        try:
            outcome["result"] = provider.send(part, route)
        except BaseException as exc:  # noqa: BLE001 - reported as the attempt's outcome
            outcome["error"] = exc

    before = len(stand_in.received())
    with _capturing_logs(capture):
        worker = threading.Thread(target=target, name="conformance-send", daemon=True)
        begin = time.monotonic()
        worker.start()
        worker.join(limit_ms / 1000)
        hung = worker.is_alive()
        if hung:
            with contextlib.suppress(Exception):
                stand_in.close()  # releases a hanging stand-in, so the channel's request ends
            worker.join(SEND_GRACE_MS / 1000)
        duration_ms = int((time.monotonic() - begin) * 1000)
    seen = tuple(stand_in.received()[before:])
    return _Attempt(answer=answer, result=outcome.get("result"), error=outcome.get("error"), hung=hung,
                    duration_ms=duration_ms, seen=seen, logs=tuple(capture.messages))


def _run_with_stand_in(provider: Any, case: Case, context: Any, stand_in: Any, answers: tuple[ServiceAnswer, ...]) -> CaseCheck:
    label = _label(context.adapter)
    secrets = {str(k): str(v) for k, v in dict(stand_in.secrets or {}).items()}
    secret_values = sorted({v for v in secrets.values() if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)

    def redact(value: Any) -> Any:
        if isinstance(value, str):
            for secret in secret_values:
                value = value.replace(secret, "<secret>")
            return value
        if isinstance(value, dict):
            return {k: redact(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [redact(v) for v in value]
        return value

    with _patched_environ(secrets):
        problem = _configure(provider, context.name, stand_in.settings)
        if problem:
            return CaseCheck(problems=(redact(problem),))
        declared = _declared(provider)
        missing = [c for c in case.requires if c not in declared]
        if missing:
            return CaseCheck(skipped=f"configured for its stand-in, the channel does not declare capability {', '.join(missing)}")
        unless = sorted(c for c in case.input.get("unless_declared", ()) if c in declared)
        if unless:
            return CaseCheck(skipped=f"configured for its stand-in, the channel declares {', '.join(unless)}; this case is for "
                                     "channels that do not")
        limits = getattr(provider, "limits", None)
        problem = _limits_problem(limits)
        if problem:
            return CaseCheck(problems=(problem,))
        part = build_part(case, limits)
        try:
            options = channel_options_for(provider, dict(stand_in.options or {}))
        except SchedulerError as exc:
            return CaseCheck(problems=(redact(f"the service adapter's delivery_options do not validate: {exc.code}: "
                                              f"{exc.message}"),))
        route = DeliveryRoute(channel=context.name, target=stand_in.target, options=options)
        expect = case.expect
        limit_ms = SEND_LIMIT_MS
        if "max_duration_ms" in expect:
            limit_ms = min(limit_ms, expect["max_duration_ms"] + MAX_DURATION_GRACE_MS)
        attempts: list[_Attempt] = []
        for answer in answers:
            try:
                stand_in.respond_with(answer)
            except NotImplementedError as exc:
                return CaseCheck(skipped=f"service adapter {label} cannot give the answer {answer.kind}: "
                                         f"{exc or 'no reason given'}")
            attempt = _send(provider, part, route, answer, stand_in, limit_ms)
            attempts.append(attempt)
            if attempt.hung or attempt.outcome != "transient":
                break
        problems = _compare(case, part, limits, declared, attempts, secret_values, stand_in)
    if not problems:
        return CaseCheck()
    observed = _observed(part, limits, attempts, secrets)
    return CaseCheck(problems=tuple(redact(p) for p in problems), observed=redact(observed))


# --------------------------------------------------------------------------- checks


def _leaks(attempt: _Attempt, secrets: list[str]) -> list[str]:
    """Where a secret value shows in what ``send`` produced."""
    if not secrets:
        return []
    places: dict[str, str] = {}
    error = attempt.error
    if error is not None:
        texts = [str(error), repr(error.args), str(getattr(error, "message", "")), str(getattr(error, "code", ""))]
        places["the error (message, code or args)"] = "\n".join(texts)
    result = attempt.result
    if result is not None and error is None:
        details = getattr(result, "details", None)
        try:
            details_text = json.dumps(dict(details or {}), default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            details_text = repr(details)
        places["the receipt"] = f"{getattr(result, 'receipt_id', '')}\n{details_text}\n{result!r}"
    places["a log record emitted while sending"] = "\n".join(attempt.logs)
    return [f"a secret of the channel's settings appears in {where}" for where, text in places.items()
            if any(secret in text for secret in secrets)]


def _shape_problems(attempt: _Attempt) -> list[str]:
    """What is wrong with what ``send`` returned or raised, whatever the case expects."""
    if attempt.hung:
        return [(f"send() did not return within {attempt.duration_ms} ms (the stand-in was told: {attempt.answer.kind}); "
                 "the channel must give up on its own (a timeout of its own)")]
    error, result = attempt.error, attempt.result
    if error is not None:
        if not isinstance(error, DeliveryError) or attempt.outcome is None:
            code = f" [{error.code}]" if isinstance(error, SchedulerError) else ""
            return [(f"send() raised {type(error).__name__}{code}: {error} -- a failure must be a TransientDeliveryError or "
                     "a PermanentDeliveryError")]
        problems = []
        if not isinstance(error.code, str) or not _ERROR_CODE.match(error.code):
            problems.append(f"error code {error.code!r} is not UPPER_SNAKE")
        if not isinstance(error.message, str) or not error.message.strip():
            problems.append("the error has no message")
        retry_after = getattr(error, "retry_after_s", None)
        if retry_after is not None and (not isinstance(retry_after, (int, float)) or isinstance(retry_after, bool)
                                        or retry_after < 0):
            problems.append(f"retry_after_s {retry_after!r} is not a non-negative number of seconds")
        return problems
    if not isinstance(result, DeliveryReceipt):
        return [f"send() returned {type(result).__name__}, not a DeliveryReceipt"]
    problems = []
    if result.receipt_id is not None and not isinstance(result.receipt_id, str):
        problems.append(f"receipt_id {result.receipt_id!r} is not a string or None")
    if not isinstance(result.details, Mapping):
        problems.append(f"receipt details is {type(result.details).__name__}, not a mapping")
    return problems


def _compare(case: Case, part: Any, limits: Any, declared: set[str], attempts: list[_Attempt], secrets: list[str],
             stand_in: Any) -> list[str]:
    """Every difference between what happened and the case's ``expect``, plus the checks every case makes."""
    expect = case.expect
    problems = [f"the stand-in: {p}" for p in list(getattr(stand_in, "problems", None) or ())]
    if part.attachments:
        if ("attachments" in declared) != limits.supports_attachments:
            problems.append(f"the channel {'declares' if 'attachments' in declared else 'does not declare'} the attachments "
                            f"capability but limits.supports_attachments is {limits.supports_attachments}")
        largest = max(a["size_bytes"] for a in part.attachments)
        if limits.supports_attachments and limits.max_attachment_bytes < largest:
            problems.append(f"limits.max_attachment_bytes ({limits.max_attachment_bytes}) is smaller than the case's "
                            f"{largest}-byte file")
    answers_n = len(case.input.get("answers", DEFAULT_ANSWERS))
    several = answers_n > 1
    for number, attempt in enumerate(attempts, 1):
        where = f"attempt {number} ({attempt.answer.kind}): " if several else ""
        problems += [where + p for p in _shape_problems(attempt)]
        problems += [where + p for p in _leaks(attempt, secrets)]
        if number < answers_n and attempt.outcome not in (None, "transient"):
            problems.append(f"{where}expected a TransientDeliveryError (the service answered {attempt.answer.kind}), "
                            f"got {attempt.describe()}")
        if len(attempt.seen) > 1 and not part.attachments:
            problems.append(f"{where}one send() made the service see {len(attempt.seen)} messages: a part without files is one "
                            "request per attempt (the outbox retries; a channel that retries inside send, or sends twice, "
                            "duplicates the part)")
        if "max_duration_ms" in expect and attempt.duration_ms > expect["max_duration_ms"] and not attempt.hung:
            problems.append(f"{where}send() took {attempt.duration_ms} ms, more than {expect['max_duration_ms']} ms")
    final = attempts[-1]
    expected, got = expect["outcome"], final.outcome
    accepted_now = [m for m in final.seen if m.accepted]
    if len(attempts) == answers_n and got is not None and got != expected:
        said = f"the service answered {final.answer.kind}"
        if final.answer.kind == "accept" and part.attachments and expected == "permanent":
            said = "the part carries files and limits.supports_attachments is false"
        if got == "delivered" and not accepted_now:
            problems.append(f"expected {_OUTCOME_TEXT[expected]} ({said}), got a receipt although the service accepted no "
                            "message: a failure swallowed")
        else:
            problems.append(f"expected {_OUTCOME_TEXT[expected]} ({said}), got {final.describe()}")
    if expected == "delivered" and got == "delivered" and not accepted_now:
        problems.append("send() returned a receipt but the service accepted no message")
    if "retry_after_s" in expect and got == "transient":
        given = getattr(final.error, "retry_after_s", None)
        if given is None:
            problems.append(f"retry_after_s: expected {expect['retry_after_s']} (the service said Retry-After: "
                            f"{final.answer.retry_after_s}), got None")
        elif isinstance(given, (int, float)) and abs(given - expect["retry_after_s"]) > RETRY_AFTER_TOLERANCE_S:
            problems.append(f"retry_after_s: expected {expect['retry_after_s']}, got {given!r}")
    seen = [m for attempt in attempts for m in attempt.seen]
    if "delivered_messages" in expect:
        count = sum(1 for m in seen if m.accepted)
        if count != expect["delivered_messages"]:
            problems.append(f"the service accepted {count} message(s), expected {expect['delivered_messages']}")
    if expect.get("body_whole") and got == "delivered" and not any(part.body in m.text for m in accepted_now):
        longest = max((len(m.text) for m in accepted_now), default=0)
        problems.append(f"the body ({len(part.body)} characters, within limits.max_chars={limits.max_chars}) did not "
                        f"arrive whole in one message (the longest text the service accepted has {longest} characters)")
    if expect.get("idempotency_key_carried"):
        if not seen:
            problems.append("the service saw no message, so no idempotency key either")
        for number, message in enumerate(seen, 1):
            if message.idempotency_key != part.idempotency_key:
                problems.append(f"message {number} the service saw carried the idempotency key {message.idempotency_key!r}, "
                                f"not the part's {part.idempotency_key!r}")
    if expect.get("attachments_delivered") and got == "delivered":
        files = [f for m in accepted_now for f in m.files]
        for attachment in part.attachments:
            same_name = [f for f in files if f.name == attachment["name"]]
            if not same_name:
                names = ", ".join(repr(f.name) for f in files) or "none"
                problems.append(f"attachment {attachment['name']!r} did not reach the service (files received: {names})")
            elif not any(f.content == attachment["content"] for f in same_name):
                problems.append(f"attachment {attachment['name']!r} reached the service with other bytes "
                                f"({len(same_name[0].content)} bytes, not {attachment['size_bytes']})")
    return problems


def _observed(part: Any, limits: Any, attempts: list[_Attempt], secrets: Mapping[str, str]) -> dict[str, Any]:
    """What a failure shows besides the differences: each attempt, what the service saw, the part and the limits.

    The caller redacts the secret values; the log records that held one are listed (redacted) to show where.
    """
    values = [v for v in secrets.values() if len(v) >= MIN_SECRET_CHARS]
    leaking = [line for a in attempts for line in a.logs if any(v in line for v in values)]
    extra = {"leaking_log_records": leaking[:5]} if leaking else {}
    return {
        "result": attempts[-1].describe() if attempts else "no attempt",
        "attempts": [{"answer": a.answer.kind, "send": a.describe(), "duration_ms": a.duration_ms,
                      "service_saw": [m.summary() for m in a.seen]} for a in attempts],
        "part": {"idempotency_key": part.idempotency_key, "index": part.index, "count": part.count,
                 "body_chars": len(part.body), "attachments": [a["name"] for a in part.attachments]},
        "limits": attrs.asdict(limits) if attrs.has(type(limits)) else repr(limits),
        "secrets": sorted(secrets),
        **extra,
    }


register_adapter(
    KindAdapter(kind="channel", check_case=_check_channel_case, run=_run_channel_case, prepare=_prepare_channel)
)
