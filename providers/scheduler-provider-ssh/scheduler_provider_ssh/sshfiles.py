"""Reading the SSH files the provider handles, without running anything: armored SSHSIG signatures and private keys.

Parsing the signature locally lets verification say precisely what is wrong (a
truncated or mangled signature, a namespace or key that differs from the envelope)
before ``ssh-keygen`` gives its single "Could not verify signature"; inspecting the
private key lets signing fail with a clear code (missing, unreadable, encrypted, too
open) instead of a passphrase prompt.

Formats: PROTOCOL.sshsig (``SSHSIG`` magic, version 1, public key, namespace, reserved,
hash algorithm, signature) and PROTOCOL.key (``openssh-key-v1``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat

import attrs
from scheduler_toolkit.evidence import EvidenceFailure

ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
ARMOR_END = "-----END SSH SIGNATURE-----"
MAX_SIGNATURE_CHARS = 64 * 1024
HASH_ALGORITHMS = frozenset({"sha256", "sha512"})
FINGERPRINT_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
_MAX_KEY_FILE = 1024 * 1024


def fingerprint_of(public_key_blob: bytes) -> str:
    """The ``SHA256:...`` fingerprint ``ssh-keygen -l`` prints for a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(public_key_blob).digest()).decode().rstrip("=")


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", f"{self.what} is truncated")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def uint32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def string(self) -> bytes:
        return self.take(self.uint32())

    def done(self) -> bool:
        return self.pos == len(self.data)


@attrs.frozen
class Signature:
    """What an SSHSIG signature says about itself (not yet whether it is valid)."""

    public_key: bytes
    key_type: str
    namespace: str
    hash_algorithm: str

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.public_key)


def parse_signature(text: object) -> Signature:
    """Parse an armored SSH signature; ``EVIDENCE_SIGNATURE_MALFORMED`` when it is truncated, mangled or not one."""
    if not isinstance(text, str) or not text.strip():
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature is missing or not text")
    if len(text) > MAX_SIGNATURE_CHARS:
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature is implausibly long")
    lines = [line.strip() for line in text.strip().splitlines()]
    if lines[0] != ARMOR_BEGIN:
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature does not start with the SSH SIGNATURE armor line")
    if len(lines) < 3 or lines[-1] != ARMOR_END:
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature is truncated (no closing armor line)")
    body = "".join(lines[1:-1])
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature's armored body is not base64 (truncated or mangled)") from None
    reader = _Reader(blob, "the signature")
    if reader.take(6) != b"SSHSIG":
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature is not an SSHSIG blob")
    version = reader.uint32()
    if version != 1:
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", f"unsupported SSHSIG version {version}")
    public_key = reader.string()
    namespace = reader.string()
    reader.string()  # reserved
    hash_algorithm = reader.string()
    signature = reader.string()
    if not reader.done():
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature has trailing bytes")
    key_reader = _Reader(public_key, "the signature's public key")
    key_type = key_reader.string()
    if not key_type or not signature:
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature holds no key or no signature value")
    try:
        algorithm = hash_algorithm.decode("ascii")
        return Signature(public_key=public_key, key_type=key_type.decode("ascii"), namespace=namespace.decode("utf-8"),
                         hash_algorithm=algorithm if algorithm in HASH_ALGORITHMS else _bad_hash(algorithm))
    except UnicodeDecodeError:
        raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", "the signature's fields are not text") from None


def _bad_hash(name: str) -> str:
    raise EvidenceFailure("EVIDENCE_SIGNATURE_MALFORMED", f"the signature uses an unsupported hash algorithm {name!r}")


def check_private_key(path: str) -> None:
    """Make sure ``ssh-keygen -Y sign`` can use ``path`` without a prompt; a coded failure saying why not.

    ``EVIDENCE_SSH_KEY_MISSING`` (no such file), ``EVIDENCE_SSH_KEY_UNREADABLE`` (not a
    readable regular file, permissions open to others, not an SSH private key),
    ``EVIDENCE_SSH_KEY_ENCRYPTED`` (protected by a passphrase: nobody is there to type it).
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise EvidenceFailure("EVIDENCE_SSH_KEY_MISSING", f"the signing key {path} does not exist") from None
    except OSError as exc:
        raise EvidenceFailure("EVIDENCE_SSH_KEY_UNREADABLE", f"the signing key {path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise EvidenceFailure("EVIDENCE_SSH_KEY_UNREADABLE", f"the signing key {path} is not a regular file")
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        raise EvidenceFailure("EVIDENCE_SSH_KEY_UNREADABLE",
                              f"the signing key {path} is accessible by others (mode {stat.S_IMODE(info.st_mode):04o});"
                              " ssh-keygen refuses it: chmod 600")
    if info.st_size > _MAX_KEY_FILE:
        raise EvidenceFailure("EVIDENCE_SSH_KEY_UNREADABLE", f"the signing key {path} is not an SSH private key (too large)")
    try:
        with open(path, "rb") as handle:
            content = handle.read(_MAX_KEY_FILE)
    except OSError as exc:
        raise EvidenceFailure("EVIDENCE_SSH_KEY_UNREADABLE", f"the signing key {path} cannot be read: {exc.strerror}") from None
    text = content.decode("ascii", "replace")
    if "-----BEGIN OPENSSH PRIVATE KEY-----" in text and "-----END OPENSSH PRIVATE KEY-----" in text:
        body = text.split("-----BEGIN OPENSSH PRIVATE KEY-----", 1)[1].split("-----END OPENSSH PRIVATE KEY-----", 1)[0]
        try:
            blob = base64.b64decode("".join(body.split()), validate=True)
            reader = _Reader(blob, "the key")
            if reader.take(15) != b"openssh-key-v1\x00":
                raise ValueError("magic")
            cipher = reader.string()
        except (binascii.Error, ValueError, EvidenceFailure):
            raise EvidenceFailure("EVIDENCE_SSH_KEY_UNREADABLE", f"the signing key {path} is a damaged OpenSSH private key") from None
        if cipher != b"none":
            raise EvidenceFailure("EVIDENCE_SSH_KEY_ENCRYPTED",
                                  f"the signing key {path} is protected by a passphrase; the scheduler signs unattended:"
                                  " use a key without one, readable only by the scheduler's account")
        return
    pem = re.search(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----(.*?)-----END", text, re.DOTALL)
    if pem:
        if "ENCRYPTED" in pem.group(1) or "ENCRYPTED" in pem.group(2):
            raise EvidenceFailure("EVIDENCE_SSH_KEY_ENCRYPTED", f"the signing key {path} is protected by a passphrase")
        return
    raise EvidenceFailure("EVIDENCE_SSH_KEY_UNREADABLE",
                          f"the signing key {path} is not an SSH private key (a public key or an agent key cannot sign here)")
