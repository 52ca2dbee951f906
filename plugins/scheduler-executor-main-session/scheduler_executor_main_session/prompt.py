"""The text delivered to the main session: a header line and the payload, sanitised; the injection tripwire.

The sanitiser and the injection patterns are the toolkit's (``scheduler_toolkit.prompt_safety``: ``sanitise_text``,
``find_injection``, ``INJECTION_PATTERNS``), the same the agent executor uses, so the two
agent executors cannot drift apart.
"""

from __future__ import annotations

import hashlib

import attrs
from scheduler_toolkit.prompt_safety import find_injection, sanitise_text

from scheduler.api import ExecutionRequest, SchedulerError

#: The kernel's limit of ``payload_message`` (64 KiB).
PAYLOAD_MAX_BYTES = 64 * 1024
CHECKED_PROVENANCE = frozenset({"user_added", "external"})


@attrs.frozen(kw_only=True)
class Text:
    """What is delivered, and what the run records about it (size and digest, never the text)."""

    text: str
    details: dict


def assemble(request: ExecutionRequest) -> Text:
    """``[scheduler:<job_id> <name>]`` then the sanitised payload; ``PROMPT_INJECTION_BLOCKED`` before anything is sent."""
    job = request.job
    payload, cut = sanitise_text(job.payload_message or "", PAYLOAD_MAX_BYTES)
    if getattr(job, "provenance", "user_added") in CHECKED_PROVENANCE:
        found = find_injection(payload)
        if found:
            hit = found[0]
            raise SchedulerError("PROMPT_INJECTION_BLOCKED", f"the payload matches the injection pattern {hit!r}; "
                                 "nothing was delivered to the main session", details={"pattern": hit, "where": "payload"})
    name, _ = sanitise_text(job.name or "", 256)
    name = " ".join(name.split())
    text = f"[scheduler:{request.job_id} {name}]\n{payload}"
    data = text.encode("utf-8")
    details = {"prompt_bytes": len(data), "prompt_sha256": hashlib.sha256(data).hexdigest()}
    if cut:
        details["payload_bytes_cut"] = cut
    return Text(text=text, details=details)
