"""The conformance engine: versioned JSON cases every provider kind must pass.

``engine`` loads and runs the cases (no pytest), ``payload`` holds the executor
payload-adapter types (a case describes a behaviour, each executor's adapter writes it
in its own payload language), ``service`` the channel service-adapter types (a case
describes what the service answers, each channel's adapter starts a loopback stand-in of
its service, built on the scripted loopback HTTP server of ``loopback``), ``channel`` the engine's adapter for kind ``channel`` (registered on
import, here), ``cli`` is the ``scheduler conformance`` command group,
``ci`` runs every first-party provider, and ``pytest_plugin`` is the opt-in pytest
adapter for plugin authors (re-exported by ``scheduler.testing``).
"""

from __future__ import annotations

from scheduler.conformance.engine import (
    ADAPTERS,
    FIXTURE_VERSION,
    FIXTURES_ENV,
    Case,
    CaseCheck,
    CaseResult,
    KindAdapter,
    Report,
    extra_fixture_dirs,
    fixtures_root,
    load_cases,
    load_corpus,
    prepare,
    register_adapter,
    run_case,
    run_kind,
    select_cases,
)
from scheduler.conformance.payload import ADAPTER_GROUP, Behaviour, PosixShellPayloads, RawPayload, Step
from scheduler.conformance.service import (
    ANSWERS,
    HttpReply,
    HttpRequest,
    HttpStandIn,
    ReceivedFile,
    ReceivedMessage,
    ServiceAnswer,
    ServiceRequest,
)

# Registers the channel kind's adapter (the executor's is registered by the engine module itself).
from scheduler.conformance import channel as _channel  # noqa: F401  isort: skip
# ... and the credential kind's (a stand-in source per case, resolved through the kernel's own checks).
from scheduler.conformance import credential as _credential  # noqa: F401  isort: skip
# ... and the evidence kind's (a setup per case: keys, trust or an attestor; attest, tamper, verify).
from scheduler.conformance import evidence as _evidence  # noqa: F401  isort: skip
# ... and the authorization kind's (a policy per case from the setup adapter, decided by the kernel's own step).
from scheduler.conformance import authorization as _authorization  # noqa: F401  isort: skip
# ... and the proof verifier kind's (trust and a proof per case from the setup adapter, verified by the kernel's own path).
from scheduler.conformance import proof_verifier as _proof_verifier  # noqa: F401  isort: skip

__all__ = [
    "ADAPTERS",
    "ADAPTER_GROUP",
    "ANSWERS",
    "FIXTURES_ENV",
    "FIXTURE_VERSION",
    "Behaviour",
    "Case",
    "CaseCheck",
    "CaseResult",
    "HttpReply",
    "HttpRequest",
    "HttpStandIn",
    "KindAdapter",
    "PosixShellPayloads",
    "RawPayload",
    "ReceivedFile",
    "ReceivedMessage",
    "Report",
    "ServiceAnswer",
    "ServiceRequest",
    "Step",
    "extra_fixture_dirs",
    "fixtures_root",
    "load_cases",
    "load_corpus",
    "prepare",
    "register_adapter",
    "run_case",
    "run_kind",
    "select_cases",
]
