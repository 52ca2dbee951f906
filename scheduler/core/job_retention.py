"""A job's ``retention`` field: how long its runs are kept (the rules: ``scheduler.ops.retention_rules``).

The field is validated when the job is stored, like every other spec field, so its normaliser is
part of the kernel's spec validation; it is not part of the execution artifact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import format_duration_ms, parse_duration_ms

if TYPE_CHECKING:
    from scheduler.core.rows import JSONObject

#: The largest ``keep_runs`` accepted (settings and job field alike).
MAX_KEEP_RUNS = 10_000_000
#: The shortest age a rule may name (a run younger than a minute is never pruned by age).
MIN_AGE_MS = 60_000
#: ``max_age`` of a job whose runs are all kept.
FOREVER = "forever"
_JOB_KEYS = ("keep_runs", "max_age")


def normalise_job_retention(value: object, field: str = "retention") -> tuple[JSONObject | None, list[dict[str, str]]]:
    """Validate a job's ``retention`` object: ``{keep_runs?: int, max_age?: duration | "forever"}``, at least one key.

    Returns the normalised object (durations in their compact form) and the problems,
    each ``{"field", "code", "error"}``; anything else than those keys is refused.
    """
    problems: list[dict[str, str]] = []

    def bad(where: str, code: str, error: str) -> None:
        problems.append({"field": where, "code": code, "error": error})

    if not isinstance(value, dict):
        bad(field, "INVALID_TYPE", "must be an object with keep_runs and/or max_age")
        return None, problems
    unknown = [k for k in value if k not in _JOB_KEYS]
    for key in unknown:
        bad(f"{field}.{key}", "UNKNOWN_FIELD", f"unknown key {key!r} (known: keep_runs, max_age)")
    if not any(k in value for k in _JOB_KEYS):
        bad(field, "REQUIRED", "set keep_runs and/or max_age")
    out: JSONObject = {}
    if "keep_runs" in value:
        keep = value["keep_runs"]
        if isinstance(keep, bool) or not isinstance(keep, int):
            bad(f"{field}.keep_runs", "INVALID_TYPE", "must be an integer")
        elif not 1 <= keep <= MAX_KEEP_RUNS:
            bad(f"{field}.keep_runs", "OUT_OF_RANGE", f"must be between 1 and {MAX_KEEP_RUNS}")
        else:
            out["keep_runs"] = keep
    if "max_age" in value:
        age = value["max_age"]
        if age == FOREVER:
            out["max_age"] = FOREVER
        else:
            try:
                ms = parse_duration_ms(age, field=f"{field}.max_age")
                if ms < MIN_AGE_MS:
                    bad(f"{field}.max_age", "OUT_OF_RANGE", "must be at least 1m (or forever)")
                else:
                    out["max_age"] = format_duration_ms(ms)
            except SchedulerError as exc:
                bad(f"{field}.max_age", exc.code, exc.message + " (or forever)")
    return (None if problems else out), problems
