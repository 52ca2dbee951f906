"""Retention rules: the settings file's ``[retention]``, a job's ``retention`` field and ``runs prune`` flags.

A run is kept while any set rule keeps it: it is among its job's newest ``keep_runs``
terminal runs, or it ended less than ``max_age`` ago (``forever`` keeps every run of the
job). With no rule set for a job, none of its runs is pruned. Each rule is taken from,
in order: a ``runs prune`` flag, the job's ``retention`` field (validated in
``scheduler.core.job_retention``), the settings file. ``scheduler.ops.pruning`` applies
them; ``scheduler.ops.retention`` is the dispatcher's duty that does so every interval.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from scheduler.base.timeutil import format_duration_ms, parse_duration_ms
from scheduler.core.job_retention import FOREVER
from scheduler.settings import current_settings


@attrs.frozen
class RunRule:
    """The retention rule of one job's runs: ``keep_runs`` newest, ``max_age_ms``; ``forever`` keeps them all."""

    keep_runs: int | None = None
    max_age_ms: int | None = None
    forever: bool = False

    @property
    def active(self) -> bool:
        """Whether this rule prunes anything at all (some rule is set and ``forever`` is not)."""
        return not self.forever and (self.keep_runs is not None or self.max_age_ms is not None)

    def to_json(self) -> dict[str, Any]:
        """The rule as recorded in a pass's ``prune_cutoffs.rules`` and shown by ``runs prune``."""
        return {"keep_runs": self.keep_runs, "max_age": FOREVER if self.forever else
                (format_duration_ms(self.max_age_ms) if self.max_age_ms else None)}


@attrs.frozen
class Rules:
    """Everything one retention pass applies; built by ``rules_from`` from settings and flags."""

    #: Flags of ``runs prune`` (they win over a job's field and the settings).
    keep_runs_flag: int | None = None
    max_age_flag_ms: int | None = None
    #: The settings file's defaults.
    keep_runs: int | None = None
    max_age_ms: int | None = None
    delivered_outbox_age_ms: int | None = None
    event_age_ms: int | None = None
    batch: int = 500
    orphan_grace_ms: int = 3_600_000

    def for_job(self, job_retention: Any) -> RunRule:
        """The rule of a job whose ``retention`` column holds ``job_retention`` (JSON text, a dict or None)."""
        own: dict[str, Any] = {}
        if isinstance(job_retention, str) and job_retention:
            try:
                own = json.loads(job_retention) or {}
            except ValueError:
                own = {}
        elif isinstance(job_retention, dict):
            own = job_retention
        keep = self.keep_runs_flag if self.keep_runs_flag is not None else own.get("keep_runs", self.keep_runs)
        if self.max_age_flag_ms is not None:
            return RunRule(keep_runs=keep, max_age_ms=self.max_age_flag_ms)
        age = own.get("max_age")
        if age == FOREVER:
            return RunRule(keep_runs=keep, forever=True)
        age_ms = parse_duration_ms(age, field="retention.max_age") if isinstance(age, str) else self.max_age_ms
        return RunRule(keep_runs=keep, max_age_ms=age_ms)

    @property
    def has_global_run_rule(self) -> bool:
        """Whether a flag or the settings prune runs of jobs that declare no retention of their own."""
        return any(v is not None for v in (self.keep_runs_flag, self.max_age_flag_ms, self.keep_runs, self.max_age_ms))

    def to_json(self) -> dict[str, Any]:
        """The rules as recorded with the pass."""
        def dur(ms: int | None) -> str | None:
            return None if ms is None else format_duration_ms(ms)
        return {"keep_runs": self.keep_runs_flag if self.keep_runs_flag is not None else self.keep_runs,
                "max_run_age": dur(self.max_age_flag_ms if self.max_age_flag_ms is not None else self.max_age_ms),
                "delivered_outbox_age": dur(self.delivered_outbox_age_ms), "event_age": dur(self.event_age_ms)}


def settings_rules(*, keep_runs: int | None = None, older_than_ms: int | None = None) -> Rules:
    """The rules of the settings file's ``[retention]``, with ``runs prune`` flags on top when given."""
    s = current_settings().kernel["retention"].value

    def ms(text: str | None) -> int | None:
        return None if text is None else parse_duration_ms(text)

    return Rules(keep_runs_flag=keep_runs, max_age_flag_ms=older_than_ms, keep_runs=s.keep_runs, max_age_ms=ms(s.max_run_age),
                 delivered_outbox_age_ms=ms(s.delivered_outbox_age), event_age_ms=ms(s.event_age), batch=s.batch,
                 orphan_grace_ms=ms(s.orphan_grace) or 3_600_000)


def interval_ms() -> int:
    """``[retention] interval`` in milliseconds."""
    return parse_duration_ms(current_settings().kernel["retention"].value.interval)
