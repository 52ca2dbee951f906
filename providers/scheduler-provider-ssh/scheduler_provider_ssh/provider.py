"""``SshProvider``: evidence signed with ``ssh-keygen -Y sign`` and verified with ``ssh-keygen -Y verify``.

The envelope follows the AgentCLI evidence envelope: ``schema``, ``version``,
``method`` (``ssh-signature``), ``key_fingerprint`` (from ``ssh-keygen -lf``),
``principal``, ``namespace``, ``payload_format`` (``canonical-json``),
``payload_digest``, ``signed_payload`` (the canonical payload text) and
``signature`` (the armored SSH signature). What is signed is the json-sort-v1 form of
the envelope without ``signature``, so the key, principal, namespace and digest are
covered by the signature too.

Trust comes only from the host's configuration: the allowed-signers file is
``[providers.ssh] allowed_signers`` (or a file a job names that the settings list in
``trusted_allowed_signers``), never anything stored with the evidence.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

import attrs
from scheduler_toolkit.canonical import canonical_bytes, hash_bytes
from scheduler_toolkit.evidence import (
    PAYLOAD_FORMAT,
    CheckedPayload,
    EvidenceFailure,
    check_bound_payload,
    check_keys,
    check_payload,
    check_requested_methods,
    declared_options,
    envelope_parts,
    parse_canonical,
)
from scheduler_toolkit.process import Completed, minimal_env, run_bounded, snippet

from scheduler.api import (
    EvidenceDeclaration,
    EvidenceEnvelope,
    EvidencePayload,
    EvidenceVerification,
    SchedulerError,
)
from scheduler_provider_ssh.sshfiles import FINGERPRINT_RE, check_private_key, parse_signature

__version__ = "0.1.0"

PROVIDER = "ssh"
METHOD = "ssh-signature"
VERSION = 1
#: Envelope schema per namespace: ``agentcli`` evidence uses AgentCLI's envelope name, everything else ours.
SCHEMA = "scheduler.evidence.ssh-signature"
AGENTCLI_SCHEMA = "agentcli.evidence.envelope"
AGENTCLI_NAMESPACE = "agentcli"
AGENTCLI_PAYLOAD_SCHEMA = "agentcli.evidence.payload"
DEFAULT_NAMESPACE = "scheduler"
#: The signed fields, in the reference's order (the signed document is their json-sort-v1 form).
SIGNED_KEYS = ("schema", "version", "method", "key_fingerprint", "principal", "namespace", "payload_format",
               "payload_digest", "signed_payload")
ENVELOPE_KEYS = (*SIGNED_KEYS, "signature")

_PRINCIPAL = re.compile(r"[A-Za-z0-9@._+/=:-]{1,256}")
_NAMESPACE = re.compile(r"[A-Za-z0-9@._+-]{1,128}")
_LISTED_FINGERPRINT = re.compile(r"^\d+ (SHA256:[A-Za-z0-9+/]{43}) ")


def _path_problem(value: str) -> str | None:
    if not value or "\x00" in value or not os.path.isabs(os.path.expanduser(value)):
        return "must be an absolute path (or start with ~/)"
    return None


def _principal_problem(value: str) -> str | None:
    return None if _PRINCIPAL.fullmatch(value) else "must be 1-256 characters of letters, digits and @ . _ + / = : -"


def _namespace_problem(value: str) -> str | None:
    return None if _NAMESPACE.fullmatch(value) else "must be 1-128 characters of letters, digits and @ . _ + -"


def _paths_problem(values: list[str]) -> str | None:
    return next((f"{v!r}: {p}" for v in values if (p := _path_problem(v))), None)


def _fingerprints_problem(values: list[str]) -> str | None:
    bad = [v for v in values if not FINGERPRINT_RE.fullmatch(v)]
    return f"not SHA256:... fingerprints (as ssh-keygen -lf prints them): {', '.join(bad)}" if bad else None


@attrs.frozen(kw_only=True)
class SshOptions:
    """A job's ``provider_config`` for the ``ssh`` evidence provider (each unset key falls back to the settings)."""

    key: str | None = attrs.field(default=None, metadata={
        "doc": "Private key that signs (absolute path; unencrypted, mode 0600).", "check": _path_problem})
    principal: str | None = attrs.field(default=None, metadata={
        "doc": "Signer identity recorded in the envelope and looked up in the allowed-signers file.",
        "check": _principal_problem})
    namespace: str | None = attrs.field(default=None, metadata={
        "doc": "ssh-keygen -n namespace; default `scheduler`, `agentcli` for AgentCLI payloads and handoff v4 jobs.",
        "check": _namespace_problem})
    allowed_signers: str | None = attrs.field(default=None, metadata={
        "doc": "Allowed-signers file to verify with; must be listed in the settings' trusted_allowed_signers.",
        "check": _path_problem})


@attrs.frozen(kw_only=True)
class SshSettings:
    """``[providers.ssh]`` of the settings file: the host's keys and, above all, its trust."""

    key: str | None = attrs.field(default=None, metadata={
        "doc": "Default private key that signs (absolute path).", "check": _path_problem})
    principal: str | None = attrs.field(default=None, metadata={
        "doc": "Default signer principal.", "check": _principal_problem})
    namespace: str | None = attrs.field(default=None, metadata={
        "doc": "Default namespace (unset: `agentcli` for AgentCLI payloads and handoff v4 jobs, else `scheduler`).",
        "check": _namespace_problem})
    allowed_signers: str | None = attrs.field(default=None, metadata={
        "doc": "The allowed-signers file verification trusts (ssh-keygen ALLOWED SIGNERS format).", "check": _path_problem})
    trusted_allowed_signers: list[str] = attrs.field(factory=list, metadata={
        "doc": "Further allowed-signers files a job's provider_config may name.", "check": _paths_problem})
    allowed_keys: list[str] = attrs.field(factory=list, metadata={
        "doc": "If set, the only private keys a job's provider_config may name (the default `key` is always allowed).",
        "check": _paths_problem})
    allowed_fingerprints: list[str] = attrs.field(factory=list, metadata={
        "doc": "If set, only keys with these SHA256 fingerprints are accepted, even when the allowed-signers file lists others.",
        "check": _fingerprints_problem})
    ssh_keygen: str = attrs.field(default="ssh-keygen", metadata={
        "doc": "The ssh-keygen program: a name looked up on PATH, or an absolute path."})
    timeout_s: float = attrs.field(default=10.0, metadata={
        "doc": "Seconds each ssh-keygen call may take.", "minimum": 0.05, "maximum": 300})
    self_check: bool = attrs.field(default=True, metadata={
        "doc": "Verify each new signature against the trust file before returning it (when trust is configured)."})


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


class SshProvider:
    """The ``ssh`` evidence provider (entry point ``scheduler.evidence_providers:ssh``). Stateless per call: thread-safe."""

    plugin_api = 3
    #: ``attest``: signs with ssh-keygen -Y sign; ``verify-evidence``: ssh-keygen -Y verify against the configured trust;
    #: ``signed-evidence``: an envelope cannot be made or rewritten without a key the host trusts (conformance cases
    #: about forged, truncated or wrongly-scoped signatures apply).
    capabilities: frozenset[str] = frozenset({"attest", "verify-evidence", "signed-evidence"})
    methods: frozenset[str] = frozenset({METHOD})
    options_class = SshOptions
    settings_class = SshSettings

    def __init__(self) -> None:
        self._settings = SshSettings()
        self._name = PROVIDER

    def registered_as(self, name: str) -> None:
        """Take the entry-point name this instance was loaded under: its envelopes and verifications carry it."""
        self._name = name

    def configure(self, settings: SshSettings) -> None:
        """Take the validated ``[providers.ssh]`` settings (the loader calls this once)."""
        self._settings = settings

    # -- attest -----------------------------------------------------------------------------------

    def attest(self, payload: EvidencePayload | bytes, declaration: EvidenceDeclaration) -> EvidenceEnvelope:
        """Sign the payload; ``SchedulerError`` with an ``EVIDENCE_*`` code when it cannot (nothing is returned unsigned)."""
        try:
            return self._attest(payload, declaration)
        except EvidenceFailure as failure:
            raise failure.error() from None

    def _attest(self, payload: Any, declaration: Any) -> EvidenceEnvelope:
        s = self._settings
        checked = check_payload(payload)
        options: SshOptions = declared_options(declaration, SshOptions, self._name)
        check_requested_methods(declaration, self.methods, self._name)
        keygen = self._keygen()
        key = self._signing_key(options)
        principal = options.principal or s.principal
        if not principal:
            raise EvidenceFailure("EVIDENCE_SSH_PRINCIPAL_MISSING",
                                  "no signer principal: set provider_config.principal or [providers.ssh] principal")
        namespace = self._namespace(options, checked)
        fingerprint = self._fingerprint(keygen, key)
        if s.allowed_fingerprints and fingerprint not in s.allowed_fingerprints:
            raise EvidenceFailure("EVIDENCE_SIGNER_UNTRUSTED",
                                  f"the signing key {fingerprint} is not in [providers.ssh] allowed_fingerprints")
        fields: dict[str, Any] = {
            "schema": AGENTCLI_SCHEMA if namespace == AGENTCLI_NAMESPACE else SCHEMA,
            "version": VERSION,
            "method": METHOD,
            "key_fingerprint": fingerprint,
            "principal": principal,
            "namespace": namespace,
            "payload_format": PAYLOAD_FORMAT,
            "payload_digest": checked.digest,
            "signed_payload": checked.text,
        }
        done = self._run(keygen, ["-Y", "sign", "-f", key, "-n", namespace], canonical_bytes(fields), "signing")
        if done.returncode != 0:
            raise EvidenceFailure("EVIDENCE_SSH_SIGN_FAILED", f"ssh-keygen -Y sign failed: {snippet(done.stderr) or 'no message'}")
        signature = done.stdout.decode("ascii", "replace").strip() + "\n"
        made = parse_signature(signature)
        if made.fingerprint != fingerprint or made.namespace != namespace:
            raise EvidenceFailure("EVIDENCE_SSH_SIGN_FAILED",
                                  "ssh-keygen produced a signature for another key or namespace than requested")
        data = {**fields, "signature": signature}
        envelope = EvidenceEnvelope(provider=self._name, format=fields["schema"], payload_digest=checked.digest, data=data)
        if s.self_check:
            try:
                trust = self._trust_file(options)
            except EvidenceFailure as failure:
                if failure.code != "EVIDENCE_TRUST_NOT_CONFIGURED":
                    raise
            else:
                self._check(envelope, checked, options, trust, keygen)
        return envelope

    def _signing_key(self, options: SshOptions) -> str:
        s = self._settings
        key = options.key or s.key
        if not key:
            raise EvidenceFailure("EVIDENCE_SSH_KEY_MISSING", "no signing key: set provider_config.key or [providers.ssh] key")
        path = os.path.expanduser(key)
        if options.key and s.allowed_keys:
            allowed = {_real(p) for p in [*s.allowed_keys, *([s.key] if s.key else [])]}
            if _real(path) not in allowed:
                raise EvidenceFailure("EVIDENCE_SSH_KEY_NOT_ALLOWED",
                                      f"the signing key {key} is not listed in [providers.ssh] allowed_keys")
        check_private_key(path)
        return path

    def _fingerprint(self, keygen: str, key: str) -> str:
        done = self._run(keygen, ["-E", "sha256", "-l", "-f", key], b"", "reading the key fingerprint")
        text = done.stdout.decode("utf-8", "replace")
        match = _LISTED_FINGERPRINT.match(text)
        if done.returncode != 0 or match is None:
            raise EvidenceFailure("EVIDENCE_SSH_KEY_UNREADABLE",
                                  f"ssh-keygen -lf cannot read the signing key {key}: {snippet(done.stderr) or 'no fingerprint'}")
        return match.group(1)

    # -- verify -----------------------------------------------------------------------------------

    def verify(self, envelope: EvidenceEnvelope | Any, payload: EvidencePayload | bytes,
               declaration: EvidenceDeclaration) -> EvidenceVerification:
        """Re-check the digest, the canonical form, namespace, principal, fingerprint and the signature; never raises."""
        try:
            self._verify(envelope, payload, declaration)
        except EvidenceFailure as failure:
            return failure.verification(self._name)
        except Exception as exc:  # noqa: BLE001 - fail closed
            return EvidenceVerification(verified=False, provider=self._name, code="EVIDENCE_VERIFICATION_FAILED",
                                        reason=f"verification failed unexpectedly: {type(exc).__name__}")
        return EvidenceVerification(verified=True, provider=self._name)

    def _verify(self, envelope: Any, payload: Any, declaration: Any) -> None:
        options: SshOptions = declared_options(declaration, SshOptions, self._name)
        digest, data = envelope_parts(envelope, self._name)
        if data.get("method") != METHOD:
            raise EvidenceFailure("EVIDENCE_METHOD_MISMATCH", f"the envelope's method {data.get('method')!r} is not {METHOD!r}")
        check_requested_methods(declaration, self.methods, self._name)
        check_keys(data, ENVELOPE_KEYS)
        for key in ENVELOPE_KEYS:
            if key != "version" and not isinstance(data[key], str):
                raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"the envelope's {key} must be a string")
        if type(data["version"]) is not int or data["version"] != VERSION:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"unsupported envelope version {data['version']!r}")
        expected_schema = AGENTCLI_SCHEMA if data["namespace"] == AGENTCLI_NAMESPACE else SCHEMA
        if data["schema"] != expected_schema:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"an envelope in namespace {data['namespace']!r} has schema {expected_schema}")
        if data["payload_format"] != PAYLOAD_FORMAT:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"unsupported payload_format {data['payload_format']!r}")
        if not FINGERPRINT_RE.fullmatch(data["key_fingerprint"]):
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's key_fingerprint is not a SHA256 fingerprint")
        if not _PRINCIPAL.fullmatch(data["principal"]) or not _NAMESPACE.fullmatch(data["namespace"]):
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", "the envelope's principal or namespace is not well-formed")
        checked = check_payload(payload)
        check_bound_payload(digest, checked)
        self._check(envelope, checked, options, self._trust_file(options), self._keygen())

    def _check(self, envelope: EvidenceEnvelope | Any, checked: CheckedPayload, options: SshOptions, trust: str, keygen: str) -> None:
        """The checks shared by verification and the self-check after signing (structure already checked)."""
        s = self._settings
        data = envelope.data if isinstance(envelope, EvidenceEnvelope) else envelope["data"]
        signed = data["signed_payload"].encode("utf-8")
        if signed != checked.canonical:
            raise EvidenceFailure("EVIDENCE_SIGNED_PAYLOAD_MISMATCH", "the signed payload is not the payload being verified")
        if hash_bytes(signed) != data["payload_digest"]:
            raise EvidenceFailure("EVIDENCE_DIGEST_MISMATCH", "the signed payload's SHA-256 is not the envelope's payload_digest")
        parse_canonical(signed, "the signed payload")
        namespace = self._namespace(options, checked)
        if data["namespace"] != namespace:
            raise EvidenceFailure("EVIDENCE_NAMESPACE_MISMATCH",
                                  f"the envelope was signed in namespace {data['namespace']!r}, expected {namespace!r}")
        principal = options.principal or s.principal
        if principal and data["principal"] != principal:
            raise EvidenceFailure("EVIDENCE_PRINCIPAL_MISMATCH",
                                  f"the envelope names principal {data['principal']!r}, expected {principal!r}")
        if s.allowed_fingerprints and data["key_fingerprint"] not in s.allowed_fingerprints:
            raise EvidenceFailure("EVIDENCE_SIGNER_UNTRUSTED",
                                  f"the key {data['key_fingerprint']} is not in [providers.ssh] allowed_fingerprints")
        signature = parse_signature(data["signature"])
        if signature.namespace != data["namespace"]:
            raise EvidenceFailure("EVIDENCE_NAMESPACE_MISMATCH",
                                  f"the signature was made in namespace {signature.namespace!r}, the envelope says {data['namespace']!r}")
        if signature.fingerprint != data["key_fingerprint"]:
            raise EvidenceFailure("EVIDENCE_FINGERPRINT_MISMATCH",
                                  f"the signature was made by key {signature.fingerprint}, the envelope names {data['key_fingerprint']}")
        try:
            document = canonical_bytes({k: data[k] for k in SIGNED_KEYS})
        except SchedulerError as exc:
            raise EvidenceFailure("EVIDENCE_ENVELOPE_INVALID", f"the envelope has no canonical form: {exc}") from None
        with tempfile.TemporaryDirectory(prefix="scheduler-ssh-evidence-") as tmp:
            sig_path = os.path.join(tmp, "evidence.sig")
            with open(os.open(sig_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="ascii") as handle:
                handle.write(data["signature"])
            done = self._run(keygen, ["-Y", "verify", "-f", trust, "-I", data["principal"], "-n", data["namespace"],
                                      "-s", sig_path], document, "verifying")
            if done.returncode == 0:
                return
            self._diagnose(keygen, trust, sig_path, document, data)

    def _diagnose(self, keygen: str, trust: str, sig_path: str, document: bytes, data: Any) -> None:
        """ssh-keygen -Y verify said no: find out whether the signature is bad or the signer is not trusted."""
        alone = self._run(keygen, ["-Y", "check-novalidate", "-n", data["namespace"], "-s", sig_path], document, "verifying")
        if alone.returncode != 0:
            raise EvidenceFailure("EVIDENCE_SIGNATURE_INVALID",
                                  "the signature does not match the signed document (the envelope or payload was changed)")
        found = self._run(keygen, ["-Y", "find-principals", "-s", sig_path, "-f", trust], b"", "verifying")
        principals = found.stdout.decode("utf-8", "replace").split() if found.returncode == 0 else []
        if principals and data["principal"] not in principals:
            raise EvidenceFailure("EVIDENCE_PRINCIPAL_MISMATCH",
                                  f"the signing key is trusted for {', '.join(sorted(set(principals)))}, not for {data['principal']!r}")
        if principals:
            raise EvidenceFailure("EVIDENCE_SIGNER_UNTRUSTED",
                                  f"the allowed-signers entry for {data['principal']!r} does not accept this signature now"
                                  " (namespace restriction or validity period)")
        raise EvidenceFailure("EVIDENCE_SIGNER_UNTRUSTED",
                              f"the signing key {data['key_fingerprint']} is not in the allowed-signers file {trust}")

    # -- configuration ----------------------------------------------------------------------------

    def _namespace(self, options: SshOptions, payload: CheckedPayload) -> str:
        """The job's or the settings' namespace; unset: ``agentcli`` for AgentCLI payloads and runs of handoff v4 jobs
        (the payload's ``handoff.version`` is 4, as the reference's v4 envelope signs), else ``scheduler``."""
        if options.namespace or self._settings.namespace:
            return options.namespace or self._settings.namespace  # type: ignore[return-value]
        handoff = payload.document.get("handoff")
        v4 = isinstance(handoff, dict) and handoff.get("version") == 4
        return AGENTCLI_NAMESPACE if v4 or payload.document.get("schema") == AGENTCLI_PAYLOAD_SCHEMA else DEFAULT_NAMESPACE

    def _trust_file(self, options: SshOptions) -> str:
        """The allowed-signers file to verify with: from the settings, or one the settings list as trusted."""
        s = self._settings
        if options.allowed_signers:
            listed = {_real(p) for p in [*([s.allowed_signers] if s.allowed_signers else []), *s.trusted_allowed_signers]}
            path = _real(options.allowed_signers)
            if path not in listed:
                raise EvidenceFailure("EVIDENCE_TRUST_FILE_UNTRUSTED",
                                      f"the allowed-signers file {options.allowed_signers} named by the job is not listed in"
                                      " [providers.ssh] allowed_signers or trusted_allowed_signers")
        elif s.allowed_signers:
            path = os.path.expanduser(s.allowed_signers)
        else:
            raise EvidenceFailure("EVIDENCE_TRUST_NOT_CONFIGURED",
                                  "no allowed-signers file is configured: set [providers.ssh] allowed_signers")
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise EvidenceFailure("EVIDENCE_TRUST_FILE_UNREADABLE", f"the allowed-signers file {path} cannot be read: {exc.strerror}") from None
        if not os.path.isfile(path):
            raise EvidenceFailure("EVIDENCE_TRUST_FILE_UNREADABLE", f"the allowed-signers file {path} is not a regular file")
        return path

    def _keygen(self) -> str:
        name = self._settings.ssh_keygen
        env = minimal_env()
        found = shutil.which(name, path=env["PATH"]) if os.sep not in name else (name if os.access(name, os.X_OK) else None)
        if not found:
            raise EvidenceFailure("EVIDENCE_SSH_KEYGEN_MISSING",
                                  f"ssh-keygen ({name}) is not installed or not executable: install OpenSSH 8.2+ or set"
                                  " [providers.ssh] ssh_keygen")
        return found

    def _run(self, keygen: str, args: list[str], data: bytes, doing: str) -> Completed:
        env = minimal_env({"SSH_ASKPASS_REQUIRE": "never"})
        try:
            done = run_bounded([keygen, *args], data, timeout_s=self._settings.timeout_s, max_stdout=256 * 1024, env=env)
        except (FileNotFoundError, PermissionError) as exc:
            raise EvidenceFailure("EVIDENCE_SSH_KEYGEN_MISSING", f"ssh-keygen cannot be started: {exc.strerror}") from None
        except OSError as exc:
            raise EvidenceFailure("EVIDENCE_SSH_FAILED", f"ssh-keygen cannot be started: {exc.strerror or exc}") from None
        if done.timed_out:
            raise EvidenceFailure("EVIDENCE_SSH_TIMEOUT", f"ssh-keygen did not finish {doing} within {self._settings.timeout_s:g} s")
        if done.oversized:
            raise EvidenceFailure("EVIDENCE_SSH_FAILED", f"ssh-keygen wrote more output than expected while {doing}")
        return done
