"""The run pipeline: its built-in steps, registered in one list in the order they run.

``DEFAULT_STEPS`` is the pipeline (the way pytest lists its built-in plugins): each entry is
one module's step (the contract: ``scheduler.core.steps.Step``), and adding a step is its
module plus one line here. A run goes, in this order::

    claim -> [approval gate, when the job requires one: the run waits, and an approved run is claimed again]
          -> artifact check (binds the run plan) -> governance -> identity -> proofs -> authorization
             (escalate: waits at an approval gate) -> credentials materialised -> execute (the executor,
             verify_shell included) -> credentials cleaned -> evidence attested -> the completion transaction

Third-party steps come from the ``scheduler.steps`` entry-point group (``installed_steps``):
each names the step it runs after (``runs_after``), so its place is as explicit as the
built-ins'. The composition root (``scheduler.runtime``) installs the result into core.
"""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint

from scheduler.base.entry_points import dist_name, entry_points_of, is_disabled, strict_loading
from scheduler.base.plugin_kinds import kind_named
from scheduler.core.steps import Step
from scheduler.pipeline.approval import ApprovalStep
from scheduler.pipeline.artifact_check import ArtifactCheckStep
from scheduler.pipeline.authorization import AuthorizationStep
from scheduler.pipeline.credentials.step import CredentialStep
from scheduler.pipeline.evidence import EvidenceStep
from scheduler.pipeline.governance import GovernanceStep
from scheduler.pipeline.identity import IdentityStep
from scheduler.pipeline.plugin_options import PluginOptionsStep
from scheduler.pipeline.proofs.step import ProofStep
from scheduler.pipeline.verification import VerificationStep

log = logging.getLogger(__name__)

#: The built-in steps, in pipeline order (hooks run in this order; ``around`` contexts nest in it).
DEFAULT_STEPS: tuple[Step, ...] = (
    ArtifactCheckStep(),  # first, when the run plan is bound: the job still is its artifact (and handoff v4 binding)
    PluginOptionsStep(),  # validation only: executor_options and delivery_options against their plugins
    GovernanceStep(),  # before: what the executor cannot enforce is denied
    IdentityStep(),  # before: who the run acts as, delegation checked
    ProofStep(),  # before: the dispatch's proof verified and claimed
    AuthorizationStep(),  # before: the authorization_ref provider permits, denies or escalates
    ApprovalStep(),  # the approval gate: opened when a dispatch of an approval_required job is claimed
    CredentialStep(),  # around execution: materialised before, cleaned after; after: redactions recorded
    VerificationStep(),  # the verify_* fields and section (the executor runs the check)
    EvidenceStep(),  # after: the run's evidence attested, once the credentials are cleaned
)

#: The entry-point group of third-party steps.
STEPS_GROUP = kind_named("step").group


def default_steps() -> tuple[Step, ...]:
    """The built-in steps in pipeline order (what ``scheduler.runtime`` installs, with ``installed_steps``' additions)."""
    return DEFAULT_STEPS


def installed_steps() -> tuple[Step, ...]:
    """The built-in steps with each third-party step of ``scheduler.steps`` placed right after the step it names.

    An entry point gives a ``Step`` (or a class making one) with ``runs_after``, the name of a
    step already in the list. One that cannot be loaded or placed is logged and left out (a job
    that needs it then fails closed: ``PIPELINE_STEP_NOT_REGISTERED``), or raises under
    ``SCHEDULER_STRICT_PLUGINS``.
    """
    steps = list(DEFAULT_STEPS)
    for ep in sorted(entry_points_of(STEPS_GROUP), key=lambda e: e.name):
        if is_disabled(STEPS_GROUP, ep.name):
            continue
        try:
            step = _load(ep)
            names = [s.name for s in steps]
            anchor = getattr(step, "runs_after", None)
            if anchor not in names:
                raise ValueError(f"runs_after must name a registered step ({', '.join(names)}), not {anchor!r}")
            steps.insert(names.index(anchor) + 1 + sum(1 for s in steps if getattr(s, "runs_after", None) == anchor
                                                       and s not in DEFAULT_STEPS), step)
        except Exception as exc:  # a broken third-party step must not stop the kernel from starting
            if strict_loading():
                raise
            log.warning("pipeline step %r from %s not registered: %s: %s", ep.name, dist_name(ep), type(exc).__name__, exc)
    return tuple(steps)


def _load(ep: EntryPoint) -> Step:
    obj = ep.load()
    step = obj() if isinstance(obj, type) else obj
    if not isinstance(step, Step):
        raise TypeError(f"{ep.value} is not a pipeline step (scheduler.core.steps.Step)")
    return step
