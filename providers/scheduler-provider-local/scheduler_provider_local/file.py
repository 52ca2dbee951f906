"""``file``: a credential read from a private file under one of the configured roots.

The binding's ``ref`` is an absolute path (``~`` expands to the dispatcher's home).
It is read only when

* ``[providers.file] roots`` lists a directory that holds it: both the path as
  written and the path with every symlink resolved must lie under the same root
  (no root configured: every ref is refused; a job must never read the
  dispatcher's SSH key just because it is 0600);
* it is a regular file owned by the dispatcher's user (or root) with no group or
  other permission bit (``chmod 600``/``400``);
* it holds at most ``max_bytes``.

The file is opened component by component from the root with ``O_NOFOLLOW``, so a
directory or the file itself swapped for a symlink between the check and the read is
refused (``CREDENTIAL_REF_DENIED``) rather than followed. The mode, owner and type
are checked on the open descriptor, not on the name.

``read_private_file`` is the same reader without the roots rule, for settings
references (see ``schemes.py``).
"""

from __future__ import annotations

import errno
import os
import stat

import attrs
from scheduler_toolkit.settings import plugin_settings

from scheduler.api import CredentialBinding, CredentialContext, ResolvedCredential
from scheduler_provider_local.errors import CredentialError

DEFAULT_MAX_BYTES = 64 * 1024
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted at the path must not block the dispatcher


def _absolute_dirs(value: list[str]) -> str | None:
    bad = [r for r in value if not os.path.isabs(os.path.expanduser(r))]
    return "each root must be an absolute directory path (~ allowed)" if bad else None


@attrs.frozen(kw_only=True)
class FileSettings:
    """``[providers.file]``: where credential files may live and how large they may be."""

    roots: list[str] = attrs.field(factory=list, metadata={
        "check": _absolute_dirs, "doc": "Directories a binding's file must lie in (after resolving symlinks too); none: every ref is refused."})
    max_bytes: int = attrs.field(default=DEFAULT_MAX_BYTES, metadata={
        "minimum": 1, "maximum": 16 * 1024 * 1024, "doc": "Largest credential file read, in bytes."})
    strip_newline: bool = attrs.field(default=True, metadata={
        "doc": "Drop one trailing line end (\\n or \\r\\n), as editors and echo add one."})


class FileRefused(Exception):
    """Why a file was not read: a ``CREDENTIAL_*`` code and a message that names the path, never its content."""

    def __init__(self, code: str, message: str, **details: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _check_and_read(fd: int, shown: str, max_bytes: int) -> bytes:
    """The content of an open descriptor once type, owner, mode and size pass."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused("CREDENTIAL_FILE_INSECURE", f"{shown} is not a regular file", reason="not-regular")
    if info.st_uid not in (os.geteuid(), 0):
        raise FileRefused("CREDENTIAL_FILE_INSECURE", f"{shown} is owned by uid {info.st_uid}, not by the dispatcher's "
                          f"user ({os.geteuid()}) or root", reason="owner")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise FileRefused("CREDENTIAL_FILE_INSECURE", f"{shown} has mode {mode:04o}: group or other may access it "
                          "(chmod 600)", reason="mode", mode=f"{mode:04o}")
    if info.st_size > max_bytes:
        raise FileRefused("CREDENTIAL_FILE_TOO_LARGE", f"{shown} holds {info.st_size} bytes, more than {max_bytes}",
                          size=info.st_size, max_bytes=max_bytes)
    chunks: list[bytes] = []
    total = 0
    while True:  # bounded even if the file grows while we read it
        chunk = os.read(fd, min(65536, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise FileRefused("CREDENTIAL_FILE_TOO_LARGE", f"{shown} holds more than {max_bytes} bytes", max_bytes=max_bytes)
    return b"".join(chunks)


def _open_beneath(root: str, parts: list[str], shown: str) -> int:
    """Open ``root/parts...`` one component at a time, never following a symlink (the parts are already resolved)."""
    fd = os.open(root, _OPEN_FLAGS | _DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = _OPEN_FLAGS | _NOFOLLOW | (_NONBLOCK if last else _DIRECTORY)
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise FileRefused("CREDENTIAL_REF_DENIED", f"{shown} changed into a symlink while it was opened",
                                      reason="symlink-swapped") from None
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _decode(raw: bytes, strip_newline: bool) -> str | bytes:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw  # binary credentials (a keystore) stay bytes; a file presentation carries them as they are
    if strip_newline:
        text = text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")
    return text


def read_credential_file(ref: str, settings: FileSettings) -> tuple[str | bytes, dict[str, object]]:
    """Read a credential file per the rules of this module: (value, non-secret metadata). Raises ``FileRefused``."""
    path = os.path.expanduser(ref)
    if not os.path.isabs(path):
        raise FileRefused("CREDENTIAL_REF_INVALID", "file ref must be an absolute path (~ allowed)", reason="relative")
    if not settings.roots:
        raise FileRefused("CREDENTIAL_REF_DENIED", f"{path}: [providers.file] roots is empty, so no file may be read",
                          reason="no-roots")
    lexical = os.path.normpath(path)
    real = os.path.realpath(path)
    roots = [(os.path.normpath(os.path.expanduser(r)), os.path.realpath(os.path.expanduser(r))) for r in settings.roots]
    named = [(r, rr) for r, rr in roots if _within(lexical, r) or _within(lexical, rr)]
    if not named:
        raise FileRefused("CREDENTIAL_REF_DENIED", f"{path} is not under any [providers.file] root", reason="outside-roots")
    home = next((rr for _, rr in named if _within(real, rr)), None)
    if home is None:
        raise FileRefused("CREDENTIAL_REF_DENIED", f"{path} resolves (through a symlink) outside its root",
                          reason="symlink-escape")
    if real == home:
        raise FileRefused("CREDENTIAL_FILE_INSECURE", f"{path} is a root directory, not a file", reason="not-regular")
    parts = os.path.relpath(real, home).split(os.sep)
    try:
        fd = _open_beneath(home, parts, path)
    except FileNotFoundError:
        raise FileRefused("CREDENTIAL_NOT_FOUND", f"{path} does not exist") from None
    except OSError as exc:
        raise FileRefused("CREDENTIAL_FILE_UNREADABLE", f"{path} cannot be opened: {exc.strerror or type(exc).__name__}") from None
    try:
        raw = _check_and_read(fd, path, settings.max_bytes)
    except OSError as exc:
        raise FileRefused("CREDENTIAL_FILE_UNREADABLE", f"{path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    finally:
        os.close(fd)
    if not raw:
        raise FileRefused("CREDENTIAL_EMPTY", f"{path} is empty")
    value = _decode(raw, settings.strip_newline)
    if value in ("", b""):
        raise FileRefused("CREDENTIAL_EMPTY", f"{path} holds only a line end")
    return value, {"provider": "file", "source": f"file:{path}", "bytes": len(raw)}


def read_private_file(path: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> str | None:
    """A settings reference's file: the same type/owner/mode/size checks, no roots (the operator wrote the path).

    None when it does not exist (the ``SecretRef`` contract); ``PermissionError`` whose
    ``strerror`` says what is wrong otherwise (``SecretRef.resolve`` reports it as
    ``SECRET_UNRESOLVED``). Symlinks are followed here: the settings file is as trusted
    as its references, and mounted secrets (Kubernetes) are symlinks.
    """
    path = os.path.expanduser(path)
    try:
        fd = os.open(path, _OPEN_FLAGS | _NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        raw = _check_and_read(fd, path, max_bytes)
    except FileRefused as refused:
        raise PermissionError(errno.EACCES, refused.message) from None
    finally:
        os.close(fd)
    value = _decode(raw, True)
    if isinstance(value, bytes):
        raise PermissionError(errno.EINVAL, f"{path} is not UTF-8 text")
    return value


class FileCredentialProvider:
    """Credential driver ``file`` (group ``scheduler.credential_providers``)."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset()  # a file is re-read at every resolve: nothing to refresh or revoke
    settings_class = FileSettings

    def __init__(self) -> None:
        self._settings: FileSettings | None = None

    def configure(self, settings: FileSettings) -> None:
        """The loader hands over the validated ``[providers.file]`` table."""
        self._settings = settings

    def _current(self) -> FileSettings:
        return self._settings if self._settings is not None else plugin_settings("credential", "file", FileSettings)

    def resolve(self, binding: CredentialBinding, context: CredentialContext) -> ResolvedCredential:
        """The file's content; ``CREDENTIAL_*`` naming the path when it may not or cannot be read."""
        try:
            value, metadata = read_credential_file(binding.ref, self._current())
        except FileRefused as refused:
            raise CredentialError(refused.code, f"credential {binding.name!r}: {refused.message}",
                                  details={"binding": binding.name, "provider": "file", "ref": binding.ref, **refused.details}) from None
        return ResolvedCredential.for_binding(binding, value, metadata=metadata)
