"""Pumping a child's pipes: stdout and stderr read concurrently, stdin fed, no deadlock at any size.

One ``poll`` loop over all pipes of one process (on the worker's own thread, or
on a background thread once the worker must do something else): it reads whatever
stream has data (so a child blocked writing stderr never waits for stdout to finish)
and writes stdin in non-blocking chunks. It stops at EOF on both output pipes, or
when told to (``stop``), so an escaped grandchild holding a pipe open can never keep
it alive. The pump alone reads and closes the pipes.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import os
import select
import threading
import time
from typing import Any, Protocol

from scheduler_toolkit.output import StreamCapture, StreamRecorder

#: Bytes per read; pipes are enlarged to this size when the kernel allows it.
READ_CHUNK = 1 << 20
#: A read this large found the pipe full (Linux's default capacity): the stream is chatty, enlarge its pipe.
FULL_PIPE = 1 << 16
#: How often the loop looks at the stop flag when no pipe is ready.
POLL_S = 0.05
#: The poll events that tell EOF of a pipe on their own: a hang-up alone (no data, no error) has nothing left to read.
_EOF_ONLY = select.POLLHUP | select.POLLIN | select.POLLERR | select.POLLNVAL


class Sink(Protocol):
    """Where one output stream goes; ``write`` returns False once a cap is exceeded."""

    def write(self, chunk: bytes) -> bool:
        """Take one chunk."""


class RecorderSink:
    """A ``StreamRecorder`` and the head of the stream as recorded, while it is small.

    The recorder's excerpt is decoded text; structured-output parsing needs the bytes.
    The recorder keeps them (redacted: credential values are already replaced) while the
    stream is within its offload threshold; ``head`` hands them out up to ``keep_bytes``:
    a stream that fits is whole in ``head``; a larger one is in the artifact file.
    """

    def __init__(self, recorder: StreamRecorder, *, keep_bytes: int) -> None:
        self.recorder = recorder
        self._keep = keep_bytes

    def write(self, chunk: bytes) -> bool:
        """Record a chunk; False once the recorder's cap is exceeded."""
        return self.recorder.write(chunk)

    @property
    def head(self) -> bytes:
        """The recorded stream if it stayed within ``keep_bytes``, else empty (read the artifact)."""
        head = self.recorder.head
        return head if len(head) <= self._keep else b""

    def finish(self) -> StreamCapture:
        """Close the recorder and describe the stream."""
        return self.recorder.finish()


class HashSink:
    """Counts and hashes a stream without storing any of it (verification output).

    With ``redactions`` (``ExecutionRequest.redactions``) the count and digest cover the
    redacted bytes, as for recorded output; call ``finish`` once the stream has ended.
    """

    def __init__(self, redactions: Any = None) -> None:
        self._hash = hashlib.sha256()
        self.bytes = 0
        self._redactor = redactions.stream() if redactions is not None else None

    def write(self, chunk: bytes) -> bool:
        """Hash a chunk; never refuses."""
        if self._redactor is not None:
            chunk = self._redactor.feed(chunk)
        self._hash.update(chunk)
        self.bytes += len(chunk)
        return True

    def finish(self) -> None:
        """End of stream: account for the bytes a redactor still held back."""
        if self._redactor is not None:
            tail = self._redactor.flush()
            self._hash.update(tail)
            self.bytes += len(tail)

    @property
    def sha256(self) -> str:
        """Hex digest of everything written so far."""
        return self._hash.hexdigest()


def _enlarge_pipe(fd: int) -> None:
    """Best effort: a bigger pipe buffer means fewer wake-ups for chatty commands (done at their first full read)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, READ_CHUNK)
    except (OSError, AttributeError):
        pass


class PipePump:
    """Drains a process's stdout/stderr into sinks and feeds its stdin: inline on the caller's thread, or on a thread of its own.

    The worker that runs a command drives the selector itself (``step``), so a short
    command costs no thread: the same ``select`` also watches ``exit_fd`` (a pidfd,
    readable once the leader has exited, without reaping it), so the exit is seen the
    moment it happens instead of at the next poll. When the worker has something else
    to do while output must keep flowing (terminating the group), ``start`` hands the
    rest of the loop to a background thread.
    """

    def __init__(
        self,
        outputs: dict[str, tuple[int, Sink]],
        *,
        stdin: int | None = None,
        stdin_data: bytes = b"",
        exit_fd: int | None = None,
    ) -> None:
        """``outputs``: stream name to (read end, sink); ``stdin``: the write end to feed ``stdin_data`` into.
        The pump owns these fds from now on and closes every one of them (``exit_fd`` stays the caller's)."""
        self._outputs = outputs
        self._stdin = stdin
        #: The pipe fds this pump still has to close.
        self._open_fds = {fd for fd, _ in outputs.values()} | ({stdin} if stdin is not None else set())
        self._stdin_data = memoryview(stdin_data)
        self._exit_fd = exit_fd
        #: Set by ``stop`` (plain flags: a pump has at most one thread besides the caller's, and it only polls them).
        self._stop = False
        #: True as soon as any sink refuses a chunk (its cap was exceeded).
        self.limit_exceeded = False
        #: True once ``exit_fd`` became readable: the leader exited (it is not reaped).
        self.leader_exited = False
        self._ended = False
        #: Names of the streams that exceeded their cap.
        self.exceeded: list[str] = []
        self.error: BaseException | None = None
        self._poll: select.poll | None = None
        #: What each polled fd is: ``(name, sink)`` of an output, None for stdin, "exit" for ``exit_fd``.
        self._fds: dict[int, tuple[str, Sink] | str | None] = {}
        self._readers = len(outputs)
        self._enlarged: set[int] = set()
        self._thread: threading.Thread | None = None

    @property
    def watches_exit(self) -> bool:
        """True while ``exit_fd`` tells this pump about the leader's exit."""
        return self._exit_fd is not None

    def _open(self) -> select.poll:
        """The poll set, made on first use: poll, not epoll, for a handful of fds of one short-lived process
        (no epoll instance to create, fill and close with a system call per fd)."""
        poll = self._poll
        if poll is None:
            poll = self._poll = select.poll()
            for name, (fd, sink) in self._outputs.items():
                self._watch(fd, select.POLLIN, (name, sink))
            if self._stdin is not None:
                os.set_blocking(self._stdin, False)
                self._watch(self._stdin, select.POLLOUT, None)
            if self._exit_fd is not None:
                self._watch(self._exit_fd, select.POLLIN, "exit")
        return poll

    def _watch(self, fd: int, events: int, what: tuple[str, Sink] | str | None) -> None:
        assert self._poll is not None
        self._poll.register(fd, events)
        self._fds[fd] = what

    def _unwatch(self, fd: int) -> None:
        assert self._poll is not None
        self._poll.unregister(fd)
        del self._fds[fd]

    def _round(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for any watched fd (readable, writable, hang-up or error) and handle each."""
        for fd, events in self._open().poll(math.ceil(max(0.0, timeout_s) * 1000)):
            if fd in self._fds:
                self._handle(fd, events)

    def step(self, timeout_s: float) -> None:
        """One round on the caller's thread: wait up to ``timeout_s`` for output, stdin room or the exit; handle it.

        Errors are kept in ``error`` (the pipes are closed then); never raises.
        """
        if self._ended:
            if timeout_s > 0:
                time.sleep(timeout_s)  # nothing left to pump; only this caller's thread can be waiting
            return
        try:
            if not self._readers and self.leader_exited:
                self._teardown()
                return
            self._round(timeout_s)
            if not self._readers and (self.leader_exited or self._exit_fd is None):
                self._teardown()
        except BaseException as exc:  # noqa: BLE001 - e.g. the artifact disk is full: reported, never silent
            self.error = exc
            self._teardown()

    def _handle(self, fd: int, events: int) -> None:
        what = self._fds[fd]
        if what == "exit":
            self._unwatch(fd)
            self.leader_exited = True
            return
        if what is None:
            if self._feed_stdin():
                self._unwatch(fd)
                self._close_stdin()
            return
        assert isinstance(what, tuple)
        name, sink = what
        if events & _EOF_ONLY == select.POLLHUP:
            chunk = b""  # hang-up with nothing left to read: EOF without a read(2) to say so
        else:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
        if not chunk:
            self._unwatch(fd)
            self._close(fd)
            self._readers -= 1
            return
        if len(chunk) >= FULL_PIPE and fd not in self._enlarged:
            self._enlarged.add(fd)
            _enlarge_pipe(fd)
        if not sink.write(chunk) and not self.limit_exceeded:
            self.exceeded.append(name)
            self.limit_exceeded = True

    def _teardown(self) -> None:
        """Stop watching and close every pipe; idempotent."""
        self._fds.clear()
        for fd in list(self._open_fds):
            self._close(fd)
        self._ended = True

    def start(self) -> None:
        """Go on pumping on a background thread (the caller no longer calls ``step``)."""
        if self._thread is None and not self._ended:
            self._thread = threading.Thread(target=self._run, name="shell-pipe-pump", daemon=True)
            self._thread.start()

    @property
    def finished(self) -> bool:
        """True once every output pipe reached EOF and was closed (or the pump was stopped)."""
        return self._ended or not self._readers

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for EOF on all outputs; True when the pump is done."""
        if self._thread is not None:
            self._thread.join(max(0.0, timeout_s))
            return not self._thread.is_alive()
        end = time.monotonic() + max(0.0, timeout_s)
        while not self._ended and self._readers and not self._stop:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.step(min(left, POLL_S))
        if not self._ended:
            self._teardown()
        return True

    def stop(self, timeout_s: float = 1.0) -> bool:
        """Abandon the pipes (a process outside the group still holds them) and close them."""
        self._stop = True
        if self._thread is None:
            self._teardown()
            return True
        return self.join(timeout_s)

    def _run(self) -> None:
        """The background loop: until EOF on every output or ``stop``; closes every pipe when it ends."""
        try:
            while self._readers and not self._stop:
                self._round(POLL_S)
        except BaseException as exc:  # noqa: BLE001 - e.g. the artifact disk is full: reported, never silent
            self.error = exc
        finally:
            self._teardown()

    def _feed_stdin(self) -> bool:
        """Write the next chunk of stdin; True when all was written or the reader went away."""
        if not self._stdin_data:
            return True
        try:
            written = os.write(self._stdin, self._stdin_data[:READ_CHUNK])  # type: ignore[arg-type]
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:  # EPIPE: the command does not read its input; that is its business
            return True
        self._stdin_data = self._stdin_data[written:]
        return not self._stdin_data

    def _close_stdin(self) -> None:
        """Close stdin (EOF for the command); idempotent."""
        if self._stdin is not None:
            self._close(self._stdin)

    def _close(self, fd: int) -> None:
        """Close one of the pump's pipe fds, once (a number closed twice could be someone else's by then)."""
        if fd in self._open_fds:
            self._open_fds.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass
