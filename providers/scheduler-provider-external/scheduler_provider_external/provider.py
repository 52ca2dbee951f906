"""``ExternalProvider``: evidence attested and verified by an attestor someone else runs.

The host configures the attestor (``[providers.external]``): a command that reads one
JSON request on stdin and writes one JSON answer on stdout, or an HTTP endpoint that
answers a POST. The provider sends the canonical payload and its digest, and stores
what the attestor returns as the envelope's ``attestation``; verification sends the
payload and that attestation back. The protocol is in ``protocol.py`` and the README.

Everything fails closed: a late, oversized, malformed or ambiguous answer, a non-zero
exit, an HTTP status other than 200, an answer for another request, payload or method
is an error (attest) or ``verified=False`` (verify), each with its own code.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

import attrs
from scheduler_toolkit.evidence import (
    PAYLOAD_FORMAT,
    EvidenceFailure,
    check_bound_payload,
    check_keys,
    check_payload,
    check_requested_methods,
    declared_options,
    envelope_parts,
    requested_methods,
)
from scheduler_toolkit.settings import SecretRef

from scheduler.api import (
    EvidenceDeclaration,
    EvidenceEnvelope,
    EvidencePayload,
    EvidenceVerification,
    SchedulerError,
)
from scheduler_provider_external import protocol
from scheduler_provider_external.transport import HttpAttestor, endpoint_label, run_command

__version__ = "0.1.0"

PROVIDER = "external"
SCHEMA = "scheduler.evidence.external"
VERSION = 1
DEFAULT_METHOD = "external"
ENVELOPE_KEYS = ("schema", "version", "method", "attestor", "payload_format", "payload_digest", "attestation")
_METHOD = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "authorization", "accept"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _url_problem(value: str) -> str | None:
    parts = re.match(r"^(https?)://[^/\s]+", value)
    return None if parts else "must be an absolute http:// or https:// URL"


def _command_problem(value: list[str]) -> str | None:
    if value and (not value[0] or "\x00" in "".join(value)):
        return "must be a program and its arguments (a list of strings, no shell)"
    return None


def _methods_problem(value: list[str]) -> str | None:
    bad = [m for m in value if not _METHOD.fullmatch(m)]
    if not value:
        return "must name at least one method"
    return f"not method names (lowercase letters, digits, . _ -): {', '.join(bad)}" if bad else None


def _method_problem(value: str) -> str | None:
    return None if _METHOD.fullmatch(value) else "must be a method name (lowercase letters, digits, . _ -)"


def _headers_problem(value: dict[str, str]) -> str | None:
    for name, text in value.items():
        if not _HEADER.fullmatch(name) or name.lower() in _RESERVED_HEADERS:
            return f"{name!r} is not a header this provider lets you set"
        if "\r" in text or "\n" in text:
            return f"the value of {name!r} must not contain line breaks"
    return None


def _env_problem(value: dict[str, str] | list[str]) -> str | None:
    bad = [n for n in value if not _ENV_NAME.fullmatch(n)]
    return f"not environment variable names: {', '.join(bad)}" if bad else None


def _params_problem(value: dict[str, str]) -> str | None:
    return "at most 32 parameters of at most 1024 characters each" if len(value) > 32 or any(
        len(k) > 128 or len(v) > 1024 for k, v in value.items()) else None


@attrs.frozen(kw_only=True)
class ExternalOptions:
    """A job's ``provider_config`` for the ``external`` evidence provider: what to ask, never whom."""

    method: str | None = attrs.field(default=None, metadata={
        "doc": "Method to ask the attestor for (one of [providers.external] methods).", "check": _method_problem})
    params: dict[str, str] = attrs.field(factory=dict, metadata={
        "doc": "Parameters forwarded to the attestor as the request's `options` (not secret: they are stored with the job).",
        "check": _params_problem})


def _one_transport(instance: ExternalSettings, _attribute: Any, _value: Any) -> None:
    if instance.command and instance.url:
        raise ValueError("set either command or url, not both: which attestor answers must never be ambiguous")
    if (instance.verify_command and instance.url) or (instance.verify_url and instance.command):
        raise ValueError("verify_command goes with command, verify_url with url")


@attrs.frozen(kw_only=True)
class ExternalSettings:
    """``[providers.external]`` of the settings file: the attestor and the bounds put on it."""

    command: list[str] = attrs.field(factory=list, metadata={
        "doc": "Attestor command: program and arguments, run without a shell; JSON request on stdin, answer on stdout.",
        "check": _command_problem})
    verify_command: list[str] = attrs.field(factory=list, metadata={
        "doc": "Command for verification (default: `command`).", "check": _command_problem})
    url: str | None = attrs.field(default=None, metadata={
        "doc": "Attestor endpoint: the request is POSTed as JSON, the answer is the 200 body.", "check": _url_problem})
    verify_url: str | None = attrs.field(default=None, validator=_one_transport, metadata={
        "doc": "Endpoint for verification (default: `url`).", "check": _url_problem})
    token: SecretRef | None = attrs.field(default=None, metadata={
        "doc": "Bearer token sent to the endpoint (a secret reference).", "secret": True})
    headers: dict[str, str] = attrs.field(factory=dict, metadata={
        "doc": "Extra request headers (not secrets).", "check": _headers_problem})
    env: dict[str, str] = attrs.field(factory=dict, metadata={
        "doc": "Extra environment for the command (not secrets).", "check": _env_problem})
    pass_env: list[str] = attrs.field(factory=list, metadata={
        "doc": "Variables passed through from the scheduler's environment to the command.", "check": _env_problem})
    name: str | None = attrs.field(default=None, metadata={
        "doc": "Label recorded in envelopes as `attestor` (default: the command's program name or the endpoint's origin)."})
    methods: list[str] = attrs.field(factory=lambda: [DEFAULT_METHOD], metadata={
        "doc": "Methods the attestor may answer with; any other is refused.", "check": _methods_problem})
    timeout_s: float = attrs.field(default=10.0, metadata={
        "doc": "Seconds an attestation may take, start to complete answer.", "minimum": 0.05, "maximum": 600})
    verify_timeout_s: float | None = attrs.field(default=None, metadata={
        "doc": "Seconds a verification may take (default: `timeout_s`).", "minimum": 0.05, "maximum": 600})
    max_answer_bytes: int = attrs.field(default=1024 * 1024, metadata={
        "doc": "Largest answer accepted; a longer one fails (and a command writing it is killed).",
        "minimum": 256, "maximum": 64 * 1024 * 1024})


class ExternalProvider:
    """The ``external`` evidence provider (entry point ``scheduler.evidence_providers:external``)."""

    plugin_api = 3
    #: ``attest`` and ``verify-evidence``, both performed by the configured attestor.
    capabilities: frozenset[str] = frozenset({"attest", "verify-evidence"})
    #: Replaced by ``[providers.external] methods`` when configured.
    methods: frozenset[str] = frozenset({DEFAULT_METHOD})
    options_class = ExternalOptions
    settings_class = ExternalSettings

    def __init__(self) -> None:
        self._settings = ExternalSettings()
        self._http = HttpAttestor(f"scheduler-provider-external/{__version__}")

    def configure(self, settings: ExternalSettings) -> None:
        """Take the validated ``[providers.external]`` settings (the loader calls this once)."""
        self._settings = settings
        self.methods = frozenset(settings.methods)
        self._http.close()

    def close(self) -> None:
        """Close pooled HTTP connections."""
        self._http.close()

    @property
    def attestor(self) -> str:
        """The label envelopes record: never a URL's path or query, which may hold tokens."""
        s = self._settings
        if s.name:
            return s.name
        if s.command:
            return "command:" + os.path.basename(s.command[0])
        if s.url:
            return "http:" + endpoint_label(s.url)
        return "unconfigured"

    # -- attest -----------------------------------------------------------------------------------

    def attest(self, payload: EvidencePayload | bytes, declaration: EvidenceDeclaration) -> EvidenceEnvelope:
        """Ask the attestor; ``SchedulerError`` with an ``EVIDENCE_*`` code for any failure or doubtful answer."""
        try:
            return self._attest(payload, declaration)
        except EvidenceFailure as failure:
            raise failure.error() from None

    def _attest(self, payload: Any, declaration: Any) -> EvidenceEnvelope:
        checked = check_payload(payload)
        options: ExternalOptions = declared_options(declaration, ExternalOptions, PROVIDER)
        check_requested_methods(declaration, self.methods, PROVIDER)
        requested = options.method or next(iter(requested_methods(declaration)), None)
        if requested is not None and requested not in self.methods:
            raise EvidenceFailure("EVIDENCE_METHOD_UNSUPPORTED",
                                  f"method {requested!r} is not in [providers.external] methods ({', '.join(sorted(self.methods))})")
        request_id = uuid.uuid4().hex
        body = protocol.request("attest", request_id, checked, requested, options.params)
        raw = self._ask("attest", body, self._settings.timeout_s)
        method, attestation = protocol.attest_answer(raw, request_id, checked, self.methods, requested,
                                                     self._settings.max_answer_bytes)
        data = {
            "schema": SCHEMA,
            "version": VERSION,
            "method": method,
            "attestor": self.attestor,
            "payload_format": PAYLOAD_FORMAT,
            "payload_digest": checked.digest,
            "attestation": attestation,
        }
        return EvidenceEnvelope(provider=PROVIDER, format=SCHEMA, payload_digest=checked.digest, data=data)

    # -- verify -----------------------------------------------------------------------------------

    def verify(self, envelope: EvidenceEnvelope | Any, payload: EvidencePayload | bytes,
               declaration: EvidenceDeclaration) -> EvidenceVerification:
        """Check the envelope locally, then ask the attestor; never raises, anything doubtful is ``verified=False``."""
        try:
            return self._verify(envelope, payload, declaration)
        except EvidenceFailure as failure:
            return failure.verification(PROVIDER)
        except Exception as exc:  # noqa: BLE001 - fail closed
            return EvidenceVerification(verified=False, provider=PROVIDER, code="EVIDENCE_VERIFICATION_FAILED",
                                        reason=f"verification failed unexpectedly: {type(exc).__name__}")

    def _verify(self, envelope: Any, payload: Any, declaration: Any) -> EvidenceVerification:
        options: ExternalOptions = declared_options(declaration, ExternalOptions, PROVIDER)
        digest, data = envelope_parts(envelope, PROVIDER)
        if data.get("schema") != SCHEMA:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"the envelope's schema is not {SCHEMA}")
        method = data.get("method")
        if method not in self.methods:
            raise EvidenceFailure("EVIDENCE_METHOD_MISMATCH", f"the envelope's method {method!r} is not in [providers.external] methods")
        if options.method is not None and method != options.method:
            raise EvidenceFailure("EVIDENCE_METHOD_MISMATCH", f"the envelope's method {method!r} is not the declared {options.method!r}")
        check_requested_methods(declaration, self.methods, PROVIDER)
        if requested_methods(declaration) and method not in requested_methods(declaration):
            raise EvidenceFailure("EVIDENCE_METHOD_MISMATCH", f"the envelope's method {method!r} is not one the declaration asks for")
        check_keys(data, ENVELOPE_KEYS)
        if type(data["version"]) is not int or data["version"] != VERSION:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"unsupported envelope version {data['version']!r}")
        if data["payload_format"] != PAYLOAD_FORMAT:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"unsupported payload_format {data['payload_format']!r}")
        if not isinstance(data["attestor"], str) or not isinstance(data["attestation"], dict) or not data["attestation"]:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's attestor or attestation is malformed")
        checked = check_payload(payload)
        check_bound_payload(digest, checked)
        request_id = uuid.uuid4().hex
        body = protocol.request("verify", request_id, checked, method, options.params, data["attestation"])
        s = self._settings
        raw = self._ask("verify", body, s.verify_timeout_s or s.timeout_s)
        verified, code, reason = protocol.verify_answer(raw, request_id, checked, self.methods, method)
        if verified:
            return EvidenceVerification(verified=True, provider=PROVIDER)
        return EvidenceVerification(verified=False, provider=PROVIDER, code="EVIDENCE_EXTERNAL_REJECTED",
                                    reason=f"the attestor did not verify the evidence: {code}" + (f": {reason}" if reason else ""))

    # -- the attestor -----------------------------------------------------------------------------

    def _ask(self, operation: str, body: bytes, timeout_s: float) -> bytes:
        s = self._settings
        command = (s.verify_command or s.command) if operation == "verify" else s.command
        url = (s.verify_url or s.url) if operation == "verify" else s.url
        if command:
            return run_command(command, body, timeout_s=timeout_s, max_bytes=s.max_answer_bytes, env=s.env, pass_env=s.pass_env)
        if url:
            headers = dict(s.headers)
            if s.token is not None:
                try:
                    headers["authorization"] = "Bearer " + s.token.resolve()
                except SchedulerError as exc:  # SECRET_UNRESOLVED names the reference, never the value
                    raise EvidenceFailure("EVIDENCE_EXTERNAL_NOT_CONFIGURED", exc.message) from None
            return self._http.post(url, body, headers=headers, timeout_s=timeout_s, max_bytes=s.max_answer_bytes)
        raise EvidenceFailure("EVIDENCE_EXTERNAL_NOT_CONFIGURED",
                              "no attestor is configured: set [providers.external] command or url")
