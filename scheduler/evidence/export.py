"""Portable evidence: a run's evidence as an in-toto attestation in a DSSE envelope.

``runs evidence RUN_ID --export in-toto`` re-verifies the run's evidence from history
(``scheduler.evidence.verify.verify_run``; nothing is exported from evidence that does not verify)
and then writes it in a form anyone can check without this scheduler:

* an in-toto **Statement** v1 (``https://in-toto.io/Statement/v1``) whose **subjects** are
  the run's output streams (``run/<RUN_ID>/stdout`` and ``.../stderr``, each with the
  ``sha256`` of the COMPLETE stream as the payload binds it) and whose **predicate** is the
  evidence payload document itself (``predicateType`` ``PREDICATE_TYPE``). The Statement is
  serialised as json-sort-v1 canonical JSON, so the predicate's canonical form is byte for
  byte the stored payload and its SHA-256 is the evidence record's ``payload_sha256``;
* wrapped in a **DSSE** envelope (``payloadType`` ``application/vnd.in-toto+json``) signed
  with the host's Ed25519 key (``[evidence] export_key``), by ``securesystemslib``.

The Statement is built and validated with ``in_toto_attestation`` (its protobuf Statement and
ResourceDescriptor checks) and signed with ``securesystemslib.dsse``; only the predicate is
inserted as plain JSON, because the protobuf ``Struct`` would turn every integer of the
payload into a float and so change the bytes the evidence provider attested.

Both libraries are optional (``pip install 'scheduler-kernel[export]'``); they are imported
only here, only when exporting (``EVIDENCE_EXPORT_UNAVAILABLE`` when missing).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scheduler.base.canonical import canonical_bytes
from scheduler.base.errors import SchedulerError
from scheduler.evidence.payload import EvidenceFailure, parse_canonical
from scheduler.evidence.verify import verify_run
from scheduler.settings import current_settings

#: The predicate type of an exported run: the scheduler's evidence payload document.
PREDICATE_TYPE = "urn:scheduler-kernel:evidence-payload:v1"
#: DSSE payload type of in-toto Statements.
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: The export formats ``runs evidence --export`` knows.
EXPORT_FORMATS = ("in-toto",)
#: The output streams that become subjects, in order.
STREAMS = ("stdout", "stderr")


def _libraries() -> tuple[Any, Any, Any, Any, Any]:
    """The in-toto and DSSE library parts, or ``EVIDENCE_EXPORT_UNAVAILABLE`` when they are not installed."""
    try:
        from google.protobuf import json_format
        from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
        from in_toto_attestation.v1.statement import Statement
        from securesystemslib.dsse import Envelope
        from securesystemslib.signer import CryptoSigner
    except ImportError as exc:
        raise SchedulerError(
            "EVIDENCE_EXPORT_UNAVAILABLE",
            f"in-toto export needs the in-toto-attestation and securesystemslib packages ({exc});"
            " install them with: pip install 'scheduler-kernel[export]'",
        ) from None
    return json_format, ResourceDescriptor, Statement, Envelope, CryptoSigner


def configured_key_path(key_path: str | os.PathLike[str] | None = None) -> Path:
    """The signing key's path: ``key_path`` when given, else ``[evidence] export_key``; ``EVIDENCE_EXPORT_KEY_MISSING`` when neither."""
    if key_path is None:
        key_path = current_settings().kernel["evidence"].value.export_key
    if not key_path:
        raise SchedulerError(
            "EVIDENCE_EXPORT_KEY_MISSING",
            "no export signing key is configured: set [evidence] export_key in the settings file"
            " (or SCHEDULER_EVIDENCE_EXPORT_KEY) to an Ed25519 private key in PEM",
        )
    return Path(os.fspath(key_path)).expanduser()


def load_signing_key(path: Path) -> Any:
    """The Ed25519 private key in the PEM file ``path``; ``EVIDENCE_EXPORT_KEY_INVALID`` for anything else.

    Only an unencrypted Ed25519 key is accepted: the export promises an Ed25519 signature,
    and silently signing with another algorithm would change what a verifier must trust.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SchedulerError("EVIDENCE_EXPORT_KEY_INVALID", f"cannot read the export key {path}: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SchedulerError("EVIDENCE_EXPORT_KEY_INVALID",
                             f"the export key {path} is not an unencrypted PEM private key: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - cryptography raises UnsupportedAlgorithm for exotic keys
        raise SchedulerError("EVIDENCE_EXPORT_KEY_INVALID", f"the export key {path} cannot be loaded: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SchedulerError("EVIDENCE_EXPORT_KEY_INVALID",
                             f"the export key {path} is a {type(key).__name__.removeprefix('_')}, not an Ed25519 key")
    return key


def _hex_digest(value: Any, what: str) -> str:
    """The hex part of a ``sha256:<hex>`` digest (or bare hex) from the payload; ``EVIDENCE_EXPORT_FAILED`` otherwise."""
    text = value if isinstance(value, str) else ""
    hexpart = text.removeprefix("sha256:")
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise SchedulerError("EVIDENCE_EXPORT_FAILED", f"the evidence payload's {what} is not a SHA-256 digest")
    return hexpart


def stream_subjects(run_id: str, document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Statement subjects of a payload: one per output stream it binds, ``{name, digest: {sha256}}``."""
    result = document.get("result")
    if not isinstance(result, Mapping):
        raise SchedulerError("EVIDENCE_EXPORT_FAILED", "the evidence payload has no result to take output digests from")
    subjects = []
    for stream in STREAMS:
        value = result.get(f"{stream}_sha256")
        if value is None:
            continue
        subjects.append({"name": f"run/{run_id}/{stream}", "digest": {"sha256": _hex_digest(value, f"{stream}_sha256")}})
    if not subjects:
        raise SchedulerError("EVIDENCE_EXPORT_FAILED",
                             "the evidence payload binds no output stream digests (an interrupted run?), so it has no subject")
    return subjects


def build_statement(run_id: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """The in-toto Statement v1 of a run's payload, validated by ``in_toto_attestation``, with the exact predicate."""
    json_format, ResourceDescriptor, Statement, _, _ = _libraries()
    subjects = stream_subjects(run_id, document)
    descriptors = [ResourceDescriptor(name=s["name"], digest=s["digest"]).pb for s in subjects]
    statement = Statement(descriptors, PREDICATE_TYPE, dict(document))
    try:
        statement.validate()
    except ValueError as exc:
        raise SchedulerError("EVIDENCE_EXPORT_FAILED", f"the in-toto Statement is not valid: {exc}") from None
    body = json_format.MessageToDict(statement.pb)
    body["predicate"] = dict(document)  # exact: the protobuf Struct holds numbers as floats
    return body


def sign_statement(statement: Mapping[str, Any], key: Any) -> dict[str, Any]:
    """The DSSE envelope (as its JSON object) of ``statement`` in json-sort-v1 form, signed with the Ed25519 ``key``."""
    _, _, _, Envelope, CryptoSigner = _libraries()
    envelope = Envelope(payload=canonical_bytes(dict(statement)), payload_type=PAYLOAD_TYPE, signatures={})
    signer = CryptoSigner(key)
    envelope.sign(signer)
    return dict(envelope.to_dict())


def public_key_info(key: Any) -> dict[str, Any]:
    """The verifier's view of the signing key: its securesystemslib key id and its public key in PEM."""
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.signer import SSlibKey

    public = key.public_key()
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")
    return {"keyid": SSlibKey.from_crypto(public).keyid, "public_key_pem": pem}


def _verified(check: Any) -> tuple[bool, str | None, str | None]:
    """``(verified, code, message)`` of a ``verify_run`` outcome (an object or a JSON mapping)."""
    get = check.get if isinstance(check, Mapping) else (lambda name, default=None: getattr(check, name, default))
    verified = get("verified") is True
    code = get("code") or get("error_code")
    message = get("reason") or get("message") or get("error")
    return verified, code, message


def evidence_row(tx: Any, run_id: str) -> dict[str, Any]:
    """The evidence record of ``run_id`` (it survives its run's pruning); ``EVIDENCE_EXPORT_FAILED`` when there is none."""
    row = tx.one("SELECT * FROM evidence_records WHERE run_id = ?", (run_id,))
    if row is None:
        raise SchedulerError("EVIDENCE_EXPORT_FAILED", f"run {run_id} has no evidence record to export")
    return dict(row)


def export_in_toto(store: Any, run_id: str, *, key_path: str | os.PathLike[str] | None = None,
                   verify: Callable[[Any, str], Any] | None = None) -> dict[str, Any]:
    """The run's evidence as a signed in-toto DSSE envelope: ``{"envelope", "statement", "keyid", ...}``.

    Refuses (``EVIDENCE_EXPORT_KEY_MISSING`` / ``_KEY_INVALID``) before touching the run when no
    usable key is configured, and (``EVIDENCE_EXPORT_FAILED`` with the verification's code in
    ``details``) when the run's evidence does not re-verify: an export vouches for evidence
    the scheduler has just checked, never for a tampered record. Writes nothing.
    """
    key = load_signing_key(configured_key_path(key_path))
    _libraries()
    check = (verify or verify_run)(store, run_id)
    verified, code, message = _verified(check)
    if not verified:
        raise SchedulerError("EVIDENCE_EXPORT_FAILED",
                             f"run {run_id}'s evidence did not verify ({code}: {message}); nothing exported",
                             details={"verification_code": code})
    with store.read() as tx:
        row = evidence_row(tx, run_id)
    try:
        document = parse_canonical(str(row["canonical_payload"]).encode("utf-8"), "the stored evidence payload")
    except EvidenceFailure as exc:
        raise SchedulerError("EVIDENCE_EXPORT_FAILED", exc.message, details={"verification_code": exc.code}) from None
    statement = build_statement(run_id, document)
    envelope = sign_statement(statement, key)
    return {"run_id": run_id, "format": "in-toto", "payload_type": PAYLOAD_TYPE, "predicate_type": PREDICATE_TYPE,
            "payload_sha256": row["payload_sha256"], "provider": row.get("provider"),
            "subjects": statement["subject"], **public_key_info(key), "envelope": envelope}


def write_export(envelope: Mapping[str, Any], output: str | os.PathLike[str]) -> Path:
    """Write the envelope as JSON to ``output`` atomically (a temp file renamed into place); ``EVIDENCE_EXPORT_FAILED`` on I/O errors."""
    target = Path(os.fspath(output)).expanduser().absolute()
    data = (json.dumps(dict(envelope), indent=2, sort_keys=True) + "\n").encode("utf-8")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".export-", dir=target.parent if str(target.parent) else ".")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise SchedulerError("EVIDENCE_EXPORT_FAILED", f"cannot write {target}: {exc.strerror or exc}") from None
    return target
