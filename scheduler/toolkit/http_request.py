"""An HTTP request that can be stopped at once from another thread (for executors that talk to agents).

httpx has no way to interrupt a blocked read. ``AbortableRequest`` runs one streamed
request in a helper thread and hands what happens over a queue (``events``): ``("head",
response)``, ``("data", bytes)`` per chunk, then ``("end", None)`` or ``("fail", exc)``. The
supervising thread (the executor's worker) waits on the queue while it watches cancellation
and the run deadline; ``abort()`` shuts down the request's sockets (found through httpcore's
``trace`` extension), which wakes the helper out of its read and tells the server at once
that the client went away. The agent and main-session executors share it.
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any

#: httpcore trace events that carry a connected socket.
_CONNECTED = ("connection.connect_tcp.complete", "connection.start_tls.complete")


class AbortableRequest(threading.Thread):
    """One streamed ``POST`` of ``body`` (JSON) through ``client`` in a helper thread; ``start()`` it, read ``events``."""

    def __init__(self, client: Any, url: str, headers: dict[str, str], body: dict[str, Any], *, name: str = "http") -> None:
        super().__init__(name=name, daemon=True)
        self.client, self.url, self.headers, self.body = client, url, headers, body
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.aborted = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def _trace(self, name: str, info: dict[str, Any]) -> None:
        if name not in _CONNECTED:
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
        if self.aborted.is_set():  # aborted while connecting: this socket must not live either
            _shutdown(sock)

    def run(self) -> None:
        """The helper thread: the request, its chunks, its end or failure onto ``events`` (nothing once aborted)."""
        try:
            with self.client.stream("POST", self.url, headers=self.headers, json=self.body,
                                    extensions={"trace": self._trace}) as response:
                self.events.put(("head", response))
                for chunk in response.iter_bytes():
                    if self.aborted.is_set():
                        return
                    self.events.put(("data", chunk))
            self.events.put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the supervisor
            if not self.aborted.is_set():
                self.events.put(("fail", exc))

    def abort(self) -> None:
        """Stop now: the server sees the connection close, the helper's blocked read returns."""
        self.aborted.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


__all__ = ["AbortableRequest"]
