"""Credentials down a chain: what a chained child run presents, per its parent's ``child_credential_policy``.

The policy is declared by the parent (the job whose credentials would flow), never by the
child, so a child cannot take what its parent did not grant:

* ``none`` (default): the child presents only its own bindings; nothing flows from the parent.
* ``inherit``: the child presents the parent's bindings as well as its own (resolved again,
  for the child's run, through the same providers); a name bound by both refuses the run
  (``CREDENTIAL_DUPLICATE``).
* ``downscope``: the child presents only its own bindings, and each must be one the parent
  holds (same provider and ref; the child may change how it is presented): a child
  binding the parent does not hold refuses the run (``CREDENTIAL_DOWNSCOPE_DENIED``).
* ``independent``: the child presents only its own bindings, resolved with no lineage
  (providers are not told which run it follows), as if it had been started on its own.

Delegation depth, cycles and allowed delegators are the identity step's
(``scheduler.pipeline.identity``); this module only decides which bindings a run presents.
"""

from __future__ import annotations

import json

from scheduler.base.errors import SchedulerError
from scheduler.core.claimed import ClaimedRun
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.rows import JobRow, JSONObject
from scheduler.core.spec import JobSpec
from scheduler.core.store.base import Store
from scheduler.pipeline.credentials.bindings import Binding


def parent_policy(store: Store, started: ClaimedRun) -> tuple[str, list[Binding]]:
    """The parent job's policy and bindings (``("none", [])`` when the parent is gone). One primary-key read."""
    parent_id = started.job.parent_id
    if not parent_id:
        return "none", []
    with store.read() as tx:
        row = tx.one("SELECT credentials, child_credential_policy FROM jobs WHERE id = ?", (parent_id,))
    if row is None:
        return "none", []
    parent = JobRow.from_row(row)
    raw: object = parent.credentials
    bindings: list[Binding] = json.loads(raw) if isinstance(raw, str) else list(raw) if isinstance(raw, list) else []
    return parent.child_credential_policy or "none", bindings


def bindings_for_run(
    store: Store, started: ClaimedRun, spec: JobSpec, own: list[Binding], outcomes: RunOutcomes
) -> tuple[list[Binding], str | None]:
    """The bindings this run presents (its own, adjusted by its chain parent's policy; recorded in ``outcomes``),
    and that policy (None when the run follows no chain parent)."""
    if spec.schedule_kind != "chain" or not started.parent_run_id:
        return own, None
    policy, parent = parent_policy(store, started)
    lineage: JSONObject = {"policy": policy, "parent_job_id": started.job.parent_id, "parent_run_id": started.parent_run_id}
    if policy == "inherit" and parent:
        names = {_name(b).upper() for b in own}
        clash = sorted(_name(b) for b in parent if _name(b).upper() in names)
        if clash:
            raise SchedulerError("CREDENTIAL_DUPLICATE", f"the parent job grants credential(s) {', '.join(clash)} that this "
                                 "job binds itself (child_credential_policy inherit)", details={**lineage, "names": clash})
        outcomes.record("credential.inherited", {**lineage, "names": [b["name"] for b in parent]})
        return [*own, *parent], policy
    if policy == "downscope" and own:
        held = {(b["provider"], b["ref"]) for b in parent}
        denied = sorted(_name(b) for b in own if (b["provider"], b["ref"]) not in held)
        if denied:
            raise SchedulerError("CREDENTIAL_DOWNSCOPE_DENIED", f"credential(s) {', '.join(denied)} are not held by the parent "
                                 "job (child_credential_policy downscope)", details={**lineage, "names": denied})
        outcomes.record("credential.downscoped", {**lineage, "names": [b["name"] for b in own]})
    return own, policy


def _name(binding: Binding) -> str:
    """A binding's name."""
    return binding["name"]

