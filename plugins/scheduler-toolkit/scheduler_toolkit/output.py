"""Output capture for executors: a stream recorded into the artifact store, and digest-checked reads back.

``StreamRecorder(root=..., directory=..., name=...)`` (or ``request.stream_recorder(name)``)
counts and hashes a whole stream, keeps an excerpt and offloads it to a file once it is large;
``finish()`` gives the ``StreamCapture`` an ``ExecutionResult`` carries. ``read_artifact``
reads an offloaded stream back, refusing one whose size or SHA-256 differs.
``DEFAULT_EXCERPT_BYTES`` / ``DEFAULT_OFFLOAD_BYTES`` are the kernel's limits. The kernel's
own code (``scheduler.core.outputs``), re-exported.
"""

from __future__ import annotations

from scheduler.core.outputs import DEFAULT_EXCERPT_BYTES, DEFAULT_OFFLOAD_BYTES, StreamCapture, StreamRecorder, read_artifact

__all__ = ["DEFAULT_EXCERPT_BYTES", "DEFAULT_OFFLOAD_BYTES", "StreamCapture", "StreamRecorder", "read_artifact"]
