"""Reading a file a job or an operator names, never more than a limit: ``read_capped``.

A policy, key, JWKS or CA file is read whole, but a file that is too large (or a FIFO that never
ends) is refused with the caller's code instead of being read into memory. The kernel's own
code (``scheduler.base.files``), re-exported.
"""

from __future__ import annotations

from scheduler.base.files import read_capped

__all__ = ["read_capped"]
