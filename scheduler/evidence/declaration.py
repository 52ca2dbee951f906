"""A job's ``evidence`` declaration: validated, normalised, and checked against its installed provider.

The declaration (reference notes §3) says which provider attests the job's runs and how::

    {"provider": "ssh", "methods": ["ssh-signature"], "provider_config": {"principal": "ops@example.org"},
     "payload": {"bind": ["command", "result"], "context": {...}, "format": "canonical-json"},
     "verify": {"required": true}, "collect": ["stdout", "stderr"], "retention": "90d"}

Kernel rules (``normalise``, no plugin imported): only these keys; ``provider`` a driver
name, ``checksum`` when omitted (the default provider for direct jobs; a job that declares
no ``evidence`` at all gets none; the legacy alias ``sha256`` is stored as ``checksum``); ``methods`` a list of distinct method names, and a
declaration naming another provider may not ask for the checksum-only method ``sha256``
(a signed declaration is never quietly a checksum); ``payload.bind`` and ``collect`` drawn
from fixed vocabularies; ``payload.context`` any JSON value of at most 16 KiB canonical;
``payload.format`` ``canonical-json`` (``json`` is its alias and is stored as
``canonical-json``); ``verify.required`` a boolean; ``retention`` as
``scheduler.evidence.retention`` reads it.

Plugin rules (``provider_problems``, only when validating with plugins): the methods must be
ones the provider performs, and ``provider_config`` must validate against its
``options_class`` (normalised to its non-default values). A provider that is not installed is
the kernel's one missing-plugin rule (``scheduler.plugins.refs``: ``EVIDENCE_NOT_AVAILABLE``).

The kernel always binds every section it has into the payload, so ``bind`` never leaves
something out: the payload records the requested names and the enforced ones (the core set,
the requested, every outcome present) and binds a requested outcome the run lacks as
``null``; ``collect`` of ``stdout`` / ``stderr`` puts a bounded excerpt of the stored,
redacted output into the payload (``scheduler.evidence.build``, payload version 2).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from scheduler.base.canonical import canonical_bytes
from scheduler.base.errors import SchedulerError
from scheduler.base.options import option_problems, options_to_json
from scheduler.core.members import options_class_of
from scheduler.evidence.retention import check_retention

#: Keys a declaration may hold.
DECLARATION_KEYS = ("provider", "methods", "provider_config", "payload", "verify", "collect", "retention")
PAYLOAD_KEYS = ("bind", "context", "format")
VERIFY_KEYS = ("required",)
#: What a declaration may say it binds (the reference's vocabulary); every one present is always bound.
BIND_NAMES = frozenset({
    "execution_id", "command", "contract", "result", "postcondition", "identity", "trust", "authorization",
    "authorization_proof", "delegation", "credential_handoff", "context",
})
#: What a declaration may say it collects (``stdout`` / ``stderr``: a bounded excerpt in the payload; see evidence_build).
COLLECT_NAMES = frozenset({"result", "identity", "authorization", "governance", "stdout", "stderr", "exit_code"})
PAYLOAD_FORMATS = {"canonical-json": "canonical-json", "json": "canonical-json"}
DEFAULT_PROVIDER = "checksum"
#: Legacy provider names, stored as the provider they name (seed 000: ``provider: "sha256"`` is the checksum backend).
PROVIDER_ALIASES = {"sha256": DEFAULT_PROVIDER}
#: Methods only the checksum provider performs: another provider asking for them would be a downgrade.
CHECKSUM_ONLY_METHODS = frozenset({"sha256"})
MAX_CONTEXT_BYTES = 16 * 1024
MAX_EVIDENCE_REF_CHARS = 256

_DRIVER_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_METHOD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$")

Problem = dict[str, str]


def _problem(field: str, message: str, code: str) -> Problem:
    return {"field": field, "code": code, "error": message}


def _names(value: Any, field: str, vocabulary: frozenset[str], problems: list[Problem]) -> list[str]:
    """A list of distinct names from ``vocabulary``, sorted (the stored form)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(_problem(field, "must be a list of strings", "INVALID_TYPE"))
        return []
    unknown = sorted(set(value) - vocabulary)
    if unknown:
        problems.append(_problem(field, f"unknown {', '.join(map(repr, unknown))}; one of {', '.join(sorted(vocabulary))}",
                                 "INVALID_CHOICE"))
    if len(set(value)) != len(value):
        problems.append(_problem(field, "must not repeat a name", "INVALID_VALUE"))
    return sorted(set(value))


def normalise(value: Any, field: str = "evidence") -> tuple[dict[str, Any] | None, list[Problem]]:
    """The stored form of a declaration and every problem with it (kernel rules only; nothing imported).

    Returns ``(None, problems)`` when anything is wrong, so a bad declaration is never stored.
    """
    problems: list[Problem] = []
    if not isinstance(value, dict):
        return None, [_problem(field, "must be an object (provider, methods, provider_config, payload, verify, collect,"
                                      " retention)", "INVALID_TYPE")]
    for key in value:
        if key not in DECLARATION_KEYS:
            problems.append(_problem(f"{field}.{key}", f"unknown key {key!r}; one of {', '.join(DECLARATION_KEYS)}",
                                     "UNKNOWN_FIELD"))
    provider = value.get("provider", DEFAULT_PROVIDER)
    if provider is None:
        provider = DEFAULT_PROVIDER
    if isinstance(provider, str):
        provider = PROVIDER_ALIASES.get(provider, provider)
    if not isinstance(provider, str) or not _DRIVER_RE.match(provider):
        problems.append(_problem(f"{field}.provider", "must be a provider name ([a-z0-9_.-], max 64)", "INVALID_VALUE"))
        provider = DEFAULT_PROVIDER
    methods = value.get("methods")
    if methods is None:
        methods = []
    elif not isinstance(methods, list) or not all(isinstance(m, str) and _METHOD_RE.match(m) for m in methods):
        problems.append(_problem(f"{field}.methods", "must be a list of method names", "INVALID_TYPE"))
        methods = []
    elif len(set(methods)) != len(methods):
        problems.append(_problem(f"{field}.methods", "must not repeat a method", "INVALID_VALUE"))
    elif provider != DEFAULT_PROVIDER and CHECKSUM_ONLY_METHODS & set(methods):
        problems.append(_problem(
            f"{field}.methods",
            f"{', '.join(sorted(CHECKSUM_ONLY_METHODS & set(methods)))} is a checksum method; provider {provider!r} would"
            " not attest it (a declaration is never downgraded to a checksum): use provider checksum, or that provider's"
            " own methods", "CONFLICT"))
    config = value.get("provider_config")
    if config is None:
        config = {}
    elif not isinstance(config, dict):
        problems.append(_problem(f"{field}.provider_config", "must be an object of the provider's options", "INVALID_TYPE"))
        config = {}
    payload = value.get("payload")
    if payload is None:
        payload = {}
    elif not isinstance(payload, dict):
        problems.append(_problem(f"{field}.payload", "must be an object (bind, context, format)", "INVALID_TYPE"))
        payload = {}
    for key in payload:
        if key not in PAYLOAD_KEYS:
            problems.append(_problem(f"{field}.payload.{key}", f"unknown key {key!r}; one of {', '.join(PAYLOAD_KEYS)}",
                                     "UNKNOWN_FIELD"))
    bind = _names(payload.get("bind"), f"{field}.payload.bind", BIND_NAMES, problems)
    context = payload.get("context")
    if context is not None:
        try:
            size = len(canonical_bytes(context))
        except SchedulerError as exc:
            problems.append(_problem(f"{field}.payload.context", f"has no canonical JSON form: {exc.message}", "INVALID_VALUE"))
        else:
            if size > MAX_CONTEXT_BYTES:
                problems.append(_problem(f"{field}.payload.context", f"is {size} bytes of canonical JSON; at most"
                                                                      f" {MAX_CONTEXT_BYTES}", "TOO_LARGE"))
    fmt = payload.get("format", "canonical-json")
    if fmt not in PAYLOAD_FORMATS:
        problems.append(_problem(f"{field}.payload.format", "must be canonical-json (or its alias json)", "INVALID_CHOICE"))
        fmt = "canonical-json"
    verify = value.get("verify")
    required = False
    if verify is not None:
        if not isinstance(verify, dict):
            problems.append(_problem(f"{field}.verify", "must be an object ({\"required\": true|false})", "INVALID_TYPE"))
        else:
            for key in verify:
                if key not in VERIFY_KEYS:
                    problems.append(_problem(f"{field}.verify.{key}", f"unknown key {key!r}; only required", "UNKNOWN_FIELD"))
            required = verify.get("required", False)
            if not isinstance(required, bool):
                problems.append(_problem(f"{field}.verify.required", "must be true or false", "INVALID_TYPE"))
                required = False
    collect = _names(value.get("collect"), f"{field}.collect", COLLECT_NAMES, problems)
    retention = value.get("retention")
    if retention is not None:

        try:
            check_retention(retention)
        except SchedulerError as exc:
            problems.append(_problem(f"{field}.retention", exc.message, exc.code))
    if problems:
        return None, problems
    return {
        "provider": provider,
        "methods": list(methods),
        "provider_config": dict(config),
        "payload": {"bind": bind, "context": context, "format": PAYLOAD_FORMATS[fmt]},
        "verify": {"required": required},
        "collect": collect,
        "retention": retention,
    }, []


def check_evidence_ref(value: Any, field: str = "evidence_ref") -> list[Problem]:
    """Problems with an ``evidence_ref`` (a label carried into the evidence row: at most 256 characters, one line)."""
    if not isinstance(value, str):
        return [_problem(field, "must be a string", "INVALID_TYPE")]
    if not value.strip() or len(value) > MAX_EVIDENCE_REF_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return [_problem(field, f"must be 1-{MAX_EVIDENCE_REF_CHARS} characters without control characters", "INVALID_VALUE")]
    return []


def provider_problems(declaration: dict[str, Any], load: Callable[[str, str], Any],
                      field: str = "evidence") -> tuple[dict[str, Any] | None, list[Problem]]:
    """Check a normalised declaration against its installed provider (``load(kind, name)``; None when not installed).

    Returns the declaration with its ``provider_config`` normalised (None when unchanged or the
    provider is not installed: the missing-plugin rule reports that) and the problems.
    """
    provider = load("evidence", declaration["provider"])
    if provider is None:
        return None, []
    problems: list[Problem] = []
    supported = frozenset(getattr(provider, "methods", ()) or ())
    unsupported = [m for m in declaration["methods"] if m not in supported]
    if unsupported:
        problems.append(_problem(
            f"{field}.methods",
            f"provider {declaration['provider']!r} does not perform {', '.join(map(repr, unsupported))}"
            f" (it performs {', '.join(sorted(supported)) or 'nothing'})", "INVALID_CHOICE"))
    cls = options_class_of(provider)
    raw = declaration["provider_config"]
    config: dict[str, Any] | None = None
    if cls is None:
        if raw:
            problems.append(_problem(f"{field}.provider_config", f"provider {declaration['provider']!r} takes no provider_config",
                                     "UNKNOWN_FIELD"))
    else:
        kwargs, found = option_problems(cls, raw, f"{field}.provider_config")
        problems += found
        if not found:
            try:
                config = options_to_json(cls(**kwargs))
            except (TypeError, ValueError) as exc:
                problems.append(_problem(f"{field}.provider_config", str(exc), "INVALID_VALUE"))
    if problems:
        return None, problems
    if config is None or config == raw:
        return None, []
    return {**declaration, "provider_config": config}, []


__all__ = [
    "BIND_NAMES",
    "CHECKSUM_ONLY_METHODS",
    "COLLECT_NAMES",
    "DECLARATION_KEYS",
    "DEFAULT_PROVIDER",
    "MAX_CONTEXT_BYTES",
    "check_evidence_ref",
    "normalise",
    "provider_problems",
]
