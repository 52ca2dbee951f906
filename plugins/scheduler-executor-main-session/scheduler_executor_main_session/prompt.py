"""The text delivered to the main session: a header line and the payload, sanitised; the injection tripwire.

COPIED from ``scheduler_executor_agent.prompt`` (``sanitise``, ``fold``, the pattern table,
``find_injection``) because a plugin imports only ``scheduler.api``. The kernel should offer
these as ``scheduler.api.prompt`` (one list of patterns, one sanitiser) so both agent
executors cannot drift apart.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

import attrs

from scheduler.api import ExecutionRequest, SchedulerError

#: The kernel's limit of ``payload_message`` (64 KiB).
PAYLOAD_MAX_BYTES = 64 * 1024
CHECKED_PROVENANCE = frozenset({"user_added", "external"})

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def sanitise(text: str, limit_bytes: int) -> tuple[str, int]:
    """``text`` without control characters, bounded to ``limit_bytes`` UTF-8 bytes: (text, bytes cut off)."""
    clean = _CONTROLS.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    raw = clean.encode("utf-8")
    if len(raw) <= limit_bytes:
        return clean, 0
    kept = raw[:limit_bytes].decode("utf-8", errors="ignore")
    return kept, len(raw) - len(kept.encode("utf-8"))


INJECTION_PATTERNS: dict[str, re.Pattern[str]] = {
    "system-tag": re.compile(r"[\[<]\s*/?\s*system\s*[\]>]"),
    "role-label": re.compile(r"(?m)^[ \t>#*_`-]*(?:system|assistant|human)\s*:"),
    "chat-template-token": re.compile(
        r"<\|\s*(?:im_start|im_end|system|user|assistant|endoftext|eot_id|start_header_id|end_header_id)\s*\|>"),
    "ignore-previous": re.compile(
        r"\b(?:ignore|disregard|forget)\s+(?:all\s+|any\s+|the\s+|your\s+)*(?:previous|prior|above|earlier|preceding)\b"),
    "override-instructions": re.compile(r"\boverride\s+(?:all\s+|the\s+|your\s+|any\s+)*(?:instructions|rules|system\s+prompt)\b"),
    "new-instructions": re.compile(r"\bnew\s+instructions\s*:"),
    "you-are-now": re.compile(r"\byou\s+are\s+now\b"),
    "act-as": re.compile(r"\bact\s+as\b"),
    "pretend-to-be": re.compile(r"\bpretend\s+to\s+be\b"),
    "jailbreak": re.compile(r"\bjailbreak"),
    "dan-mode": re.compile(r"\bdan\s+mode\b"),
    "developer-mode": re.compile(r"\bdeveloper\s+mode\b"),
    "instruction-header": re.compile(r"(?m)^[ \t]*#{1,6}[ \t]*(?:instructions?|system)\b"),
}
_SYSTEM_CAPS = re.compile(r"\bSYSTEM\s*:")


def fold(text: str) -> str:
    """NFKC (fullwidth letters become ASCII), format characters and soft hyphens removed, case folded."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf" and ch != "\u00ad")
    return text.casefold()


def find_injection(text: str) -> str | None:
    """The id of the first pattern (by position) ``text`` matches, or None."""
    nfkc = unicodedata.normalize("NFKC", "".join(ch for ch in text if unicodedata.category(ch) != "Cf"))
    if _SYSTEM_CAPS.search(nfkc):
        return "system-label"
    folded = fold(text)
    hits = [(m.start(), pid) for pid, rx in INJECTION_PATTERNS.items() if (m := rx.search(folded))]
    return min(hits)[1] if hits else None


@attrs.frozen(kw_only=True)
class Text:
    """What is delivered, and what the run records about it (size and digest, never the text)."""

    text: str
    details: dict


def assemble(request: ExecutionRequest) -> Text:
    """``[scheduler:<job_id> <name>]`` then the sanitised payload; ``PROMPT_INJECTION_BLOCKED`` before anything is sent."""
    job = request.job
    payload, cut = sanitise(job.payload_message or "", PAYLOAD_MAX_BYTES)
    if getattr(job, "provenance", "user_added") in CHECKED_PROVENANCE:
        hit = find_injection(payload)
        if hit:
            raise SchedulerError("PROMPT_INJECTION_BLOCKED", f"the payload matches the injection pattern {hit!r}; "
                                 "nothing was delivered to the main session", details={"pattern": hit, "where": "payload"})
    name, _ = sanitise(job.name or "", 256)
    name = " ".join(name.split())
    text = f"[scheduler:{request.job_id} {name}]\n{payload}"
    data = text.encode("utf-8")
    details = {"prompt_bytes": len(data), "prompt_sha256": hashlib.sha256(data).hexdigest()}
    if cut:
        details["payload_bytes_cut"] = cut
    return Text(text=text, details=details)
