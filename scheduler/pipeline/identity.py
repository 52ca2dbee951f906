"""Identity and trust: who a run acts as, at which trust level, and on whose behalf (the pipeline step before credentials).

A job may declare ``identity`` (see docs/identity.md)::

    {"subject": {"kind": "service", "principal": "backup-bot"},
     "trust": {"level": "operator"},
     "delegation": {"mode": "on-behalf-of", "max_depth": 2, "allowed_delegators": ["job:nightly", "service:*"]}}

Every run resolves one ``ResolvedIdentity`` (``resolve``): a job without a declaration acts
as ``job:<name>`` at trust ``user`` and costs no query; a declared subject and level are used
as written (the CLI refused, at ``jobs add``/``update``, a level above the invoking account's:
``check_invoker``). A chain child whose delegation ``mode`` is ``inherit`` or ``on-behalf-of``
derives its identity from the run that triggered it (its recorded ``identity_json``): the
effective trust is never above the delegator's, the delegation depth is counted along the
chain, a principal appearing twice is a cycle, and the delegator must be allowed. Any failure
ends the run ``error`` with a ``DELEGATION_*`` code before anything of its payload runs; what
was decided is still committed with the run (``identity_json``, ``trust_level``, ``principal``,
``delegation_json``) and every event of the run carries its principal and trust level.
"""

from __future__ import annotations

import json
import os
import re
import stat as st
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any, TypeGuard

import attrs

from scheduler.approvals.decisions import approver_identity, scope_matches
from scheduler.base.errors import SchedulerError
from scheduler.core.artifact import section_problems
from scheduler.core.claimed import ClaimedRun
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.rows import JobRow, JSONObject, JSONValue, RunRow, json_object
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Normaliser, Problem, Run, StepBase
from scheduler.core.store.base import Store
from scheduler.settings import Settings, current_settings

#: Trust levels, lowest first.
TRUST_LEVELS: tuple[str, ...] = ("untrusted", "user", "operator", "system")
_RANK = {level: index for index, level in enumerate(TRUST_LEVELS)}
#: The level of a run whose job declares none.
DEFAULT_TRUST = "user"
#: Subject kinds a job may declare (``job`` is the implicit subject of a job without one, never declared).
SUBJECT_KINDS: tuple[str, ...] = ("user", "service", "agent", "workload")
#: Delegation modes: ``none`` (a chain trigger hands no identity on), ``inherit`` (act as the delegator's
#: principal), ``on-behalf-of`` (act as the job's own subject, on behalf of the delegator).
DELEGATION_MODES: tuple[str, ...] = ("none", "inherit", "on-behalf-of")
#: Longest delegation chain any policy may allow (the job chain itself is at most 10 deep).
MAX_DELEGATION_DEPTH = 10
MAX_ALLOWED_DELEGATORS = 64
MAX_IDENTITY_BYTES = 32 * 1024
#: How many earlier attempts of the same job (retries, replays) are followed back to find the delegator run.
MAX_ATTEMPT_WALK = 256
#: A principal name: what the reference calls a local principal (no spaces, no controls, no ``:`` prefix games).
_NAME_RE = re.compile(r"[A-Za-z0-9@._/+-]{1,256}")
_KINDS_ALL = ("job", *SUBJECT_KINDS)

_KEYS = ("subject", "trust", "delegation")
_SUBJECT_KEYS = ("kind", "principal")
_TRUST_KEYS = ("level",)
_DELEGATION_KEYS = ("mode", "max_depth", "allowed_delegators")


def rank(level: str) -> int:
    """The order of a trust level (``untrusted`` 0 ... ``system`` 3); unknown levels rank below everything."""
    return _RANK.get(level, -1)


def lower(a: str, b: str) -> str:
    """The lower of two trust levels (delegation never raises trust)."""
    return a if rank(a) <= rank(b) else b


# --------------------------------------------------------------------------- the declaration


def _problem(field: str, code: str, error: str) -> dict[str, str]:
    return {"field": field, "code": code, "error": error}


def _closed(value: object, keys: tuple[str, ...], field: str, code: str, problems: list[dict[str, str]]) -> TypeGuard[JSONObject]:
    """Whether ``value`` is an object (a problem recorded otherwise, and one per key not in ``keys``)."""
    if not isinstance(value, dict):
        problems.append(_problem(field, code, "must be an object"))
        return False
    for key in sorted(str(k) for k in value if k not in keys):
        problems.append(_problem(f"{field}.{key}", code, f"unknown key {key!r} (known: {', '.join(keys)})"))
    return True


def _delegator_pattern(entry: object) -> bool:
    """``*``, ``KIND:*`` or ``KIND:NAME`` with a known kind (``job`` included)."""
    if not isinstance(entry, str):
        return False
    if entry == "*":
        return True
    kind, sep, name = entry.partition(":")
    return bool(sep) and kind in _KINDS_ALL and (name == "*" or bool(_NAME_RE.fullmatch(name)))


def normalise_declaration(value: object, field: str = "identity") -> tuple[JSONObject | None, list[dict[str, str]]]:
    """Validate a job's ``identity`` declaration; return its normalised form (defaults filled in) and the problems.

    Problems are ``VALIDATION_FAILED`` details: ``IDENTITY_INVALID`` for the subject, trust level
    and shape, ``DELEGATION_POLICY_INVALID`` for the delegation policy. Unknown keys are refused.
    """
    problems: list[dict[str, str]] = []
    if not _closed(value, _KEYS, field, "IDENTITY_INVALID", problems):
        return None, problems
    try:
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError):
        size = MAX_IDENTITY_BYTES + 1
    if size > MAX_IDENTITY_BYTES:
        return None, [_problem(field, "IDENTITY_INVALID", f"must be at most {MAX_IDENTITY_BYTES} bytes of JSON")]
    out: JSONObject = {"subject": None, "trust": {"level": DEFAULT_TRUST}, "delegation": {"mode": "none"}}
    subject = value.get("subject")
    if subject is not None and _closed(subject, _SUBJECT_KEYS, f"{field}.subject", "IDENTITY_INVALID", problems):
        kind, name = subject.get("kind"), subject.get("principal")
        if kind == "job":
            problems.append(_problem(f"{field}.subject.kind", "IDENTITY_INVALID",
                                     "`job` is the implicit subject of a job without one; declare user, service, agent or workload"))
        elif kind not in SUBJECT_KINDS:
            problems.append(_problem(f"{field}.subject.kind", "IDENTITY_INVALID", f"must be one of {', '.join(SUBJECT_KINDS)}"))
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            problems.append(_problem(f"{field}.subject.principal", "IDENTITY_INVALID",
                                     "must be 1-256 characters of [A-Za-z0-9@._/+-]"))
        out["subject"] = {"kind": kind, "principal": name}
    trust = value.get("trust")
    if trust is not None and _closed(trust, _TRUST_KEYS, f"{field}.trust", "IDENTITY_INVALID", problems):
        level = trust.get("level", DEFAULT_TRUST)
        if level not in TRUST_LEVELS:
            problems.append(_problem(f"{field}.trust.level", "IDENTITY_INVALID", f"must be one of {', '.join(TRUST_LEVELS)}"))
        out["trust"] = {"level": level}
    delegation = value.get("delegation")
    if delegation is not None and _closed(delegation, _DELEGATION_KEYS, f"{field}.delegation", "DELEGATION_POLICY_INVALID",
                                          problems):
        out["delegation"] = _normalise_policy(delegation, f"{field}.delegation", problems)
    return (None, problems) if problems else (out, [])


def _normalise_policy(policy: JSONObject, field: str, problems: list[dict[str, str]]) -> JSONObject:
    mode = policy.get("mode", "none")
    if mode not in DELEGATION_MODES:
        problems.append(_problem(f"{field}.mode", "DELEGATION_POLICY_INVALID", f"must be one of {', '.join(DELEGATION_MODES)}"))
        return {"mode": mode}
    if mode == "none":
        for key in ("max_depth", "allowed_delegators"):
            if key in policy:
                problems.append(_problem(f"{field}.{key}", "DELEGATION_POLICY_INVALID",
                                         "only with mode inherit or on-behalf-of (mode none accepts no delegation)"))
        return {"mode": "none"}
    depth = policy.get("max_depth", 1)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DELEGATION_DEPTH:
        problems.append(_problem(f"{field}.max_depth", "DELEGATION_POLICY_INVALID",
                                 f"must be an integer from 1 to {MAX_DELEGATION_DEPTH}"))
    allowed: JSONValue = policy.get("allowed_delegators")
    if not isinstance(allowed, list) or not allowed:
        problems.append(_problem(f"{field}.allowed_delegators", "DELEGATION_POLICY_INVALID",
                                 "is required with a delegating mode: a non-empty list of `KIND:NAME`, `KIND:*` or `*`"
                                 " (nothing is delegated to a job that did not say from whom)"))
        allowed = []
    elif len(allowed) > MAX_ALLOWED_DELEGATORS:
        problems.append(_problem(f"{field}.allowed_delegators", "DELEGATION_POLICY_INVALID",
                                 f"at most {MAX_ALLOWED_DELEGATORS} entries"))
    else:
        for index, entry in enumerate(allowed):
            if not _delegator_pattern(entry):
                problems.append(_problem(f"{field}.allowed_delegators[{index}]", "DELEGATION_POLICY_INVALID",
                                         f"must be `*`, `KIND:*` or `KIND:NAME` with KIND one of {', '.join(_KINDS_ALL)}"))
    names: list[JSONValue] = [*sorted({a for a in allowed if isinstance(a, str)})]
    return {"mode": mode, "max_depth": depth, "allowed_delegators": names}


def declared_level(declaration: JSONObject | None) -> str:
    """The trust level a job declares (``user`` without a declaration)."""
    if not declaration:
        return DEFAULT_TRUST
    return str(json_object(declaration.get("trust")).get("level") or DEFAULT_TRUST)


# --------------------------------------------------------------------------- the resolved identity


@attrs.frozen(kw_only=True)
class Delegation:
    """How a run came to act for someone else: the run that delegated, and the chain of principals up to this run."""

    mode: str
    depth: int
    max_depth: int
    delegator_principal: str
    delegator_trust_level: str
    delegator_run_id: str
    delegator_job_id: str
    #: Principals root first, ending with the principal this run acts as.
    chain: tuple[str, ...]

    def to_json(self) -> JSONObject:
        """The ``delegation_json`` of the run."""
        return {
            "mode": self.mode, "depth": self.depth, "max_depth": self.max_depth, "chain": list(self.chain),
            "delegator": {"principal": self.delegator_principal, "trust_level": self.delegator_trust_level,
                          "run_id": self.delegator_run_id, "job_id": self.delegator_job_id},
        }


@attrs.frozen(kw_only=True)
class ResolvedIdentity:
    """Who a run acts as (``principal`` is ``KIND:NAME``) and at which effective trust level.

    Handed to the later pipeline steps as ``RunOutcomes.identity`` (credentials, authorization
    providers, evidence) and recorded on the run.
    """

    subject_kind: str
    subject_principal: str
    trust_level: str
    declared_level: str
    #: ``default`` (no declaration), ``declared`` or ``delegated``.
    source: str
    delegation: Delegation | None = None

    @property
    def principal(self) -> str:
        """``KIND:NAME``, as recorded on the run and its events."""
        return f"{self.subject_kind}:{self.subject_principal}"

    @property
    def chain(self) -> tuple[str, ...]:
        """Principals root first, ending with this one (just this one when not delegated)."""
        return self.delegation.chain if self.delegation is not None else (self.principal,)

    @property
    def depth(self) -> int:
        """Delegation hops up to this run (0 when not delegated)."""
        return self.delegation.depth if self.delegation is not None else 0

    def to_json(self) -> JSONObject:
        """The ``identity_json`` of the run."""
        return {"status": "resolved", "principal": self.principal,
                "subject": {"kind": self.subject_kind, "principal": self.subject_principal},
                "trust_level": self.trust_level, "declared_level": self.declared_level, "source": self.source,
                "depth": self.depth}

    def as_mapping(self) -> JSONObject:
        """What providers receive (``CredentialContext.identity``, ``AuthorizationRequest.identity``): the run's
        ``identity_json`` plus its ``delegation`` (``delegation_json``, or None when not delegated)."""
        return {**self.to_json(), "delegation": self.delegation.to_json() if self.delegation is not None else None}


def default_identity(job: JobRow) -> ResolvedIdentity:
    """The identity of a run of a job declaring none: the job itself (``job:<name>``) at trust ``user``."""
    return ResolvedIdentity(subject_kind="job", subject_principal=str(job.name), trust_level=DEFAULT_TRUST,
                            declared_level=DEFAULT_TRUST, source="default")


def own_identity(job: JobRow, declaration: JSONObject) -> ResolvedIdentity:
    """The identity a job declares for itself (its subject, or ``job:<name>``, at its declared level)."""
    subject = json_object(declaration.get("subject")) or {"kind": "job", "principal": str(job.name)}
    level = declared_level(declaration)
    return ResolvedIdentity(subject_kind=str(subject["kind"]), subject_principal=str(subject["principal"]), trust_level=level,
                            declared_level=level, source="declared")


def _default_parts() -> tuple[str, str, str]:
    """The default identity's ``identity_json`` split around the job's name, which it holds twice (principal and
    subject): written once with a stand-in name no job can have (a NUL) and split where it went."""
    stand_in = ResolvedIdentity(subject_kind="job", subject_principal="\x00", trust_level=DEFAULT_TRUST,
                                declared_level=DEFAULT_TRUST, source="default")
    before, middle, after = json.dumps(stand_in.to_json(), sort_keys=True).split("\\u0000")
    return before, middle, after


_DEFAULT_PARTS = _default_parts()


def default_identity_json(name: str) -> str:
    """``json.dumps(default_identity(job).to_json(), sort_keys=True)`` for a job named ``name``, composed from its fixed
    parts and the name's escaped form: every run of a job that declares no identity records it, and only the name
    differs between jobs."""
    return encode_basestring_ascii(name)[1:-1].join(_DEFAULT_PARTS)


def record(outcomes: RunOutcomes, resolved: ResolvedIdentity, text: str | None = None) -> None:
    """Put a resolved identity into the run's outcomes (columns committed with the run, handed to later steps).
    ``text``: its ``identity_json`` when the caller composed it (``default_identity_json``)."""
    outcomes.identity = resolved
    outcomes.columns["identity_json"] = text if text is not None else json.dumps(resolved.to_json(), sort_keys=True)
    outcomes.columns["trust_level"] = resolved.trust_level
    outcomes.columns["principal"] = resolved.principal
    if resolved.delegation is not None:
        outcomes.columns["delegation_json"] = json.dumps(resolved.delegation.to_json(), sort_keys=True)


def _declaration(spec: JobSpec) -> JSONObject | None:
    value = getattr(spec, "identity", None)
    return value if isinstance(value, dict) else None


def resolve(store: Store, started: ClaimedRun, spec: JobSpec, outcomes: RunOutcomes) -> None:
    """Resolve the run's identity and trust level into ``outcomes`` (raises ``DELEGATION_*`` on a delegation failure).

    A job without a declaration, or whose delegation mode is ``none``, costs no query. A
    delegating job's run reads the run that triggered its chain (following retries and
    replays of itself back to it) and checks the delegation before anything executes.
    """
    declaration = _declaration(spec)
    if declaration is None:
        record(outcomes, default_identity(started.job), default_identity_json(str(started.job.name)))
        return
    own = own_identity(started.job, declaration)
    policy = json_object(declaration.get("delegation")) or {"mode": "none"}
    if policy.get("mode", "none") == "none" or not started.source_run_id:
        record(outcomes, own)
        if own.source == "declared":
            outcomes.record("identity.resolved", {"principal": own.principal, "trust_level": own.trust_level})
        return
    try:
        resolved = check_delegation(store, started.job, started.source_run_id, own=own, policy=policy)
    except SchedulerError as exc:
        _record_denial(outcomes, own, policy, exc)
        raise
    record(outcomes, resolved)
    if resolved.delegation is not None:
        outcomes.record("identity.delegated", resolved.delegation.to_json() | {"principal": resolved.principal,
                                                                                "trust_level": resolved.trust_level})


def _record_denial(outcomes: RunOutcomes, own: ResolvedIdentity, policy: JSONObject, exc: SchedulerError) -> None:
    """What a refused delegation leaves on the run: no principal, no trust level, the attempt and why."""
    details = exc.details if isinstance(exc.details, dict) else {}
    outcomes.columns["identity_json"] = json.dumps({
        "status": "denied", "error_code": exc.code, "subject": {"kind": own.subject_kind, "principal": own.subject_principal},
        "declared_level": own.declared_level}, sort_keys=True)
    outcomes.columns["delegation_json"] = json.dumps({"status": "denied", "error_code": exc.code, "mode": policy.get("mode"),
                                                      "max_depth": policy.get("max_depth"), **details}, sort_keys=True)
    outcomes.record("identity.denied", {"error_code": exc.code, "message": exc.message, **details})


#: Run columns read from the run a delegation comes from.
_SOURCE_COLUMNS = "id, job_id, source_run_id, identity_json, trust_level, principal, delegation_json"


def delegator_run(store: Store, job_id: str, source_run_id: str) -> RunRow | None:
    """The run that delegated to this job's run: the first run of another job behind ``source_run_id``.

    A retry or replay's source is an earlier attempt of the same job; those are followed back
    (bounded) to the chain parent. None when the lineage reaches no other job's run (the run
    was not chain-triggered: nothing is delegated).
    """
    cursor: str | None = source_run_id
    with store.read() as tx:
        for _ in range(MAX_ATTEMPT_WALK):
            if cursor is None:
                return None
            row = tx.one(f"SELECT {_SOURCE_COLUMNS} FROM runs WHERE id = ?", (cursor,))
            if row is None:
                raise SchedulerError("DELEGATION_SOURCE_UNRESOLVED", f"the run {cursor} this run follows is gone: its delegator"
                                     " cannot be checked", details={"delegator_run_id": cursor})
            run = RunRow.from_row(row)
            if run.job_id != job_id:
                return run
            cursor = run.source_run_id
    raise SchedulerError("DELEGATION_SOURCE_UNRESOLVED", f"more than {MAX_ATTEMPT_WALK} attempts lead back to the delegator",
                         details={"delegator_run_id": source_run_id})


def _strings(value: JSONValue) -> list[str]:
    """The strings of a JSON list (an allow list); nothing for anything else."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _allowed(principal: str, allowed: list[str]) -> bool:
    kind = principal.partition(":")[0]
    return any(a == "*" or a == principal or a == f"{kind}:*" for a in allowed)


def check_delegation(store: Store, job: JobRow, source_run_id: str, *, own: ResolvedIdentity,
                     policy: JSONObject) -> ResolvedIdentity:
    """The identity of a delegating job's run that follows ``source_run_id``, or ``DELEGATION_*``.

    ``own`` is the identity the job declares for itself, ``policy`` its normalised delegation
    policy. Checks, in order: the delegator run recorded a resolved identity
    (``DELEGATION_SOURCE_UNRESOLVED`` otherwise: a run from before identities, or one whose own
    delegation was refused), the delegator is in ``allowed_delegators`` (``DELEGATION_NOT_ALLOWED``),
    the depth (``DELEGATION_DEPTH_EXCEEDED``) and that the acting principal is not already in the
    chain (``DELEGATION_CYCLE``). The effective trust is the lower of the job's declared level and
    the delegator's effective level. Also usable by the credential step to re-check a chain child.
    """
    mode = str(policy.get("mode", "none"))
    if mode == "none":
        return own
    row = delegator_run(store, job.id, source_run_id)
    if row is None:
        return own
    base: JSONObject = {"delegator_run_id": row.id, "delegator_job_id": row.job_id}
    try:
        recorded = json.loads(row.identity_json) if row.identity_json else None
    except ValueError:
        recorded = None
    trust_level = row.trust_level
    if not isinstance(recorded, dict) or recorded.get("status") != "resolved" or trust_level not in TRUST_LEVELS \
            or trust_level is None or not row.principal:
        raise SchedulerError("DELEGATION_SOURCE_UNRESOLVED", f"the delegating run {row.id} has no resolved identity"
                             " (it predates identities, or its own identity was refused)", details=base)
    delegator = str(row.principal)
    try:
        parent = json.loads(row.delegation_json) if row.delegation_json else None
    except ValueError:
        parent = None
    parent_chain = [str(p) for p in parent["chain"]] if isinstance(parent, dict) and isinstance(parent.get("chain"), list) \
        else [delegator]
    parent_depth = parent["depth"] if isinstance(parent, dict) and isinstance(parent.get("depth"), int) else 0
    depth = parent_depth + 1
    acting = delegator if mode == "inherit" else own.principal
    chain = parent_chain if mode == "inherit" else [*parent_chain, acting]
    details: JSONObject = {**base, "delegator": delegator, "chain": list(chain), "depth": depth}
    if not _allowed(delegator, _strings(policy.get("allowed_delegators"))):
        raise SchedulerError("DELEGATION_NOT_ALLOWED", f"{delegator} is not among the allowed delegators of job"
                             f" {job.name!r}", details=details)
    max_depth = policy.get("max_depth") or 1
    if depth > int(max_depth if isinstance(max_depth, (int, str)) else 1):
        raise SchedulerError("DELEGATION_DEPTH_EXCEEDED", f"delegation depth {depth} is above the job's max_depth"
                             f" {policy.get('max_depth') or 1}", details=details)
    if mode != "inherit" and acting in parent_chain:
        raise SchedulerError("DELEGATION_CYCLE", f"{acting} already appears in the delegation chain"
                             f" {' -> '.join(parent_chain)}", details=details)
    kind, _, name = acting.partition(":")
    delegation = Delegation(mode=mode, depth=depth, max_depth=int(max_depth if isinstance(max_depth, (int, str)) else 1),
                            delegator_principal=delegator, delegator_trust_level=trust_level, delegator_run_id=row.id,
                            delegator_job_id=row.job_id, chain=tuple(chain))
    return ResolvedIdentity(subject_kind=kind, subject_principal=name, trust_level=lower(own.declared_level, trust_level),
                            declared_level=own.declared_level, source="delegated", delegation=delegation)


# --------------------------------------------------------------------------- the invoking account (CLI)


@attrs.frozen(kw_only=True)
class Invoker:
    """The OS account running the CLI and the highest trust level it may give a job."""

    name: str
    uid: int
    level: str
    #: Why this level (shown in refusals): ``root``, ``database owner``, ``[identity] operators in FILE`` ...
    reason: str


def _trusted_file(path: Path, owners: set[int]) -> bool:
    """Whether a settings file (and its directory) is owned by one of ``owners`` and writable by nobody else.

    The directory is checked too, so nobody else can swap the file between its reading and this check.
    """
    try:
        for item in (path, path.parent):
            info = os.stat(item)
            if info.st_uid not in owners or info.st_mode & (st.S_IWGRP | st.S_IWOTH):
                if item == path.parent and info.st_mode & st.S_ISVTX and info.st_uid in owners | {0}:
                    continue  # a sticky directory (/tmp-like): others cannot replace the file
                return False
    except OSError:
        return False
    return True


def _listed(entries: tuple[str, ...], name: str, uid: int) -> bool:
    return any(scope_matches(entry, name, uid) for entry in entries)


def invoker(store: object = None, *, settings: Settings | None = None) -> Invoker:
    """The invoking account's level: what ``jobs add``/``update`` may give a job at most.

    From the effective uid and its password-database name (never ``$USER``): root is
    ``system``; the owner of the SQLite database file is ``operator``; accounts listed in
    ``[identity] system_users`` / ``operators`` get that level, but only when the list comes from
    a settings file owned by root or the database owner that nobody else can write (a list in
    the invoker's own file, or in a ``SCHEDULER_IDENTITY_*`` variable, grants nothing); everyone
    else is ``[identity] default_level`` (``user``; it can only lower, never raise).
    """
    name, uid = approver_identity()
    if uid == 0:
        return Invoker(name=name, uid=uid, level="system", reason="root")
    owner = None
    path = getattr(store, "path", None)
    if path is not None:
        try:
            owner = os.stat(path).st_uid
        except OSError:
            owner = None
    if settings is None:
        settings = current_settings()
    resolved = settings.kernel.get("identity")
    granted, why = None, ""
    if resolved is not None:
        owners = {0} | ({owner} if owner is not None else set())
        cfg = resolved.value
        for key, level in (("system_users", "system"), ("operators", "operator")):
            source = resolved.sources.get(key, "default")
            entries = tuple(getattr(cfg, key, ()) or ())
            if entries and source.startswith("file:") and _trusted_file(Path(source[5:]), owners) \
                    and _listed(entries, name, uid):
                granted, why = level, f"[identity] {key} in {source[5:]}"
                break
    if granted is None and owner is not None and uid == owner:
        granted, why = "operator", "owner of the database file"
    if granted is not None:
        return Invoker(name=name, uid=uid, level=granted, reason=why)
    default = getattr(resolved.value, "default_level", DEFAULT_TRUST) if resolved is not None else DEFAULT_TRUST
    return Invoker(name=name, uid=uid, level=lower(default, DEFAULT_TRUST), reason="default level")


def check_invoker(spec: JobSpec, who: Invoker, *, previous: JobSpec | None = None, field: str = "identity") -> None:
    """Refuse (``IDENTITY_LEVEL_EXCEEDS_INVOKER``) a job whose trust level is above the invoker's, and
    (``IDENTITY_SUBJECT_NOT_ALLOWED``) a ``user`` subject naming another account below ``operator``.

    ``previous`` (an update) is the stored spec: a job above the invoker's level cannot be changed
    by it at all (changing its command would run at a level the invoker does not have).
    """
    if previous is not None and rank(declared_level(_declaration(previous))) > rank(who.level):
        raise SchedulerError("IDENTITY_LEVEL_EXCEEDS_INVOKER", f"job {previous.name!r} runs at trust level"
                             f" {declared_level(_declaration(previous))!r}, above your level {who.level!r} ({who.name},"
                             f" {who.reason}): only an account at that level can change it",
                             details={"account": who.name, "uid": who.uid, "level": who.level, "reason": who.reason})
    declaration = _declaration(spec)
    level = declared_level(declaration)
    if rank(level) > rank(who.level):
        raise SchedulerError("IDENTITY_LEVEL_EXCEEDS_INVOKER", f"job {spec.name!r} declares trust level {level!r}, above"
                             f" your level {who.level!r} ({who.name}, {who.reason}); see docs/identity.md",
                             details={"field": f"{field}.trust.level", "account": who.name, "uid": who.uid,
                                      "level": who.level, "reason": who.reason})
    subject = json_object((declaration or {}).get("subject"))
    if subject.get("kind") == "user" and rank(who.level) < rank("operator") \
            and not _listed((str(subject.get("principal")),), who.name, who.uid):
        raise SchedulerError("IDENTITY_SUBJECT_NOT_ALLOWED", f"job {spec.name!r} would act as user"
                             f" {subject.get('principal')!r}; at level {who.level!r} a job may only act as your own account"
                             f" ({who.name})", details={"field": f"{field}.subject.principal", "account": who.name,
                                                        "level": who.level})


class IdentityStep(StepBase):
    """The pipeline step: every run resolves who it acts as (``resolve``), before proofs, authorization and credentials."""

    name = "identity"
    fields: Mapping[str, Normaliser | None] = {"identity": normalise_declaration}
    sections = ("identity",)

    def check_section(self, name: str, value: object, sections: Mapping[str, Any]) -> list[Problem]:
        """A compiled identity declaration must be one ``normalise_declaration`` accepts."""
        return [] if value is None else section_problems(normalise_declaration(value, "identity")[1])

    def before(self, run: Run) -> None:
        """Resolve the run's identity into its outcomes (``DELEGATION_*`` on a refused delegation)."""
        resolve(run.store, run.started, run.spec, run.outcomes)
