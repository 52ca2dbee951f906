"""The engine's adapter for kind ``proof_verifier``: verify proofs through a verifier exactly as the proof step does.

Per case, the verifier's **setup adapter** mints what the case needs in the verifier's own format:
the trust (keys, a JWKS, a CA, an allowed-signers file) in the case's directory, a declaration
naming it, and a proof bound to the conformance artifact. A setup adapter is any object with

    conformance_proof(request: ProofSetupRequest) -> setup

and the setup has ``declaration`` (the job's ``authorization_proof`` without ``source`` and
``clock_skew_s``: the engine sets both), ``proof`` (the proof text), what a verified proof must
report (``proof_id``, ``key_id``, ``not_before_ms`` (or None), ``expires_at_ms``), ``trust_files``
(the files the declaration's trust lives in), optionally ``settings`` (the verifier's
``[providers.NAME]`` table) and ``close()``. ``request.defect`` says what the adapter mints
(``DEFECTS``): ``none`` (a valid proof: window from ``request.now_ms`` minus a minute or more to
at least five minutes ahead), ``wrong_key`` (signed by a key the declaration does not trust),
``bad_signature`` (what is signed changed after signing: the window extended), ``unbound`` (a
proof naming no artifact). A defect the format cannot express raises
``NotImplementedError("why")``: the case is skipped with the reason, never passed. The adapter is
found as the other kinds find theirs: the one given (``--adapter MODULE:ATTR``), the verifier's
own ``conformance_proof`` method, the entry point named like the verifier in
``scheduler.conformance_adapters``; else ``CONFORMANCE_NO_SETUP_ADAPTER``.

The other defects the engine makes itself from a valid proof (``PROOFS``): ``garbage`` (the proof
text is not a proof at all), ``other_artifact`` (verified for another artifact than it names),
``expired`` / ``not_yet_valid`` (verified at a clock past its window, or before it, plus the skew),
``trust_missing`` / ``trust_empty`` (the trust files removed, or emptied). ``settings: empty``
verifies the valid proof with the verifier configured with an empty ``[providers.NAME]`` table
instead of the setup's ``settings`` (skipped for a setup that gives none). A ``fault`` takes the
verifier's own answer to a valid proof and does what a faulty build would (``FAULTS``).

A case is verified by the kernel's own code, not a copy: the declaration is the one
``validate_spec`` normalises, the proof is read by the step's ``read_source``, and
``scheduler.pipeline.proofs.verify.verify_with`` calls the verifier (bounded, ``CALL_LIMIT_S`` here),
checks its answer, the window with the declared skew and the artifact binding. Whatever the case
expects, the engine also checks: a refusal is a ``PROOF_*`` code with a message; a verified proof
reports the setup's proof id, key id and window, the declared method and this artifact; asking
again gives the same answer; the verifier does not change the declaration it was handed; the
proof text never appears in an error or a record; and before a negative case counts, a valid proof
of the same kind of setup must verify (a verifier that refuses everything proves nothing).
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from pathlib import Path
from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.conformance.engine import Case, CaseCheck, KindAdapter, register_adapter
from scheduler.conformance.kinds import ProviderContext, adapter_label, configure_provider, expected_codes, provider_context
from scheduler.conformance.kinds import resolve_adapter as _resolve_adapter
from scheduler.core.spec import validate_spec
from scheduler.pipeline.proofs.source import read_source
from scheduler.pipeline.proofs.verify import verify_with
from scheduler.plugins.protocols import VerifiedProof, proof_verifier_name

#: The method every setup adapter has.
SETUP_METHOD = "conformance_proof"
#: What the adapter mints (``ProofSetupRequest.defect``).
DEFECTS: dict[str, str] = {
    "none": "a valid proof for the request's artifact, its window around request.now_ms",
    "wrong_key": "a proof signed by a key (or certificate) the declaration's trust does not hold",
    "bad_signature": "a proof whose signed content changed after signing (its window extended)",
    "unbound": "a validly signed proof that names no artifact",
}
#: What the case presents (the schema's ``proof_verifier_input.proof`` lists the same), and the adapter's defect for it.
PROOFS: dict[str, str] = {
    "valid": "none", "wrong_key": "wrong_key", "bad_signature": "bad_signature", "unbound": "unbound",
    "garbage": "none", "other_artifact": "none", "expired": "none", "not_yet_valid": "none",
    "trust_missing": "none", "trust_empty": "none",
}
#: What a faulty build does with the verifier's own answer to a valid proof (``proof_verifier_input.fault``).
FAULTS: dict[str, str] = {
    "raise": "raises after verifying",
    "wrong_type": "returns the record as a dict instead of a VerifiedProof",
    "wrong_method": "answers a VerifiedProof of another method",
    "late": "answers after the kernel stopped waiting",
}
#: The artifact every proof is minted for, and the one an ``other_artifact`` case verifies against.
ARTIFACT_DIGEST = "sha256:" + "c0" * 32
OTHER_ARTIFACT_DIGEST = "sha256:" + "0d" * 32
#: The clock skew every case declares (seconds), and the variable the proof is read from.
SKEW_S = 5
SOURCE_ENV = "SCHEDULER_CONFORMANCE_PROOF"
GARBAGE = "conformance: this is not a proof of any format {"
JOB_NAME = "conformance-proof-job"
#: The kernel's bound on one verification in the engine (``VERIFY_LIMIT_S`` in production).
CALL_LIMIT_S = 2.0
#: Shorter than this, a proof text is not searched for in messages (it would match by accident).
MIN_PROOF_CHARS = 16


@attrs.frozen(kw_only=True)
class ProofSetupRequest:
    """What a setup adapter is asked for: the case, the verifier, what to mint, where, for which artifact and when."""

    case_id: str
    verifier: str
    defect: str
    workdir: Path
    artifact_digest: str = ARTIFACT_DIGEST
    now_ms: int = 0
    skew_s: int = SKEW_S


def _check_proof_case(case: Case) -> None:
    """What the schema cannot say: an expectation that fits the case."""
    inp, expect = case.input, case.expect
    outcome = expect["outcome"]
    if (case.polarity == "positive") != (outcome == "verified"):
        raise ValueError("a positive proof_verifier case expects outcome verified, a negative one refused")
    if outcome == "verified" and (expected_codes(expect) or inp["proof"] != "valid" or "fault" in inp):
        raise ValueError("only a valid proof without a fault is verified, and a verified proof has no error_code")
    if outcome == "refused" and not expected_codes(expect):
        raise ValueError("a negative proof_verifier case names its error_code(s)")
    if "fault" in inp and inp["proof"] != "valid":
        raise ValueError("a fault case starts from a valid proof")
    if inp.get("settings", "configured") == "empty" and (outcome != "refused" or inp["proof"] != "valid" or "fault" in inp):
        raise ValueError("a case with empty settings presents a valid proof without a fault and expects outcome refused")


# --------------------------------------------------------------------------- per verifier


def resolve_proof_adapter(name: str | None, provider: Any, explicit: Any = None) -> Any:
    """The setup adapter of proof verifier ``name`` (explicit, the verifier's own method, the entry point)."""
    return _resolve_adapter(name, provider, explicit, method=SETUP_METHOD, role="setup", subject="proof verifier",
                            missing_code="CONFORMANCE_NO_SETUP_ADAPTER", missing_why="there are no keys or proofs to verify")


def _prepare_proof_verifier(name: str | None, provider: Any, adapter: Any) -> ProviderContext:
    return provider_context(name, resolve_proof_adapter(name, provider, adapter), "conformance-proofs")


# --------------------------------------------------------------------------- faults


class _Faulty:
    """The verifier under test, and then what a faulty build does with its answer (``FAULTS``)."""

    def __init__(self, inner: Any, fault: str, release: threading.Event) -> None:
        self.inner, self.fault, self.release = inner, fault, release
        self.plugin_api = inner.plugin_api
        self.capabilities = inner.capabilities
        self.own: list[Any] = []

    def verify_proof(self, request: Any) -> Any:
        answer = self.inner.verify_proof(request)
        self.own.append(answer)
        if self.fault == "raise":
            raise RuntimeError("conformance fault: the verifier raised after verifying")
        if self.fault == "wrong_type":
            return answer.to_json() if isinstance(answer, VerifiedProof) else {"proof_id": "x"}
        if self.fault == "wrong_method":
            return attrs.evolve(answer, method="conformance-other-method") if isinstance(answer, VerifiedProof) else answer
        self.release.wait(CALL_LIMIT_S * 10)  # late: the kernel has stopped waiting long before
        return answer


# --------------------------------------------------------------------------- running one case


@attrs.define
class _Verified:
    """One verification: the answer or the refusal, and what the verifier was handed."""

    verified: VerifiedProof | None = None
    code: str | None = None
    message: str = ""
    details: Any = None
    error: BaseException | None = None
    declaration_changed: bool = False

    def describe(self) -> str:
        if self.error is not None:
            return f"engine error {type(self.error).__name__}: {self.error}"
        if self.verified is not None:
            return f"verified {json.dumps(self.verified.to_json(), sort_keys=True)}"[:600]
        return f"refused {self.code}: {self.message}"[:600]


def _declaration(setup: Any) -> dict[str, Any]:
    """The setup's declaration as ``jobs add`` normalises it, reading the proof from ``SOURCE_ENV``."""
    raw = {**dict(getattr(setup, "declaration", None) or {}), "source": {"env": SOURCE_ENV}, "clock_skew_s": SKEW_S}
    spec = validate_spec({"name": JOB_NAME, "schedule_kind": "manual", "payload_message": "true", "authorization_proof": raw},
                         check_past=False, plugin_options=False)
    return spec.authorization_proof or {}  # never None: the declaration was given


def _verify(provider: Any, declaration: dict[str, Any], proof: str, name: str, *, artifact_digest: str,
            now_ms: int) -> _Verified:
    """One verification through the kernel's ``verify_with``, the proof read by the step's ``read_source``."""
    out = _Verified()
    handed = copy.deepcopy(declaration)
    try:
        text = read_source(handed, env={SOURCE_ENV: proof})
        out.verified = verify_with(provider, handed, text, artifact_digest=artifact_digest, now_ms=now_ms, name=name,
                                   limit_s=CALL_LIMIT_S)
    except SchedulerError as exc:
        out.code, out.message, out.details = exc.code, exc.message, exc.details
    except Exception as exc:  # noqa: BLE001 - the kernel's path must never raise anything else
        out.error = exc
    out.declaration_changed = handed != declaration
    return out


def _setup(adapter: Any, case: Case, name: str, defect: str, workdir: Path, now: int) -> Any:
    workdir.mkdir(parents=True, exist_ok=True)
    request = ProofSetupRequest(case_id=case.id, verifier=name, defect=defect, workdir=workdir, now_ms=now)
    return getattr(adapter, SETUP_METHOD)(request)


def _run_proof_case(provider: Any, case: Case, workdir: Path, context: Any) -> CaseCheck:
    """One case: the trust and a proof from the setup adapter, the verifier configured, the kernel's verification."""
    adapter = context.adapter
    presented = case.input["proof"]
    defect = PROOFS[presented]
    now = int(time.time() * 1000)
    setups: list[Any] = []
    try:
        try:
            setup = _setup(adapter, case, context.name, defect, workdir / "case", now)
            setups.append(setup)
            control = setup
            if defect != "none":
                control = _setup(adapter, case, context.name, "none", workdir / "control", now)
                setups.append(control)
        except NotImplementedError as exc:
            return CaseCheck(skipped=f"setup adapter {adapter_label(adapter)} cannot mint this case's proof: {exc or 'no reason given'}")
        except Exception as exc:  # noqa: BLE001 - an adapter bug fails the case
            return CaseCheck(problems=(f"setup adapter {adapter_label(adapter)} raised {type(exc).__name__}: {exc}",))
        return _run_with(provider, case, context, setup, control, now)
    finally:
        for made in setups:
            with contextlib.suppress(Exception):
                made.close()


def _run_with(provider: Any, case: Case, context: Any, setup: Any, control: Any, now: int) -> CaseCheck:
    unconfigured = case.input.get("settings", "configured") == "empty"
    if unconfigured and not dict(getattr(setup, "settings", None) or {}):
        return CaseCheck(skipped="the setup configures nothing on the host (the verifier's trust is the declaration's own)")
    problem = configure_provider(provider, context.name, getattr(setup, "settings", None), role="setup")
    if problem:
        return CaseCheck(problems=(problem,))
    try:
        declaration = _declaration(setup)
        control_declaration = declaration if control is setup else _declaration(control)
    except SchedulerError as exc:
        return CaseCheck(problems=((f"the setup's declaration makes no valid job: {exc.code}: {exc.message}"
                                    f" {json.dumps(exc.details, default=str)[:400] if exc.details else ''}"),))
    name = proof_verifier_name(declaration)
    if context.name != "conformance-proofs" and name != context.name:
        return CaseCheck(problems=((f"the setup's declaration is verified by {name!r}, not by the verifier under test"
                                    f" {context.name!r}"),))
    inp, expect = case.input, case.expect
    presented = inp["proof"]
    problems: list[str] = []
    if case.polarity == "negative" or "fault" in inp:
        own = _verify(provider, control_declaration, str(control.proof), name, artifact_digest=ARTIFACT_DIGEST, now_ms=now)
        if own.verified is None:
            return CaseCheck(problems=((f"the setup's valid proof was not verified ({own.describe()}): a verifier that refuses"
                                        " everything proves nothing by refusing this case"),))
    if unconfigured and configure_provider(provider, context.name, {}, role="setup", which="empty settings") is not None:
        return CaseCheck()  # the host refuses to configure (load) the verifier without its table: fail closed
    proof, digest, at = str(setup.proof), ARTIFACT_DIGEST, now
    if presented == "garbage":
        proof = GARBAGE
    elif presented == "other_artifact":
        digest = OTHER_ARTIFACT_DIGEST
    elif presented in ("expired", "not_yet_valid"):
        at, skipped = _shifted_clock(setup, presented)
        if skipped:
            return CaseCheck(skipped=skipped)
    elif presented in ("trust_missing", "trust_empty"):
        skipped = _spoil_trust(setup, presented)
        if skipped:
            return CaseCheck(skipped=skipped)
    fault = inp.get("fault")
    release = threading.Event()
    asked = _Faulty(provider, fault, release) if fault else provider
    try:
        result = _verify(asked, declaration, proof, name, artifact_digest=digest, now_ms=at)
    finally:
        release.set()
    if result.error is not None:
        return CaseCheck(problems=(f"the kernel's verification raised {type(result.error).__name__}: {result.error}",))
    outcome = "verified" if result.verified is not None else "refused"
    if outcome != expect["outcome"]:
        problems.append(f"outcome: expected {expect['outcome']}, got {result.describe()}")
    codes = expected_codes(expect)
    if codes and result.code not in codes:
        problems.append(f"error_code: expected {' or '.join(codes)}, got {result.code!r} ({result.message[:300]})")
    if result.code is not None and not result.code.startswith("PROOF_"):
        problems.append(f"the refusal's code {result.code!r} is not a PROOF_* code")
    if result.code is not None and not result.message.strip():
        problems.append("the refusal carries no message")
    if result.declaration_changed:
        problems.append("the verifier changed the declaration it was handed")
    problems += _leak_problems(proof, result)
    if fault:
        problems += _fault_problems(asked)
    elif result.verified is not None:
        problems += _verified_problems(result.verified, setup, declaration)
        again = _verify(provider, declaration, proof, name, artifact_digest=digest, now_ms=at)
        if again.verified != result.verified:
            problems.append(f"asked again, the verifier answered differently: {again.describe()}")
    observed = {"verification": result.describe(), "declaration": declaration}
    return CaseCheck(problems=tuple(problems), observed=observed if problems else None)


def _shifted_clock(setup: Any, presented: str) -> tuple[int, str | None]:
    """The clock of an ``expired`` / ``not_yet_valid`` case: just past the window plus the skew, or just before it."""
    if presented == "expired":
        return int(setup.expires_at_ms) + SKEW_S * 1000 + 1000, None
    not_before = getattr(setup, "not_before_ms", None)
    if not_before is None:
        return 0, "the setup's proofs state no start of their window (not_before_ms is None)"
    return int(not_before) - SKEW_S * 1000 - 1000, None


def _spoil_trust(setup: Any, presented: str) -> str | None:
    """Remove (``trust_missing``) or empty (``trust_empty``) the setup's trust files; a skip reason when it names none."""
    files = [Path(p) for p in (getattr(setup, "trust_files", None) or ())]
    if not files:
        return "the setup names no trust_files (its trust is not in files the engine can remove)"
    for path in files:
        if presented == "trust_missing":
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(b"")
    return None


def _verified_problems(verified: VerifiedProof, setup: Any, declaration: dict[str, Any]) -> list[str]:
    """A verified proof reports what the setup minted, the declared method and skew, and this artifact."""
    want = {"method": declaration["method"], "proof_id": getattr(setup, "proof_id", None), "key_id": getattr(setup, "key_id", None),
            "artifact_digest": ARTIFACT_DIGEST, "not_before_ms": getattr(setup, "not_before_ms", None),
            "expires_at_ms": getattr(setup, "expires_at_ms", None), "skew_ms": SKEW_S * 1000}
    return [f"{field}: expected {value!r}, the verified proof says {getattr(verified, field)!r}"
            for field, value in want.items() if getattr(verified, field) != value]


def _fault_problems(faulty: _Faulty) -> list[str]:
    """The verifier's own answer (before the fault) must have been a verified proof, or the fault proves nothing."""
    own = faulty.own[0] if faulty.own else None
    if not isinstance(own, VerifiedProof):
        return [(f"the verifier's own answer to a valid proof (before the fault) was {type(own).__name__}, not a"
                 " VerifiedProof: the fault proves nothing")]
    return []


def _leak_problems(proof: str, result: _Verified) -> list[str]:
    """The proof text never appears in a refusal (message, details) or in the record of a verified proof."""
    if len(proof) < MIN_PROOF_CHARS:
        return []
    seen = [result.message, json.dumps(result.details, default=str) if result.details is not None else "",
            json.dumps(result.verified.to_json()) if result.verified is not None else ""]
    return ["the proof text appears in what the kernel records or reports"] if any(proof in text for text in seen) else []


register_adapter(
    KindAdapter(kind="proof_verifier", check_case=_check_proof_case, run=_run_proof_case, prepare=_prepare_proof_verifier)
)


__all__ = ["ARTIFACT_DIGEST", "CALL_LIMIT_S", "DEFECTS", "FAULTS", "OTHER_ARTIFACT_DIGEST", "PROOFS", "SETUP_METHOD",
           "SKEW_S", "ProofSetupRequest", "resolve_proof_adapter"]
