"""The ``authorization_proof`` job field: validation and normalisation of the declaration (never of a proof).

A declaration says how each dispatch finds and checks its proof (docs/proofs.md)::

    {"method": "jwt", "source": {"env": "BACKUP_PROOF"}, "issuer": "https://idp.example",
     "audience": "scheduler", "algorithms": ["RS256"], "public_key_file": "/etc/scheduler/idp.pem", "clock_skew_s": 30}

The proof itself is never part of a job: ``source`` names where each dispatch reads it afresh (an
environment variable of the dispatcher or a file), and a key that looks like an inline proof is
refused. Unknown keys are refused. Problems are ``VALIDATION_FAILED`` details with the field code
``PROOF_DECLARATION_INVALID``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scheduler.core.rows import JSONObject

METHODS: tuple[str, ...] = ("jwt", "detached-signature", "certificate")
#: Asymmetric JWT algorithms only: a verifier holds a public key, never a shared secret (``HS*``) or ``none``.
JWT_ALGORITHMS: tuple[str, ...] = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
DEFAULT_JWT_ALGORITHMS: tuple[str, ...] = ("RS256", "ES256")
SIGNATURE_FORMATS: tuple[str, ...] = ("ssh", "ed25519")
DEFAULT_NAMESPACE = "scheduler-proof"
DEFAULT_SKEW_S = 30
MAX_SKEW_S = 300
CODE = "PROOF_DECLARATION_INVALID"

_COMMON = ("method", "source", "clock_skew_s")
_KEYS: dict[str, tuple[str, ...]] = {
    "jwt": (*_COMMON, "issuer", "audience", "algorithms", "public_key_file", "jwks_file", "jwks_url"),
    "detached-signature": (*_COMMON, "format", "allowed_signers_file", "principal", "namespace", "public_key_file"),
    "certificate": (*_COMMON, "ca_file", "subject", "san"),
}
#: Keys that would put a proof (or key material) into the job: refused with a message saying where proofs go.
_INLINE = frozenset({"value", "proof", "token", "jwt", "signature", "certificate_chain", "private_key", "value_from"})
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_TEXT_RE = re.compile(r"[^\x00-\x1f\x7f]{1,512}")
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9@._-]{1,128}")


def _problem(field: str, error: str) -> dict[str, str]:
    return {"field": field, "code": CODE, "error": error}


def _path(value: object, field: str, problems: list[dict[str, str]]) -> str | None:
    """An absolute path without NUL or ``..`` (the dispatcher's working directory is not the operator's)."""
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value or ".." in value.split("/") or len(value) > 4096:
        problems.append(_problem(field, "must be an absolute path without '..'"))
        return None
    return value


def _text(decl: Mapping[str, object], key: str, field: str, problems: list[dict[str, str]], *, required: bool) -> str | None:
    value = decl.get(key)
    if value is None:
        if required:
            problems.append(_problem(f"{field}.{key}", "is required"))
        return None
    if not isinstance(value, str) or not _TEXT_RE.fullmatch(value):
        problems.append(_problem(f"{field}.{key}", "must be 1-512 characters without control characters"))
        return None
    return value


def _source(value: object, field: str, problems: list[dict[str, str]]) -> JSONObject | None:
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in ("env", "file"):
        problems.append(_problem(field, 'must be {"env": "NAME"} or {"file": "/absolute/path"} (where each dispatch reads the'
                                        " proof afresh; a proof is never stored in the job)"))
        return None
    kind, target = next(iter(value.items()))
    if kind == "env":
        if not isinstance(target, str) or not _ENV_RE.fullmatch(target):
            problems.append(_problem(f"{field}.env", "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"))
            return None
        return {"env": target}
    path = _path(target, f"{field}.file", problems)
    return {"file": path} if path else None


def normalise(value: object, field: str = "authorization_proof") -> tuple[JSONObject | None, list[dict[str, str]]]:
    """Validate an ``authorization_proof`` declaration; return its normalised form (defaults filled in) and the problems."""
    problems: list[dict[str, str]] = []
    if not isinstance(value, dict):
        return None, [_problem(field, "must be an object")]
    method = value.get("method")
    if method not in METHODS:
        return None, [_problem(f"{field}.method", f"must be one of {', '.join(METHODS)}")]
    for key in sorted(str(k) for k in value if k not in _KEYS[method]):
        if key in _INLINE:
            problems.append(_problem(f"{field}.{key}", "a proof is never stored in the job: name where each dispatch reads it"
                                                       ' with source {"env": NAME} or {"file": PATH}'))
        else:
            problems.append(_problem(f"{field}.{key}", f"unknown key {key!r} for method {method} (known: {', '.join(_KEYS[method])})"))
    out: JSONObject = {"method": method}
    if "source" not in value:
        problems.append(_problem(f"{field}.source", "is required"))
    else:
        out["source"] = _source(value["source"], f"{field}.source", problems)
    skew = value.get("clock_skew_s", DEFAULT_SKEW_S)
    if isinstance(skew, bool) or not isinstance(skew, int) or not 0 <= skew <= MAX_SKEW_S:
        problems.append(_problem(f"{field}.clock_skew_s", f"must be an integer from 0 to {MAX_SKEW_S}"))
    out["clock_skew_s"] = skew
    if method == "jwt":
        out["issuer"] = _text(value, "issuer", field, problems, required=True)
        out["audience"] = _text(value, "audience", field, problems, required=True)
        algorithms = value.get("algorithms", list(DEFAULT_JWT_ALGORITHMS))
        if (not isinstance(algorithms, list) or not algorithms or len(algorithms) > len(JWT_ALGORITHMS)
                or any(a not in JWT_ALGORITHMS for a in algorithms)):
            problems.append(_problem(f"{field}.algorithms", f"must be a non-empty list of {', '.join(JWT_ALGORITHMS)}"))
        else:
            out["algorithms"] = sorted(set(algorithms))
        keys = [k for k in ("public_key_file", "jwks_file", "jwks_url") if k in value]
        if len(keys) != 1:
            problems.append(_problem(field, "needs exactly one of public_key_file, jwks_file, jwks_url"))
        elif keys[0] == "jwks_url":
            url = value["jwks_url"]
            if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s\x00]{1,2000}", url):
                problems.append(_problem(f"{field}.jwks_url", "must be an http(s) URL (plain http only to a loopback host)"))
            elif url.startswith("http://") and not _loopback(url):
                problems.append(_problem(f"{field}.jwks_url", "plain http is accepted only for a loopback host; use https"))
            else:
                out["jwks_url"] = url
        else:
            out[keys[0]] = _path(value[keys[0]], f"{field}.{keys[0]}", problems)
    elif method == "detached-signature":
        fmt = value.get("format", "ssh" if "allowed_signers_file" in value else "ed25519" if "public_key_file" in value else None)
        if fmt not in SIGNATURE_FORMATS:
            problems.append(_problem(f"{field}.format", f"must be one of {', '.join(SIGNATURE_FORMATS)}"))
        out["format"] = fmt
        if fmt == "ssh":
            out["allowed_signers_file"] = _path(value.get("allowed_signers_file"), f"{field}.allowed_signers_file", problems)
            out["principal"] = _text(value, "principal", field, problems, required=True)
            namespace = value.get("namespace", DEFAULT_NAMESPACE)
            if not isinstance(namespace, str) or not _NAMESPACE_RE.fullmatch(namespace):
                problems.append(_problem(f"{field}.namespace", "must be 1-128 characters of [A-Za-z0-9@._-]"))
            out["namespace"] = namespace
            if "public_key_file" in value:
                problems.append(_problem(f"{field}.public_key_file", "is for format ed25519 (ssh uses allowed_signers_file)"))
        elif fmt == "ed25519":
            out["public_key_file"] = _path(value.get("public_key_file"), f"{field}.public_key_file", problems)
            for key in ("allowed_signers_file", "principal", "namespace"):
                if key in value:
                    problems.append(_problem(f"{field}.{key}", "is for format ssh"))
    else:
        out["ca_file"] = _path(value.get("ca_file"), f"{field}.ca_file", problems)
        for key in ("subject", "san"):
            text = _text(value, key, field, problems, required=False)
            if text is not None:
                out[key] = text
    return (None, problems) if problems else (out, [])


def _loopback(url: str) -> bool:
    """Whether an ``http://`` URL names a loopback host (127.0.0.0/8, ::1, localhost)."""
    host = url[len("http://"):].split("/", 1)[0].rsplit("@", 1)[-1]
    if host.startswith("["):
        return host.split("]", 1)[0] == "[::1"
    host = host.split(":", 1)[0]
    return host == "localhost" or host.startswith("127.")


def recurring_warning(schedule_kind: str | None, declaration: Mapping[str, Any] | None) -> str | None:
    """What ``jobs validate`` says about a recurring job (cron, every) with a proof: each proof id serves ONE dispatch, so
    its source must hold a fresh proof before every slot, or the next dispatch is denied ``PROOF_REPLAYED`` (quarantine)."""
    if not declaration or schedule_kind not in ("cron", "every"):
        return None
    source = declaration.get("source") or {}
    if "env" in source:
        return (f"authorization_proof.source.env {source['env']} is fixed for the dispatcher's lifetime, but a recurring"
                f" ({schedule_kind}) job dispatches many times and each proof id is accepted once: the second dispatch would present the same"
                " proof and be denied PROOF_REPLAYED (the job quarantined). Use a file source that is refreshed before each slot")
    return (f"authorization_proof.source.file {source.get('file')} must be replaced with a freshly minted proof (new proof id)"
            f" before every slot of this recurring ({schedule_kind}) job: a proof id is accepted once, so a file that is not refreshed is"
            " denied PROOF_REPLAYED at the next dispatch (the job quarantined)")
