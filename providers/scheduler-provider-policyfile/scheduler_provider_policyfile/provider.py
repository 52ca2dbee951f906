"""The ``policyfile`` authorization provider: allow/deny/escalate rules in a TOML file, default deny.

``authorization_ref: "policyfile:<file>"`` names a file (``.toml`` may be left out) inside
``[providers.policyfile] policy_dir``. A file::

    mode = "first-match"          # or "deny-overrides"
    [[rule]]
    effect = "permit"             # permit | deny | escalate
    reason = "nightly backups"
    jobs = ["backup-*"]           # globs on the job name
    executors = ["shell"]
    principals = ["service:backup"]   # globs on the run's identity principal (KIND:NAME)
    trust_levels = ["operator", "system"]
    dispatch_kinds = ["schedule", "retry"]
    days = ["mon", "tue", "wed", "thu", "fri"]
    hours = "01:00-05:00"         # [start, end) in tz; may wrap midnight
    tz = "Europe/Berlin"

A rule matches when every condition it states matches (a condition left out matches
anything). ``first-match`` (the default): the first matching rule decides. ``deny-overrides``:
any matching ``deny`` wins, then any ``escalate``, then any ``permit``. No match: deny.
A rule naming a part the request does not carry (the job's ``authorization.request.include``
left it out) fails the decision (``POLICYFILE_REQUEST_INCOMPLETE``): a deny, never a skip.
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from scheduler_toolkit.files import read_capped

from scheduler.api import AuthorizationDecision, AuthorizationRequest, SchedulerError

__version__ = "0.1.0"

MODES = ("first-match", "deny-overrides")
EFFECTS = ("permit", "deny", "escalate")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
RULE_KEYS = ("effect", "reason", "jobs", "executors", "principals", "trust_levels", "dispatch_kinds", "days", "hours", "tz")
TRUST_LEVELS = ("untrusted", "user", "operator", "system")
MAX_FILE_BYTES = 256 * 1024


@attrs.frozen(kw_only=True)
class PolicyFileSettings:
    """``[providers.policyfile]``."""

    policy_dir: str | None = attrs.field(default=None, metadata={
        "doc": "Directory of the rules files a policy ref names (unset: every decision is a deny, POLICYFILE_NOT_CONFIGURED)."})


@attrs.frozen
class Rule:
    """One validated rule."""

    effect: str
    reason: str
    jobs: tuple[str, ...] | None
    executors: tuple[str, ...] | None
    principals: tuple[str, ...] | None
    trust_levels: tuple[str, ...] | None
    dispatch_kinds: tuple[str, ...] | None
    days: tuple[str, ...] | None
    hours: tuple[int, int] | None
    tz: str


@attrs.frozen
class Rules:
    """A parsed rules file."""

    mode: str
    rules: tuple[Rule, ...]


def _minutes(text: str) -> int:
    hh, _, mm = text.partition(":")
    if not (hh.isdigit() and mm.isdigit() and len(mm) == 2 and 0 <= int(hh) <= 24 and 0 <= int(mm) < 60) or (int(hh) == 24 and mm != "00"):
        raise ValueError(f"{text!r} is not HH:MM")
    return int(hh) * 60 + int(mm)


def parse_rules(text: str, where: str = "rules") -> tuple[Rules | None, list[str]]:
    """Parse and validate a rules file; ``(rules, [])`` or ``(None, problems)`` (every problem, with its place)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [f"{where}: not valid TOML: {exc}"]
    problems: list[str] = []
    for key in data:
        if key not in ("mode", "rule"):
            problems.append(f"{where}: unknown key {key!r} (known: mode, rule)")
    mode = data.get("mode", "first-match")
    if mode not in MODES:
        problems.append(f"{where}: mode must be one of {', '.join(MODES)}")
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        return None, problems + [f"{where}: rule must be an array of tables ([[rule]])"]
    rules = []
    for i, raw in enumerate(raw_rules):
        at = f"{where}: rule[{i}]"
        if not isinstance(raw, dict):
            problems.append(f"{at}: must be a table")
            continue
        for key in raw:
            if key not in RULE_KEYS:
                problems.append(f"{at}: unknown key {key!r}")
        effect = raw.get("effect")
        if effect not in EFFECTS:
            problems.append(f"{at}.effect: must be one of {', '.join(EFFECTS)}")
        lists: dict[str, tuple[str, ...] | None] = {}
        for key in ("jobs", "executors", "principals", "trust_levels", "dispatch_kinds", "days"):
            value = raw.get(key)
            if value is None:
                lists[key] = None
            elif not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
                problems.append(f"{at}.{key}: must be a non-empty list of strings")
            else:
                lists[key] = tuple(value)
        for level in lists.get("trust_levels") or ():
            if level not in TRUST_LEVELS:
                problems.append(f"{at}.trust_levels: {level!r} is not one of {', '.join(TRUST_LEVELS)}")
        for day in lists.get("days") or ():
            if day not in DAYS:
                problems.append(f"{at}.days: {day!r} is not one of {', '.join(DAYS)}")
        hours = None
        if raw.get("hours") is not None:
            try:
                start, _, end = str(raw["hours"]).partition("-")
                hours = (_minutes(start.strip()), _minutes(end.strip()))
            except ValueError as exc:
                problems.append(f"{at}.hours: must be HH:MM-HH:MM ({exc})")
        tz = raw.get("tz", "UTC")
        try:
            ZoneInfo(str(tz))
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(f"{at}.tz: unknown time zone {tz!r}")
        reason = raw.get("reason", "")
        if not isinstance(reason, str):
            problems.append(f"{at}.reason: must be a string")
        if not problems and isinstance(effect, str):  # no problems: effect is one of EFFECTS
            rules.append(Rule(effect=effect, reason=reason or f"rule[{i}] {effect}", hours=hours, tz=str(tz), **lists))
    return (None, problems) if problems else (Rules(mode=mode, rules=tuple(rules)), [])


def load_rules(policy_dir: str | None, policy_ref: str) -> Rules:
    """The rules file a policy ref names inside ``policy_dir``; ``SchedulerError`` when it cannot be used."""
    if not policy_dir:
        raise SchedulerError("POLICYFILE_NOT_CONFIGURED", "[providers.policyfile] policy_dir is not set")
    name = policy_ref if policy_ref.endswith(".toml") else policy_ref + ".toml"
    if os.path.isabs(name) or ".." in name.split("/") or "\\" in name:
        raise SchedulerError("POLICYFILE_REF_INVALID", f"policy ref {policy_ref!r} must be a relative file name inside policy_dir")
    path = os.path.join(policy_dir, name)
    data = read_capped(path, MAX_FILE_BYTES, what="rules file", unreadable="POLICYFILE_NOT_FOUND", too_large="POLICYFILE_INVALID")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SchedulerError("POLICYFILE_INVALID", f"{path} is not UTF-8") from None
    rules, problems = parse_rules(text, name)
    if rules is None:
        raise SchedulerError("POLICYFILE_INVALID", "; ".join(problems), details={"problems": problems})
    return rules


def _need(value: Any, part: str, key: str) -> Any:
    if value is None:
        raise SchedulerError("POLICYFILE_REQUEST_INCOMPLETE",
                             f"a rule tests {key} but the request carries no {part} (authorization.request.include)")
    return value


def _any_glob(value: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _instant(request: AuthorizationRequest) -> datetime:
    started = (request.trigger or {}).get("started_at")
    if isinstance(started, str) and started:
        return datetime.fromisoformat(started)
    return datetime.now(UTC)


def rule_matches(rule: Rule, request: AuthorizationRequest) -> bool:
    """Whether every condition ``rule`` states holds for ``request`` (``POLICYFILE_REQUEST_INCOMPLETE`` when it cannot tell)."""
    job = request.job or {}
    if rule.jobs is not None and not _any_glob(str(_need(job.get("name"), "job", "jobs")), rule.jobs):
        return False
    if rule.executors is not None:
        _need(job or None, "job", "executors")
        executor = request.executor or job.get("executor")  # the kernel resolves session_target's default executor
        if executor not in rule.executors:
            return False
    if rule.principals is not None or rule.trust_levels is not None:
        identity = _need(request.identity, "identity", "principals/trust_levels")
        if rule.principals is not None and not _any_glob(str(identity.get("principal")), rule.principals):
            return False
        if rule.trust_levels is not None and identity.get("trust_level") not in rule.trust_levels:
            return False
    if rule.dispatch_kinds is not None:
        kind = _need((request.trigger or {}).get("dispatch_kind"), "trigger", "dispatch_kinds")
        if kind not in rule.dispatch_kinds:
            return False
    if rule.days is not None or rule.hours is not None:
        local = _instant(request).astimezone(ZoneInfo(rule.tz))
        if rule.days is not None and DAYS[local.weekday()] not in rule.days:
            return False
        if rule.hours is not None:
            minute, (start, end) = local.hour * 60 + local.minute, rule.hours
            inside = start <= minute < end if start <= end else (minute >= start or minute < end)
            if not inside:
                return False
    return True


def evaluate(rules: Rules, request: AuthorizationRequest) -> AuthorizationDecision:
    """The decision of ``rules`` for ``request`` (see the module docstring); no match is a deny."""
    matched = [(i, r) for i, r in enumerate(rules.rules) if rule_matches(r, request)]
    if not matched:
        return AuthorizationDecision(decision="deny", reason="no rule matched (default deny)", details={"rule": None})
    if rules.mode == "first-match":
        i, rule = matched[0]
    else:
        i, rule = min(matched, key=lambda m: ({"deny": 0, "escalate": 1, "permit": 2}[m[1].effect], m[0]))
    return AuthorizationDecision(decision=rule.effect, reason=rule.reason, details={"rule": i, "mode": rules.mode})  # type: ignore[arg-type]


class PolicyFileProvider:
    """The ``policyfile`` authorization provider (entry point ``scheduler.authorization_providers:policyfile``)."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset({"escalate"})
    settings_class = PolicyFileSettings
    options_class = None

    def __init__(self) -> None:
        self.policy_dir: str | None = None

    def configure(self, settings: PolicyFileSettings) -> None:
        """Take ``policy_dir`` (``~`` expanded)."""
        self.policy_dir = os.path.expanduser(settings.policy_dir) if settings.policy_dir else None

    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        """Problems of the rules file (``jobs validate`` and ``doctor``): missing, unreadable, not valid TOML, bad rules."""
        try:
            load_rules(self.policy_dir, policy_ref)
        except SchedulerError as exc:
            return [f"{exc.code}: {exc.message}"]
        return []

    def resolve_authorization(self, request: AuthorizationRequest) -> AuthorizationDecision:
        """Read the rules file afresh (an edit applies to the next run) and decide."""
        return evaluate(load_rules(self.policy_dir, request.policy_ref), request)
