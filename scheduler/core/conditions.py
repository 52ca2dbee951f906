"""Chain trigger conditions: ``contains:TEXT`` and ``regex:PATTERN`` on a parent's output.

Regexes run on RE2 (google-re2), a linear-time engine, so a hostile pattern or a
huge output cannot stall the completion transaction; the input is capped too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from scheduler.base.errors import SchedulerError

#: Only the first this-many characters of a parent's output are matched.
MAX_CONDITION_INPUT = 256 * 1024


@lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """Compile a pattern with RE2; raise ``INVALID_CONDITION`` for syntax RE2 refuses."""
    import re2  # third-party, imported on first use: commands that compile no pattern do not load it

    if not pattern:
        raise SchedulerError("INVALID_CONDITION", "regex: pattern must not be empty")
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except Exception as exc:  # noqa: BLE001 - re2.error and friends
        raise SchedulerError("INVALID_CONDITION", f"regex: cannot compile {pattern!r}: {exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc}") from None


def condition_matches(condition: str | None, text: str | None) -> bool:
    """Whether a parent's output satisfies a child's trigger condition (no condition: always)."""
    if not condition:
        return True
    subject = (text or "")[:MAX_CONDITION_INPUT]
    if condition.startswith("contains:"):
        return condition[len("contains:") :] in subject
    if condition.startswith("regex:"):
        return compile_pattern(condition[len("regex:") :]).search(subject) is not None
    raise SchedulerError("INVALID_CONDITION", f"unknown condition form: {condition[:40]!r}")
