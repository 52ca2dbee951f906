"""The engine's adapter for kind ``evidence``: attest a payload through a provider, change something, verify.

Per case, the provider's **setup adapter** prepares what the provider needs to attest and
verify (nothing for a checksum; real ``ssh-keygen`` keys and allowed-signers files for
SSH; a reference attestor for the external provider) for the case's ``signer``
(``trusted``, ``untrusted_key``, ``other_principal``, ``other_namespace``) and says how
to configure the provider. A setup adapter is any object with

    conformance_setup(request: SetupRequest) -> setup

and the setup has ``settings`` (the ``[providers.NAME]`` table used to attest),
optionally ``verify_settings`` (the table used to verify; default: ``settings``),
``provider_config`` (the job's ``evidence.provider_config``), ``secrets`` (environment
variables set while the case runs), ``signature_field`` (the path, inside the envelope's
``data``, of the signature or keyed attestation: truncated by ``signature_truncated``),
``secret_values()`` (key material that must never appear in an envelope, an error, a
verification or a log record) and ``close()``. A signer the adapter cannot set up raises
``NotImplementedError("why")``: the case is skipped with that reason, never passed. The
engine finds the adapter as the other kinds do: the one given (``--adapter MODULE:ATTR``),
the provider's own ``conformance_setup`` method, the entry point named like the provider
in ``scheduler.conformance_adapters``; else ``CONFORMANCE_NO_SETUP_ADAPTER``.

A case attests a kernel-shaped payload (``EvidencePayload``: json-sort-v1 bytes and their
digest) with the declaration the kernel would hand over, holds the envelope to the
kernel's own acceptance checks (an ``EvidenceEnvelope`` of this provider for this payload,
storable as canonical JSON), stores it as the kernel does and verifies the stored form,
after the case's ``tamper``. Whatever the case expects, the engine also checks: ``verify``
never raises and returns an ``EvidenceVerification`` naming the provider, a refusal has an
``EVIDENCE_*`` code and a reason, an ``attest`` refusal is a ``SchedulerError`` with an
``EVIDENCE_*`` code, and no secret value leaks. Before a negative verification counts,
the untouched envelope must verify (with the signer's own settings): a provider that
refuses everything proves nothing by refusing a tampered envelope.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.canonical import canonical_bytes, hash_bytes
from scheduler.base.errors import SchedulerError
from scheduler.conformance.engine import Case, CaseCheck, KindAdapter, _patched_environ, register_adapter
from scheduler.conformance.kinds import ProviderContext, adapter_label, configure_provider, expected_codes, provider_context
from scheduler.conformance.kinds import resolve_adapter as _resolve_adapter
from scheduler.evidence.providers import envelope_json, to_provider_declaration
from scheduler.plugins.protocols import EvidenceEnvelope, EvidencePayload, EvidenceVerification

#: The method every setup adapter has.
SETUP_METHOD = "conformance_setup"
#: Who signs, as the verifier sees it (the schema's ``evidence_input.signer`` lists the same).
SIGNERS: dict[str, str] = {
    "trusted": "a key (or attestor) the verifier trusts, for the expected principal and namespace",
    "untrusted_key": "a key the verifier does not trust (its trust holds another key)",
    "other_principal": "a key the verifier trusts only for another principal",
    "other_namespace": "a trusted key, signing in a namespace the verifier does not expect",
}
#: What the engine changes between attesting and verifying (``evidence_input.tamper``).
TAMPERS: dict[str, str] = {
    "none": "nothing",
    "payload": "one value of the payload (the exit code), the envelope unchanged",
    "payload_rebound": "the payload, and every copy of its digest and text in the envelope rewritten to match",
    "transplant": "the envelope is the one attested for another run's payload",
    "signature_truncated": "the signature (setup.signature_field) cut to half its length",
    "provider_relabelled": "the envelope's provider renamed",
    "foreign_envelope": "an envelope made by another provider",
    "method_unknown": "the envelope's method replaced by one no provider performs",
    "envelope_not_object": "the stored envelope is a JSON string, not an object",
    "data_not_object": "the envelope's data is a string",
    "data_field_added": "the envelope's data gains an unknown field",
    "data_field_removed": "the envelope's data loses a field (not schema, version, method or payload_digest)",
    "digest_malformed": "the envelope's payload_digest (both copies) is not sha256: and 64 hex digits",
    "data_value_changed": ("each value of the envelope's data but schema, version, method and payload_digest changed in turn "
                           "(a string's last character, a number plus one): every one must be refused"),
}
#: What the verifier is configured with when it verifies (``evidence_input.trust``).
TRUSTS: dict[str, str] = {
    "configured": "the setup's own settings",
    "empty": "an empty [providers.NAME] table (the host has no trust or key configured)",
    "unreadable": "the setup's settings, every file of the case's directory they name moved away (then configured again)",
}
#: What is wrong with the payload handed to ``attest`` (``evidence_input.payload_defect``).
PAYLOAD_DEFECTS = ("noncanonical", "digest_wrong")
#: How long one provider call may take before the engine gives up on it (a signature or an attestor round trip takes
#: milliseconds; a provider that hangs fails the case after this).
CALL_LIMIT_S = 10.0
#: A secret shorter than this is not searched for (it would match by accident).
MIN_SECRET_CHARS = 8
UNKNOWN_METHOD = "conformance-no-such-method"
FOREIGN_PROVIDER = "conformance-foreign"

_CODE = re.compile(r"^EVIDENCE_[A-Z0-9]+(_[A-Z0-9]+)*$")


@attrs.frozen(kw_only=True)
class SetupRequest:
    """What a setup adapter is asked for: the case, who signs, and a directory (removed after the case)."""

    case_id: str
    provider: str
    signer: str
    workdir: Path


class EvidenceSetup:
    """What a setup adapter may return: the tables to attest and verify with, the secrets, where the signature is.

    ``settings`` is the ``[providers.NAME]`` table used to attest (and to verify, unless
    ``verify_settings`` is given); ``provider_config`` the job's ``evidence.provider_config``;
    ``secrets`` environment variables set while the case runs; ``signature_field`` the key (a
    string) or the path (a tuple of keys) inside the envelope's ``data`` of the signature or MAC;
    ``secret_values`` the key material that must never appear in an envelope, an error, a
    verification or a log record; ``on_close`` what ``close`` runs (removing a key agent ...).
    Any object with these attributes works as well; this one is the short way.
    """

    def __init__(self, settings: dict[str, Any] | None = None, *, verify_settings: dict[str, Any] | None = None,
                 provider_config: dict[str, Any] | None = None, secrets: dict[str, str] | None = None,
                 signature_field: str | tuple[str, ...] = (), secret_values: list[str] | tuple[str, ...] = (),
                 on_close: Any = None) -> None:
        self.settings = dict(settings or {})
        self.verify_settings = None if verify_settings is None else dict(verify_settings)
        self.provider_config = dict(provider_config or {})
        self.secrets = dict(secrets or {})
        self.signature_field = signature_field
        self._secret_values = list(secret_values)
        self._on_close = on_close

    def secret_values(self) -> list[str]:
        """The key material the engine searches every output for."""
        return list(self._secret_values)

    def close(self) -> None:
        """Run ``on_close`` (once the case is over)."""
        if self._on_close is not None:
            self._on_close()


class _Skip(Exception):
    """A case that cannot apply to this provider (raised inside a case, reported as skipped with its message)."""


def signature_path(setup: Any) -> tuple[str, ...]:
    """The setup's ``signature_field`` as a path of keys: a string is one key, a sequence is the path.

    Anything else (a number, a mapping, a sequence holding something other than strings) is a
    ``CONFORMANCE_ADAPTER_INVALID`` naming what was given, so ``"mac"`` is never split into
    ``('m', 'a', 'c')``.
    """
    raw = getattr(setup, "signature_field", None)
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,) if raw else ()
    if isinstance(raw, (list, tuple)) and all(isinstance(k, str) and k for k in raw):
        return tuple(raw)
    raise SchedulerError("CONFORMANCE_ADAPTER_INVALID",
                         f"the setup's signature_field is {raw!r}: give one key of the envelope's data (a string, e.g. "
                         "\"mac\") or the path to it (a tuple of strings, e.g. (\"signature\", \"value\"))")


def _check_evidence_case(case: Case) -> None:
    """What the schema cannot say: the expectation fits what the case does."""
    inp, expect = case.input, case.expect
    outcome = expect["outcome"]
    if inp.get("trust", "configured") != "configured" and outcome != "refused":
        raise ValueError("a case verifying without trust (trust empty or unreadable) expects outcome refused")
    if inp.get("payload_defect") and outcome != "attest_refused":  # as before SIM102: the methods half could never fire
        raise ValueError("a defective payload or an unsupported method must expect outcome attest_refused")
    if outcome == "attest_refused" and inp.get("tamper", "none") != "none":
        raise ValueError("an attest_refused case has no envelope to tamper with")
    if (case.polarity == "positive") != (outcome == "verified"):
        raise ValueError("a positive evidence case expects outcome verified, a negative one refused or attest_refused")
    if case.polarity == "negative" and not expected_codes(expect):
        raise ValueError("a negative evidence case names its error_code(s)")


# --------------------------------------------------------------------------- per provider


def resolve_setup_adapter(name: str | None, provider: Any, explicit: Any = None) -> Any:
    """The setup adapter of evidence provider ``name`` (explicit, the provider's own method, the entry point)."""
    return _resolve_adapter(name, provider, explicit, method=SETUP_METHOD, role="setup", subject="evidence",
                            missing_code="CONFORMANCE_NO_SETUP_ADAPTER",
                            missing_why="there are no keys, trust or attestor to attest and verify with")


def _prepare_evidence(name: str | None, provider: Any, adapter: Any) -> ProviderContext:
    return provider_context(name, resolve_setup_adapter(name, provider, adapter), "conformance-evidence")


# --------------------------------------------------------------------------- payloads and envelopes


def _document(run_id: str, exit_code: int = 0) -> dict[str, Any]:
    """A payload document shaped like the kernel's (``scheduler.evidence.build``), for run ``run_id``."""
    return {
        "schema": "scheduler.evidence.payload", "version": 1, "canonicalization": "json-sort-v1",
        "run_id": run_id, "job_id": "00000000-0000-4000-8000-00000000c0de", "dispatch_id": f"job:manual:{run_id}",
        "dispatch_kind": "manual", "attempt": 1, "scheduled_for": 1767225600000, "started_at": 1767225600012,
        "executor": "shell", "artifact_digest": "sha256:" + "a" * 64,
        "actor": {"dispatcher_owner": "conformance:1:ab12", "dispatcher_token": 7},
        "command": {"kind": "shell", "payload_sha256": "sha256:" + "b" * 64, "payload_bytes": 18},
        "result": {"status": "ok" if exit_code == 0 else "error", "error_code": None, "exit_code": exit_code,
                   "signal": None, "timed_out": False, "duration_ms": 412, "stdout_sha256": "sha256:" + "c" * 64,
                   "stdout_bytes": 12, "stderr_sha256": "sha256:" + "d" * 64, "stderr_bytes": 0},
    }


def _payload(document: dict[str, Any], defect: str | None = None) -> Any:
    """The ``EvidencePayload`` the kernel would hand over, or one with the case's defect."""
    canonical = canonical_bytes(document)
    if defect == "noncanonical":  # the same JSON with one blank: not json-sort-v1, digest its own
        spaced = canonical.replace(b'","', b'", "', 1)
        return EvidencePayload(document=document, canonical=spaced, digest=hash_bytes(spaced))
    if defect == "digest_wrong":
        return EvidencePayload(document=document, canonical=canonical, digest=hash_bytes(canonical + b" "))
    return EvidencePayload(document=document, canonical=canonical, digest=hash_bytes(canonical))


def _declaration(name: str, options: Any, methods: Any) -> Any:
    """The declaration the kernel hands a provider (``to_provider_declaration`` of a stored ``evidence`` block)."""
    return to_provider_declaration({"provider": name, "methods": list(methods or ()), "provider_config": dict(options or {}),
                                    "verify": {"required": True}})


def _accepted_problem(envelope: Any, name: str, payload: Any) -> str | None:
    """The kernel's acceptance check of an attestation (``scheduler.evidence.attest``): its own, for this payload, storable."""
    if not isinstance(envelope, EvidenceEnvelope):
        return f"attest returned {type(envelope).__name__}, not an EvidenceEnvelope"
    if envelope.provider != name:
        return f"attest returned an envelope of provider {envelope.provider!r}, not {name!r}"
    if envelope.payload_digest != payload.digest:
        return "attest returned an envelope for another payload (its payload_digest is not the payload's)"
    try:
        envelope_json(envelope)
    except Exception as exc:  # noqa: BLE001 - the kernel could not store it
        return f"the envelope cannot be stored as canonical JSON: {type(exc).__name__}: {exc}"
    return None


def _stored(envelope: Any) -> Any:
    """The envelope as the evidence row stores it and re-verification reads it back (a JSON object)."""
    return json.loads(envelope_json(envelope))


def _as_given(stored: Any) -> Any:
    """What re-verification hands ``verify`` for a stored envelope (``scheduler.evidence.verify``)."""
    keys = {"provider", "format", "payload_digest", "data"}
    return EvidenceEnvelope(**stored) if isinstance(stored, dict) and set(stored) == keys else stored


def _replace(value: Any, swaps: dict[str, str]) -> Any:
    if isinstance(value, str):
        return swaps.get(value, value)
    if isinstance(value, dict):
        return {k: _replace(v, swaps) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, swaps) for v in value]
    return value


# --------------------------------------------------------------------------- running one case


class _Logs:
    """Every log record emitted while a case runs."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        outer = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                with contextlib.suppress(Exception):
                    outer.messages.append(f"{record.name}: {record.getMessage()}")

        self.handler = Handler(logging.DEBUG)


@contextlib.contextmanager
def _capturing_logs() -> Any:
    logs = _Logs()
    root = logging.getLogger()
    old = root.level
    root.addHandler(logs.handler)
    root.setLevel(logging.DEBUG)
    try:
        yield logs
    finally:
        root.removeHandler(logs.handler)
        root.setLevel(old)


def _bounded(fn: Any) -> tuple[Any, BaseException | None, bool]:
    """``fn()`` in a worker thread, at most ``CALL_LIMIT_S``: (result, exception, hung)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the call's outcome
            box["exc"] = exc

    worker = threading.Thread(target=target, name="conformance-evidence", daemon=True)
    worker.start()
    worker.join(CALL_LIMIT_S)
    return box.get("result"), box.get("exc"), worker.is_alive()


@attrs.define
class _Verdict:
    """One ``verify`` call as the engine saw it."""

    outcome: Any = None
    error: BaseException | None = None
    hung: bool = False

    def describe(self) -> str:
        if self.hung:
            return f"verify did not return within {CALL_LIMIT_S:g} s"
        if self.error is not None:
            return f"verify raised {type(self.error).__name__}: {self.error}"
        o = self.outcome
        return f"verified={getattr(o, 'verified', None)!r} code={getattr(o, 'code', None)!r} reason={getattr(o, 'reason', None)!r}"


def _verify(provider: Any, envelope: Any, payload: Any, declaration: Any) -> _Verdict:
    result, error, hung = _bounded(lambda: provider.verify(envelope, payload, declaration))
    return _Verdict(outcome=result, error=error, hung=hung)


def _verdict_problems(verdict: _Verdict, name: str, what: str) -> list[str]:
    """What every verification must be: returned (never raised), an EvidenceVerification of this provider, coherent."""
    if verdict.hung:
        return [f"{what}: verify did not return within {CALL_LIMIT_S:g} s"]
    if verdict.error is not None:
        return [(f"{what}: verify raised {type(verdict.error).__name__}: {verdict.error} (it must return "
                 "verified=False with a code, never raise)")]
    o = verdict.outcome
    if not isinstance(o, EvidenceVerification):
        return [f"{what}: verify returned {type(o).__name__}, not an EvidenceVerification"]
    problems = []
    if o.provider != name:
        problems.append(f"{what}: the verification names provider {o.provider!r}, not {name!r}")
    if o.verified is True and o.code is not None:
        problems.append(f"{what}: verified=True with a failure code {o.code!r} (ambiguous; the kernel counts it as not verified)")
    if o.verified is not True:
        if not _CODE.match(o.code or ""):
            problems.append(f"{what}: a refusal's code {o.code!r} is not EVIDENCE_* UPPER_SNAKE")
        if not (o.reason or "").strip():
            problems.append(f"{what}: the refusal has no reason")
    return problems


def _passed(verdict: _Verdict, name: str) -> bool:
    o = verdict.outcome
    return verdict.error is None and not verdict.hung and getattr(o, "verified", None) is True and \
        getattr(o, "code", None) is None and getattr(o, "provider", None) == name


def _run_evidence_case(provider: Any, case: Case, workdir: Path, context: Any) -> CaseCheck:
    """One case: the setup, the provider configured with it, attest, tamper, verify, the checks."""
    adapter = context.adapter
    request = SetupRequest(case_id=case.id, provider=context.name, signer=case.input.get("signer", "trusted"),
                           workdir=workdir)
    try:
        setup = adapter.conformance_setup(request)
    except NotImplementedError as exc:
        return CaseCheck(skipped=f"setup adapter {adapter_label(adapter)} cannot set up this case: {exc or 'no reason given'}")
    except Exception as exc:  # noqa: BLE001 - an adapter bug fails the case
        return CaseCheck(problems=(f"setup adapter {adapter_label(adapter)} raised {type(exc).__name__}: {exc}",))
    try:
        secrets = {str(k): str(v) for k, v in dict(getattr(setup, "secrets", None) or {}).items()}
        try:
            with _patched_environ(secrets), _capturing_logs() as logs:
                problems, observed, texts = _run_with_setup(provider, case, context.name, setup, workdir)
        except _Skip as skip:
            return CaseCheck(skipped=str(skip))
        except SchedulerError as exc:  # the setup adapter gave something the engine cannot use
            return CaseCheck(problems=(f"setup adapter {adapter_label(adapter)}: {exc.code}: {exc.message}",))
        values = [v for v in (getattr(setup, "secret_values", list)() or []) if len(v) >= MIN_SECRET_CHARS]
        values += [v for v in secrets.values() if len(v) >= MIN_SECRET_CHARS]
        texts["a log record"] = "\n".join(logs.messages)
        problems += [f"a secret of the setup (key material) appears in {where}" for where, text in texts.items()
                     if any(v in text for v in values)]
        if problems:
            return CaseCheck(problems=tuple(_redact(p, values) for p in problems),
                             observed={k: _redact(str(v), values) for k, v in observed.items()})
        return CaseCheck()
    finally:
        with contextlib.suppress(Exception):
            setup.close()


def _redact(text: str, values: list[str]) -> str:
    for v in sorted(values, key=len, reverse=True):
        text = text.replace(v, "<secret>")
    return text


def _run_with_setup(provider: Any, case: Case, name: str, setup: Any,
                    workdir: Path) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """Attest, tamper, verify; returns (problems, observed, texts to search for secrets). Raises ``_Skip``."""
    inp, expect = case.input, case.expect
    trust = inp.get("trust", "configured")
    if trust != "configured" and not dict(getattr(setup, "settings", None) or {}):
        raise _Skip("the provider's setup configures nothing (no trust or key to leave out)")
    codes = expected_codes(expect)
    problems: list[str] = []
    observed: dict[str, Any] = {}
    texts: dict[str, str] = {}
    problem = configure_provider(provider, name, getattr(setup, "settings", None), role="setup")
    if problem:
        return [problem], observed, texts
    declaration = _declaration(name, getattr(setup, "provider_config", None), inp.get("methods"))
    run_id = str(uuid.uuid4())
    document = _document(run_id)
    payload = _payload(document, inp.get("payload_defect"))

    envelope, error, hung = _bounded(lambda: provider.attest(payload, declaration))
    if hung:
        return [f"attest did not return within {CALL_LIMIT_S:g} s"], observed, texts
    if error is not None:
        code = getattr(error, "code", None)
        observed["attest"] = f"{type(error).__name__}{f' [{code}]' if code else ''}: {error}"
        texts["the attest error"] = "\n".join([str(error), repr(getattr(error, "args", ())),
                                               json.dumps(getattr(error, "details", None), default=str)])
        if not isinstance(error, SchedulerError):
            problems.append(f"attest raised {type(error).__name__}: {error} -- a refusal must be a SchedulerError with an "
                            "EVIDENCE_* code")
        elif not _CODE.match(error.code or ""):
            problems.append(f"attest refused with code {error.code!r}, not EVIDENCE_* UPPER_SNAKE")
        elif not (error.message or "").strip():
            problems.append("attest refused without a message")
        if expect["outcome"] != "attest_refused":
            problems.append(f"attest failed: {observed['attest']}")
        elif codes and code not in codes:
            problems.append(f"error_code: expected {' or '.join(codes)}, attest refused with {code!r}")
        return problems, observed, texts
    if expect["outcome"] == "attest_refused":
        why = f"the payload is {inp['payload_defect']}" if inp.get("payload_defect") else \
            f"the declaration asks for methods {inp.get('methods')}"
        problems.append(f"attest returned an envelope, but it must refuse ({why}; expected {' or '.join(codes)})")
        return problems, observed, texts
    accepted = _accepted_problem(envelope, name, payload)
    if accepted:
        return [accepted], observed, texts
    stored = _stored(envelope)
    texts["the envelope"] = json.dumps(stored)
    observed["envelope"] = json.dumps(stored)[:600]

    tamper = inp.get("tamper", "none")
    signer = inp.get("signer", "trusted")
    if tamper != "none" or signer != "trusted" or trust != "configured":
        # The untouched envelope must verify with the signer's own settings before a refusal means anything.
        control = _verify(provider, _as_given(copy.deepcopy(stored)), payload, declaration)
        if not _passed(control, name):
            problems.append("the untouched envelope does not verify with the signer's own settings "
                            f"({control.describe()}), so a refusal of the changed one proves nothing")
            return problems, observed, texts
    verify_settings = getattr(setup, "verify_settings", None)
    if verify_settings is not None:
        problem = configure_provider(provider, name, verify_settings, role="setup", which="verify_settings")
        if problem:
            return [problem], observed, texts
    moved: list[tuple[Path, Path]] = []
    try:
        if trust != "configured":
            table = dict(verify_settings if verify_settings is not None else getattr(setup, "settings", None) or {})
            refused = _withdraw_trust(provider, name, trust, table, workdir, moved)
            if refused is not None:  # the host refuses to configure (or load) the provider: fail closed, nothing to verify
                observed["configure"] = refused
                return problems, observed, texts
        return _verify_case(provider, name, case, setup, stored, payload, document, declaration, observed, texts)
    finally:
        for original, away in moved:  # the setup's own clean-up (and its secret_values) may read them again
            with contextlib.suppress(OSError):
                away.rename(original)


def _verify_case(provider: Any, name: str, case: Case, setup: Any, stored: dict[str, Any], payload: Any,
                 document: dict[str, Any], declaration: Any, observed: dict[str, Any],
                 texts: dict[str, str]) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """The case's verification of the stored envelope after its tamper, and the comparison with ``expect``."""
    inp, expect = case.input, case.expect
    codes = expected_codes(expect)
    tamper, signer, trust = inp.get("tamper", "none"), inp.get("signer", "trusted"), inp.get("trust", "configured")
    problems: list[str] = []
    if tamper == "data_value_changed":
        return _changed_values(provider, name, stored, payload, declaration, codes, observed, texts, signature_path(setup))

    target_envelope, target_payload, problem = _tampered(provider, name, tamper, stored, payload, document, declaration, setup)
    if problem:
        return [problem], observed, texts
    verdict = _verify(provider, target_envelope, target_payload, declaration)
    observed["verify"] = verdict.describe()
    texts["the verification"] = verdict.describe()
    problems += _verdict_problems(verdict, name, "verify")
    if problems:
        return problems, observed, texts
    outcome = verdict.outcome
    if expect["outcome"] == "verified":
        if not _passed(verdict, name):
            problems.append(f"expected the envelope to verify, got {verdict.describe()}")
    elif outcome.verified is True:
        why = TAMPERS[tamper] if tamper != "none" else SIGNERS[signer] if signer != "trusted" else f"verified with {TRUSTS[trust]}"
        problems.append(f"the envelope verified, but it must be refused ({why};"
                        f" expected {' or '.join(codes)})")
    elif codes and outcome.code not in codes:
        problems.append(f"error_code: expected {' or '.join(codes)}, got {outcome.code!r} ({outcome.reason})")
    return problems, observed, texts


def _tampered(provider: Any, name: str, tamper: str, stored: dict[str, Any], payload: Any, document: dict[str, Any],
              declaration: Any, setup: Any) -> tuple[Any, Any, str | None]:
    """(envelope as verify gets it, payload to verify against, a problem) after the case's ``tamper``."""
    envelope = copy.deepcopy(stored)
    given_data = envelope.get("data")
    data: dict[str, Any] = given_data if isinstance(given_data, dict) else {}
    if tamper == "none":
        return _as_given(envelope), payload, None
    if tamper == "payload":
        return _as_given(envelope), _payload(_document(document["run_id"], exit_code=1)), None
    if tamper == "payload_rebound":
        other = _payload(_document(document["run_id"], exit_code=1))
        swaps = {payload.digest: other.digest, payload.digest.removeprefix("sha256:"): other.digest.removeprefix("sha256:"),
                 payload.canonical.decode("utf-8"): other.canonical.decode("utf-8")}
        return _as_given(_replace(envelope, swaps)), other, None
    if tamper == "transplant":
        other = _payload(_document(str(uuid.uuid4())))
        moved, error, hung = _bounded(lambda: provider.attest(other, declaration))
        if hung or error is not None or _accepted_problem(moved, name, other):
            return None, None, f"attesting the other run's payload failed: {error or 'no envelope'}"
        return _as_given(_stored(moved)), payload, None
    if tamper == "signature_truncated":
        path = signature_path(setup)
        holder: Any = data
        for key in path[:-1]:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if not path or not isinstance(holder, dict) or not isinstance(holder.get(path[-1]), str):
            return None, None, (f"the setup names no signature_field holding a string in the envelope's data "
                                f"(signature_field={path!r}), so the signature cannot be truncated")
        holder[path[-1]] = holder[path[-1]][: len(holder[path[-1]]) // 2]
        return _as_given(envelope), payload, None
    if tamper == "provider_relabelled":
        envelope["provider"] = FOREIGN_PROVIDER
        return _as_given(envelope), payload, None
    if tamper == "foreign_envelope":
        fmt = "conformance.evidence.foreign"
        foreign = {"provider": FOREIGN_PROVIDER, "format": fmt, "payload_digest": payload.digest,
                   "data": {"schema": fmt, "version": 1, "method": "foreign", "payload_digest": payload.digest}}
        return _as_given(foreign), payload, None
    if tamper == "method_unknown":
        data["method"] = UNKNOWN_METHOD
        return _as_given(envelope), payload, None
    if tamper == "envelope_not_object":
        return json.dumps(envelope), payload, None
    if tamper == "data_not_object":
        envelope["data"] = json.dumps(data)
        return envelope, payload, None
    if tamper == "data_field_added":
        data["conformance_extra"] = True
        return _as_given(envelope), payload, None
    if tamper == "data_field_removed":
        removable = sorted(k for k in data if k not in ("schema", "version", "method", "payload_digest"))
        if not removable:
            return None, None, "the envelope's data has no field besides schema, version, method and payload_digest to remove"
        del data[removable[-1]]
        return _as_given(envelope), payload, None
    if tamper == "digest_malformed":
        bad = "sha256:" + "z" * 64
        envelope["payload_digest"] = bad
        if "payload_digest" in data:
            data["payload_digest"] = bad
        return _as_given(envelope), payload, None
    return None, None, f"unknown tamper {tamper!r}"


def _withdraw_trust(provider: Any, name: str, trust: str, table: dict[str, Any], workdir: Path,
                    moved: list[tuple[Path, Path]]) -> str | None:
    """Configure the provider without its trust (``TRUSTS``); the refusal to configure, or None when it took the settings.

    ``empty`` configures an empty table. ``unreadable`` moves away every file of the case's
    directory a top-level setting names, then configures the same table again (a host whose
    key or trust file is gone when it starts), recording each ``(original, moved)`` in ``moved``;
    ``_Skip`` when no setting names such a file.
    """
    if trust == "empty":
        return configure_provider(provider, name, {}, role="setup", which="empty settings")
    root = workdir.resolve()
    for value in table.values():
        if not isinstance(value, str) or not value:
            continue
        path = Path(value).expanduser()
        with contextlib.suppress(OSError, ValueError):
            if path.is_file() and path.resolve().is_relative_to(root):
                away = path.with_name(path.name + ".moved-away")
                path.rename(away)
                moved.append((path, away))
    if not moved:
        raise _Skip("no setting of the setup names a file (a key or trust file) to move away")
    return configure_provider(provider, name, table, role="setup", which="settings (their files moved away)")


def _changed(value: Any) -> Any:
    """``value`` changed as little as can be: a string's last character, a number plus one, anything else replaced."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str) and value:
        return value[:-1] + ("A" if value[-1] != "A" else "B")
    return "conformance-changed"


def _changed_values(provider: Any, name: str, stored: dict[str, Any], payload: Any, declaration: Any, codes: list[str],
                    observed: dict[str, Any], texts: dict[str, str],
                    signature: tuple[str, ...]) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """The signature (the setup's ``signature_field``) changed, or without one every value of the envelope's data (but the
    fields every envelope has) changed in turn: each must be refused.

    What any verifier claims by ``verified`` (with ``signed-evidence`` or without): the envelope's
    signature or MAC, and without one every field it carries, was checked. A MAC it never
    recomputes is caught here whether or not the provider declares ``signed-evidence``.
    """
    given = stored.get("data")
    data: dict[str, Any] = given if isinstance(given, dict) else {}
    paths = [signature] if signature else [(k,) for k in sorted(data) if k not in ("schema", "version", "method",
                                                                                  "payload_digest")]
    if not paths:
        raise _Skip("the envelope's data has no field besides schema, version, method and payload_digest to change")
    problems: list[str] = []
    for path in paths:
        field = ".".join(path)
        envelope = copy.deepcopy(stored)
        holder: Any = envelope["data"]
        for key in path[:-1]:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or path[-1] not in holder:
            return [f"the setup's signature_field {path!r} names nothing in the envelope's data"], observed, texts
        holder[path[-1]] = _changed(holder[path[-1]])
        verdict = _verify(provider, _as_given(envelope), payload, declaration)
        texts[f"the verification with data.{field} changed"] = verdict.describe()
        found = _verdict_problems(verdict, name, f"verify with data.{field} changed")
        if found:
            problems += found
        elif verdict.outcome.verified is True:
            problems.append(f"the envelope verified with its data.{field} changed: a verifier checks every field its envelope "
                            "carries (a signature or MAC it never recomputes proves nothing)")
        elif codes and verdict.outcome.code not in codes:
            problems.append(f"data.{field} changed: error_code: expected {' or '.join(codes)}, got {verdict.outcome.code!r}")
        if problems:
            observed["verify"] = verdict.describe()
            break
    return problems, observed, texts


register_adapter(
    KindAdapter(kind="evidence", check_case=_check_evidence_case, run=_run_evidence_case, prepare=_prepare_evidence)
)


__all__ = ["PAYLOAD_DEFECTS", "SETUP_METHOD", "SIGNERS", "TAMPERS", "TRUSTS", "EvidenceSetup", "SetupRequest",
           "resolve_setup_adapter", "signature_path"]
