"""The structured-output record of a run (``output_format`` ``json`` / ``ndjson``), for executors.

``structured_from_capture(fmt, capture, root=..., head=...)`` parses a captured stream (from
its artifact when it was offloaded) into the record the kernel stores: malformed output does
not fail the run, the record says ``valid: false`` and where parsing stopped.
``unparsed_record(fmt, total_bytes=..., sha256=..., artifact=..., warning=...)`` is the record
of output deliberately not parsed (a limit exceeded, an unreadable artifact). The code is
``scheduler.core.structured``, re-exported.
"""

from __future__ import annotations

from scheduler.core.structured import structured_from_capture, unparsed_record

__all__ = ["structured_from_capture", "unparsed_record"]
