"""The artifact store: offloaded run output on disk, bound to its SHA-256 in the database.

Executors stream output through a ``StreamRecorder``: it keeps a bounded excerpt
for the database row, spills the whole stream to a file once it passes a
threshold, and always knows the byte count and SHA-256 of the complete stream.
The excerpt is text, so it is the stream itself only when the stream is short,
valid UTF-8 and free of NUL bytes; any other stream (binary output, however small)
is written to the artifact store too, so the exact bytes can always be read back.
Readers go through ``read_artifact`` / ``read_stream``, which refuse a path outside
the store and bytes whose digest no longer matches (tampering or corruption). The one
unverified read is ``read_growing``: a running run's offloaded file so far (``runs output --follow``).

Files and directories are created private (``0600``/``0700``) or group-shared
(``0660``/``2770``), see ``scheduler.core.filemodes``.
Where a store's artifacts live is ``scheduler.core.store.default_artifacts_root``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.core import filemodes
from scheduler.core.redaction import Redactions
from scheduler.core.rows import RunRow

#: Bytes of each stream kept in the database row.
DEFAULT_EXCERPT_BYTES = 64 * 1024
#: Streams larger than this are offloaded to a file in the artifact store.
DEFAULT_OFFLOAD_BYTES = 64 * 1024


@attrs.frozen(kw_only=True)
class StreamCapture:
    """One captured output stream: size and digest of the *whole* stream, an excerpt, maybe an artifact."""

    bytes: int
    sha256: str
    excerpt: str
    truncated: bool = False
    artifact: str | None = None  # path relative to the artifacts root, when the full stream was offloaded
    limit_exceeded: bool = False
    #: Credential values replaced by ``[REDACTED:<name>]`` in this stream: count per binding name (never a value).
    redactions: Mapping[str, int] = attrs.Factory(dict)


def run_dir(root: Path, run_id: str, *, create: bool = True) -> Path:
    """The per-run artifact directory (created unless ``create=False``: then on first offload)."""
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise SchedulerError("ARTIFACT_PATH_INVALID", f"bad run id for an artifact path: {run_id!r}")
    runs = _RUNS_DIRS.get(root)
    if runs is None:  # one path join per run, not two (every run's request names its directory)
        if len(_RUNS_DIRS) >= 64:
            _RUNS_DIRS.clear()
        runs = _RUNS_DIRS[root] = root / "runs"
    path = runs / run_id
    if create:
        filemodes.ensure_dir(path)
    return path


#: Artifacts root -> its ``runs`` directory; bounded, cleared when full.
_RUNS_DIRS: dict[Path, Path] = {}


def excerpt_is_exact(data: bytes) -> bool:
    """Whether ``data`` survives as a text excerpt byte for byte: valid UTF-8 and no NUL.

    NUL is excluded because PostgreSQL ``text`` cannot hold it; whatever fails this
    test is kept in the artifact store instead.
    """
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class StreamRecorder:
    """Records one output stream: hash and size of everything, excerpt in memory, file above a threshold."""

    def __init__(
        self,
        *,
        root: Path,
        directory: Path,
        name: str,
        excerpt_bytes: int = DEFAULT_EXCERPT_BYTES,
        offload_bytes: int = DEFAULT_OFFLOAD_BYTES,
        cap_bytes: int | None = None,
        redactions: Redactions | None = None,
    ) -> None:
        """``redactions`` (``ExecutionRequest.redactions``): credential values replaced by ``[REDACTED:<name>]``
        before anything is counted, hashed, buffered or offloaded; None takes the plain path (no scanning)."""
        self._root = root
        self._path = directory / name
        self._excerpt_limit = excerpt_bytes
        self._offload_bytes = offload_bytes
        self._cap = cap_bytes
        self._hash = hashlib.sha256()
        self._size = 0
        self._buffer = bytearray()
        self._file: BinaryIO | None = None
        self.limit_exceeded = False
        #: Why the artifact file could not be written, if it could not (``finish`` does not retry).
        self.offload_error: OSError | None = None
        self._redactor = redactions.stream() if redactions is not None else None
        self._head: bytes | None = None

    @property
    def head(self) -> bytes:
        """The whole recorded (redacted) stream while it is at most ``offload_bytes`` long, else ``b""`` (read the
        artifact): what a structured-output parser may read in memory, never the unredacted input."""
        if self._head is not None:
            return self._head
        return bytes(self._buffer) if self._file is None else b""

    @property
    def redaction_counts(self) -> dict[str, int]:
        """Occurrences replaced so far, per credential binding name (never a value)."""
        return dict(self._redactor.counts) if self._redactor is not None else {}

    def write(self, chunk: bytes) -> bool:
        """Record a chunk; False once the per-stream cap is exceeded (the caller should stop the process)."""
        if self._redactor is not None and chunk:
            chunk = self._redactor.feed(chunk)  # the tail that may start a secret stays back until the next chunk
        return self._record(chunk)

    def _record(self, chunk: bytes) -> bool:
        """Count, hash and keep (buffer or file) bytes that are final: already redacted."""
        if not chunk:
            return not self.limit_exceeded
        if self._cap is not None and self._size + len(chunk) > self._cap:
            chunk = chunk[: max(0, self._cap - self._size)]
            self.limit_exceeded = True
        self._hash.update(chunk)
        self._size += len(chunk)
        if self._file is not None:
            self._file.write(chunk)
        else:
            self._buffer.extend(chunk)
            if len(self._buffer) > self._offload_bytes:
                self._offload()
        return not self.limit_exceeded

    def _offload(self) -> None:
        """Start the artifact file with everything buffered so far; keep only the excerpt in memory.

        Raises the ``OSError`` when the file cannot be written (the caller decides: the
        shell executor stops the run with ``OUTPUT_CAPTURE_FAILED``).
        """
        try:
            filemodes.ensure_dir(self._path.parent)
            fd, _created = filemodes.create_file(self._path, os.O_WRONLY | os.O_TRUNC)
            self._file = os.fdopen(fd, "wb")
            self._file.write(self._buffer)
        except OSError as exc:
            self.offload_error = exc
            raise
        del self._buffer[self._excerpt_limit :]

    def finish(self) -> StreamCapture:
        """Close the stream and describe it.

        A stream still only in memory is offloaded now unless its excerpt is the whole
        stream byte for byte (``excerpt_is_exact``): a small binary or cut-off stream
        would otherwise survive only as a lossy excerpt.
        """
        if self._redactor is not None:
            try:
                self._record(self._redactor.flush())
            except OSError:
                pass  # offload_error is set: described below like any failed offload
        if self._head is None:
            self._head = bytes(self._buffer) if self._file is None else b""
        exact = len(self._buffer) <= self._excerpt_limit and excerpt_is_exact(bytes(self._buffer))
        if self._file is None and not exact and self.offload_error is None:
            try:
                self._offload()
            except OSError:
                pass  # described below: no artifact, and the excerpt marked as not the whole stream
        artifact = None
        if self._file is not None:
            self._file.close()
            artifact = str(self._path.relative_to(self._root))
        excerpt_bytes = bytes(self._buffer[: self._excerpt_limit])
        return StreamCapture(
            bytes=self._size,
            sha256=self._hash.hexdigest(),
            # A display excerpt when the stream is offloaded: undecodable bytes and NUL become U+FFFD.
            excerpt=excerpt_bytes.decode("utf-8", errors="replace").replace("\x00", "\ufffd"),
            # "The excerpt is not the whole stream": cut off, or not reproducible as text.
            truncated=self._size > len(excerpt_bytes) or (artifact is None and not exact),
            artifact=artifact,
            limit_exceeded=self.limit_exceeded,
            redactions=self.redaction_counts,
        )


def resolve_artifact(root: Path, relative: str) -> Path:
    """The absolute path of an artifact, refusing anything that escapes the store (``ARTIFACT_PATH_INVALID``)."""
    base = root.resolve()
    candidate = (base / relative).resolve()
    if relative.startswith(("/", "\\")) or base not in candidate.parents:
        raise SchedulerError("ARTIFACT_PATH_INVALID", f"artifact path escapes the artifact store: {relative!r}")
    return candidate


def read_artifact(root: Path, relative: str, expected_sha256: str, expected_bytes: int | None = None) -> bytes:
    """Read an offloaded artifact, verifying its digest (``ARTIFACT_MISSING`` / ``ARTIFACT_TAMPERED``)."""
    path = resolve_artifact(root, relative)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SchedulerError("ARTIFACT_MISSING", f"offloaded artifact is missing: {relative}") from None
    except OSError as exc:
        raise SchedulerError("ARTIFACT_MISSING", f"cannot read artifact {relative}: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected_sha256 or (expected_bytes is not None and len(data) != expected_bytes):
        raise SchedulerError(
            "ARTIFACT_TAMPERED",
            f"artifact {relative} does not match its recorded digest (expected {expected_sha256[:12]}..., found {digest[:12]}...)",
        )
    return data


def read_growing(root: Path, run_id: str, stream: str, offset: int, *, limit: int = 1024 * 1024) -> bytes:
    """What a running run's executor has offloaded so far to ``runs/<run_id>/<stream>``, from ``offset`` on (at most
    ``limit`` bytes): ``b""`` while it has none (short output stays in memory until the run ends).

    For ``runs output --follow`` only: the bytes are unverified, since a stream's digest is
    recorded when the run ends; the follower checks what it showed against ``read_stream`` then.
    Recorders write redacted bytes, so nothing here is a credential value. ``stream`` is
    ``stdout`` or ``stderr`` (the names executors record through ``request.stream_recorder``).
    """
    if stream not in ("stdout", "stderr"):
        raise SchedulerError("INVALID_ARGUMENT", f"unknown output stream {stream!r}; one of stdout, stderr")
    try:
        with open(run_dir(root, run_id, create=False) / stream, "rb") as fh:
            fh.seek(offset)
            return fh.read(limit)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise SchedulerError("ARTIFACT_MISSING", f"cannot read run {run_id}'s growing {stream}: {exc}") from None


def read_stream(root: Path, row: RunRow | Mapping[str, object], stream: str) -> bytes:
    """The exact bytes of one output stream of a run row, verified against its recorded size and SHA-256.

    An offloaded stream is read through ``read_artifact``; an inline one is its excerpt,
    which must hash to the recorded digest. A mismatch is ``ARTIFACT_TAMPERED`` (the row
    or file was changed, or an older recorder kept binary output only as a lossy
    excerpt); a stream of which only a cut-off excerpt was kept is ``ARTIFACT_MISSING``.
    Never returns bytes that do not match the record.
    """
    run = row if isinstance(row, RunRow) else RunRow.from_row(row)
    if stream == "stdout":
        artifact, digest, size, excerpt, truncated = (run.stdout_artifact, run.stdout_sha256, run.stdout_bytes,
                                                      run.stdout_excerpt, run.stdout_truncated)
    elif stream == "stderr":
        artifact, digest, size, excerpt, truncated = (run.stderr_artifact, run.stderr_sha256, run.stderr_bytes,
                                                      run.stderr_excerpt, run.stderr_truncated)
    else:
        raise SchedulerError("INVALID_ARGUMENT", f"unknown output stream {stream!r}; one of stdout, stderr")
    run_ref = run.id
    if artifact:
        if not digest:
            raise SchedulerError("ARTIFACT_TAMPERED", f"run {run_ref} {stream}: artifact {artifact} has no recorded digest")
        return read_artifact(root, artifact, digest, size)
    if not digest:
        if excerpt or size:
            raise SchedulerError("ARTIFACT_TAMPERED", f"run {run_ref} {stream}: output is stored without its digest")
        return b""  # nothing was recorded (the run never produced this stream)
    data = (excerpt or "").encode("utf-8")
    found = hashlib.sha256(data).hexdigest()
    if found == digest and (size is None or len(data) == size):
        return data
    if truncated:
        raise SchedulerError(
            "ARTIFACT_MISSING",
            f"run {run_ref} {stream}: only an excerpt of the {size}-byte stream was kept (cut off or not text), not the stream",
        )
    raise SchedulerError(
        "ARTIFACT_TAMPERED",
        f"run {run_ref} {stream}: the stored output does not match its recorded digest"
        f" (expected {digest[:12]}..., found {found[:12]}...; changed, or kept only as a lossy excerpt)",
    )
