"""Prompt safety for executors that hand text to a language model: one sanitiser, one injection tripwire.

Both agent executors (``agent`` and ``main-session``) build a prompt from text the operator
may not have written (a job's payload, a heartbeat file, another run's output). They must
clean it and check it the same way, so the shared part lives here, in the toolkit both
depend on; before, the ``main-session`` executor carried a copy of the agent executor's code
that could drift.

* :func:`sanitise_text`: CR/LF and lone CR become LF; C0 controls except TAB and LF, DEL,
  C1 controls and the bidi embedding/override/isolate characters are removed; *then* the
  text is bounded in UTF-8 bytes at a character boundary (never half a character).
* :data:`INJECTION_PATTERNS` and :func:`find_injection`: the known prompt-injection shapes
  (role labels, system tags, chat-template tokens, "ignore previous instructions" ...),
  matched over :func:`fold_text` (NFKC, format characters and soft hyphens removed, case
  folded) with word boundaries and line anchors, plus ``SYSTEM:`` in capitals on the
  unfolded text. The pattern ids are what ``PROMPT_INJECTION_BLOCKED`` names.

What an executor does with a match (which parts it checks, for which provenance, the
error's wording) stays the executor's own.
"""

from __future__ import annotations

import re
import unicodedata

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def sanitise_text(text: str, limit_bytes: int) -> tuple[str, int]:
    """``text`` without control characters, bounded to ``limit_bytes`` UTF-8 bytes: (text, bytes cut off).

    Line ends are normalised to LF first; C0 controls except TAB and LF, DEL, C1 controls and
    bidi embedding/override/isolate characters are removed; the result is then cut at a
    character boundary, so the limit counts the bytes that remain.
    """
    clean = _CONTROLS.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    raw = clean.encode("utf-8")
    if len(raw) <= limit_bytes:
        return clean, 0
    kept = raw[:limit_bytes].decode("utf-8", errors="ignore")  # never half a character
    return kept, len(raw) - len(kept.encode("utf-8"))


#: Pattern id -> regex over the folded text (:func:`fold_text`). The ids are what
#: ``PROMPT_INJECTION_BLOCKED`` names; the executors' READMEs list them.
INJECTION_PATTERNS: dict[str, re.Pattern[str]] = {
    "system-tag": re.compile(r"[\[<]\s*/?\s*system\s*[\]>]"),
    "role-label": re.compile(r"(?m)^[ \t>#*_`-]*(?:system|assistant|human)\s*:"),
    "chat-template-token": re.compile(
        r"<\|\s*(?:im_start|im_end|system|user|assistant|endoftext|eot_id|start_header_id|end_header_id)\s*\|>"),
    "ignore-previous": re.compile(
        r"\b(?:ignore|disregard|forget)\s+(?:all\s+|any\s+|the\s+|your\s+)*(?:previous|prior|above|earlier|preceding)\b"),
    "override-instructions": re.compile(
        r"\boverride\s+(?:all\s+|the\s+|your\s+|any\s+)*(?:instructions|rules|system\s+prompt)\b"),
    "new-instructions": re.compile(r"\bnew\s+instructions\s*:"),
    "you-are-now": re.compile(r"\byou\s+are\s+now\b"),
    "act-as": re.compile(r"\bact\s+as\b"),
    "pretend-to-be": re.compile(r"\bpretend\s+to\s+be\b"),
    "jailbreak": re.compile(r"\bjailbreak"),
    "dan-mode": re.compile(r"\bdan\s+mode\b"),
    "developer-mode": re.compile(r"\bdeveloper\s+mode\b"),
    "instruction-header": re.compile(r"(?m)^[ \t]*#{1,6}[ \t]*(?:instructions?|system)\b"),
}
#: ``SYSTEM:`` in capitals anywhere (checked on the unfolded text: ``file system:`` in prose is not a label).
_SYSTEM_CAPS = re.compile(r"\bSYSTEM\s*:")


def fold_text(text: str) -> str:
    """What injection patterns are matched against: NFKC (fullwidth letters become ASCII), format
    characters (zero-width space/joiners, soft hyphen, BOM) removed, case folded."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf" and ch != "\u00ad")
    return text.casefold()


def find_injection(text: str) -> tuple[str, str] | None:
    """The first injection pattern (by position) ``text`` matches: (pattern id, the matched text), or None.

    ``system-label`` (``SYSTEM:`` in capitals, on the NFKC text without format characters)
    is checked first; then every pattern of :data:`INJECTION_PATTERNS` over :func:`fold_text`.
    """
    nfkc = unicodedata.normalize("NFKC", "".join(ch for ch in text if unicodedata.category(ch) != "Cf"))
    caps = _SYSTEM_CAPS.search(nfkc)
    if caps:
        return "system-label", caps.group(0)
    folded = fold_text(text)
    hits = [(m.start(), pid, m.group(0)) for pid, rx in INJECTION_PATTERNS.items() if (m := rx.search(folded))]
    if not hits:
        return None
    _, pid, matched = min(hits)
    return pid, matched


__all__ = ["INJECTION_PATTERNS", "find_injection", "fold_text", "sanitise_text"]
