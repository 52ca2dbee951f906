"""The engine's adapter for kind ``credential``: resolve a case's binding through a provider, as the kernel would.

Per case, the provider's **source adapter** starts a stand-in of the credential's source
(a variable, a private file, a command, a loopback OAuth2 token endpoint) able to give
the case's answer (``source``: ``value``, ``missing``, ``empty``, ``refused``,
``failure``, ``malformed``, ``expired``, ``slow``) and says how to point the provider at
it. A source adapter is any object with

    conformance_source(request: SourceRequest) -> stand-in

and the stand-in has ``settings`` (the ``[providers.NAME]`` table, secret fields as
references), ``secrets`` (environment variables those references read, set while the
case runs), ``ref`` (the binding's ``ref``), ``values()`` (every value the source held or
issued), optionally ``revoked()`` (values it confirmed revoked) and ``close()``. A source
that cannot give an answer raises ``NotImplementedError("why")``: the case is skipped
with that reason, never passed. The engine finds the adapter as the channel kind finds
its service adapter: the one given (``--adapter MODULE:ATTR``), the provider's own
``conformance_source`` method, the entry point named like the provider in
``scheduler.conformance_adapters``; else ``CONFORMANCE_NO_SOURCE_ADAPTER``.

Each ``resolve`` goes through the kernel's own checks (``scheduler.pipeline.credentials.step``), not a
copy of them: bounded in time (``call_bounded``: ``CREDENTIAL_RESOLVE_TIMEOUT``), the
answer for exactly this binding (``CREDENTIAL_BINDING_MISMATCH``), not expired
(``CREDENTIAL_EXPIRED``), a usable value for its medium. Then it compares with
``expect`` and always checks: a refusal is a ``SchedulerError`` with a ``CREDENTIAL_*``
code and a message (never another exception); a presented value is one the source held;
the provider gave up on its own within its configured timeout; ``refresh`` returns a
``RefreshResult`` whose credential passes the same checks; ``revoke`` returns an explicit
``RevokeResult`` and says ``revoked`` only when the source confirmed it; a revoked value
is never presented again; and no value or source secret appears in an error, an answer's
``metadata`` or ``repr``, a log record, or what the provider reported to the kernel's
session bookkeeping (``CredentialContext.sessions``, a ``MemoryProviderSessions`` here).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.options import build_options
from scheduler.conformance.engine import Case, CaseCheck, KindAdapter, _patched_environ, register_adapter
from scheduler.conformance.kinds import ProviderContext, adapter_label, configure_provider, provider_context
from scheduler.conformance.kinds import resolve_adapter as _resolve_adapter
from scheduler.core.members import options_class_of
from scheduler.pipeline.credentials.sessions import MemoryProviderSessions
from scheduler.pipeline.credentials.step import _check_answer, _value_bytes, call_bounded
from scheduler.plugins.protocols import (
    CredentialBinding,
    CredentialContext,
    CredentialPresent,
    RefreshResult,
    ResolvedCredential,
    RevokeResult,
)

#: The method every source adapter has.
SOURCE_METHOD = "conformance_source"
#: What a stand-in source can be asked to do (the schema's ``credential_input.source`` lists the same).
SOURCES: dict[str, str] = {
    "value": "hold a valid value for the ref",
    "missing": "hold nothing for the ref",
    "empty": "hold an empty value",
    "refused": "refuse access (a file readable by others, a denied variable, a client secret refused with HTTP 401)",
    "failure": "fail (a command exiting non-zero, HTTP 500)",
    "malformed": "answer with something that is not a credential (a token endpoint's non-JSON answer)",
    "expired": "hand out a value that has already expired",
    "slow": "take longer than the provider's configured timeout",
}
#: How a stand-in answers a revocation (``credential_input.revoke_answer``).
REVOKE_ANSWERS = ("accept", "unavailable", "reject")
#: The timeout (seconds) source adapters are asked to configure in the provider (``SourceRequest.timeout_s``) for the
#: ``slow`` case, whose source answers later than this and whose provider must give up on its own.
SOURCE_TIMEOUT_S = 2.0
#: The timeout the other cases configure: they test answers, not time, so an answer a loaded machine delays past
#: ``SOURCE_TIMEOUT_S`` (a loopback round trip under a parallel test run) is still the answer (below ``CALL_LIMIT_S``).
ANSWER_TIMEOUT_S = 6.0
#: How long one provider call may take before the engine's bound (the kernel's ``call_bounded``) ends it.
CALL_LIMIT_S = 8.0
#: A secret shorter than this is not searched for (it would match by accident).
MIN_SECRET_CHARS = 6

_CODE = re.compile(r"^CREDENTIAL_[A-Z0-9]+(_[A-Z0-9]+)*$")


@attrs.frozen(kw_only=True)
class SourceRequest:
    """What a source adapter is asked for: the case, the source's answer, how to answer a revocation, a directory."""

    case_id: str
    provider: str
    source: str
    workdir: Path
    revoke_answer: str | None = None
    timeout_s: float = SOURCE_TIMEOUT_S


def _check_credential_case(case: Case) -> None:
    """What the schema cannot say: steps that fit the expectation."""
    if case.input.get("settings", "configured") == "empty" and case.expect.get("outcome") != "refused":
        raise ValueError("a case with empty settings expects outcome refused")
    steps = list(case.input.get("steps", ["resolve"]))
    if steps[0] != "resolve":
        raise ValueError("the first step must be resolve (refresh and revoke act on a resolved credential)")
    expect = case.expect
    if "revoke" in expect and "revoke" not in steps:
        raise ValueError("expect.revoke needs a revoke step")
    if "refreshed" in expect and "refresh" not in steps:
        raise ValueError("expect.refreshed needs a refresh step")
    if ("revoke" in steps or "refresh" in steps) and expect.get("outcome") != "presented":
        raise ValueError("refresh and revoke steps need expect.outcome presented")
    if "revoke" in steps and "revoke_answer" not in case.input:
        raise ValueError("a revoke step needs input.revoke_answer")


# --------------------------------------------------------------------------- per provider


def resolve_source_adapter(name: str | None, provider: Any, explicit: Any = None) -> Any:
    """The source adapter of credential provider ``name`` (explicit, the provider's own method, the entry point)."""
    return _resolve_adapter(name, provider, explicit, method=SOURCE_METHOD, role="source", subject="credential",
                            missing_code="CONFORMANCE_NO_SOURCE_ADAPTER",
                            missing_why="there is no stand-in credential source to resolve from")


def _prepare_credential(name: str | None, provider: Any, adapter: Any) -> ProviderContext:
    return provider_context(name, resolve_source_adapter(name, provider, adapter), "conformance-credential")


# --------------------------------------------------------------------------- running one case


class _Logs(logging.Handler):
    """Every log record emitted while a case runs (any thread: the provider may log from a helper)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.messages.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _capturing_logs() -> Iterator[_Logs]:
    root = logging.getLogger()
    handler = _Logs()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def _binding(case: Case, provider: Any, name: str, ref: str) -> Any:
    spec = dict(case.input.get("binding") or {})
    present = CredentialPresent(**spec.get("present", {"medium": "env", "key": "CONFORMANCE_TOKEN"}))
    options = spec.get("options")
    cls = options_class_of(provider)
    if cls is not None:
        options = build_options(cls, options or {}, "credentials.options")
    return CredentialBinding(name=spec.get("name", "conformance"), provider=name, ref=ref, present=present,
                             required=spec.get("required", True), options=options)


@attrs.define
class _Step:
    """One provider call: what it was, what came back, how long it took."""

    action: str
    result: Any = None
    error: BaseException | None = None
    duration_ms: int = 0

    def describe(self) -> str:
        if self.error is not None:
            code = getattr(self.error, "code", None)
            return f"{self.action}: {type(self.error).__name__}{f' [{code}]' if code else ''}: {self.error}"
        return f"{self.action}: {self.result!r}"[:300]


def _kernel_resolve(provider: Any, binding: Any, context: Any) -> Any:
    """``resolve`` exactly as the kernel calls and checks it (``scheduler.pipeline.credentials.step``); the checked answer."""
    where = {"binding": binding.name, "provider": binding.provider}
    answer = call_bounded(lambda: provider.resolve(binding, context), CALL_LIMIT_S, code="CREDENTIAL_RESOLVE_TIMEOUT",
                          what=f"credential {binding.name!r}: provider {binding.provider!r}", details=where)
    if not isinstance(answer, ResolvedCredential):
        raise TypeError(f"resolve returned {type(answer).__name__}, not a ResolvedCredential")
    _check_answer(binding, answer, where)
    _value_bytes(binding, answer.value, where)
    return answer


def _timed(action: str, fn: Any) -> _Step:
    step = _Step(action=action)
    begin = time.monotonic()
    try:
        step.result = fn()
    except BaseException as exc:  # noqa: BLE001 - the step's outcome
        step.error = exc
    step.duration_ms = int((time.monotonic() - begin) * 1000)
    return step


def _run_credential_case(provider: Any, case: Case, workdir: Path, context: Any) -> CaseCheck:
    """One case: a stand-in source, the provider configured at it, the steps, the checks."""
    adapter = context.adapter
    source = case.input.get("source", "value")
    request = SourceRequest(case_id=case.id, provider=context.name, source=source, workdir=workdir,
                            revoke_answer=case.input.get("revoke_answer"),
                            timeout_s=SOURCE_TIMEOUT_S if source == "slow" else ANSWER_TIMEOUT_S)
    try:
        stand_in = adapter.conformance_source(request)
    except NotImplementedError as exc:
        return CaseCheck(skipped=f"source adapter {adapter_label(adapter)} cannot give this case's source: {exc or 'no reason given'}")
    except Exception as exc:  # noqa: BLE001 - an adapter bug fails the case
        return CaseCheck(problems=(f"source adapter {adapter_label(adapter)} raised {type(exc).__name__}: {exc}",))
    try:
        return _run_with_source(provider, case, context, stand_in)
    finally:
        with contextlib.suppress(Exception):
            stand_in.close()


def _forms(value: str) -> list[str]:
    raw = value.encode("utf-8", "replace")
    return [value, base64.b64encode(raw).decode().rstrip("="), raw.hex()]


def _run_with_source(provider: Any, case: Case, context: Any, stand_in: Any) -> CaseCheck:
    secrets = {str(k): str(v) for k, v in dict(getattr(stand_in, "secrets", None) or {}).items()}
    expect = case.expect
    with _patched_environ(secrets):
        if case.input.get("settings", "configured") == "empty":
            if not dict(getattr(stand_in, "settings", None) or {}):
                return CaseCheck(skipped="the provider's source configures nothing on the host (nothing to leave out)")
            if configure_provider(provider, context.name, {}, role="source", which="empty settings") is not None:
                return CaseCheck()  # the host refuses to configure (load) the provider without its table: fail closed
        else:
            problem = configure_provider(provider, context.name, getattr(stand_in, "settings", None), role="source")
            if problem:
                return CaseCheck(problems=(problem,))
        declared = set(getattr(provider, "capabilities", ()) or ())
        missing = [c for c in case.requires if c not in declared]
        if missing:
            return CaseCheck(skipped=f"the provider does not declare capability {', '.join(missing)}")
        try:
            binding = _binding(case, provider, context.name, stand_in.ref)
        except SchedulerError as exc:
            return CaseCheck(problems=(f"the case's binding options do not validate: {exc.code}: {exc.message}",))
        sessions = MemoryProviderSessions()
        ctx = CredentialContext(run_id=str(uuid.uuid4()), job_id=str(uuid.uuid4()), sessions=sessions)
        steps: list[_Step] = []
        current: Any = None
        with _capturing_logs() as logs:
            for action in case.input.get("steps", ["resolve"]):
                if action == "resolve":
                    step = _timed("resolve", lambda: _kernel_resolve(provider, binding, ctx))
                    if step.error is None:
                        current = step.result
                elif action == "refresh":
                    step = _timed("refresh", lambda: provider.refresh(current, binding, ctx))  # noqa: B023 - _timed calls it at once
                else:
                    step = _timed("revoke", lambda: provider.revoke(current, binding, ctx))  # noqa: B023 - _timed calls it at once
                steps.append(step)
                if action == "resolve" and step.error is not None:
                    break
    problems: list[str] = []
    held = set(stand_in.values())
    first = steps[0]
    want = expect["outcome"]
    if want == "presented" and first.error is not None:
        problems.append(f"expected the value to be presented, got {first.describe()}")
    if want == "refused" and first.error is None:
        problems.append(f"expected a refusal (the source was told: {case.input.get('source', 'value')}), but a value was "
                        "presented")
    for step in steps:
        problems += _step_problems(step, binding, expect, held)
    if "error_code" in expect and first.error is not None and getattr(first.error, "code", None) != expect["error_code"]:
        problems.append(f"error_code: expected {expect['error_code']}, got {getattr(first.error, 'code', None)!r}")
    revoked_values: list[str] = []
    for i, step in enumerate(steps):
        if step.action == "refresh" and step.error is None:
            result = step.result
            if not isinstance(result, RefreshResult):
                problems.append(f"refresh returned {type(result).__name__}, not a RefreshResult")
            elif "refreshed" in expect and result.refreshed is not expect["refreshed"]:
                problems.append(f"refresh: expected refreshed={expect['refreshed']}, got {result.refreshed} ({result.reason})")
            elif result.refreshed:
                problems += _refreshed_problems(result, binding, held)
        if step.action == "revoke" and step.error is None:
            result = step.result
            if not isinstance(result, RevokeResult):
                problems.append(f"revoke returned {type(result).__name__}, not a RevokeResult")
                continue
            if result.outcome != expect.get("revoke", result.outcome):
                problems.append(f"revoke: expected {expect['revoke']!r}, got {result.outcome!r} ({result.reason})")
            value = _text(steps[0].result.value) if steps[0].error is None else None
            confirmed = set(getattr(stand_in, "revoked", list)())
            if result.outcome == "revoked" and value not in confirmed:
                problems.append("revoke answered revoked, but the source never confirmed a revocation of the value")
            if value is not None:
                revoked_values.append(value)
            for later in steps[i + 1:]:
                if later.action == "resolve" and later.error is None and _text(later.result.value) in revoked_values:
                    problems.append("a value whose revocation was attempted was presented again")
        if step.error is not None and step.action != "resolve":
            problems.append(f"{step.action} raised {type(step.error).__name__}: {step.error} (it must return a result, "
                            "never raise)")
    values = [v for v in held if len(v) >= MIN_SECRET_CHARS] + [v for v in secrets.values() if len(v) >= MIN_SECRET_CHARS]
    problems += _leaks(steps, logs.messages, sessions, values)
    if problems:
        return CaseCheck(problems=tuple(_redact(p, values) for p in problems),
                         observed={"steps": [_redact(s.describe(), values) for s in steps],
                                   "sessions": [_redact(repr(r), values) for r in sessions.records.values()]})
    return CaseCheck()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _step_problems(step: _Step, binding: Any, expect: dict[str, Any], held: set[str]) -> list[str]:
    problems: list[str] = []
    if "max_duration_ms" in expect and step.duration_ms > expect["max_duration_ms"]:
        problems.append(f"{step.action} took {step.duration_ms} ms, more than {expect['max_duration_ms']} ms")
    if step.action != "resolve":
        return problems
    error = step.error
    if error is None:
        if _text(step.result.value) not in held:
            problems.append("resolve presented a value the source never held or issued")
        return problems
    if not isinstance(error, SchedulerError):
        problems.append(f"resolve raised {type(error).__name__}: {error} -- a refusal must be a SchedulerError with a "
                        "CREDENTIAL_* code")
        return problems
    if error.code == "CREDENTIAL_RESOLVE_TIMEOUT":
        problems.append(f"resolve did not return within {CALL_LIMIT_S:g} s (the kernel's bound ended it); the provider must "
                        f"give up on its own within its configured timeout ({SOURCE_TIMEOUT_S:g} s)")
    elif not _CODE.match(error.code or ""):
        problems.append(f"error code {error.code!r} is not CREDENTIAL_* UPPER_SNAKE")
    if not (error.message or "").strip():
        problems.append("the refusal has no message")
    return problems


def _refreshed_problems(result: Any, binding: Any, held: set[str]) -> list[str]:
    if result.credential is None:
        return ["refresh answered refreshed=True without a credential"]
    try:
        _check_answer(binding, result.credential, {"binding": binding.name, "provider": binding.provider})
    except SchedulerError as exc:
        return [f"the refreshed credential would be refused: {exc.code}: {exc.message}"]
    if _text(result.credential.value) not in held:
        return ["refresh returned a value the source never issued"]
    return []


def _leaks(steps: list[_Step], logs: list[str], sessions: Any, values: list[str]) -> list[str]:
    if not values:
        return []
    places: dict[str, str] = {}
    for step in steps:
        if step.error is not None:
            e = step.error
            places[f"the {step.action} error"] = "\n".join([str(e), repr(e.args), str(getattr(e, "message", "")),
                                                           json.dumps(getattr(e, "details", None), default=str)])
        elif step.result is not None:
            result = step.result
            credential = getattr(result, "credential", result)
            meta = getattr(credential, "metadata", None)
            places[f"the {step.action} answer's metadata or repr"] = (
                json.dumps(dict(meta or {}), default=str) + repr(result) + str(getattr(result, "reason", "")))
    places["a log record"] = "\n".join(logs)
    places["the provider's session records"] = repr(list(sessions.records.values()))
    found = []
    for where, text in places.items():
        if any(form in text for v in values for form in _forms(v)):
            found.append(f"a credential value or source secret appears in {where}")
    return found


def _redact(text: str, values: list[str]) -> str:
    for v in sorted(values, key=len, reverse=True):
        for form in _forms(v):
            text = text.replace(form, "<secret>")
    return text


register_adapter(
    KindAdapter(kind="credential", check_case=_check_credential_case, run=_run_credential_case, prepare=_prepare_credential)
)


__all__ = ["REVOKE_ANSWERS", "SOURCES", "SOURCE_METHOD", "SourceRequest", "resolve_source_adapter"]
