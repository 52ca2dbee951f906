"""The run step contract, and the registry of the installed steps.

A *step* is one stage of the run pipeline (governance, identity, proofs, authorization, the
approval gate, credentials, verification, evidence, or a third party's). It owns, in one object:

* **its job-spec fields**: ``fields`` maps each field it owns to its normaliser (``None``: the
  field's declared kind is checked by the kernel), ``check`` holds its rules across fields and
  ``check_installed`` what it checks against installed plugins (``jobs add``, ``jobs validate``);
* **its part of the execution artifact**: ``sections`` names the sections ``project`` returns,
  ``check_section`` says why a compiled (handoff v4) section is not one it enforces, and
  ``check_binding`` proves a job bound to an artifact kind other than native;
* **its part of every run**: ``applies`` (a pure function of the artifact's sections, so the run
  plan is cached per artifact sections), ``gates``/``open_gate`` (a gate opened when a dispatch is
  claimed: nothing of the run starts before a decision), ``before`` (continue by returning,
  refuse by raising ``SchedulerError`` with a stable code; ask for an approval by setting
  ``run.outcomes.escalate`` and raising, the completion transaction opens the gate), ``around``
  (a context around execution) and ``after`` (the result, possibly changed, once execution ended).

Subclass ``StepBase`` and override only the hooks the step needs: a hook left at its default
is not in any plan, so it costs nothing per run. Core never imports a step: the composition
root (``scheduler.runtime``) hands the ordered list to ``install``; the kernel reads it back
through ``registered`` and fails closed (``PIPELINE_NOT_INSTALLED``) where it is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from scheduler.base.errors import SchedulerError

if TYPE_CHECKING:
    from scheduler.core.claimed import ClaimedRun
    from scheduler.core.execution import CredentialPresentation, ExecutionResult
    from scheduler.core.outcomes import RunOutcomes
    from scheduler.core.rows import JobRow, JSONObject
    from scheduler.core.spec import JobSpec
    from scheduler.core.store.base import Store, Tx

#: Code when the kernel needs the steps and the composition root installed none.
NOT_INSTALLED = "PIPELINE_NOT_INSTALLED"
#: Code when a job needs a step that is not registered (an artifact section, a field or an artifact kind no step owns).
NOT_REGISTERED = "PIPELINE_STEP_NOT_REGISTERED"

#: One validation finding: ``{"field", "code", "error"}``.
Problem = dict[str, str]
#: A field normaliser: ``(value as given, field name) -> (normalised value or None, problems)``.
Normaliser = Callable[[Any, str], tuple[object, list[Problem]]]


class Problems(Protocol):
    """Where cross-field rules report (the spec validator's collector)."""

    def add(self, field: str, message: str, code: str = "INVALID_VALUE") -> None:
        """Record one problem."""

    def has(self, field: str) -> bool:
        """Whether ``field`` already has a problem (a rule about an invalid field says nothing more)."""


class Run:
    """One run as the steps see it on its worker: what they read, and what the hooks hand on to later ones.

    (Plain slotted classes and named tuples here, not attrs: the CLI imports this module at start-up.)
    """

    __slots__ = ("credentials", "executed", "executor", "spec", "started", "store")

    def __init__(self, store: Store, started: ClaimedRun, spec: JobSpec) -> None:
        self.store, self.started, self.spec = store, started, spec
        #: The loaded executor plugin (the dispatcher loads it before the first ``before`` hook).
        self.executor: Any = None
        #: The credentials presented to the executor (set by a step's ``around``), never stored.
        self.credentials: tuple[CredentialPresentation, ...] = ()
        #: True once the executor returned a valid result (``after`` hooks that read its output check it).
        self.executed = False

    @property
    def outcomes(self) -> RunOutcomes:
        """What the steps decided, committed with the run by the completion transaction."""
        return self.started.outcomes


class Gate(NamedTuple):
    """A claimed dispatch a step gates: the run to create waiting for a decision (``open_gate``)."""

    run_id: str
    #: The job row as the claim read it.
    job: JobRow
    dispatch_id: str
    dispatch_kind: str
    attempt: int
    scheduled_for: int
    parent_run_id: str | None
    retry_of_run_id: str | None
    replay_of_run_id: str | None
    now: int
    actor: str | None


@runtime_checkable
class Step(Protocol):
    """One stage of the run pipeline (see the module docstring; ``StepBase`` gives every hook a no-op default)."""

    #: Unique name (plans, ``PIPELINE_*`` errors, the ``scheduler.steps`` entry point).
    name: str
    @property
    def fields(self) -> Mapping[str, Normaliser | None]:
        """Job-spec fields this step owns -> their normaliser (None: the field's declared kind is checked by the kernel)."""

    @property
    def sections(self) -> tuple[str, ...]:
        """Execution-artifact sections this step projects and validates."""

    def project(self, spec: JobSpec) -> JSONObject:
        """This step's sections of the job's execution artifact (exactly ``sections``). ``spec`` is a view without
        the fields outside the execution contract (``scheduler.core.spec.NON_CONTRACT_FIELDS``: reading one raises
        ``AttributeError``), since jobs that differ only there share one cached projection."""

    def check(self, values: Mapping[str, Any], problems: Problems) -> None:
        """Rules across this step's fields and others (``values``: the normalised fields of a spec being validated)."""

    def check_installed(self, spec: JobSpec) -> tuple[JSONObject, list[Problem]]:
        """What the installed plugins say of the job: normalised field values to store, and problems."""

    def check_section(self, name: str, value: object, sections: Mapping[str, Any]) -> list[Problem]:
        """Why section ``name`` of a compiled artifact is not a declaration this step enforces (fields: artifact paths)."""

    def check_binding(self, tx: Tx, row: Mapping[str, object], spec: JobSpec) -> bool:
        """Prove a job row bound to an artifact kind this step owns agrees with it (raise); False: not this step's kind."""

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Whether the step takes part in runs of an artifact with these sections (pure: plans are cached per artifact sections)."""

    def gates(self, job: JobRow) -> bool:
        """Whether a claimed dispatch of ``job`` (its row) waits at this step's gate before anything runs."""

    def open_gate(self, tx: Tx, gate: Gate) -> None:
        """Open the gate in the claim transaction: the run waits for a decision; its approval claims it again."""

    def before(self, run: Run) -> None:
        """Decide before execution: return to continue, raise ``SchedulerError`` to refuse with its code."""

    def around(self, run: Run) -> AbstractContextManager[None]:
        """A context entered before execution and left after it, on every path (credentials)."""

    def after(self, run: Run, result: ExecutionResult) -> ExecutionResult:
        """Once execution ended (or was refused): the result to commit."""


class StepBase:
    """Defaults for every ``Step`` hook: a step overrides only what it does (the others are in no plan)."""

    name: str = ""
    fields: Mapping[str, Normaliser | None] = {}
    sections: tuple[str, ...] = ()

    def project(self, spec: JobSpec) -> JSONObject:
        """Each of ``sections`` as the job-spec attribute of the same name (a step whose section is shaped
        otherwise overrides this)."""
        return {name: getattr(spec, name) for name in self.sections}

    def check(self, values: Mapping[str, Any], problems: Problems) -> None:
        """No cross-field rule."""

    def check_installed(self, spec: JobSpec) -> tuple[JSONObject, list[Problem]]:
        """Nothing to check against plugins."""
        return {}, []

    def check_section(self, name: str, value: object, sections: Mapping[str, Any]) -> list[Problem]:
        """Nothing to refuse."""
        return []

    def check_binding(self, tx: Tx, row: Mapping[str, object], spec: JobSpec) -> bool:
        """No artifact kind of its own."""
        return False

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Takes part in every run (only the hooks it overrides run)."""
        return True

    def gates(self, job: JobRow) -> bool:
        """No gate at claim."""
        return False

    def open_gate(self, tx: Tx, gate: Gate) -> None:
        """No gate at claim."""

    def before(self, run: Run) -> None:
        """Continue."""

    def around(self, run: Run) -> AbstractContextManager[None]:
        """No context."""
        return contextlib.nullcontext()

    def after(self, run: Run, result: ExecutionResult) -> ExecutionResult:
        """The result unchanged."""
        return result


def overrides(step: object, hook: str) -> bool:
    """Whether ``step`` implements ``hook`` itself (a ``StepBase`` default does nothing and is left out of plans)."""
    return getattr(type(step), hook, None) is not getattr(StepBase, hook)


class Installed(NamedTuple):
    """The registered steps in pipeline order, and what the kernel looks up in them."""

    steps: tuple[Step, ...]
    #: Field name -> (owning step, its normaliser or None).
    field_owners: Mapping[str, tuple[Step, Normaliser | None]]
    #: Section name -> owning step.
    section_owners: Mapping[str, Step]
    #: Steps with a gate at claim.
    gates: tuple[Step, ...]
    #: Steps that prove artifact kinds other than native.
    binders: tuple[Step, ...]

    def owner_of_section(self, name: str) -> Step:
        """The step projecting section ``name`` (``PIPELINE_STEP_NOT_REGISTERED`` when none does)."""
        step = self.section_owners.get(name)
        if step is None:
            raise SchedulerError(NOT_REGISTERED, f"no registered pipeline step owns the artifact section {name!r}",
                                 details={"section": name})
        return step


_installed: Installed | None = None
#: A deferred installation (``install(factory)``): made on first use, so a command that needs no step imports none.
_pending: Callable[[], Sequence[Step]] | None = None


def install(steps: Sequence[Step] | Callable[[], Sequence[Step]]) -> Installed | None:
    """Register the run pipeline: ``steps`` in the order they run (the composition root calls this at start-up).

    ``steps`` may be a function giving them: it is called when the kernel first needs the steps
    (CLI start-up stays fast for commands that validate and run nothing). Refuses (``ValueError``)
    a step that does not implement ``Step``, two steps of one name, and a field or section claimed
    by two steps. Replaces whatever was installed before.
    """
    global _installed, _pending
    if callable(steps):
        _installed, _pending = None, steps
        _plans.clear()
        return None
    names: set[str] = set()
    field_owners: dict[str, tuple[Step, Normaliser | None]] = {}
    section_owners: dict[str, Step] = {}
    for step in steps:
        if not isinstance(step, Step) or not step.name:
            raise ValueError(f"{step!r} is not a pipeline step (scheduler.core.steps.Step, with a name)")
        if step.name in names:
            raise ValueError(f"two pipeline steps are named {step.name!r}")
        names.add(step.name)
        for field, normaliser in step.fields.items():
            if field in field_owners:
                raise ValueError(f"field {field!r} is owned by steps {field_owners[field][0].name!r} and {step.name!r}")
            field_owners[field] = (step, normaliser)
        for section in step.sections:
            if section in section_owners:
                raise ValueError(f"section {section!r} is owned by steps {section_owners[section].name!r} and {step.name!r}")
            section_owners[section] = step
    ordered = tuple(steps)
    _pending = None
    _installed = Installed(steps=ordered, field_owners=field_owners, section_owners=section_owners,
                           gates=tuple(s for s in ordered if overrides(s, "gates")),
                           binders=tuple(s for s in ordered if overrides(s, "check_binding")))
    _plans.clear()
    return _installed


def registered() -> Installed:
    """The installed steps; ``PIPELINE_NOT_INSTALLED`` when the composition root installed none (fail closed)."""
    if _installed is None and _pending is not None:
        install(_pending())
    if _installed is None:
        raise SchedulerError(NOT_INSTALLED, "the run pipeline is not installed (the composition root, scheduler.runtime,"
                             " installs its steps before jobs are validated or run)")
    return _installed


@contextlib.contextmanager
def installed_as(steps: Sequence[Step] | None) -> Iterator[None]:
    """Install ``steps`` (None: nothing) for the body, then restore what was installed before (tests)."""
    global _installed, _pending
    before = _installed, _pending
    try:
        if steps is None:
            _installed, _pending = None, None
            _plans.clear()
        else:
            install(steps)
        yield
    finally:
        _installed, _pending = before
        _plans.clear()


# --------------------------------------------------------------------------- the run plan


class Plan(NamedTuple):
    """Which steps take part in runs of one artifact, and their hooks in pipeline order (derived, never stored; shared
    by every artifact with the same sections, so it names none)."""

    #: Names of the steps that apply, in order (``runs`` never record it: the artifact is the truth).
    steps: tuple[str, ...]
    before: tuple[Callable[[Run], None], ...]
    around: tuple[Callable[[Run], AbstractContextManager[None]], ...]
    after: tuple[Callable[[Run, ExecutionResult], ExecutionResult], ...]


#: Plans by artifact digest (cleared on ``install``); bounded, cleared when full.
_plans: dict[str, Plan] = {}
_PLANS_MAX = 4096


def plan_for(digest: str, sections: Callable[[], Mapping[str, Any]], kernel_sections: frozenset[str]) -> Plan:
    """The run plan of the artifact ``digest`` (proven by the caller to have ``sections()``), cached per digest."""
    plan = _plans.get(digest)
    if plan is None:
        plan = derive_plan(digest, sections(), kernel_sections)
        if len(_plans) >= _PLANS_MAX:
            _plans.clear()
        _plans[digest] = plan
    return plan


def derive_plan(digest: str, sections: Mapping[str, Any], kernel_sections: frozenset[str]) -> Plan:
    """The run plan of an artifact with ``sections``: the registered steps that apply, their hooks in order.

    ``PIPELINE_STEP_NOT_REGISTERED`` when a non-empty section is neither the kernel's nor a registered step's:
    the plan would differ from the artifact. A step that does not apply, or a hook left at its default, is in no
    tuple of the plan, so it costs nothing per run.
    """
    installed = registered()
    refuse_unowned(digest, sections, kernel_sections)
    applying = [s for s in installed.steps if s.applies(sections)]
    return Plan(steps=tuple(s.name for s in applying),
                before=tuple(s.before for s in applying if overrides(s, "before")),
                around=tuple(s.around for s in applying if overrides(s, "around")),
                after=tuple(s.after for s in applying if overrides(s, "after")))


def refuse_unowned(digest: str, sections: Mapping[str, Any], kernel_sections: frozenset[str]) -> None:
    """``PIPELINE_STEP_NOT_REGISTERED`` when artifact ``digest`` has a non-empty section that is neither the kernel's
    nor a registered step's (a plan derived without its owner would not be the plan the artifact binds)."""
    owners = registered().section_owners
    unowned = sorted(k for k, v in sections.items() if k not in kernel_sections and k not in owners and v not in (None, {}, [], ""))
    if unowned:
        raise SchedulerError(NOT_REGISTERED, f"artifact {digest} declares {', '.join(unowned)}, which no registered pipeline step"
                             " owns (install the step's distribution, or re-save the job)", details={"sections": unowned})
