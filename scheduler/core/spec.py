"""Job specs: the field catalogue, validation and normalisation into ``JobSpec``.

The catalogue lives in one place: the attrs fields of ``JobSpec`` and their
metadata. The validator, ``scheduler schema jobs`` and the storage layer (one
column per field) all read it from there, so they cannot drift apart.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import check_instant_ms, format_duration_ms, now_ms, parse_duration_ms, parse_iso, to_iso
from scheduler.core.conditions import compile_pattern
from scheduler.core.job_retention import normalise_job_retention
from scheduler.core.rows import JobRow
from scheduler.core.schedules import Schedule, validate_cron, validate_timezone
from scheduler.core.steps import NOT_REGISTERED, Installed, registered

if TYPE_CHECKING:
    from scheduler.core.rows import JSONObject, SQLValue

MAX_PAYLOAD_BYTES = 64 * 1024
MAX_CONDITION_CHARS = 1024
#: Characters a job name may not hold: controls (C0, DEL, C1 such as U+0085 NEL), line and
#: paragraph separators (U+2028, U+2029), and bidirectional controls (U+061C, U+200E, U+200F,
#: U+202A-U+202E, U+2066-U+2069), which make a listing show a name other than the stored one.
_NAME_FORBIDDEN = "\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
#: A job name: 1-128 allowed characters, not blank, no white space at either end (refused, never stripped).
_NAME_RE = re.compile(rf"(?!\s)[^{_NAME_FORBIDDEN}]{{1,128}}(?<!\s)")


def _name_problem(name: str) -> str:
    """Why ``name`` fails ``_NAME_RE``, naming the offending character (so an invisible one can be found)."""
    if not name.strip():
        return "must not be empty or blank"
    if name != name.strip():
        return "must not begin or end with white space"
    if len(name) > 128:
        return "must be at most 128 characters"
    bad = next((ch for ch in name if re.match(f"[{_NAME_FORBIDDEN}]", ch)), "?")
    kind = "line or paragraph separator" if bad in "\u2028\u2029" else "control character" if bad <= "\x9f" else "bidirectional control"
    return f"must not contain U+{ord(bad):04X} (a {kind})"


_DRIVER_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_IDENTIFIER_LIKE = re.compile(r"^[A-Za-z0-9_.:@/+-]{1,256}$")

#: Text fields handed to exec() or used as paths, where a NUL byte can never work.
_NO_NUL_FIELDS = frozenset({"payload_message", "verify_shell", "delivery_to", "watchdog_alert_to"})

#: Executor-specific fields that moved into ``executor_options`` (schema v3): old name -> new place.
MOVED_FIELDS = {
    "shell_env_policy": "executor_options.env_policy (shell executor)",
    "working_dir": "executor_options.working_dir (shell executor)",
    "stdin_text": "executor_options.stdin_text (shell executor)",
    "context_mode": "executor_options.context_mode (agent executors)",
    "heartbeat_file": "executor_options.heartbeat_file (agent executors)",
}

#: Which executor driver a session target uses when the spec names none.
DEFAULT_EXECUTORS = {"shell": "shell", "isolated": "agent", "main": "main-session"}


def _f(
    default: object = attrs.NOTHING,
    *,
    kind: str,
    doc: str,
    choices: tuple[str, ...] | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    required: bool = False,
) -> Any:
    """Declare one spec field with the metadata the validator and the catalogue read."""
    meta = {
        "kind": kind,
        "doc": doc,
        "choices": choices,
        "minimum": minimum,
        "maximum": maximum,
        "required": required,
    }
    if required:
        return attrs.field(metadata=meta)
    return attrs.field(default=default, metadata=meta)


@attrs.frozen(kw_only=True, slots=False)
class JobSpec:
    """A validated, normalised job specification (what a user may set).

    Not slotted: ``spec_from_row`` (every run) fills a new spec's ``__dict__`` in one C-level call instead of
    running the generated ``__init__`` (``_filled``), as ``scheduler.core.rows`` does for rows.
    """

    name: str = _f(
        kind="str", required=True,
        doc="Unique human name of the job (1-128 chars; no control, line-separator or bidi-control characters,"
            " no leading or trailing space).",
    )
    schedule_kind: str = _f(
        kind="choice",
        choices=("cron", "every", "at", "manual", "chain"),
        doc="How the job is triggered: cron expression, fixed interval, one instant, only by `jobs run`, or by a parent job."
            " Left out, it is inferred from the one of schedule_cron, schedule_every, schedule_at given"
            " (two of them: SCHEDULE_KIND_AMBIGUOUS).",
        required=True,
    )
    payload_message: str = _f(
        kind="str", doc="What to run: the shell command, or the prompt for an agent target (max 64 KiB).", required=True
    )
    description: str | None = _f(None, kind="str", doc="Free text shown in listings.")
    enabled: bool = _f(True, kind="bool", doc="A disabled job is never dispatched on schedule.")
    job_type: str = _f("standard", kind="choice", choices=("standard", "watchdog"), doc="`watchdog`: payload is a check; failure raises an alert.")
    provenance: str = _f(
        "user_added", kind="choice", choices=("static", "user_added", "external"), doc="Trust tier of whoever created the job."
    )
    schedule_cron: str | None = _f(None, kind="cron", doc="5-field, or 6-field with seconds first. Only with schedule_kind=cron.")
    schedule_every: str | None = _f(None, kind="duration", doc="Interval such as 30s, 5m, 1h30m (>= 1s). Only with schedule_kind=every.")
    schedule_at: int | None = _f(None, kind="instant", doc="ISO-8601 instant with a zone (Z or offset). Only with schedule_kind=at.")
    schedule_tz: str = _f("UTC", kind="timezone", doc="IANA zone in which the cron expression is evaluated.")
    dst_gap_policy: str = _f(
        "shift", kind="choice", choices=("shift", "skip"), doc="A local time that does not exist (spring forward): run after the gap, or skip."
    )
    dst_fold_policy: str = _f(
        "once", kind="choice", choices=("once", "twice"), doc="A local time that occurs twice (fall back): run once (first) or at both."
    )
    misfire_policy: str = _f(
        "coalesce", kind="choice", choices=("coalesce", "skip"), doc="Slots missed while down: run once (coalesce) or skip them all."
    )
    allow_past_at: bool = _f(False, kind="bool", doc="Accept a schedule_at in the past (it runs as soon as possible).")
    session_target: str = _f("shell", kind="choice", choices=("shell", "isolated", "main"), doc="Where the payload runs.")
    executor: str | None = _f(None, kind="driver", doc="Executor driver name; defaults from session_target (shell, agent, main-session).")
    executor_options: dict = _f(
        attrs.Factory(dict), kind="options",
        doc="Options of the job's executor, validated by that plugin (`scheduler schema jobs --executor NAME` lists them).",
    )
    constraints: dict = _f(
        attrs.Factory(dict), kind="constraints",
        doc="What the executor must enforce: `sandbox`, `network` (none, loopback), `allowed_paths`, `max_tokens`, `max_cost`."
        " A job whose executor lacks the matching capability is refused (SCHEDULER_GOVERNANCE_DENIED, docs/governance.md).",
    )
    identity: dict | None = _f(
        None, kind="identity",
        doc="Who the run acts as (docs/identity.md): `subject` {kind: user|service|agent|workload, principal},"
        " `trust` {level: untrusted|user|operator|system}, `delegation` {mode: none|inherit|on-behalf-of, max_depth,"
        " allowed_delegators}. Unset: the job itself (`job:NAME`) at trust `user`.",
    )
    credentials: list = _f(
        attrs.Factory(list), kind="credentials",
        doc="Credential bindings (docs/credentials.md): a list of {name, provider, ref, present {medium: env|file|stdin, key?,"
        " file_name?}, required?, options?}; values are resolved by the provider at run time and never stored.",
    )
    child_credential_policy: str = _f(
        "none", kind="choice", choices=("none", "inherit", "downscope", "independent"),
        doc="What this job's chained children may present of its credentials (docs/credentials.md).",
    )
    authorization_proof: dict | None = _f(
        None, kind="authorization_proof",
        doc="The proof each dispatch must present (docs/proofs.md): `method` jwt|detached-signature|certificate, `source`"
        " {env: NAME} or {file: PATH} read afresh per dispatch (never the proof itself), the method's keys/CA and"
        " `clock_skew_s`. Verified, bound to the artifact, checked against revocations and claimed once before the payload.",
    )
    run_timeout_ms: int = _f(300_000, kind="int", minimum=1, maximum=7 * 86_400_000, doc="Wall-clock limit of one run in milliseconds.")
    max_retries: int = _f(0, kind="int", minimum=0, maximum=100, doc="Retries after a failed run (exponential backoff).")
    retry_backoff_ms: int = _f(30_000, kind="int", minimum=0, maximum=86_400_000, doc="Base backoff before the first retry; doubles per retry.")
    overlap_policy: str = _f("skip", kind="choice", choices=("skip", "allow", "queue"), doc="A slot that comes while the job runs: skip it, run in parallel, or queue it.")
    queue_limit: int = _f(10, kind="int", minimum=1, maximum=1000, doc="With overlap_policy=queue: most slots waiting per job.")
    max_consecutive_failures: int = _f(3, kind="int", minimum=0, maximum=1000, doc="Auto-pause after this many failures in a row (0 = never).")
    delivery_guarantee: str = _f(
        "at-most-once", kind="choice", choices=("at-most-once", "at-least-once"), doc="Replay a run interrupted by a crash (at-least-once) or not."
    )
    parent_id: str | None = _f(None, kind="str", doc="Parent job id or name; required for (and only with) schedule_kind=chain.")
    trigger_on: str | None = _f(None, kind="choice", choices=("success", "failure", "complete"), doc="Chain: which parent outcome triggers this job (default success).")
    trigger_delay_s: int = _f(0, kind="int", minimum=0, maximum=86_400 * 30, doc="Chain: delay after the parent finishes.")
    trigger_condition: str | None = _f(None, kind="condition", doc="Chain: `contains:TEXT` or `regex:PATTERN` matched on the parent's output.")
    delivery_mode: str = _f("none", kind="choice", choices=("none", "always", "on_success", "on_failure"), doc="When to deliver the result.")
    delivery_channel: str | None = _f(None, kind="driver", doc="Channel driver for delivery (required unless delivery_mode=none).")
    delivery_to: str | None = _f(None, kind="str", doc="Channel-specific destination.")
    delivery_options: dict = _f(attrs.Factory(dict), kind="options", doc="Options of the delivery channel, validated by that plugin.")
    notify: bool = _f(True, kind="bool", doc="Send the settings file's `[notifications]` about this job's runs (false: opt out).")
    output_format: str = _f("text", kind="choice", choices=("text", "json", "ndjson"), doc="How stdout is parsed into structured output.")
    verify_shell: str | None = _f(None, kind="str", doc="Shell check run after a successful command.")
    verify_timeout_s: int = _f(60, kind="int", minimum=1, maximum=86_400, doc="Limit of the verification check.")
    verify_on_failure: str = _f("error", kind="choice", choices=("error", "warn"), doc="A failed check turns the run into an error, or only warns.")
    approval_required: bool = _f(False, kind="bool", doc="Every run waits for an approval decision.")
    approval_timeout_s: int = _f(3600, kind="int", minimum=1, maximum=30 * 86_400, doc="How long an approval may stay pending.")
    approval_timeout_action: str = _f("reject", kind="choice", choices=("reject", "approve"), doc="What a timeout decides (scoped gates always reject).")
    approval_risk_level: str = _f("medium", kind="choice", choices=("low", "medium", "high", "critical"), doc="Risk shown to approvers.")
    approval_approver_scope: str | None = _f(None, kind="scope", doc="Who may approve: a local user name, `uid:N`; domain scopes are rejected.")
    watchdog_alert_channel: str | None = _f(None, kind="driver", doc="Watchdog: channel that receives the alert.")
    watchdog_alert_to: str | None = _f(None, kind="str", doc="Watchdog: destination of the alert.")
    watchdog_self_destruct: bool = _f(False, kind="bool", doc="Watchdog: disable the job (kept, with its history; `jobs enable` re-arms it) after its first passing check.")
    evidence: dict | None = _f(
        None, kind="evidence",
        doc="Evidence of every run (docs/evidence.md): `provider` (default checksum), `methods`, `provider_config`,"
        " `payload` {bind, context, format}, `verify` {required}, `collect`, `retention`. Unset: no evidence.",
    )
    evidence_ref: str | None = _f(None, kind="evidence_ref", doc="A label (<= 256 chars) carried into each evidence row; only with evidence.")
    retention: dict | None = _f(
        None, kind="retention",
        doc="How long this job's runs are kept (docs/operations.md): `keep_runs` (newest N) and/or `max_age` (a duration,"
        " or `forever`); each key set overrides the settings file's [retention] rule for this job. Not part of the artifact.",
    )
    authorization_ref: str | None = _f(
        None, kind="authorization_ref",
        doc="`<provider>:<policy-ref>` (<= 256 chars): the authorization provider decides permit, deny or escalate"
        " before every run (docs/authorization.md); any failure denies. The provider must be installed.",
    )
    authorization: dict | None = _f(
        None, kind="authorization",
        doc="How the authorization_ref provider is asked: `provider_config` (its options), `request` {include: job, trigger,"
        " artifact_digest, identity, proof}, `decision` (map an answer to permit|deny|escalate, only stricter),"
        " `on_error` (deny only), `escalation` {risk_level}. Only with authorization_ref.",
    )

    def executor_name(self) -> str:
        """The executor driver this job runs on."""
        return self.executor or DEFAULT_EXECUTORS[self.session_target]

    def schedule(self) -> Schedule:
        """The ``scheduler.core.schedules.Schedule`` this spec describes."""
        return Schedule(
            kind=self.schedule_kind,
            cron=self.schedule_cron,
            every_ms=parse_duration_ms(self.schedule_every) if self.schedule_every else None,
            at_ms=self.schedule_at,
            tz=self.schedule_tz,
            dst_gap=self.dst_gap_policy,
            dst_fold=self.dst_fold_policy,
        )

    def to_json(self) -> JSONObject:
        """JSON view: instants as ISO-8601 ``Z``."""
        out: JSONObject = attrs.asdict(self)
        out["schedule_at"] = to_iso(self.schedule_at)
        return out


SPEC_FIELDS: tuple[attrs.Attribute, ...] = attrs.fields(JobSpec)
SPEC_FIELD_NAMES: frozenset[str] = frozenset(f.name for f in SPEC_FIELDS)
#: The spec fields (one stored column each) in declaration order.
SPEC_COLUMN_ORDER: tuple[str, ...] = tuple(f.name for f in SPEC_FIELDS)

#: The fields outside the execution contract: how the job is named and described, when and how often it runs, how
#: its failures are retried and its runs kept. No artifact section reads them (``scheduler.core.artifact`` projects
#: a view of the spec that refuses them), so a job's projection is a function of the other fields alone and is
#: shared by every job that has the same values there.
NON_CONTRACT_FIELDS: frozenset[str] = frozenset({
    "name", "description", "enabled", "schedule_kind", "schedule_cron", "schedule_every", "schedule_at", "schedule_tz",
    "dst_gap_policy", "dst_fold_policy", "misfire_policy", "allow_past_at", "max_retries", "retry_backoff_ms",
    "overlap_policy", "queue_limit", "max_consecutive_failures", "delivery_guarantee", "parent_id", "trigger_on",
    "trigger_delay_s", "trigger_condition", "notify", "retention",
})
#: The spec fields of the execution contract (every field but ``NON_CONTRACT_FIELDS``), in declaration order.
CONTRACT_COLUMN_ORDER: tuple[str, ...] = tuple(n for n in SPEC_COLUMN_ORDER if n not in NON_CONTRACT_FIELDS)


def _default(f: attrs.Attribute) -> Any:
    """A field's default value (a fresh one for factory defaults)."""
    factory = getattr(f.default, "factory", None)  # an ``attrs.Factory``
    return factory() if callable(factory) else f.default


def field_catalogue() -> list[dict[str, object]]:
    """The documented field list (`scheduler schema jobs`), generated from ``JobSpec``."""
    rows = []
    for f in SPEC_FIELDS:
        m = f.metadata
        constraints: JSONObject = {}
        if m["choices"]:
            constraints["choices"] = list(m["choices"])
        if m["minimum"] is not None:
            constraints["minimum"] = m["minimum"]
        if m["maximum"] is not None:
            constraints["maximum"] = m["maximum"]
        rows.append(
            {
                "name": f.name,
                "type": m["kind"],
                "required": m["required"],
                "default": None if f.default is attrs.NOTHING else _default(f),
                "constraints": constraints,
                "description": m["doc"],
            }
        )
    return rows


class _Errors:
    """Collects per-field validation errors so a user sees all of them at once."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, field: str, message: str, code: str = "INVALID_VALUE") -> None:
        self.items.append({"field": field, "code": code, "error": message})

    def has(self, field: str) -> bool:
        return any(e["field"] == field for e in self.items)


#: Field kinds the kernel checks itself; a field of any other kind is validated by the pipeline step that owns it.
KERNEL_KINDS = frozenset({"str", "bool", "int", "instant", "choice", "duration", "cron", "timezone", "driver", "scope",
                          "condition", "options", "retention"})


def _coerce(f: attrs.Attribute, value: object, errors: _Errors, installed: Installed) -> Any:
    """Type-check and normalise one field value; record an error and return None when bad.

    A field a registered step owns with a normaliser of its own is that step's to check
    (``scheduler.core.steps``); a field of a kind the kernel does not know and no step owns is
    refused with ``PIPELINE_STEP_NOT_REGISTERED`` (never stored unchecked).
    """
    m, name = f.metadata, f.name
    if value is None:
        if m["required"]:
            errors.add(name, "is required", "REQUIRED")
        return None
    owner = installed.field_owners.get(name)
    if owner is not None and owner[1] is not None:
        normalised, problems = owner[1](value, name)
        for p in problems:
            errors.add(p["field"], p["error"], p["code"])
        return normalised
    kind = m["kind"]
    if kind not in KERNEL_KINDS:
        raise SchedulerError(NOT_REGISTERED, f"the job field {name!r} belongs to a pipeline step that is not registered",
                             details={"field": name, "kind": kind})
    if kind == "options":
        if not isinstance(value, dict):
            errors.add(name, "must be an object of the plugin's options", "INVALID_TYPE")
            return None
        return dict(value)
    if kind == "retention":
        retention, found = normalise_job_retention(value, name)
        for p in found:
            errors.add(p["field"], p["error"], p["code"])
        return retention
    if kind == "bool":
        if not isinstance(value, bool):
            errors.add(name, "must be true or false", "INVALID_TYPE")
            return None
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            errors.add(name, "must be an integer", "INVALID_TYPE")
            return None
        if m["minimum"] is not None and value < m["minimum"]:
            errors.add(name, f"must be >= {m['minimum']}", "OUT_OF_RANGE")
            return None
        if m["maximum"] is not None and value > m["maximum"]:
            errors.add(name, f"must be <= {m['maximum']}", "OUT_OF_RANGE")
            return None
        return value
    if kind == "instant":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            errors.add(name, "must be an ISO-8601 instant with a zone", "INVALID_TYPE")
            return None
        try:
            if isinstance(value, int):
                return check_instant_ms(value, field=name)
            return parse_iso(value, field=name)
        except SchedulerError as exc:
            errors.add(name, exc.message, exc.code)
            return None
    if not isinstance(value, str):
        errors.add(name, "must be a string", "INVALID_TYPE")
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800") from JSON: cannot be stored or printed
        errors.add(name, "must be valid Unicode text (it contains a lone surrogate)", "INVALID_VALUE")
        return None
    if "\x00" in value and name in _NO_NUL_FIELDS:
        errors.add(name, "must not contain NUL characters (they can never be passed to a process)", "INVALID_VALUE")
        return None
    if kind == "choice":
        if value not in m["choices"]:
            errors.add(name, f"must be one of {', '.join(m['choices'])}", "INVALID_CHOICE")
            return None
        return value
    if kind == "duration":
        try:
            ms = parse_duration_ms(value, field=name)
        except SchedulerError as exc:
            errors.add(name, exc.message, exc.code)
            return None
        if ms < 1000:
            errors.add(name, "must be at least 1s", "OUT_OF_RANGE")
            return None
        return format_duration_ms(ms)
    if kind == "cron":
        try:
            return validate_cron(value)
        except SchedulerError as exc:
            errors.add(name, exc.message, exc.code)
            return None
    if kind == "timezone":
        try:
            return validate_timezone(value)
        except SchedulerError as exc:
            errors.add(name, exc.message, exc.code)
            return None
    if kind == "driver":
        if not _DRIVER_RE.match(value):
            errors.add(name, "must be a driver name ([a-z0-9_.-], max 64)", "INVALID_VALUE")
            return None
        return value
    if kind == "scope":
        if "\\" in value or "@" in value:
            errors.add(name, "domain scopes are not supported; use a local user name or uid:N", "INVALID_SCOPE")
            return None
        if not _IDENTIFIER_LIKE.match(value):
            errors.add(name, "must be a local user name or uid:N", "INVALID_SCOPE")
            return None
        return value
    if kind == "condition":
        return _check_condition(name, value, errors)
    return value  # plain "str"


def _check_condition(name: str, value: str, errors: _Errors) -> str | None:
    """Accept ``contains:TEXT`` or a ``regex:PATTERN`` that the linear-time engine compiles."""
    if len(value) > MAX_CONDITION_CHARS:
        errors.add(name, f"must be at most {MAX_CONDITION_CHARS} characters", "TOO_LARGE")
        return None
    if value.startswith("contains:") and len(value) > len("contains:"):
        return value
    if value.startswith("regex:"):
        try:
            compile_pattern(value[len("regex:") :])
        except SchedulerError as exc:
            errors.add(name, exc.message, exc.code)
            return None
        return value
    errors.add(name, "must be `contains:TEXT` or `regex:PATTERN`", "INVALID_CONDITION")
    return None


def validate_spec(obj: object, *, now: int | None = None, check_past: bool = True, plugin_options: bool = True) -> JobSpec:
    """Validate a job spec object into a ``JobSpec``; raise ``VALIDATION_FAILED`` listing every problem.

    ``check_past`` rejects an ``at`` instant already in the past unless the spec
    sets ``allow_past_at`` (creation-time rule; updates of old jobs skip it).
    ``plugin_options`` asks every registered step what the installed plugins say of the
    job (``Step.check_installed``: plugin options, constraints against the executor, providers);
    the kernel's own checks never need it. Without installed steps nothing is validated
    (``PIPELINE_NOT_INSTALLED``).
    """
    installed = registered()
    if not isinstance(obj, dict):
        raise SchedulerError("VALIDATION_FAILED", "a job spec must be a JSON object", details=[
            {"field": "", "code": "INVALID_TYPE", "error": "expected an object"}
        ])
    errors = _Errors()
    obj = _infer_schedule_kind(obj, errors)
    for key in obj:
        if key in MOVED_FIELDS:
            errors.add(str(key), f"moved: set {MOVED_FIELDS[key]} instead", "FIELD_MOVED")
        elif key not in SPEC_FIELD_NAMES:
            errors.add(str(key), f"unknown field {key!r}", "UNKNOWN_FIELD")
    values: dict[str, object] = {}
    for f in SPEC_FIELDS:
        if f.name in obj:
            values[f.name] = _coerce(f, obj[f.name], errors, installed)
            if values[f.name] is None and f.default is not attrs.NOTHING:
                values[f.name] = _default(f)
        elif f.metadata["required"] and not errors.has(f.name):
            errors.add(f.name, "is required", "REQUIRED")
    name = values.get("name")
    if isinstance(name, str) and not _NAME_RE.fullmatch(name):
        errors.add("name", _name_problem(name), "INVALID_VALUE")
    verify = values.get("verify_shell")
    if isinstance(verify, str) and not verify.strip():
        errors.add("verify_shell", "must not be empty or blank (leave it out for no check)", "REQUIRED")
    _url_credential_checks(values, errors)
    payload = values.get("payload_message")
    if isinstance(payload, str):
        if not payload.strip():
            errors.add("payload_message", "must not be empty", "REQUIRED")
        elif len(payload.encode("utf-8")) > MAX_PAYLOAD_BYTES:
            errors.add("payload_message", f"must be at most {MAX_PAYLOAD_BYTES} bytes", "TOO_LARGE")
    _cross_checks(values, errors, now=now_ms() if now is None else now, check_past=check_past)
    for step in installed.steps:
        step.check(values, errors)
    if errors.items:
        fields = ", ".join(sorted({e["field"] for e in errors.items}))
        raise SchedulerError("VALIDATION_FAILED", f"invalid job spec: {fields}", details=errors.items)
    if values.get("schedule_kind") == "chain" and values.get("trigger_on") is None:
        values["trigger_on"] = "success"
    spec = _spec(values)
    if plugin_options:
        normalised: dict[str, object] = {}
        problems: list[dict[str, str]] = []
        for step in installed.steps:
            changed, found = step.check_installed(spec)
            normalised.update(changed)
            problems += found
        if problems:
            for p in problems:
                errors.add(p["field"], p["error"], p["code"])
            fields = ", ".join(sorted({e["field"] for e in errors.items}))
            raise SchedulerError("VALIDATION_FAILED", f"invalid job spec: {fields}", details=errors.items)
        if normalised:
            evolve: Callable[..., JobSpec] = attrs.evolve
            spec = evolve(spec, **normalised)
    return spec


#: A URL carrying credentials: a password (``scheme://user:pass@host``, any scheme) or, for the web's schemes,
#: any user part at all (``https://token@host``: tokens travel there). The match stops before the secret.
_URL_CREDENTIALS = re.compile(
    r"\b(?:[a-z][a-z0-9+.-]*://[^/?#\s@:]*:[^/?#\s@]*@|(?:https?|wss?)://[^/?#\s@]+@)", re.IGNORECASE | re.ASCII,
)
#: Spec fields holding a destination URL (or a text that may be one), checked for credentials.
_URL_FIELDS = ("delivery_to", "watchdog_alert_to")
#: Plugin option objects whose string values are checked for URLs with credentials.
_URL_OPTION_FIELDS = ("delivery_options", "executor_options")


def url_has_credentials(text: str) -> bool:
    """Whether ``text`` holds a URL with credentials in it (``user:pass@``, or a token before ``@`` in an http(s)/ws(s) URL).

    The one test for every target that is stored in plain text: job fields and options here, and
    ``[notifications] routes``, whose destinations are copied into the outbox (``scheduler.plugins.options``).
    """
    return _URL_CREDENTIALS.search(text) is not None


def _url_credential_checks(values: dict[str, object], errors: _Errors) -> None:
    """Refuse any URL with credentials in it (``URL_CREDENTIALS_REFUSED``): the job spec is stored in plain text.

    ``delivery_to``, ``watchdog_alert_to`` and every string inside ``delivery_options`` and
    ``executor_options`` (at any depth) are checked; the message never repeats the value. A
    secret belongs in a credential reference (the channel's settings, ``credentials``), which
    is resolved when used and never stored.
    """
    message = ("must not carry credentials in a URL (user:password@ or a token before @): the job spec, `jobs get`"
               " and the outbox would keep them in plain text; put the secret in a credential reference instead"
               " (the channel's settings secret or a `credentials` binding, docs/credentials.md)")
    for name in _URL_FIELDS:
        value = values.get(name)
        if isinstance(value, str) and url_has_credentials(value):
            errors.add(name, message, "URL_CREDENTIALS_REFUSED")
    for name in _URL_OPTION_FIELDS:
        stack: list[tuple[str, object]] = [(name, values.get(name))]
        while stack:
            path, value = stack.pop()
            if isinstance(value, str):
                if url_has_credentials(value):
                    errors.add(path, message, "URL_CREDENTIALS_REFUSED")
            elif isinstance(value, dict):
                stack.extend((f"{path}.{key}", child) for key, child in value.items())
            elif isinstance(value, list):
                stack.extend((f"{path}[{i}]", child) for i, child in enumerate(value))


#: The schedule field that implies each ``schedule_kind`` (``_infer_schedule_kind``, ``_cross_checks``).
SCHEDULE_FIELD_KINDS = {"schedule_cron": "cron", "schedule_every": "every", "schedule_at": "at"}


def _infer_schedule_kind(obj: dict[Any, Any], errors: _Errors) -> dict[Any, Any]:
    """``obj`` with ``schedule_kind`` filled in when it is absent (or null) and exactly one schedule field is set.

    ``{"schedule_every": "5m", ...}`` means ``every``, as ``schedule_cron`` means ``cron`` and
    ``schedule_at`` means ``at``: a user who gave the schedule need not name its kind too. Two
    or three of them without a kind is ``SCHEDULE_KIND_AMBIGUOUS`` (the kind cannot be guessed);
    none leaves the kind required. A given kind is never changed (``_cross_checks`` then
    refuses a schedule field of another kind as ``CONFLICT``).
    """
    if obj.get("schedule_kind") is not None:
        return obj
    given = [field for field in SCHEDULE_FIELD_KINDS if obj.get(field) is not None]
    if len(given) == 1:
        return {**obj, "schedule_kind": SCHEDULE_FIELD_KINDS[given[0]]}
    if len(given) > 1:
        errors.add("schedule_kind", f"is not given and {' and '.join(given)} name different kinds; set schedule_kind"
                   " (or keep one of them)", "SCHEDULE_KIND_AMBIGUOUS")
    return obj


def _cross_checks(v: dict[str, object], errors: _Errors, *, now: int, check_past: bool) -> None:
    """The kernel's rules that involve several fields (each step adds its own: ``Step.check``)."""
    kind = v.get("schedule_kind")
    for field, owner in SCHEDULE_FIELD_KINDS.items():
        present = v.get(field) is not None
        if kind == owner and not present and not errors.has(field):
            errors.add(field, f"is required when schedule_kind={owner}", "REQUIRED")
        if kind is not None and kind != owner and present:
            errors.add(field, f"is only valid with schedule_kind={owner}", "CONFLICT")
    at = v.get("schedule_at")
    if kind == "at" and isinstance(at, int) and check_past and at <= now and not v.get("allow_past_at"):
        errors.add("schedule_at", "is in the past (set allow_past_at to accept it)", "AT_IN_PAST")
    if kind == "chain" and not v.get("parent_id") and not errors.has("parent_id"):
        errors.add("parent_id", "is required when schedule_kind=chain", "REQUIRED")
    if kind is not None and kind != "chain":
        for field in ("parent_id", "trigger_on", "trigger_condition"):
            if v.get(field) is not None:
                errors.add(field, "is only valid with schedule_kind=chain", "CONFLICT")
        if v.get("trigger_delay_s"):
            errors.add("trigger_delay_s", "is only valid with schedule_kind=chain", "CONFLICT")
    if v.get("delivery_mode", "none") != "none" and not v.get("delivery_channel"):
        errors.add("delivery_channel", "is required unless delivery_mode=none", "REQUIRED")
    if v.get("job_type") == "watchdog" and v.get("session_target", "shell") != "shell":
        errors.add("job_type", "watchdog jobs run on the shell target", "CONFLICT")


#: Field kinds stored as JSON text (one column each) and shown as JSON values (``job_to_json``).
JSON_KINDS = frozenset({"options", "constraints", "identity", "evidence", "credentials", "authorization_proof", "authorization",
                        "retention"})


def spec_to_row(spec: JobSpec) -> dict[str, SQLValue]:
    """Storage view of a spec: one column per field, booleans as 0/1, plugin options as JSON text."""
    values = attrs.asdict(spec)
    for f in SPEC_FIELDS:
        kind = f.metadata["kind"]
        if kind == "bool":
            values[f.name] = int(values[f.name])
        elif kind in JSON_KINDS:
            values[f.name] = None if values[f.name] is None else json.dumps(values[f.name], sort_keys=True)
    row: dict[str, SQLValue] = values
    return row


#: (name, kind, default-or-NOTHING) per field: spec_from_row is on the dispatcher's hot path.
#: The default is a value, or (``attrs.Factory``) its factory.
_ROW_PLAN: tuple[tuple[str, str, bool, Callable[[], object] | None, object], ...] = tuple(
    (f.name, "bool" if f.metadata["kind"] == "bool" else "json" if f.metadata["kind"] in JSON_KINDS else "",
     f.default is not attrs.NOTHING, getattr(f.default, "factory", None), f.default)
    for f in SPEC_FIELDS
)


#: The spec columns of a ``JobRow``, in ``_ROW_PLAN`` order, in one call.
_SPEC_COLUMNS = attrgetter(*SPEC_COLUMN_ORDER)


def spec_columns(row: JobRow | Mapping[str, object]) -> tuple[object, ...]:
    """The values of the spec columns of a job row (a ``JobRow`` or the mapping a read returned), in spec order."""
    if isinstance(row, JobRow):  # the concrete class first: isinstance on the Mapping ABC costs a Python-level check
        values: tuple[object, ...] = _SPEC_COLUMNS(row)
        return values
    return tuple(map(row.get, SPEC_COLUMN_ORDER))


_CONTRACT_COLUMNS = attrgetter(*CONTRACT_COLUMN_ORDER)


def contract_columns(row: JobRow) -> tuple[object, ...]:
    """The stored values of the contract columns of a job row (``CONTRACT_COLUMN_ORDER``): what its projection and
    plan are a function of, so caches of them are keyed on these exact values."""
    values: tuple[object, ...] = _CONTRACT_COLUMNS(row)
    return values


def spec_from_row(row: JobRow | Mapping[str, object]) -> JobSpec:
    """Rebuild the ``JobSpec`` stored in a jobs row (already validated when written).

    On the dispatcher's hot path (every run): the contract columns of a ``JobRow`` are converted once per exact
    stored values (``_contract_shape``: jobs of one shape share it), the other columns per call, and the spec's
    ``__dict__`` is filled in C (``_filled``) rather than through ``JobSpec.__init__``. JSON values are parsed
    afresh for every spec (two specs never share a dict or a list), so the spec of one run can be changed by
    whatever it is handed to without reaching another's.
    """
    if not isinstance(row, JobRow):
        return _spec(_converted(_ROW_PLAN, spec_columns(row)))
    columns = _CONTRACT_COLUMNS(row)
    shape = _contract_shape(columns)
    if shape is None:  # a JSON column read as a mapping (unhashable): converted, never remembered
        values = _converted(_CONTRACT_PLAN, columns)
        values.update(_converted(_OTHER_PLAN, _OTHER_COLUMNS(row)))
        return _spec(values)
    fixed, fresh = shape
    others = list(_OTHER_COLUMNS(row))
    for i, default, factory in _OTHER_DEFAULTED:  # a column read as None takes its field's default
        if others[i] is None:
            others[i] = factory() if factory is not None else default
    for i in _OTHER_BOOLS:
        if others[i] is not None:
            others[i] = bool(others[i])
    for i, name in _OTHER_JSON:
        if others[i] is not None:
            others[i] = _json_value(name, others[i])
    return _filled(fixed, fresh, others)


def _json_value(name: str, val: object) -> object:
    """The stored JSON column ``name`` (its text, or a mapping a read returned) as a new spec value."""
    if isinstance(val, str):
        return json.loads(val)
    if isinstance(val, Mapping):
        return dict(val)
    raise TypeError(f"the {name} column holds {type(val).__name__}, not JSON text")


def _converted(plan: tuple[tuple[str, str, bool, Callable[[], object] | None, object], ...],
               columns: tuple[object, ...]) -> dict[str, object]:
    """The stored column values ``columns`` (in ``plan`` order) as spec field values: defaults, booleans, JSON parsed."""
    values: dict[str, object] = {}
    for (name, kind, has_default, factory, default), val in zip(plan, columns, strict=True):
        if val is None:
            if has_default:
                val = factory() if factory is not None else default
        elif kind == "bool":
            val = bool(val)
        elif kind == "json":
            val = _json_value(name, val)
        values[name] = val
    return values


#: What a contract shape remembers: every spec field in declaration order, its contract fields converted (the
#: others, and the JSON ones, are placeholders the caller replaces), and a maker of a fresh value per JSON (or
#: factory-defaulted) contract field.
_Shape = tuple[dict[str, object], tuple[tuple[str, Callable[[], object]], ...]]


def _contract_shape(columns: tuple[object, ...]) -> _Shape | None:
    """The contract fields of stored contract columns ``columns``: scalars converted once per exact values
    (remembered), JSON values made afresh by their makers (an empty object or list as a new one, other text parsed).
    None when a column is unhashable (a JSON column read as a mapping): nothing is remembered for it."""
    try:
        shape = _CONTRACT_SHAPES.get(columns)
    except TypeError:
        return None
    if shape is None:
        converted = _converted(_CONTRACT_PLAN, columns)
        fresh = tuple((name, _maker(text, factory)) for (name, kind, _, factory, _), text
                      in zip(_CONTRACT_PLAN, columns, strict=True) if (kind == "json" and text is not None)
                      or (text is None and factory is not None))
        made = {name for name, _make in fresh}
        shape = ({name: None if name in made else converted.get(name) for name in SPEC_COLUMN_ORDER}, fresh)
        if len(_CONTRACT_SHAPES) >= _CONTRACT_SHAPES_MAX:
            _CONTRACT_SHAPES.clear()
        _CONTRACT_SHAPES[columns] = shape
    return shape


def _maker(text: object, factory: Callable[[], object] | None) -> Callable[[], object]:
    """What makes a fresh value of a stored JSON ``text`` each time: the field's default ``factory`` for none,
    ``dict``/``list`` for ``{}``/``[]``, else a parse."""
    if text is None and factory is not None:
        return factory
    if text == "{}":
        return dict
    if text == "[]":
        return list
    if isinstance(text, str):
        return functools.partial(json.loads, text)
    raise TypeError(f"a stored JSON column holds {type(text).__name__}, not JSON text")


_CONTRACT_PLAN = tuple(p for p in _ROW_PLAN if p[0] not in NON_CONTRACT_FIELDS)
_OTHER_PLAN = tuple(p for p in _ROW_PLAN if p[0] in NON_CONTRACT_FIELDS)
_OTHER_NAMES = tuple(p[0] for p in _OTHER_PLAN)
_OTHER_COLUMNS = attrgetter(*_OTHER_NAMES)
#: ``(index, default, factory)`` of the other fields whose default is not None (a None column takes it).
_OTHER_DEFAULTED = tuple((i, default, factory) for i, (_n, _kind, has_default, factory, default) in enumerate(_OTHER_PLAN)
                         if has_default and (factory is not None or default is not None))
#: Indexes of the other fields stored as 0/1, and of those stored as JSON text (with their names).
_OTHER_BOOLS = tuple(i for i, p in enumerate(_OTHER_PLAN) if p[1] == "bool")
_OTHER_JSON = tuple((i, p[0]) for i, p in enumerate(_OTHER_PLAN) if p[1] == "json")
#: Stored contract column values -> their ``_Shape``; bounded, cleared when full.
_CONTRACT_SHAPES: dict[tuple[object, ...], _Shape] = {}
_CONTRACT_SHAPES_MAX = 4096


def _filled(fixed: dict[str, object], fresh: tuple[tuple[str, Callable[[], object]], ...], others: list[object]) -> JobSpec:
    """A new ``JobSpec`` of a contract shape's ``fixed`` values, a value of each ``fresh`` maker and the ``others``
    (``_OTHER_NAMES`` order), its ``__dict__`` filled in C rather than through the generated ``__init__`` (a
    frozen ``__init__`` sets each of the 56 fields through a Python-level ``object.__setattr__`` call: about 7 µs
    a spec on the worker's hot path). ``JobSpec`` has no validator, converter or post-init that this skips, the
    fields keep their declaration order (``fixed`` has every field), and a test holds such a spec equal to
    ``JobSpec(**values)``'s."""
    spec: JobSpec = object.__new__(JobSpec)
    values = spec.__dict__
    values.update(fixed)
    for name, make in fresh:
        values[name] = make()
    values.update(zip(_OTHER_NAMES, others, strict=True))
    return spec


def _spec(values: dict[str, object]) -> JobSpec:
    """``JobSpec(**values)`` of values validated (or stored validated) field by field."""
    make: Callable[..., JobSpec] = JobSpec
    return make(**values)


def executor_name_of(row: JobRow | Mapping[str, object]) -> str:
    """The executor driver of a stored job, without rebuilding its whole spec."""
    executor: object
    target: object
    if isinstance(row, JobRow):
        executor, target = row.executor, row.session_target
    else:
        executor, target = row.get("executor"), row.get("session_target")
    return str(executor) if executor else DEFAULT_EXECUTORS[str(target or "shell")]


def spec_to_input(spec: JobSpec) -> JSONObject:
    """The spec as a user-editable object (only non-default fields), used as the base for updates."""
    out: JSONObject = {}
    for f in SPEC_FIELDS:
        val = getattr(spec, f.name)
        if f.metadata["required"] or val != _default(f):
            out[f.name] = to_iso(val) if f.name == "schedule_at" and val is not None else val
    return out
