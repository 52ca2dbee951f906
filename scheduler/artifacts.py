"""The artifact store: offloaded run output on disk, bound to its SHA-256 in the database.

Executors stream output through a ``StreamRecorder``: it keeps a bounded excerpt
for the database row, spills the whole stream to a file once it passes a
threshold, and always knows the byte count and SHA-256 of the complete stream.
Readers go through ``read_artifact``, which refuses a path outside the store and
a file whose digest no longer matches (tampering or corruption).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from scheduler.errors import SchedulerError
from scheduler.execution import StreamCapture

#: Bytes of each stream kept in the database row.
DEFAULT_EXCERPT_BYTES = 64 * 1024
#: Streams larger than this are offloaded to a file in the artifact store.
DEFAULT_OFFLOAD_BYTES = 64 * 1024


def default_artifacts_root(db_location: str) -> Path:
    """``$SCHEDULER_ARTIFACTS_DIR``, else ``artifacts/`` beside a SQLite file, else the XDG data dir."""
    env = os.environ.get("SCHEDULER_ARTIFACTS_DIR")
    if env:
        return Path(env)
    if "://" not in db_location:
        return Path(db_location).expanduser().resolve().parent / "artifacts"
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "scheduler" / "artifacts"


def run_dir(root: Path, run_id: str, *, create: bool = True) -> Path:
    """The per-run artifact directory (created unless ``create=False``: then on first offload)."""
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise SchedulerError("ARTIFACT_PATH_INVALID", f"bad run id for an artifact path: {run_id!r}")
    path = root / "runs" / run_id
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


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
    ) -> None:
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

    def write(self, chunk: bytes) -> bool:
        """Record a chunk; False once the per-stream cap is exceeded (the caller should stop the process)."""
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
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self._path, "wb")
                self._file.write(self._buffer)
                del self._buffer[self._excerpt_limit :]
        return not self.limit_exceeded

    def finish(self) -> StreamCapture:
        """Close the stream and describe it."""
        artifact = None
        if self._file is not None:
            self._file.close()
            artifact = str(self._path.relative_to(self._root))
        excerpt_bytes = bytes(self._buffer[: self._excerpt_limit])
        return StreamCapture(
            bytes=self._size,
            sha256=self._hash.hexdigest(),
            excerpt=excerpt_bytes.decode("utf-8", errors="replace"),
            truncated=self._size > len(excerpt_bytes),
            artifact=artifact,
            limit_exceeded=self.limit_exceeded,
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
