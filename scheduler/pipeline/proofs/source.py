"""Reading a run's authorization proof afresh from the source its declaration names (an environment variable or a file).

The proof is never part of the job: every dispatch reads it again, so a source that is unset,
missing or empty is ``PROOF_MISSING``, and one larger than ``MAX_PROOF_BYTES`` or not UTF-8 text
is ``PROOF_MALFORMED``, before any verifier sees it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.files import read_capped

#: Largest proof (token or document) read from a source.
MAX_PROOF_BYTES = 64 * 1024


def read_source(declaration: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str:
    """The proof text from the declared source, read afresh (``PROOF_MISSING`` when absent, empty or oversized)."""
    source = declaration["source"]
    if "env" in source:
        value = (os.environ if env is None else env).get(source["env"], "")
        where = f"environment variable {source['env']}"
    else:
        where = f"file {source['file']}"
        raw = read_capped(source["file"], MAX_PROOF_BYTES, what="proof file", unreadable="PROOF_MISSING",
                          too_large="PROOF_MALFORMED")
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SchedulerError("PROOF_MALFORMED", f"the proof in {where} is not UTF-8 text") from None
    value = value.strip()
    if not value:
        raise SchedulerError("PROOF_MISSING", f"no proof: {where} is unset or empty")
    if len(value.encode("utf-8")) > MAX_PROOF_BYTES:
        raise SchedulerError("PROOF_MALFORMED", f"the proof in {where} is larger than {MAX_PROOF_BYTES} bytes")
    return value


__all__ = ["MAX_PROOF_BYTES", "read_source"]
