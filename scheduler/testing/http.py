"""A real HTTP server on loopback for tests (``LoopbackHTTPServer``): records every request, answers as scripted.

It lives in ``scheduler.conformance.loopback``, where the channel conformance stand-in
(``HttpStandIn``) is built on it; plugin tests import it from here.
"""

from __future__ import annotations

from scheduler.conformance.loopback import Behaviour, LoopbackHTTPServer, Recorded, Reply

__all__ = ["Behaviour", "LoopbackHTTPServer", "Recorded", "Reply"]
